"""Drivers of notebook 13, rope: a learner's rotary attention step fed a sequence chunk by chunk.

The grader's question is the not-yet-rotated queries, keys and values of a whole sequence and
the sizes of the chunks it arrives in; the driver hands the learner's function each chunk with
the cache its previous call returned, as a decoder does. It holds no reference and no secret,
and judges nothing: its errors name kinds and shapes, never values.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def _pair(answer: Any, what: str) -> tuple:
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        kind = "nothing (None): is a `return` missing?" if answer is None else f"a {type(answer).__name__}"
        raise TypeError(f"rotary_attention_step should return {what}, but it returned {kind}")
    return tuple(answer)


def cached_steps(fn: Any) -> Any:
    """A rotary_attention_step function -> fn(q, k, v, chunks, base) returning (the outputs of
    every call concatenated along the positions, (batch, heads, seq_len, d_k); the keys and the
    values of the cache the last call returned).

    q, k, v are (batch, heads, seq_len, d_k) float32; the first call gets the first ``chunks[0]``
    positions and no cache, each later call the next ``chunks[i]`` and the cache the previous
    call returned, as it returned it. ``base`` None leaves the default base.
    """
    import torch

    def run(q, k, v, chunks, base=None):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        q, k, v = (torch.tensor(np.asarray(t), dtype=torch.float32) for t in (q, k, v))
        outs, cache, start = [], None, 0
        options = {} if base is None else {"base": float(base)}
        with torch.no_grad():
            for size in np.asarray(chunks).tolist():
                out, cache = _pair(fn(q[..., start:start + size, :], k[..., start:start + size, :],
                                      v[..., start:start + size, :], cache, **options), "(out, cache)")
                if not isinstance(out, torch.Tensor) or out.dim() != 4 or out.shape[-2] != size:
                    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    raise ValueError(f"rotary_attention_step for {size} new token(s) returned an output of shape "
                                     f"{shape}; expected (batch, heads, {size}, d_k): one row per new token")
                outs.append(out)
                start += size
        keys, values = _pair(cache, "(out, (keys, values)) with the cache a pair (keys, values)")
        return torch.cat(outs, dim=-2), torch.as_tensor(keys), torch.as_tensor(values)

    return run
