"""Drivers of notebook 16 (serving): build the learner's module, load the grader's weights by
name, feed the tokens chunk by chunk with the cache, hand back the outputs and the cache.

They hold no reference and no secret, and judge nothing: their errors name kinds, names and
shapes, never values. The names are the notebook's, which it maps to transformers'.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .encoder import _build
from .modern_decoder import _load

# ---------------------------------------------------------------- LatentAttention (DeepSeek-V2's MLA)

# what each parameter is, for the message of a missing or misshaped name (no solution line)
_LATENT = {"W_q": "W_q, an nn.Linear from d_model to heads * (nope_dim + rope_dim) features, no bias",
           "W_dkv": "W_dkv, an nn.Linear from d_model to kv_rank + rope_dim features, no bias: the latent, then "
                    "one RoPE key shared by all heads (not one per head)",
           "kv_norm": "kv_norm, an RMSNorm over kv_rank features (eps): the latent's norm",
           "W_ukv": "W_ukv, an nn.Linear from kv_rank to heads * (nope_dim + v_dim) features, no bias",
           "W_o": "W_o, an nn.Linear from heads * v_dim to d_model features, no bias"}


def _flat(part: Any) -> Any:
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
        return torch.cat(outs, dim=1), _flat(cache[0]), _flat(cache[1])
    return run
