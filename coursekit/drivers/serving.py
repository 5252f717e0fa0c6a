"""Drivers of notebook 16 (serving): build the learner's PagedKVCache, run a script of appends,
gathers and frees on it, and hand back what it gave and what its pool holds.

They hold no reference and no secret, and judge nothing: their errors name kinds, names and
shapes, never values.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .encoder import _build

APPEND, GATHER, FREE = 0, 1, 2

_CREATE = {"key_blocks": "self.key_blocks = torch.zeros(num_blocks, heads, block_size, d_k)",
           "value_blocks": "self.value_blocks = torch.zeros(num_blocks, heads, block_size, d_k)",
           "free_blocks": "self.free_blocks, a list of the free blocks' ids (all of range(num_blocks) at first)",
           "block_tables": "self.block_tables, a dict: sequence id -> the list of its blocks' ids, in order"}


def _attribute(cache: Any, name: str) -> Any:
    if not hasattr(cache, name):
        raise AttributeError(f"PagedKVCache has no attribute {name}: create it in __init__ as {_CREATE[name]}")
    return getattr(cache, name)


def _pool(cache: Any, name: str, shape: tuple) -> Any:
    import torch

    pool = _attribute(cache, name)
    if not isinstance(pool, torch.Tensor) or tuple(pool.shape) != shape:
        got = tuple(pool.shape) if isinstance(pool, torch.Tensor) else type(pool).__name__
        raise ValueError(f"PagedKVCache.{name} should be one tensor of shape (num_blocks, heads, block_size, d_k) "
                         f"= {shape}, but it is {got}: {_CREATE[name]}")
    return pool


def _read(pool: Any, table: list, length: int) -> np.ndarray:
    """The first ``length`` positions a table's blocks hold, in table order: (heads, length, d_k)."""
    rows = [pool[int(block)].detach().numpy() for block in table]              # each (heads, block_size, d_k)
    stacked = np.concatenate(rows, axis=1) if rows else np.zeros(pool.shape[1:2] + (0,) + pool.shape[3:])
    return stacked[:, :length]


def _checked(pair: Any, heads: int, length: int, d_k: int) -> tuple:
    import torch

    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        kind = "nothing (None): is a `return` missing?" if pair is None else f"a {type(pair).__name__}"
        raise TypeError(f"PagedKVCache.gather should return (keys, values), but it returned {kind}")
    out = []
    for name, x in zip(("keys", "values"), pair):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (heads, length, d_k):
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"PagedKVCache.gather returned {name} of shape {got}; expected (heads, length, d_k) "
                             f"= {(heads, length, d_k)}, the sequence's tokens in order")
        out.append(x.detach().numpy().astype(np.float64))
    return tuple(out)


def drive_paged_kv_cache(cls: Any) -> Any:
    """A PagedKVCache class -> fn(num_blocks, block_size, heads, d_k, script, keys, values) returning
    (gathered keys, gathered values, keys in the pool, values in the pool, counts).

    The cache is built as ``cls(num_blocks, block_size, heads, d_k)``; ``script`` is an int array
    (operations, 3) of rows (op, seq, n): op 0 appends the next n tokens of ``keys`` and ``values``
    (float32 (heads, total, d_k), taken in order) to sequence seq, op 1 gathers seq, op 2 frees it.
    Gathered keys and values are every gather's (keys, values) concatenated along the length axis
    (heads, gathered, d_k); the pool's are the same positions read from key_blocks and value_blocks
    through the sequence's block table (block p // block_size of the table, offset p % block_size).
    counts (operations, 3), after each operation: num_blocks - len(free_blocks), the blocks the live
    tables hold, and how many distinct blocks they hold.
    """
    import torch

    def run(num_blocks, block_size, heads, d_k, script, keys, values):
        num_blocks, block_size, heads, d_k = (int(n) for n in (num_blocks, block_size, heads, d_k))
        cache = _build(cls, (num_blocks, block_size, heads, d_k), {})
        shape = (num_blocks, heads, block_size, d_k)
        keys, values = torch.tensor(keys, dtype=torch.float32), torch.tensor(values, dtype=torch.float32)
        taken, lengths, gathered, counts = 0, {}, [], []
        for op, seq, n in np.asarray(script, dtype=np.int64).tolist():
            if op == APPEND:
                cache.append(seq, keys[:, taken:taken + n], values[:, taken:taken + n])
                taken, lengths[seq] = taken + n, lengths.get(seq, 0) + n
            elif op == GATHER:
                length = lengths.get(seq, 0)
                got = _checked(cache.gather(seq), heads, length, d_k)
                table = list(_attribute(cache, "block_tables")[seq])
                pooled = tuple(_read(_pool(cache, name, shape), table, length)
                               for name in ("key_blocks", "value_blocks"))
                gathered.append(got + pooled)
            else:
                cache.free(seq)
                lengths.pop(seq, None)
            tables = [list(t) for t in _attribute(cache, "block_tables").values()]
            held = [int(b) for t in tables for b in t]
            counts.append((num_blocks - len(_attribute(cache, "free_blocks")), len(held), len(set(held))))
        parts = [np.concatenate([g[i] for g in gathered], axis=1) for i in range(4)]
        return (*parts, np.array(counts, dtype=np.int64))
    return run
