"""Mistake and variant cases of notebook 15's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must score
full marks (exercise-standard.md, item 6). RMSNorm and SwiGLU go through the drivers of
coursekit/drivers/modern_decoder.py, as they do while grading. Small modules: 6 seeds.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.check_cases import shared_tests
from tests.conftest import solution_namespace


@pytest.fixture(scope="module")
def modern_decoder_notebook() -> dict:
    """The reference solutions of notebook 15 (RMSNorm, SwiGLU, Attention, DecoderLayer)."""
    return solution_namespace("15_modern_decoder")


# ---------------------------------------------------------------- RMSNorm

class _Norm(nn.Module):
    """An RMSNorm whose forward is ``self.normed(x)`` (the cases below write only that)."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps


def _norm(forward, default=1e-6):
    def __init__(self, d_model, eps=default):
        _Norm.__init__(self, d_model, eps)
    return type("RMSNorm", (_Norm,), {"__init__": __init__, "forward": forward})


class LayerNormNoBias(_Norm):
    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, None, self.eps)


class EpsOutside(_Norm):
    def forward(self, x):
        rms = x.norm(dim=-1, keepdim=True) / math.sqrt(x.shape[-1])
        return self.weight * x / (rms + self.eps)


class UnitVector(_Norm):
    def forward(self, x):
        return F.normalize(x, dim=-1) * self.weight


class Gemma(_Norm):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


class HuggingFaceStyle(_Norm):
    """LlamaRMSNorm's forward, float32 inside."""

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return self.weight * hidden_states.to(input_dtype)


class TorchFunctional(_Norm):
    def forward(self, x):
        return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)


class FromTheNorm(_Norm):
    def forward(self, x):
        d = x.shape[-1]
        return x / torch.sqrt(x.norm(dim=-1, keepdim=True) ** 2 / d + self.eps) * self.weight


# ---------------------------------------------------------------- SwiGLU

class _FFN(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.W_gate = nn.Linear(d_model, d_ff, bias=False)
        self.W_up = nn.Linear(d_model, d_ff, bias=False)
        self.W_down = nn.Linear(d_ff, d_model, bias=False)


class GeGLU(_FFN):
    def forward(self, x):
        return self.W_down(F.gelu(self.W_gate(x)) * self.W_up(x))


class GateOnUp(_FFN):
    def forward(self, x):
        return self.W_down(F.silu(self.W_up(x)) * self.W_gate(x))


class NoDown(_FFN):
    def forward(self, x):
        gate = self.W_gate(x)
        return gate * torch.sigmoid(gate) * self.W_up(x)


class ReGLU(_FFN):
    def forward(self, x):
        return self.W_down(torch.relu(self.W_gate(x)) * self.W_up(x))


class HandWrittenSiLU(_FFN):
    def forward(self, x):
        gate = self.W_gate(x)
        return self.W_down(gate * torch.sigmoid(gate) * self.W_up(x))


class Functional(_FFN):
    def forward(self, x):
        hidden = F.silu(F.linear(x, self.W_gate.weight)) * F.linear(x, self.W_up.weight)
        return F.linear(hidden, self.W_down.weight)


class Einsum(_FFN):
    def forward(self, x):
        gate = torch.einsum("...d,fd->...f", x, self.W_gate.weight)
        up = torch.einsum("...d,fd->...f", x, self.W_up.weight)
        return torch.einsum("...f,df->...d", F.silu(gate) * up, self.W_down.weight)


# ---------------------------------------------------------------- Attention

from grader.checks.reference.modern_decoder import Attention as _Layers  # noqa: E402


class _Heads(_Layers):
    """The reference's layers (W_q, W_k, W_v, W_o; q_norm and k_norm when qk_norm) and its ValueError;
    the cases below write forward(x, cache) only."""

    def project(self, x):
        batch, new, _ = x.shape
        q = self.W_q(x).view(batch, new, self.heads, self.head_dim).transpose(1, 2)
        k = self.W_k(x).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.W_v(x).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def normed(self, x, cache):
        """(q, k, v) of the heads, QK-normed when qk_norm, and past, the cached length."""
        q, k, v = self.project(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v, 0 if cache is None else cache[0].shape[-2]

    def rope(self, q, k, start):
        cos, sin = self.cos_sin(start, q.shape[-2])
        return q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin

    def cos_sin(self, start, new, theta=None):
        inv = 1.0 / (theta or self.rope_theta) ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        freqs = torch.outer(torch.arange(start, start + new).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    @staticmethod
    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def finish(self, q, k, v, cache, scale=None, order="interleave"):
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=-2), torch.cat([cache[1], v], dim=-2)
        group = self.heads // self.kv_heads
        expand = (lambda t: t.repeat_interleave(group, dim=1)) if order == "interleave" else (
            lambda t: t.repeat(1, group, 1, 1))
        new, total = q.shape[-2], k.shape[-2]
        mask = torch.ones(new, total, dtype=torch.bool).tril(diagonal=total - new)
        out = F.scaled_dot_product_attention(q, expand(k), expand(v), attn_mask=mask, scale=scale)
        return self.W_o(out.transpose(1, 2).flatten(2)), (k, v)


class HuggingFaceAttention(_Heads):
    """transformers' way: cos and sin of the positions, apply_rotary_pos_emb, repeat_kv, SDPA."""

    def forward(self, x, cache=None):
        q, k, v, past = self.normed(x, cache)
        return self.finish(*self.rope(q, k, past), v, cache)


class ComplexAttention(_Heads):
    """The halves as the real and imaginary parts of complex numbers, rotated by e^(i m theta)."""

    def forward(self, x, cache=None):
        q, k, v, past = self.normed(x, cache)
        half = self.head_dim // 2
        angles = torch.outer(torch.arange(past, past + x.shape[1]).double(),
                             self.rope_theta ** (-torch.arange(half).double() * 2 / self.head_dim))
        turn = torch.polar(torch.ones_like(angles), angles)

        def rotate(t):
            z = torch.complex(t[..., :half].double(), t[..., half:].double()) * turn
            return torch.cat([z.real, z.imag], dim=-1).float()
        return self.finish(rotate(q), rotate(k), v, cache)


class EinsumGroups(_Heads):
    """The query heads viewed as (kv_heads, group): no copy of the keys and values."""

    def forward(self, x, cache=None):
        q, k, v, past = self.normed(x, cache)
        q, k = self.rope(q, k, past)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        batch, _, new, hd = q.shape
        grouped = q.view(batch, self.kv_heads, self.heads // self.kv_heads, new, hd)
        scores = torch.einsum("bkgqd,bksd->bkgqs", grouped, k) / hd ** 0.5
        total = k.shape[2]
        scores = scores.masked_fill(torch.ones(new, total, dtype=torch.bool).tril(total - new).logical_not(),
                                    float("-inf"))
        out = torch.einsum("bkgqs,bksd->bkgqd", scores.softmax(-1), v).reshape(batch, self.heads, new, hd)
        return self.W_o(out.transpose(1, 2).reshape(batch, new, -1)), (k, v)


class NormAfterRope(_Heads):
    def forward(self, x, cache=None):
        q, k, v = self.project(x)
        q, k = self.rope(q, k, 0 if cache is None else cache[0].shape[-2])
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return self.finish(q, k, v, cache)


class RepeatNotInterleave(HuggingFaceAttention):
    def finish(self, q, k, v, cache, scale=None, order="interleave"):
        return super().finish(q, k, v, cache, scale, order="repeat")


class PositionsFromZero(_Heads):
    def forward(self, x, cache=None):
        q, k, v, _ = self.normed(x, cache)
        return self.finish(*self.rope(q, k, 0), v, cache)


class ScaledByDModel(HuggingFaceAttention):
    def finish(self, q, k, v, cache, scale=None, order="interleave"):
        return super().finish(q, k, v, cache, scale=self.W_q.in_features ** -0.5)


class RoFormerPairs(_Heads):
    """notebook 13's interleaved pairs (2i, 2i + 1)."""

    def forward(self, x, cache=None):
        q, k, v, past = self.normed(x, cache)
        cos, sin = self.cos_sin(past, x.shape[1])
        half = self.head_dim // 2
        cos, sin = cos[:, :half].repeat_interleave(2, -1), sin[:, :half].repeat_interleave(2, -1)

        def turn(t):
            return torch.stack([-t[..., 1::2], t[..., ::2]], dim=-1).flatten(-2)
        return self.finish(q * cos + turn(q) * sin, k * cos + turn(k) * sin, v, cache)


# ---------------------------------------------------------------- DecoderLayer

from grader.checks.reference.modern_decoder import DecoderLayer as _Block  # noqa: E402


class HuggingFaceLayer(_Block):
    """Qwen3DecoderLayer's forward: residual = hidden_states, and so on."""

    def forward(self, hidden_states, cache=None):
        residual = hidden_states
        hidden_states = self.input_norm(hidden_states)
        hidden_states, cache = self.attention(hidden_states, cache)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_norm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states, cache


class SublayerList(_Block):
    """The two sublayers as (norm, function) pairs in a loop."""

    def forward(self, x, cache=None):
        state = {"cache": cache}

        def attend(t):
            out, state["cache"] = self.attention(t, state["cache"])
            return out
        for norm, sublayer in ((self.input_norm, attend), (self.post_attention_norm, self.mlp)):
            x = x + sublayer(norm(x))
        return x, state["cache"]


class InPlaceAdds(_Block):
    def forward(self, x, cache=None):
        out, cache = self.attention(self.input_norm(x), cache)
        out = out.add(x)
        return out.add(self.mlp(self.post_attention_norm(out))), cache


class PostNorm(_Block):
    def forward(self, x, cache=None):
        attended, cache = self.attention(x, cache)
        h = self.input_norm(x + attended)
        return self.post_attention_norm(h + self.mlp(h)), cache


class NoMlpResidual(_Block):
    def forward(self, x, cache=None):
        attended, cache = self.attention(self.input_norm(x), cache)
        return self.mlp(self.post_attention_norm(x + attended)), cache


class ParallelBlock(_Block):
    def forward(self, x, cache=None):
        attended, cache = self.attention(self.input_norm(x), cache)
        return x + attended + self.mlp(self.post_attention_norm(x)), cache


class OneNorm(_Block):
    def forward(self, x, cache=None):
        attended, cache = self.attention(self.input_norm(x), cache)
        h = x + attended
        return h + self.mlp(self.input_norm(h)), cache


# ---------------------------------------------------------------- Model

from grader.checks.reference.modern_decoder import Model as _Model  # noqa: E402


class HuggingFaceModel(_Model):
    """Qwen3Model's loop and Qwen3ForCausalLM's head: hidden_states, a cache or a list of Nones."""

    def forward(self, input_ids, past_key_values=None):
        hidden_states = self.embedding(input_ids)
        past_key_values = past_key_values or [None] * len(self.layers)
        new_cache = []
        for decoder_layer, layer_past in zip(self.layers, past_key_values):
            hidden_states, present = decoder_layer(hidden_states, layer_past)
            new_cache.append(present)
        hidden_states = self.norm(hidden_states)
        return self.output(hidden_states), tuple(new_cache)


class FunctionalHead(_Model):
    """The logits by F.linear with the output layer's weight; the caches built by a comprehension-like loop."""

    def forward(self, ids, cache=None):
        x, caches = F.embedding(ids, self.embedding.weight), []
        for layer, past in zip(self.layers, cache if cache is not None else [None] * len(self.layers)):
            x, present = layer(x, past)
            caches += [present]
        return F.linear(self.norm(x), self.output.weight), caches


class NoFinalNorm(_Model):
    def forward(self, ids, cache=None):
        x, caches = self.embedding(ids), []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, cache[i] if cache else None)
            caches.append(c)
        return self.output(x), caches


class GemmaScale(_Model):
    def forward(self, ids, cache=None):
        x, caches = self.embedding(ids) * math.sqrt(self.embedding.embedding_dim), []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, cache[i] if cache else None)
            caches.append(c)
        return self.output(self.norm(x)), caches


class LayersWithoutCache(_Model):
    """The caches collected and returned, but never handed back to the layers."""

    def forward(self, ids, cache=None):
        x, caches = self.embedding(ids), []
        for layer in self.layers:
            x, c = layer(x)
            caches.append(c)
        return self.output(self.norm(x)), caches


class FirstCacheForAll(_Model):
    def forward(self, ids, cache=None):
        x, caches = self.embedding(ids), []
        for layer in self.layers:
            x, c = layer(x, cache[0] if cache else None)
            caches.append(c)
        return self.output(self.norm(x)), caches


class LastLogitsOnly(_Model):
    def forward(self, ids, cache=None):
        logits, caches = super().forward(ids, cache)
        return logits[:, -1, :].unsqueeze(1), caches


class CopiedNotTied(_Model):
    """The embedding's values copied into the output layer: two parameters, not one."""

    def __init__(self, vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta=10000.0,
                 qk_norm=False, eps=1e-6, tie_embeddings=False):
        super().__init__(vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps)
        if tie_embeddings:
            self.output.weight.data.copy_(self.embedding.weight.data)


class TiedAlways(_Model):
    def __init__(self, vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta=10000.0,
                 qk_norm=False, eps=1e-6, tie_embeddings=False):
        super().__init__(vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps,
                         tie_embeddings=True)


MISTAKES = {
    "modern_decoder-RMSNorm": [
        (LayerNormNoBias, "it subtracts the mean, as LayerNorm does"),
        (EpsOutside, "eps is added outside the square root"),
        (UnitVector, "not the root MEAN square"),
        (Gemma, "it scales by 1 + weight"),
        (_norm(lambda self, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight, 1e-5),
         "its default eps is 1e-5"),
    ],
    "modern_decoder-SwiGLU": [
        (GeGLU, "the gate goes through GELU"),
        (GateOnUp, "the gate and up projections are swapped"),
        (NoDown, "there is no down projection"),
        (ReGLU, "the gate goes through ReLU"),
    ],
    "modern_decoder-Attention": [
        (NormAfterRope, "QK-norm comes after RoPE"),
        (RepeatNotInterleave, "query head h reads key/value head h % kv_heads"),
        (PositionsFromZero, "rotated from position 0 again"),
        (ScaledByDModel, "divided by sqrt(d_model)"),
        (RoFormerPairs, "RoPE rotates the pairs (2i, 2i + 1)"),
    ],
    "modern_decoder-DecoderLayer": [
        (PostNorm, "the norms come after each residual sum"),
        (NoMlpResidual, "there is no residual around the MLP"),
        (ParallelBlock, "the MLP reads the block's input x"),
        (OneNorm, "input_norm comes before both sublayers"),
    ],
    "modern_decoder-Model": [
        (NoFinalNorm, "there is no final norm"),
        (GemmaScale, "the embedding is scaled by sqrt(d_model)"),
        (LayersWithoutCache, "the layers are called without their cache"),
        (FirstCacheForAll, "the cache of layer 0 is handed to every layer"),
        (LastLogitsOnly, "not the last position's only"),
        (CopiedNotTied, "tie_embeddings=True, but output.weight is a parameter of its own"),
        (TiedAlways, "output.weight is embedding.weight, but tie_embeddings=False"),
    ],
}

VARIANTS = {
    "modern_decoder-RMSNorm": [HuggingFaceStyle, TorchFunctional, FromTheNorm],
    "modern_decoder-SwiGLU": [HandWrittenSiLU, Functional, Einsum],
    "modern_decoder-Attention": [HuggingFaceAttention, ComplexAttention, EinsumGroups],
    "modern_decoder-DecoderLayer": [HuggingFaceLayer, SublayerList, InPlaceAdds],
    "modern_decoder-Model": [HuggingFaceModel, FunctionalHead],
}

globals().update(shared_tests("modern_decoder", MISTAKES, VARIANTS, solutions="modern_decoder_notebook", seeds=6))
