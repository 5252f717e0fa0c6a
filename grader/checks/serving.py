"""Hidden checks of notebook 16, serving: how the models of notebook 15 are served.

Everything in notebook 16 is PyTorch. ``LatentAttention`` is a module: the driver of
``coursekit/drivers/serving.py`` builds the learner's class, loads the weights drawn here by name
(``W_q``, ``W_dkv``, ``kv_norm``, ``W_ukv``, ``W_o``) and feeds the tokens chunk by chunk with the
cache. The reference, ``reference/serving.py``, is the computation of transformers'
``DeepseekV2Attention`` (q_lora_rank None); the notebook matches the learner's module to it weight
for weight.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ._core import Call, CheckFailed, Knob, Mistake, Raises, Rule, Spec
from .modern_decoder import _weight
from .reference import modern_decoder as modern
from .reference import serving as ref


# ---------------------------------------------------------------- LatentAttention (DeepSeek-V2's MLA)

def _latent_variant(pairing="interleaved", rope_on="rope", scale="qk", norm="cached", order="right",
                    positions="true", mask="bottom_right", project=True):
    """LatentAttention with some choices changed: ``pairing`` ("interleaved"; "halves": Llama's rotate_half),
    ``rope_on`` ("rope"; "whole": RoPE over each whole head, nope and rope features, the keys rotated after the
    cache), ``scale`` ("qk": sqrt(nope_dim + rope_dim); "nope"; "v"), ``norm`` ("cached": the latent normalized
    before the cache; "missing"; "uncached": the cache holds the raw latent, normalized when read),
    ``order`` ("right"; "key_rope_first": keys [k_rope, k_nope] against queries [q_nope, q_rope];
    "query_rope_first": W_q's blocks read as [q_rope, q_nope]; "latent_last": W_dkv's output read as
    [k_rope, c_kv]; "value_first": W_ukv's blocks read as [v, k_nope]), ``positions`` ("true"; "restart"),
    ``mask`` ("bottom_right"; "top_left"); ``project`` False: no W_o."""

    class LatentAttention(ref.LatentAttention):
        def forward(self, x, cache=None):
            batch, new, _ = x.shape
            nope, rope, heads = self.nope_dim, self.rope_dim, self.heads
            past = 0 if cache is None else cache[0].shape[1]
            q = self.W_q(x).view(batch, new, heads, nope + rope).transpose(1, 2)
            if order == "query_rope_first":
                q_rope, q_nope = q.split([rope, nope], dim=-1)
            else:
                q_nope, q_rope = q.split([nope, rope], dim=-1)
            down = self.W_dkv(x)
            if order == "latent_last":
                k_rope, c_kv = down.split([rope, self.kv_rank], dim=-1)
            else:
                c_kv, k_rope = down.split([self.kv_rank, rope], dim=-1)
            if norm == "cached":
                c_kv = self.kv_norm(c_kv)

            def rotate(t, first, width):
                inv_freq = self.rope_theta ** (-torch.arange(0, width, 2, dtype=torch.float32) / width)
                angles = torch.arange(first, first + t.shape[-2], dtype=torch.float32)[:, None] * inv_freq
                if pairing == "halves":
                    return t * torch.cat([angles, angles], -1).cos() + modern.rotate_half(t) * torch.cat(
                        [angles, angles], -1).sin()
                angles = angles.repeat_interleave(2, dim=-1)
                return t * angles.cos() + ref.rotate_pairs(t) * angles.sin()

            start = 0 if positions == "restart" else past
            if rope_on == "rope":
                q_rope, k_rope = rotate(q_rope, start, rope), rotate(k_rope, start, rope)
            if cache is not None:
                c_kv, k_rope = torch.cat([cache[0], c_kv], dim=1), torch.cat([cache[1], k_rope], dim=1)
            latents = self.kv_norm(c_kv) if norm == "uncached" else c_kv
            kv = self.W_ukv(latents).view(batch, past + new, heads, nope + self.v_dim).transpose(1, 2)
            if order == "value_first":
                v, k_nope = kv.split([self.v_dim, nope], dim=-1)
            else:
                k_nope, v = kv.split([nope, self.v_dim], dim=-1)
            shared = k_rope[:, None].expand(-1, heads, -1, -1)
            keys = torch.cat([shared, k_nope] if order == "key_rope_first" else [k_nope, shared], dim=-1)
            queries = torch.cat([q_nope, q_rope], dim=-1)
            if rope_on == "whole":
                queries, keys = rotate(queries, start, nope + rope), rotate(keys, 0, nope + rope)
            d_k = {"qk": nope + rope, "nope": nope, "v": self.v_dim}[scale]
            scores = queries @ keys.transpose(2, 3) / math.sqrt(d_k)
            allowed = torch.ones(new, past + new, dtype=torch.bool).tril(diagonal=past if mask == "bottom_right"
                                                                          else 0)
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            out = (weights @ v).transpose(1, 2).reshape(batch, new, heads * self.v_dim)
            return (self.W_o(out) if project else out), (c_kv, k_rope)
    return LatentAttention


def _latent_calls(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (batch, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta, eps, chunks)
    # 1. nope_dim = rope_dim, v_dim apart, the defaults; 2. an eps of 0.5, as large as the latents' mean squares
    # (the norm's eps shows), rope_theta 100; 3. no cache, rope_dim 2, theta 50. Every size pairwise apart where
    # a swap would keep the shapes (nope_dim != v_dim on 1 and 3; nope_dim + rope_dim != v_dim).
    later = tuple(rng.permutation([1, 2, 3]).tolist())
    setups = [(2, 12, 3, 5, 4, 4, 6, None, None, (2,) + later[:2]),
              (2, 10, 4, 3, 2, 6, 2, 100.0, 0.5, (1, 1) + later[1:]),
              (1, 16, 2, 8, 6, 2, 4, 50.0, None, (5,))]
    for batch, d_model, heads, kv_rank, nope, rope, v_dim, theta, eps, chunks in setups:
        seq_len = sum(chunks)

        def linear(rows, columns):
            return rng.normal(scale=1 / np.sqrt(columns), size=(rows, columns))
        weights = (linear(heads * (nope + rope), d_model), linear(kv_rank + rope, d_model), _weight(rng, kv_rank),
                   linear(heads * (nope + v_dim), kv_rank), linear(d_model, heads * v_dim))
        x = rng.normal(size=(batch, seq_len, d_model)) * rng.uniform(0.5, 2.0, size=(batch, seq_len, 1))
        options = "".join(f", {name}={value:g}" for name, value in (("rope_theta", theta), ("eps", eps))
                          if value is not None)
        what = (f"LatentAttention(d_model={d_model}, heads={heads}, kv_rank={kv_rank}, nope_dim={nope}, "
                f"rope_dim={rope}, v_dim={v_dim}{options}) on x of shape {x.shape} fed "
                f"{' + '.join(map(str, chunks))} tokens")
        calls.append(Call((d_model, heads, kv_rank, nope, rope, v_dim, theta, eps) + weights
                          + (x, np.array(chunks, dtype=np.int64)), what=what))
    calls.append(Call((8, 2, 4, 2, 3, 2, None, None, np.zeros((10, 8)), np.zeros((7, 8)), np.ones(4),
                       np.zeros((8, 4)), np.zeros((8, 4)), np.zeros((1, 2, 8)), np.array([2], dtype=np.int64)),
                      raises="ValueError", what="LatentAttention(8, heads=2, kv_rank=4, nope_dim=2, rope_dim=3, "
                                                "v_dim=2): rope_dim is odd"))
    return calls


def _chunks(call: Call) -> list[int]:
    return np.asarray(call.args[-1]).tolist()


def _cache_size(answer: object, call: Call, what: str) -> object:
    """A cache of the wrong size named for what it holds: full keys and values, or a RoPE key per head
    (the answer is (output, latents, rope_keys)); any other answer as it is."""
    if (call.raises or not isinstance(answer, tuple) or len(answer) != 3
            or not all(isinstance(a, np.ndarray) and a.dtype.kind == "f" for a in answer)):
        return answer  # (an error, another kind of answer, or a diagnostic question's record)
    x, heads, kv_rank, rope = call.args[-2], call.args[1], call.args[2], call.args[4]
    tokens = x.shape[0] * x.shape[1]
    latents, rope_keys = answer[1:]
    if latents.shape == (x.shape[0], x.shape[1], kv_rank) and rope_keys.size == tokens * heads * rope:
        raise CheckFailed(f"{what}: the cache holds a RoPE key for each head ({heads} x {rope} numbers per token); "
                          f"DeepSeek-V2's decoupled key k_rope is one key shared by all heads (W_dkv's last "
                          f"rope_dim rows), cached once: (batch, positions, rope_dim)")
    held = (latents.size + rope_keys.size) / tokens
    if held > kv_rank + rope:
        raise CheckFailed(f"{what}: the cache holds {held:g} numbers per token; multi-head latent attention caches "
                          f"kv_rank + rope_dim = {kv_rank + rope}: the normalized latents c_kv (batch, positions, "
                          f"kv_rank) and the rotated RoPE keys shared by all heads (batch, positions, rope_dim). "
                          f"Cache those two and compute each head's keys and values from the latents with W_ukv "
                          f"at every call")
    return answer


class _Unchecked(ref.LatentAttention):
    """No check that rope_dim is even: the first forward fails instead."""

    def __init__(self, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta=10000.0, eps=1e-6):
        super().__init__(d_model, heads, kv_rank, nope_dim, rope_dim + rope_dim % 2, v_dim, rope_theta, eps)
        self.rope_dim = rope_dim
        self.W_q = torch.nn.Linear(d_model, heads * (nope_dim + rope_dim), bias=False)
        self.W_dkv = torch.nn.Linear(d_model, kv_rank + rope_dim, bias=False)


class _FullCache(ref.LatentAttention):
    """Caches every head's keys and values (as notebook 15's Attention), not the latents."""

    def forward(self, x, cache=None):
        batch, new, _ = x.shape
        out, (c_kv, k_rope) = super().forward(x)  # (this call's keys and values; the cache is judged first)
        kv = self.W_ukv(c_kv).view(batch, new, self.heads, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope[:, None].expand(-1, self.heads, -1, -1)], dim=-1)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        return out, (k, v)


class _RopePerHead(ref.LatentAttention):
    """Caches the shared RoPE key expanded to every head."""

    def forward(self, x, cache=None):
        if cache is not None:
            cache = (cache[0], cache[1][:, 0])
        out, (c_kv, k_rope) = super().forward(x, cache)
        return out, (c_kv, k_rope[:, None].expand(-1, self.heads, -1, -1).contiguous())


LATENT_ATTENTION = Spec(
    id="serving-LatentAttention",
    submodules=("W_q", "W_dkv", "kv_norm", "W_ukv", "W_o"),
    function="LatentAttention",
    inputs=_latent_calls,
    reference=ref.LatentAttention,
    driver="serving.drive_latent_attention",
    parts=("output", "cached latents", "cached rope keys"),
    prepare=_cache_size,
    variant=_latent_variant,
    equivalent=(
        ("L24 0 -> 1 #2", "cache[1], the cached rope keys, has the cached latents' length: past either way"),
        ("L24 0 -> -1 #2", "cache is a pair: cache[-1] is cache[1], the rope keys, of the latents' length"),
        ("L29 torch.arange(0, self.rope_dim, 2, dtype=torch.float32) -> torch.arange(0, self.rope_dim, 2)",
         "the integers 0, 2, ... divided by rope_dim (true division) are float32 all the same"),
        ("L30 torch.arange(past, past + new, dtype=torch.float32) -> torch.arange(past, past + new)",
         "integer positions times the float32 frequencies are float32: the same angles"),
        ("L31 -1 -> 1", "angles is 2-D, (new_len, rope_dim // 2): its axis 1 is its last"),
    ),
    rules=(
        Rule("several new tokens after a cache: positions past ... past + new_len - 1, the mask bottom-right",
             lambda call: not call.raises and any(n > 1 for n in _chunks(call)[1:])),
        Rule("one new token after a cache", lambda call: not call.raises and any(n == 1 for n in _chunks(call)[1:])),
        Rule("a rope_theta given, other than 10000", lambda call: call.args[6] not in (None, 10000.0)),
        Rule("nope_dim != v_dim (a swapped split shows)", lambda call: call.args[3] != call.args[5]),
        Rule("an eps as large as the latents' mean squares", lambda call: (call.args[7] or 0) >= 0.1),
        Rule("rope_dim odd: ValueError", lambda call: call.raises == "ValueError"),
    ),
    knobs=(
        Knob("pairing", (("halves", "RoPE rotates the halves (Llama's rotate_half, pairs (i, i + rope_dim/2)); "
                                    "DeepSeek's rotates the pairs (2i, 2i + 1), the interleaved layout (transformers' "
                                    "apply_rotary_emb multiplies them as complex numbers): angles "
                                    "repeat_interleave(2), (x_2i, x_2i+1) -> (-x_2i+1, x_2i)"),)),
        Knob("rope_on", (("whole", "RoPE rotates each whole head (nope_dim + rope_dim features): only q_rope and "
                                   "the shared k_rope are rotated, at frequencies rope_theta ** (-2i / rope_dim); "
                                   "k_nope and q_nope carry no position (the decoupled RoPE of DeepSeek-V2)"),)),
        Knob("scale", (
            ("nope", "the scores are divided by sqrt(nope_dim): each head's dot product has nope_dim + rope_dim terms "
                     "(q_nope.k_nope + q_rope.k_rope): divide by sqrt(nope_dim + rope_dim)"),
            ("v", "the scores are divided by sqrt(v_dim): the queries and keys have nope_dim + rope_dim features, "
                  "divide by sqrt(nope_dim + rope_dim)"),
        )),
        Knob("norm", (
            ("missing", "the latent is not normalized: c_kv = kv_norm(W_dkv(x)[..., :kv_rank]) (transformers' "
                        "kv_a_layernorm), before W_ukv"),
            ("uncached", "the cache holds the latents before kv_norm: normalize them first and cache the normalized "
                         "latents (transformers' cache holds kv_a_layernorm's output)"),
        )),
        Knob("order", (
            ("key_rope_first", "the keys are [k_rope, k_nope] while the queries are [q_nope, q_rope]: q_nope must "
                               "meet k_nope, so the keys are cat([k_nope, k_rope]), in the queries' order"),
            ("query_rope_first", "each head's block of W_q(x) is read as [q_rope, q_nope]: it is [q_nope, q_rope], "
                                 "nope_dim features then rope_dim (transformers' q.split([qk_nope_head_dim, "
                                 "qk_rope_head_dim]))"),
            ("latent_last", "W_dkv(x) is read as [k_rope, c_kv]: it is the latent first, then the RoPE key, "
                            "split([kv_rank, rope_dim]) (transformers' kv_a_proj_with_mqa)"),
            ("value_first", "each head's block of W_ukv(c_kv) is read as [v, k_nope]: it is [k_nope, v], nope_dim "
                            "features then v_dim (transformers' kv_b_proj)"),
        )),
        Knob("positions", (("restart", "with a cache the new tokens are rotated from position 0 again: after "
                                       "`past` cached tokens they sit at positions past ... past + new_len - 1"),)),
        Knob("mask", (("top_left", "the causal mask is aligned top-left: new token j (at position past + j) may "
                                   "attend to keys 0 ... past + j, torch.ones(new_len, past + new_len)"
                                   ".tril(diagonal=past), bottom-right"),)),
    ),
    mistakes=(
        Mistake("no_W_o", "the heads are merged but not projected: apply W_o (transformers' o_proj), "
                "(batch, new_len, heads * v_dim) -> (batch, new_len, d_model)", _latent_variant(project=False)),
    ),
    diagnosed=(
        Mistake("full_cache", "numbers per token; multi-head latent attention caches", _FullCache),
        Mistake("rope_per_head", "a RoPE key for each head", _RopePerHead),
    ),
    errors=(
        Raises("{what} raised {error}; it should raise ValueError, as the docstring says: rope_dim is odd there, "
               "and RoPE rotates pairs of features, so check rope_dim % 2 in __init__", example=_Unchecked,
               match=".", when=lambda call: bool(call.raises)),
    ),
    figures=("serving-LatentAttention-figure",),
)

SPECS = (LATENT_ATTENTION,)
