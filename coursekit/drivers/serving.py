"""Drivers of notebook 16 (serving): call the learner's code on the grader's data and hand back what it gives.

They hold no reference and no secret, and judge nothing: their errors name kinds, names and
shapes, never values.

The paged KV cache: build the learner's PagedKVCache, run a script of appends, gathers and frees on
it, and hand back what it gave and what its pool holds.

Speculative decoding: ``speculative_step`` draws its uniforms from the torch.Generator it is given,
``torch.rand(k + 1, generator=generator, dtype=torch.float64)``. A CPU generator's state can be set
so that those k + 1 numbers are any we choose (the Mersenne Twister's next words, untempered), so
``output_distribution`` computes the exact distribution of the learner's step: it enumerates the
draft sequences and, for each, walks u[0], ..., u[k] in turn, finding where the output changes by
bisection on the 2^53 doubles of [0, 1) (each piece's length is its probability, to float64's
rounding). No sampling.

Multi-head latent attention: build the learner's module, load the grader's weights by name, feed the
tokens chunk by chunk with the cache, hand back the outputs and the cache. The names are the
notebook's, which it maps to transformers'.
"""
from __future__ import annotations

import itertools
import struct
from typing import Any, Callable

import numpy as np

from .encoder import _build
from .modern_decoder import _load

APPEND, GATHER, FREE = 0, 1, 2

_CREATE = {"key_blocks": "self.key_blocks, a float32 tensor of zeros, (num_blocks, heads, block_size, d_k)",
           "value_blocks": "self.value_blocks, a float32 tensor of zeros, (num_blocks, heads, block_size, d_k)",
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


def _pool_rows(pool: Any, table: list, length: int) -> np.ndarray:
    """The first ``length`` positions a table's blocks hold, in table order: (heads, length, d_k)."""
    rows = [pool[int(block)].detach().numpy() for block in table]              # each (heads, block_size, d_k)
    stacked = np.concatenate(rows, axis=1) if rows else np.zeros(pool.shape[1:2] + (0,) + pool.shape[3:])
    return stacked[:, :length]


def _gathered_pair(pair: Any, heads: int, length: int, d_k: int) -> tuple:
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
                got = _gathered_pair(cache.gather(seq), heads, length, d_k)
                table = list(_attribute(cache, "block_tables")[seq])
                pooled = tuple(_pool_rows(_pool(cache, name, shape), table, length)
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


_ULPS = 2 ** 53          # torch.rand's doubles are m / 2^53, m in [0, 2^53)


def _untemper(y: int) -> int:
    """The Mersenne Twister word whose tempered output is ``y``."""
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    r = y
    for _ in range(5):
        r = y ^ ((r << 7) & 0x9D2C5680)
    y = r & 0xFFFFFFFF
    r = y
    for _ in range(3):
        r = y ^ (r >> 11)
    return r & 0xFFFFFFFF


class _Crafted:
    """torch.Generators whose next doubles from torch.rand(n, dtype=torch.float64) are chosen
    (``ms``: each m / 2^53, m an int below 2^53)."""

    def __init__(self) -> None:
        import torch

        self.base = bytearray(bytes(torch.Generator().manual_seed(0).get_state().numpy()))
        seed = struct.unpack_from("<Q", self.base, 0)[0]
        struct.pack_into("<QiiQ", self.base, 0, seed, 624, 1, 0)   # 623 words left before the next twist

    def __call__(self, ms: tuple) -> Any:
        import torch

        raw = bytearray(self.base)
        for i, m in enumerate(ms):      # a double takes two words: its high 21 bits, then its low 32
            struct.pack_into("<QQ", raw, 24 + 16 * i, _untemper(m >> 32), _untemper(m & 0xFFFFFFFF))
        generator = torch.Generator()
        generator.set_state(torch.frombuffer(raw, dtype=torch.uint8).clone())
        return generator


def uniform_generator(uniforms: Any) -> Any:
    """A CPU torch.Generator whose next ``torch.rand(n, generator=..., dtype=torch.float64)`` draws are
    ``uniforms`` (at most 300 numbers in [0, 1), each rounded down to a multiple of 2^-53), then
    the Mersenne Twister's own. For tests a learner can check by hand."""
    ms = tuple(int(float(u) * _ULPS) for u in np.asarray(uniforms, dtype=np.float64).reshape(-1))
    if len(ms) > 300 or any(not 0 <= m < _ULPS for m in ms):
        raise ValueError("uniform_generator takes at most 300 numbers, each in [0, 1)")
    return _Crafted()(ms)


def _drawn_tokens(answer: Any) -> tuple:
    import torch

    if not isinstance(answer, torch.Tensor) or answer.dim() != 1 or answer.dtype.is_floating_point:
        kind = "None: is a `return` missing?" if answer is None else (
            f"a tensor of shape {tuple(answer.shape)} and dtype {answer.dtype}" if isinstance(answer, torch.Tensor)
            else f"a {type(answer).__name__}")
        raise TypeError(f"speculative_step should return a 1-d int64 tensor of tokens, but it returned {kind}")
    return tuple(int(t) for t in answer)


def output_distribution(step: Callable, draft_tokens: Any, q: Any, p: Any) -> dict:
    """{output tokens: probability} of ``step(draft_tokens, q, p, generator)`` over its k + 1 uniforms,
    exact to float64's rounding: the output as a function of u[0], then u[1] given u[0], ..., is cut
    where it changes (bisection), each piece weighted by its length. Assumes, as every step here does,
    that where u[j] cuts does not depend on u[j + 1], ..., and that each output takes one interval of u[j]."""
    crafted = _Crafted()
    k = int(np.shape(q)[0])
    top = _ULPS - 1

    def run(ms):
        return _drawn_tokens(step(draft_tokens, q, p, crafted(ms)))

    found: dict = {}

    def walk(prefix: tuple, mass: float) -> None:
        j = len(prefix)
        rest = (0,) * (k - j)
        start, out = 0, run(prefix + (0,) + rest)
        while True:
            end_out = run(prefix + (top,) + rest)
            if end_out == out:
                stop = _ULPS
            else:
                lo, hi = start, top          # f(lo) == out != f(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if run(prefix + (mid,) + rest) == out:
                        lo = mid
                    else:
                        hi = mid
                stop = hi
            share = mass * (stop - start) / _ULPS
            if j == k:
                found[out] = found.get(out, 0.0) + share
            else:
                walk(prefix + ((start + stop) // 2,), share)
            if stop == _ULPS:
                return
            start, out = stop, run(prefix + (stop,) + rest)

    walk((), 1.0)
    return found


def sequences(vocab: int, k: int) -> list:
    """Every output of a step with k drafts over ``vocab`` tokens, by length then in order."""
    return [s for n in range(1, k + 2) for s in itertools.product(range(vocab), repeat=n)]


def exact_step(step: Callable, q: Any, p: Any) -> np.ndarray:
    """The probability of each of ``sequences(V, k)`` as the step's output, every draft sequence
    x enumerated with its probability q[0][x_1] ... q[k - 1][x_k] (the draft's rows taken as not
    depending on earlier drafts) and the step's branches by ``output_distribution``."""
    import torch

    k, vocab = np.shape(q)
    qt, pt = torch.tensor(np.asarray(q, dtype=np.float64)), torch.tensor(np.asarray(p, dtype=np.float64))
    total: dict = {}
    for draft in itertools.product(range(vocab), repeat=k):
        weight = float(np.prod([q[i][x] for i, x in enumerate(draft)]))
        if weight == 0:
            continue
        for out, share in output_distribution(step, torch.tensor(draft, dtype=torch.int64), qt, pt).items():
            total[out] = total.get(out, 0.0) + weight * share
    return np.array([total.get(s, 0.0) for s in sequences(vocab, k)])


def speculative(fn: Any) -> Any:
    """A speculative_step function -> fn(draft_tokens, q, p, seed): with a seed, the tokens
    ``fn(draft_tokens, q, p, torch.Generator().manual_seed(seed))`` returns (int64 and float64
    tensors in); with draft_tokens and seed None, ``exact_step(fn, q, p)``, the exact distribution
    of its output over every draft sequence."""
    import torch

    def run(draft_tokens, q, p, seed):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        if seed is None:
            return exact_step(fn, q, p)
        generator = torch.Generator().manual_seed(int(seed))
        return torch.tensor(_drawn_tokens(fn(torch.tensor(np.asarray(draft_tokens), dtype=torch.int64),
                                       torch.tensor(np.asarray(q), dtype=torch.float64),
                                       torch.tensor(np.asarray(p), dtype=torch.float64), generator)))
    return run


# ---------------------------------------------------------------- LatentAttention (DeepSeek-V2's MLA)

# what each parameter is, for the message of a missing or misshaped name (no solution line)
_LATENT = {"W_q": "W_q, an nn.Linear from d_model to heads * (nope_dim + rope_dim) features, no bias",
           "W_dkv": "W_dkv, an nn.Linear from d_model to kv_rank + rope_dim features, no bias: the latent, then "
                    "one RoPE key shared by all heads (not one per head)",
           "kv_norm": "kv_norm, an RMSNorm over kv_rank features (eps): the latent's norm",
           "W_ukv": "W_ukv, an nn.Linear from kv_rank to heads * (nope_dim + v_dim) features, no bias",
           "W_o": "W_o, an nn.Linear from heads * v_dim to d_model features, no bias"}


def _as_array(part: Any) -> Any:
    """A cache part as (batch, positions, features): transformers' single-head view (batch, 1, positions,
    features) is read without its head axis; any other shape is handed back as it is (and judged)."""
    import torch

    part = torch.as_tensor(part)
    return part[:, 0] if part.dim() == 4 and part.shape[1] == 1 else part


def drive_latent_attention(cls: Any) -> Any:
    """A LatentAttention class -> fn(d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta, eps, W_q,
    W_dkv, kv_norm, W_ukv, W_o, x, chunks) returning (the outputs of every call concatenated, (batch, seq_len,
    d_model); the latents and the rope keys of the cache the last call returned).

    The module is built as ``cls(d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta=..., eps=...)``
    (rope_theta or eps None: not passed, its default), the weights loaded by name (W_q.weight, W_dkv.weight,
    kv_norm.weight, W_ukv.weight, W_o.weight), x float32 (batch, seq_len, d_model) fed ``chunks[0]`` tokens with
    no cache, then each next chunk with the cache the previous call returned.
    """
    import torch

    from .modern_decoder import _out_and_caches

    def run(d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta, eps, W_q, W_dkv, kv_norm, W_ukv, W_o,
            x, chunks):
        sizes = tuple(int(n) for n in (d_model, heads, kv_rank, nope_dim, rope_dim, v_dim))
        options = {name: float(value) for name, value in (("rope_theta", rope_theta), ("eps", eps))
                   if value is not None}
        module = _build(cls, sizes, options)
        owner = f"{getattr(cls, '__name__', 'LatentAttention')}{sizes}"
        arrays = {"W_q.weight": W_q, "W_dkv.weight": W_dkv, "kv_norm.weight": kv_norm, "W_ukv.weight": W_ukv,
                  "W_o.weight": W_o}
        _load(module, arrays, owner, _LATENT)
        x = torch.tensor(np.asarray(x), dtype=torch.float32)
        outs, cache, start = [], None, 0
        with torch.no_grad():
            for size in np.asarray(chunks).tolist():
                answer = module(x[:, start:start + size]) if cache is None else module(x[:, start:start + size], cache)
                out, cache = _out_and_caches(answer, size, "LatentAttention", "(out, (latents, rope_keys))",
                                             "an output", "d_model")
                if not isinstance(cache, (tuple, list)) or len(cache) != 2:
                    raise TypeError("LatentAttention.forward should return (out, (latents, rope_keys)): the cache a "
                                    "pair (latents, rope_keys)")
                outs.append(out)
                start += size
        return torch.cat(outs, dim=1), _as_array(cache[0]), _as_array(cache[1])
    return run


# ---------------------------------------------------------------- SinkCache (StreamingLLM)

def _stepped(x: Any, steps: int, t: int) -> Any:
    """The t-th of ``steps`` equal slices of x along its token axis (axis 2)."""
    width = x.shape[2] // steps
    return x[:, :, t * width:(t + 1) * width]


def drive_sink_cache(cls: Any) -> Any:
    """A SinkCache class -> fn(n_sink, window, rope_theta, q, k, v, steps) returning (the outputs of the
    ``steps`` calls of ``attend`` concatenated on the token axis, (batch, heads, steps, head_dim); the cache's
    keys and values after the last call, (batch, kv_heads, length, head_dim); its length after each call).

    The cache is built as ``cls(n_sink, window, rope_theta=rope_theta)`` (rope_theta None: not passed, its
    default); q, k and v float32 are cut into ``steps`` equal slices along axis 2, one token each unless the
    call is one of those that must raise, and handed to ``attend`` in order.
    """
    import torch

    def run(n_sink, window, rope_theta, q, k, v, steps):
        options = {} if rope_theta is None else {"rope_theta": float(rope_theta)}
        cache = _build(cls, (int(n_sink), int(window)), options)
        q, k, v = (torch.tensor(np.asarray(a), dtype=torch.float32) for a in (q, k, v))
        outs, lengths = [], []
        with torch.no_grad():
            for t in range(int(steps)):
                out = cache.attend(_stepped(q, steps, t), _stepped(k, steps, t), _stepped(v, steps, t))
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"SinkCache.attend should return one tensor (batch, heads, 1, head_dim), the "
                                    f"attention's output, but it returned a {type(out).__name__}")
                held = [getattr(cache, name, None) for name in ("keys", "values")]
                if not all(isinstance(h, torch.Tensor) for h in held):
                    raise AttributeError("SinkCache should keep its cache in self.keys and self.values, tensors "
                                         "(batch, kv_heads, length, head_dim) after every attend")
                outs.append(out)
                lengths.append(held[0].shape[2])
        return torch.cat(outs, dim=2), held[0], held[1], np.array(lengths, dtype=np.int64)
    return run
