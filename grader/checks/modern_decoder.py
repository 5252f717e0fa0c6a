"""Hidden checks of notebook 15, modern_decoder: the parts of the decoder of Llama and Qwen.

Everything in notebook 15 is PyTorch. ``RMSNorm`` and ``SwiGLU`` are modules: the drivers of
``coursekit/drivers/modern_decoder.py`` build the learner's class, load the weights drawn here by
name (``weight``; ``W_gate``, ``W_up``, ``W_down``) and call it on float32 inputs. The references
are ``reference/modern_decoder.py``, the computations of transformers' ``LlamaRMSNorm`` and
``LlamaMLP``; the notebook matches the learner's modules to those weight for weight.

Sizes are pairwise distinct (batch 2, seq_len 3 or 5, d_model 5, 6, 7; d_ff 9, 10, 11), every
weight has entries of both signs and none near 1 (so that a missing weight, or Gemma's
``1 + weight``, shows), every row of x has a mean far from 0 (so that LayerNorm's centring
shows), and one row of every RMSNorm input has a root mean square near sqrt(eps) (so that eps
inside or outside the root, or another eps, shows).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._core import Call, Knob, Mistake, Probe, Raises, Rule, Spec
from .reference import modern_decoder as ref


_OUTPUT = "the output of {}"  # a module's answer is its output; an error is raised by the call


# ---------------------------------------------------------------- RMSNorm

def _rms_rows(rng, shape, tiny):
    """Rows (tokens) with means far from 0 and different scales; row 0 scaled to an RMS of ``tiny``."""
    offsets = rng.uniform(1.0, 3.0, size=shape[:-1] + (1,)) * rng.choice([-1, 1], size=shape[:-1] + (1,))
    x = offsets + rng.uniform(0.5, 2.0, size=shape[:-1] + (1,)) * rng.normal(size=shape)
    rows = x.reshape(-1, shape[-1])
    rows[0] *= tiny / np.sqrt(np.mean(rows[0] ** 2))
    return x


def _weight(rng, d):
    """Entries of both signs, none near 1 (a missing weight, or 1 + weight, shows)."""
    return rng.uniform(0.3, 0.7, size=d) * rng.choice([-1, 1], size=d) + rng.choice([0.0, 1.8], size=d)


def _rms_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # 1. (batch 2, seq_len 3, d_model 5), the default eps (1e-6): one token of RMS 1e-3, where eps matters.
    # 2. (4, 6), eps=0.1; 3. (2, 5, 7), eps=1e-3: eps used, inside the root.
    for shape, eps in [((2, 3, 5), None), ((4, 6), 0.1), ((2, 5, 7), 1e-3)]:
        x = _rms_rows(rng, shape, tiny=np.sqrt(1e-6 if eps is None else eps))
        d = shape[-1]
        what = f"RMSNorm({d}{'' if eps is None else f', eps={eps}'}) on x of shape {shape}"
        calls.append(Call((d, eps, _weight(rng, d), x), what=what))
    return calls


def _rms_variant(centre=False, eps_at="inside", scale="weight", root="sqrt", reduce="mean", dim="last"):
    """RMSNorm with some choices changed: ``centre`` subtracts the mean (LayerNorm's), ``eps_at``
    where eps goes ("inside" the root, "outside" it, "none", "ignored": 1e-6 whatever is given,
    "layer_norm_default": a default of 1e-5), ``scale`` what multiplies ("weight", "none",
    "one_plus": Gemma's 1 + weight, "divided": x / weight), ``root`` ("sqrt" or "none"), ``reduce`` ("mean" of the squares
    or their "sum"), ``dim`` the axis ("last", "first": dim 0, "one": dim 1, "minus_two": dim -2,
    "all")."""
    default = 1e-5 if eps_at == "layer_norm_default" else 1e-6

    class RMSNorm(ref.RMSNorm):
        def __init__(self, d_model, eps=default):
            super().__init__(d_model, eps)

        def forward(self, x):
            used = 1e-6 if eps_at == "ignored" else self.eps
            axes = {"last": (-1,), "first": (0,), "one": (1,), "minus_two": (-2,), "all": tuple(range(x.dim()))}[dim]
            h = x - x.mean(dim=axes, keepdim=True) if centre else x
            square = h.pow(2).mean(dim=axes, keepdim=True) if reduce == "mean" else h.pow(2).sum(dim=axes,
                                                                                                   keepdim=True)
            rooted = torch.sqrt if root == "sqrt" else (lambda v: v)
            if eps_at == "outside":
                normed = h / (rooted(square) + used)
            elif eps_at == "none":
                normed = h / rooted(square)
            else:
                normed = h / rooted(square + used)
            return {"weight": normed * self.weight, "none": normed, "one_plus": normed * (1 + self.weight),
                    "divided": normed / self.weight}[scale]
    return RMSNorm


def _rms(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.mean(np.asarray(x, dtype=np.float64) ** 2, axis=-1))


def _eps_of(call: Call) -> float:
    return 1e-6 if call.args[1] is None else call.args[1]


class _Forward(ref.RMSNorm):
    """An RMSNorm whose forward is ``fn(x, weight, eps)`` (the examples of the error rules)."""

    fn = None

    def forward(self, x):
        return type(self).fn(x, self.weight, self.eps)


def _rms_forward(fn):
    return type("RMSNorm", (_Forward,), {"fn": staticmethod(fn)})


RMS_NORM = Spec(
    id="modern_decoder-RMSNorm",
    function="RMSNorm",
    inputs=_rms_inputs,
    reference=ref.RMSNorm,
    driver="modern_decoder.drive_rms_norm",
    output=_OUTPUT,
    variant=_rms_variant,
    rules=(
        Rule("the default eps (1e-6, Llama's rms_norm_eps)", lambda call: call.args[1] is None),
        Rule("eps given", lambda call: call.args[1] is not None),
        Rule("a token whose mean square is near eps", lambda call: bool(np.any(_rms(call.args[3]) ** 2
                                                                              < 10 * _eps_of(call)))),
        Rule("tokens whose mean is far from 0 (no mean is subtracted)",
             lambda call: bool(np.mean(np.abs(np.mean(call.args[3], axis=-1))) > 0.5)),
        Rule("more than two axes, normalized over the last",
             lambda call: np.ndim(call.args[3]) >= 3 and len(set(np.shape(call.args[3]))) == 3),
    ),
    knobs=(
        Knob("centre", ((True, "it subtracts the mean, as LayerNorm does: RMSNorm divides x itself by its root mean "
                               "square, x / sqrt(mean(x^2) + eps), with no mean subtracted (and no bias)"),)),
        Knob("eps_at", (
            ("outside", "eps is added outside the square root, x / (sqrt(mean(x^2)) + eps); LlamaRMSNorm adds it "
                        "inside: x * torch.rsqrt(mean(x^2) + eps)"),
            ("none", "eps is missing: it divides by sqrt(mean(x^2)), which a token of (nearly) zero features makes "
                     "(nearly) zero; add eps inside the root, sqrt(mean(x^2) + eps)"),
            ("ignored", "it ignores the eps it is built with (it uses 1e-6 whatever eps is given): use self.eps"),
            ("layer_norm_default", "its default eps is 1e-5, nn.LayerNorm's; Llama's RMSNorm defaults to 1e-6 "
                                   "(rms_norm_eps): def __init__(self, d_model, eps=1e-6)"),
        )),
        Knob("scale", (
            ("none", "the weight is missing: scale the normalized x by self.weight, feature by feature"),
            ("one_plus", "it scales by 1 + weight (Gemma's RMSNorm stores its weight so); Llama's and Qwen's scale "
                         "by the weight itself"),
            ("divided", "it divides by the weight: the weight scales the normalized x, x_hat * self.weight"),
        )),
        Knob("root", (("none", "it divides by the mean square, not by its square root: x / sqrt(mean(x^2) + eps)"),)),
        Knob("reduce", (("sum", "it divides by the norm sqrt(sum(x^2)), not the root MEAN square: "
                                "sqrt(mean(x^2) + eps), the sum divided by d_model"),)),
        Knob("dim", (
            ("first", "it takes the mean square over the first axis (dim=0); RMSNorm normalizes each token's "
                      "d_model features: the mean over the LAST axis, dim=-1, keepdim=True"),
            ("one", "it takes the mean square over axis 1 (dim=1), the positions of a (batch, seq_len, d_model) "
                    "input; RMSNorm normalizes each token's d_model features: the mean over the LAST axis, dim=-1, "
                    "keepdim=True"),
            ("minus_two", "it takes the mean square over the second-last axis (dim=-2), the tokens; RMSNorm "
                          "normalizes each token's d_model features: the mean over the LAST axis, dim=-1, "
                          "keepdim=True"),
            ("all", "it takes the mean square of the whole tensor (no dim); RMSNorm normalizes each token on its "
                    "own: the mean over the last axis, dim=-1, keepdim=True"),
        )),
    ),
    mistakes=(
        Mistake("times_rms", "it multiplies by the root mean square instead of dividing by it: x / sqrt(mean(x^2) "
                "+ eps) * weight", _rms_forward(lambda x, w, eps: x * torch.sqrt(x.pow(2).mean(-1, keepdim=True)
                                                                                   + eps) * w)),
        Mistake("not_normalized", "x is scaled by the weight but not normalized: divide it by its root mean square "
                "first, x / sqrt(mean(x^2) + eps) * weight", _rms_forward(lambda x, w, eps: x * w)),
    ),
    errors=(
        Raises("{what} raised {error}: the mean square loses its last axis, so it does not broadcast against x. "
               "Keep it: x.pow(2).mean(dim=-1, keepdim=True)",
               example=_rms_forward(lambda x, w, eps: x / torch.sqrt(x.pow(2).mean(-1) + eps) * w),
               match="must match the size of tensor"),
    ),
    by_call=True,
    figures=("modern_decoder-RMSNorm-figure",),
)


# ---------------------------------------------------------------- SwiGLU

_SILU = "SwiGLU's gate is SiLU (swish), x sigmoid(x): F.silu"
_GATES = {
    "silu": (F.silu, ""),
    "relu": (torch.relu, f"the gate goes through ReLU (ReGLU); {_SILU}"),
    "gelu": (F.gelu, f"the gate goes through GELU (GEGLU, Gemma's); {_SILU}"),
    "gelu_tanh": (lambda h: F.gelu(h, approximate="tanh"), f"the gate goes through the tanh approximation of "
                                                            f"GELU (GEGLU); {_SILU}"),
    "sigmoid": (torch.sigmoid, f"the gate goes through a sigmoid (Dauphin et al.'s GLU); {_SILU}"),
    "none": (lambda h: h, f"the gate has no activation (a bilinear layer); {_SILU}"),
    "tanh": (torch.tanh, f"the gate goes through tanh; {_SILU}"),
}
_KNOB_GATES = ("relu", "gelu", "sigmoid", "none")


def _swiglu_variant(activation="silu", swapped=False, applied="gate"):
    """SwiGLU with another gate ``activation``, the gate and up projections ``swapped`` (the
    activation on W_up(x)), or the activation ``applied`` elsewhere ("gate"; "product": to the
    product of both; "both": to both projections)."""
    act = _GATES[activation][0]

    class SwiGLU(ref.SwiGLU):
        def forward(self, x):
            gate, up = (self.W_up(x), self.W_gate(x)) if swapped else (self.W_gate(x), self.W_up(x))
            hidden = {"gate": lambda: act(gate) * up, "product": lambda: act(gate * up),
                      "both": lambda: act(gate) * act(up)}[applied]()
            return self.W_down(hidden)
    return SwiGLU


def _swiglu_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for shape, d_ff in [((2, 5, 6), 10), ((3, 7), 9), ((2, 3, 5), 11)]:
        d = shape[-1]
        W_gate = rng.normal(scale=2 / np.sqrt(d), size=(d_ff, d))
        W_up = rng.normal(scale=1 / np.sqrt(d), size=(d_ff, d))
        W_down = rng.normal(scale=1 / np.sqrt(d_ff), size=(d, d_ff))
        calls.append(Call((d, d_ff, W_gate, W_up, W_down, rng.normal(size=shape)),
                          what=f"SwiGLU({d}, {d_ff}) on x of shape {shape}"))
    return calls


def _gate_region(rng: np.random.Generator) -> list[Call]:
    """One call whose answer is act(x) * x: every projection the identity (d_ff = d_model = 11), x
    spread over [-6, 6] (where ReLU, GELU, SiLU and a sigmoid part), so that the gate's activation
    and where it is applied show alone; gate and up are then the same, so their order cannot matter."""
    grid = np.concatenate([np.linspace(-6, -2.2, 22), np.linspace(-2, 2, 22), np.linspace(2.2, 6, 22)])
    x = (grid + rng.uniform(-0.02, 0.02, size=grid.size)).reshape(6, 11)
    eye = np.eye(11)
    return [Call((11, 11, eye, eye, eye, x), what="SwiGLU(11, 11) on a known region of the gate")]


def _gate(call: Call) -> np.ndarray:
    return call.args[5] @ call.args[2].T


class _NoDown(ref.SwiGLU):
    def forward(self, x):
        return F.silu(self.W_gate(x)) * self.W_up(x)


class _Sum(ref.SwiGLU):
    def forward(self, x):
        return self.W_down(F.silu(self.W_gate(x)) + self.W_up(x))


class _NoUp(ref.SwiGLU):
    def forward(self, x):
        return self.W_down(F.silu(self.W_gate(x)))


class _Divided(ref.SwiGLU):
    def forward(self, x):
        return self.W_down(F.silu(self.W_gate(x)) / self.W_up(x))


class _NoGate(ref.SwiGLU):
    def forward(self, x):
        return self.W_down(self.W_up(x))


class _Transposed(ref.SwiGLU):
    def forward(self, x):
        return (F.silu(x @ self.W_gate.weight) * (x @ self.W_up.weight)) @ self.W_down.weight


SWIGLU = Spec(
    id="modern_decoder-SwiGLU",
    submodules=("W_gate", "W_up", "W_down"),
    function="SwiGLU",
    inputs=_swiglu_inputs,
    reference=ref.SwiGLU,
    driver="modern_decoder.drive_swiglu",
    output=_OUTPUT,
    variant=_swiglu_variant,
    rules=(
        Rule("gate values of both signs, some below -1 (SiLU, ReLU and GELU part there)",
             lambda call: bool(np.any(_gate(call) < -1) and np.any(_gate(call) > 1))),
        Rule("d_ff != d_model (nn.Linear's layout shows)", lambda call: call.args[1] != call.args[0]),
        Rule("more than two axes", lambda call: np.ndim(call.args[5]) >= 3),
    ),
    knobs=(
        Knob("activation", tuple((name, _GATES[name][1]) for name in _KNOB_GATES)),
        Knob("swapped", ((True, "the gate and up projections are swapped: the SiLU goes on W_gate(x) (gate_proj), "
                                "which then multiplies W_up(x) (up_proj) feature by feature"),)),
        Knob("applied", (
            ("product", "the SiLU is applied to the product gate * up: apply it to the gate alone, "
                        "silu(W_gate(x)) * W_up(x)"),
            ("both", "the SiLU is applied to both projections: the up projection W_up(x) stays linear, "
                     "silu(W_gate(x)) * W_up(x)"),
        )),
    ),
    probes=(
        Probe("gate", _gate_region, reads=("activation", "applied"),
              extra=(Knob("activation", tuple((name, diagnosis) for name, (_, diagnosis) in _GATES.items()
                                              if name not in _KNOB_GATES + ("silu",))),),
              right="the gate's activation is SiLU, applied to the gate alone: look at which weight goes where "
                    "and at the down projection"),
    ),
    mistakes=(
        Mistake("no_down", "there is no down projection: the hidden (..., d_ff) must go back to d_model through "
                "W_down, W_down(silu(W_gate(x)) * W_up(x))", _NoDown),
        Mistake("sum", "the gate is added to the up projection: SwiGLU multiplies them feature by feature, "
                "silu(W_gate(x)) * W_up(x)", _Sum),
        Mistake("no_up", "the up projection is missing: the hidden layer is silu(W_gate(x)) * W_up(x), the gate "
                "times the up projection", _NoUp),
        Mistake("divided", "the gate is divided by the up projection: SwiGLU multiplies them feature by feature, "
                "silu(W_gate(x)) * W_up(x)", _Divided),
        Mistake("no_gate", "the gate is missing: the hidden layer is W_up(x) alone, a linear layer; SwiGLU gates "
                "it, silu(W_gate(x)) * W_up(x)", _NoGate),
    ),
    errors=(
        Raises("{what} raised {error}. The weights use nn.Linear's layout, (out_features, in_features): call the "
               "layers, self.W_gate(x), or multiply by the transposed weight, x @ self.W_gate.weight.T",
               example=_Transposed, match="cannot be multiplied|mismatch in its core dimension|size mismatch|"
                                          "must match the size"),
    ),
    by_call=True,
    figures=("modern_decoder-SwiGLU-figure",),
)


# ---------------------------------------------------------------- Attention (GQA, QK-norm, RoPE, a KV cache)

def _interleaved_half(x):
    """RoFormer's pairs (2i, 2i + 1) rotated with the halves layout's angles: (x_2i, x_2i+1) -> (-x_2i+1, x_2i)."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


def _attention_variant(qk_norm="head_dim", pairing="halves", kv_order="interleave", positions="true",
                       mask="bottom_right", scale="head_dim", theta="used", project=True):
    """Attention with some choices changed: ``qk_norm`` ("head_dim"; "after_rope": the norm after the
    rotation; "all_heads": over heads * head_dim with the weight tiled; "skipped": not applied though
    qk_norm is True), ``pairing`` ("halves"; "interleaved": pairs (2i, 2i + 1) with angles repeated
    pair by pair), ``kv_order`` ("interleave": head h reads key/value head h // group; "tile": h %
    kv_heads), ``positions`` ("true"; "restart": 0 ... new_len - 1 at every call), ``mask``
    ("bottom_right", "top_left", "none"), ``scale`` ("head_dim"; "d_model"), ``theta`` ("used";
    "ignored": 10000 whatever rope_theta is); ``project`` False: no W_o after the heads are merged."""

    class Attention(ref.Attention):
        def forward(self, x, cache=None):
            batch, new, d_model = x.shape
            past = 0 if cache is None else cache[0].shape[2]
            q = self.W_q(x).view(batch, new, self.heads, self.head_dim).transpose(1, 2)
            k = self.W_k(x).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.W_v(x).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)

            def norm(t, module):
                if qk_norm == "all_heads":
                    flat = t.transpose(1, 2).flatten(2)
                    flat = flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + module.eps)
                    return flat.unflatten(-1, (t.shape[1], t.shape[3])).transpose(1, 2) * module.weight
                return module(t)

            normed = self.qk_norm and qk_norm != "skipped"
            if normed and qk_norm != "after_rope":
                q, k = norm(q, self.q_norm), norm(k, self.k_norm)
            base = 10000.0 if theta == "ignored" else self.rope_theta
            inv_freq = base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
            first = 0 if positions == "restart" else past
            angles = torch.arange(first, first + new, dtype=torch.float32)[:, None] * inv_freq
            if pairing == "interleaved":
                angles, turn = angles.repeat_interleave(2, dim=-1), _interleaved_half
            else:
                angles, turn = torch.cat([angles, angles], dim=-1), ref.rotate_half
            q = q * angles.cos() + turn(q) * angles.sin()
            k = k * angles.cos() + turn(k) * angles.sin()
            if normed and qk_norm == "after_rope":
                q, k = self.q_norm(q), self.k_norm(k)
            if cache is not None:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            group = self.heads // self.kv_heads
            if kv_order == "tile":
                keys, values = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
            else:
                keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = q @ keys.transpose(2, 3) / math.sqrt(d_model if scale == "d_model" else self.head_dim)
            if mask != "none":
                allowed = torch.ones(new, past + new, dtype=torch.bool).tril(diagonal=past if mask == "bottom_right"
                                                                              else 0)
                scores = scores.masked_fill(~allowed, float("-inf"))
            out = (torch.softmax(scores, dim=-1) @ values).transpose(1, 2).reshape(batch, new, -1)
            return (self.W_o(out) if project else out), (k, v)
    return Attention


def _attention_calls(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (batch, d_model, heads, kv_heads, head_dim, rope_theta, qk_norm, eps, chunks)
    # 1. Qwen3-like: groups of 3, QK-norm, heads * head_dim = 24 != d_model = 12, the default theta.
    # 2. Llama-like: groups of 2, no QK-norm, rope_theta 100, head_dim 6.
    # 3. multi-query attention, QK-norm with eps 1e-3, heads * head_dim = d_model = 16, theta 50, no cache.
    later = tuple(rng.permutation([1, 2, 3]).tolist())
    setups = [(2, 12, 6, 2, 4, None, True, None, (2,) + later[:2]),
              (2, 10, 4, 2, 6, 100.0, False, None, (1, 1) + later[1:]),
              (1, 16, 2, 1, 8, 50.0, True, 1e-3, (5,))]
    for batch, d_model, heads, kv_heads, head_dim, theta, qk_norm, eps, chunks in setups:
        seq_len = sum(chunks)
        W_q = rng.normal(scale=1 / np.sqrt(d_model), size=(heads * head_dim, d_model))
        W_k = rng.normal(scale=1 / np.sqrt(d_model), size=(kv_heads * head_dim, d_model))
        W_v = rng.normal(scale=1 / np.sqrt(d_model), size=(kv_heads * head_dim, d_model))
        W_o = rng.normal(scale=1 / np.sqrt(heads * head_dim), size=(d_model, heads * head_dim))
        norms = (_weight(rng, head_dim), _weight(rng, head_dim)) if qk_norm else (None, None)
        x = rng.normal(size=(batch, seq_len, d_model)) * rng.uniform(0.5, 2.0, size=(batch, seq_len, 1))
        options = "".join(f", {name}={value:g}" for name, value in (("rope_theta", theta), ("eps", eps))
                          if value is not None)
        what = (f"Attention(d_model={d_model}, heads={heads}, kv_heads={kv_heads}, head_dim={head_dim}{options}, "
                f"qk_norm={qk_norm}) on x of shape {x.shape} fed {' + '.join(map(str, chunks))} tokens")
        calls.append(Call((d_model, heads, kv_heads, head_dim, theta, qk_norm, eps, W_q, W_k, W_v, W_o) + norms
                          + (x, np.array(chunks, dtype=np.int64)), what=what))
    d_model, heads, kv_heads, head_dim = 12, 6, 4, 2
    calls.append(Call((d_model, heads, kv_heads, head_dim, None, False, None, np.zeros((12, 12)), np.zeros((8, 12)),
                       np.zeros((8, 12)), np.zeros((12, 12)), None, None, np.zeros((1, 2, 12)),
                       np.array([2], dtype=np.int64)), raises="ValueError",
                      what="Attention(d_model=12, heads=6, kv_heads=4, head_dim=2): 4 does not divide 6"))
    return calls


def _chunks(call: Call) -> list[int]:
    return np.asarray(call.args[-1]).tolist()


class _Unchecked(ref.Attention):
    """No check that kv_heads divides heads: the first forward fails instead."""

    def __init__(self, d_model, heads, kv_heads, head_dim, rope_theta=10000.0, qk_norm=False, eps=1e-6):
        super().__init__(d_model, kv_heads, kv_heads, head_dim, rope_theta, qk_norm, eps)
        self.heads = heads
        self.W_q = nn.Linear(d_model, heads * head_dim, bias=False)
        self.W_o = nn.Linear(heads * head_dim, d_model, bias=False)


ATTENTION = Spec(
    id="modern_decoder-Attention",
    submodules=("W_q", "W_k", "W_v", "W_o"),
    function="Attention",
    depends=("modern_decoder-RMSNorm",),  # its q_norm and k_norm are the learner's RMSNorm
    inputs=_attention_calls,
    reference=ref.Attention,
    driver="modern_decoder.drive_attention",
    parts=("output", "cached keys", "cached values"),
    variant=_attention_variant,
    equivalent=(
        ("L25 0 -> 1 #2", "cache[1], the cached values, has the cached keys' length: past either way"),
        ("L25 0 -> -1 #2", "cache is a pair: cache[-1] is cache[1], the values, of the keys' length"),
        ("L31 torch.arange(0, self.head_dim, 2, dtype=torch.float32) -> torch.arange(0, self.head_dim, 2)",
         "the integers 0, 2, ... divided by head_dim (true division) are float32 all the same"),
        ("L32 torch.arange(past, past + new, dtype=torch.float32) -> torch.arange(past, past + new)",
         "integer positions times the float32 frequencies are float32: the same angles"),
        ("L33 -1 -> 1", "angles is 2-D, (new_len, head_dim // 2): its axis 1 is its last"),
    ),
    rules=(
        Rule("groups of several query heads over several key/value heads (1 < kv_heads < heads)",
             lambda call: not call.raises and 1 < call.args[2] < call.args[1]),
        Rule("QK-norm (qk_norm=True) with weights of both signs", lambda call: not call.raises and call.args[5]),
        Rule("no QK-norm (Llama)", lambda call: not call.raises and not call.args[5]),
        Rule("several new tokens after a cache: positions past ... past + new_len - 1, the mask bottom-right",
             lambda call: not call.raises and any(n > 1 for n in _chunks(call)[1:])),
        Rule("one new token after a cache", lambda call: not call.raises and any(n == 1 for n in _chunks(call)[1:])),
        Rule("a rope_theta given, other than 10000", lambda call: call.args[4] not in (None, 10000.0)),
        Rule("heads * head_dim != d_model", lambda call: call.args[1] * call.args[3] != call.args[0]),
        Rule("kv_heads does not divide heads: ValueError", lambda call: call.raises == "ValueError"),
    ),
    knobs=(
        Knob("qk_norm", (
            ("after_rope", "QK-norm comes after RoPE: Qwen3 normalizes each head's queries and keys first (q_norm, "
                           "k_norm over head_dim), then rotates them; the norm's weight is per feature, so the "
                           "order matters"),
            ("all_heads", "QK-norm normalizes the queries (and keys) of all heads together, over heads * head_dim: "
                          "q_norm and k_norm are RMSNorm(head_dim), applied to each head's (..., head_dim) vectors "
                          "after the split into heads"),
            ("skipped", "with qk_norm=True the queries and keys are not normalized: apply self.q_norm and "
                        "self.k_norm to each head's queries and keys, before RoPE"),
        )),
        Knob("pairing", (("interleaved", "RoPE rotates the pairs (2i, 2i + 1) (RoFormer's interleaved layout); "
                                         "Llama and Qwen rotate the halves, pairs (i, i + head_dim/2): "
                                         "x * cos + rotate_half(x) * sin, cos and sin of cat([angles, angles])"),)),
        Knob("kv_order", (("tile", "query head h reads key/value head h % kv_heads, as .repeat(1, group, 1, 1) "
                                   "pairs them; in Llama and Qwen the heads of a group are consecutive, head h reads "
                                   "key/value head h // group: repeat_interleave(group, dim=1) (transformers' "
                                   "repeat_kv)"),)),
        Knob("positions", (("restart", "with a cache the new tokens are rotated from position 0 again: after "
                                       "`past` cached tokens they sit at positions past ... past + new_len - 1"),)),
        Knob("mask", (
            ("top_left", "the causal mask is aligned top-left: new token j (at position past + j) may attend to keys "
                         "0 ... past + j, torch.ones(new_len, past + new_len).tril(diagonal=past), bottom-right"),
            ("none", "there is no causal mask: token j may attend to keys 0 ... past + j only, "
                     "torch.ones(new_len, past + new_len).tril(diagonal=past)"),
        )),
        Knob("scale", (("d_model", "the scores are divided by sqrt(d_model); each head's dot products have head_dim "
                                   "terms: divide by sqrt(head_dim)"),)),
        Knob("theta", (("ignored", "it ignores rope_theta (it uses 10000 whatever is given): the frequencies are "
                                   "rope_theta ** (-2i / head_dim), with self.rope_theta"),)),
    ),
    mistakes=(
        Mistake("no_W_o", "the heads are merged but not projected: apply W_o (transformers' o_proj), "
                "(batch, new_len, heads * head_dim) -> (batch, new_len, d_model)", _attention_variant(project=False)),
    ),
    errors=(
        Raises("{what} raised {error}; it should raise ValueError, as the docstring says: kv_heads does not divide "
               "heads there, so check heads % kv_heads in __init__", example=_Unchecked, match=".",
               when=lambda call: bool(call.raises)),
    ),
    figures=("modern_decoder-Attention-figure",),
)


# ---------------------------------------------------------------- DecoderLayer (the block)

def _layer_variant(place="pre", attention_residual=True, mlp_residual=True, mlp_input="h", norms="two",
                   residual_from="x"):
    """DecoderLayer with some choices changed: ``place`` of the norms ("pre"; "post": each sublayer's sum
    normalized, as in the 2017 Transformer), the residuals around the attention and the MLP (False: none),
    ``mlp_input`` ("h", the stream after attention; "x": the block's input, a parallel block), ``norms``
    ("two"; "one": input_norm before both sublayers), ``residual_from`` ("x"; "normed": the residual
    carries input_norm(x))."""

    class DecoderLayer(ref.DecoderLayer):
        def forward(self, x, cache=None):
            second = self.input_norm if norms == "one" else self.post_attention_norm
            normed = self.input_norm(x)
            attended, cache = self.attention(x if place == "post" else normed, cache)
            base = normed if residual_from == "normed" else x
            h = base + attended if attention_residual else attended
            if place == "post":
                h = self.input_norm(h)
            inner = x if mlp_input == "x" else h
            fed = self.mlp(inner if place == "post" else second(inner))
            out = h + fed if mlp_residual else fed
            return (second(out) if place == "post" else out), cache
    return DecoderLayer


def _layer_calls(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (batch, d_model, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps, chunks)
    later = tuple(rng.permutation([1, 2]).tolist())
    # 1. Qwen3-like, with an eps of 0.5, as large as the mean squares the norms see (so that each norm's eps,
    # the two RMSNorms' and QK-norm's, shows); 2. Llama-like, the default eps, rope_theta 100.
    setups = [(2, 12, 6, 2, 4, 20, None, True, 0.5, (3,) + later),
              (2, 10, 4, 2, 6, 14, 100.0, False, None, (2, 2) + later[:1])]
    for batch, d_model, heads, kv_heads, head_dim, d_ff, theta, qk_norm, eps, chunks in setups:
        def linear(rows, columns, scale=1.0):
            return rng.normal(scale=scale / np.sqrt(columns), size=(rows, columns))
        norms = (_weight(rng, head_dim), _weight(rng, head_dim)) if qk_norm else (None, None)
        weights = ((_weight(rng, d_model), linear(heads * head_dim, d_model), linear(kv_heads * head_dim, d_model),
                    linear(kv_heads * head_dim, d_model), linear(d_model, heads * head_dim)) + norms
                   + (_weight(rng, d_model), linear(d_ff, d_model, 2.0), linear(d_ff, d_model),
                      linear(d_model, d_ff)))
        offset = rng.uniform(-1.0, 1.0, size=(1, 1, d_model))
        x = offset + rng.normal(size=(batch, sum(chunks), d_model)) * rng.uniform(0.5, 2.0, size=(batch, sum(chunks), 1))
        options = "".join(f", {name}={value:g}" for name, value in (("rope_theta", theta), ("eps", eps))
                          if value is not None)
        calls.append(Call((d_model, heads, kv_heads, head_dim, d_ff, theta, qk_norm, eps) + weights
                          + (x, np.array(chunks, dtype=np.int64)),
                          what=f"DecoderLayer(d_model={d_model}, heads={heads}, kv_heads={kv_heads}, "
                               f"head_dim={head_dim}, d_ff={d_ff}{options}, qk_norm={qk_norm}) on x of shape "
                               f"{x.shape} fed {' + '.join(map(str, chunks))} tokens"))
    return calls


DECODER_LAYER = Spec(
    id="modern_decoder-DecoderLayer",
    submodules=("input_norm", "attention", "post_attention_norm", "mlp"),
    function="DecoderLayer",
    depends=("modern_decoder-RMSNorm", "modern_decoder-SwiGLU", "modern_decoder-Attention"),  # built of them
    inputs=_layer_calls,
    reference=ref.DecoderLayer,
    driver="modern_decoder.drive_decoder_layer",
    parts=("output", "cached keys", "cached values"),
    variant=_layer_variant,
    rules=(
        Rule("QK-norm (Qwen 3)", lambda call: call.args[6]),
        Rule("no QK-norm (Llama)", lambda call: not call.args[6]),
        Rule("several new tokens after a cache", lambda call: any(n > 1 for n in _chunks(call)[1:])),
        Rule("an eps given, as large as the mean squares (every norm is built with it)",
             lambda call: call.args[7] is not None and call.args[7] >= 0.1),
        Rule("norm weights of both signs, none near 1 (each norm's own weight shows)",
             lambda call: bool(np.min(np.abs(call.args[8] - 1)) > 0.1 and np.min(np.abs(call.args[15] - 1)) > 0.1)),
    ),
    knobs=(
        Knob("place", (("post", "the norms come after each residual sum (post-norm, as in the 2017 Transformer): "
                                "Llama and Qwen normalize each sublayer's input, h = x + attention(input_norm(x)), "
                                "out = h + mlp(post_attention_norm(h))"),)),
        Knob("attention_residual", ((False, "there is no residual around the attention: h = x + "
                                            "attention(input_norm(x))"),)),
        Knob("mlp_residual", ((False, "there is no residual around the MLP: out = h + mlp(post_attention_norm(h))"),)),
        Knob("mlp_input", (("x", "the MLP reads the block's input x (a parallel block, GPT-J's): in Llama and Qwen "
                                 "it reads h = x + attention(input_norm(x)), out = h + mlp(post_attention_norm(h))"),)),
        Knob("norms", (("one", "input_norm comes before both sublayers: the MLP's input is normalized by "
                               "post_attention_norm, a norm with its own weight (post_attention_layernorm)"),)),
        Knob("residual_from", (("normed", "the residual carries the normalized x: the stream is the raw x, "
                                          "h = x + attention(input_norm(x)); only the sublayer's input is "
                                          "normalized"),)),
    ),
    figures=("modern_decoder-DecoderLayer-figure",),
)


# ---------------------------------------------------------------- Model (Llama 3 / Qwen 3)

def _model_variant(final_norm=True, embed_scale="none", cache="per_layer", eps_to="everywhere"):
    """Model with some choices changed: no ``final_norm``; ``embed_scale`` ("none"; "sqrt_d_model": the
    embedding times sqrt(d_model), Gemma's); ``cache`` ("per_layer"; "none": the layers called without a
    cache, so that new tokens restart at position 0 and forget the earlier ones; "first": the cache of
    layer 0 handed to every layer); ``eps_to`` ("everywhere"; "not_to_layers": the layers built with their
    default eps; "not_to_norm": the final norm built with its default)."""
    handed = cache

    class Model(ref.Model):
        def __init__(self, vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta=10000.0,
                     qk_norm=False, eps=1e-6, tie_embeddings=False):
            super().__init__(vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm,
                             eps, tie_embeddings)
            if eps_to == "not_to_layers":
                self.layers = nn.ModuleList([ref.DecoderLayer(d_model, heads, kv_heads, head_dim, d_ff, rope_theta,
                                                              qk_norm) for _ in range(layers)])
            if eps_to == "not_to_norm":
                self.norm = ref.RMSNorm(d_model)

        def forward(self, ids, cache=None):
            x = self.embedding(ids)
            if embed_scale == "sqrt_d_model":
                x = x * math.sqrt(x.shape[-1])
            caches = []
            for i, layer in enumerate(self.layers):
                given = None if cache is None or handed == "none" else cache[0 if handed == "first" else i]
                x, layer_cache = layer(x, given)
                caches.append(layer_cache)
            return self.output(self.norm(x) if final_norm else x), caches
    return Model


def _model_calls(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (batch, vocab, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps, tied, chunks)
    # 1. Qwen3-like (a small one: tied, QK-norm), heads * head_dim = 16 != d_model = 12, the default theta and eps;
    # 2. Llama-like (untied, no QK-norm), 3 layers, rope_theta 500, an eps of 1.0, as large as the mean squares
    # the norms see (so that the final norm's eps, and each layer's, shows).
    later = tuple(rng.permutation([1, 2]).tolist())
    setups = [(2, 23, 12, 2, 4, 2, 4, 20, None, True, None, True, (3,) + later),
              (2, 19, 10, 3, 4, 2, 6, 14, 500.0, False, 1.0, False, (4, 1) + later[:1])]
    for batch, vocab, d_model, layers, heads, kv_heads, head_dim, d_ff, theta, qk_norm, eps, tied, chunks in setups:
        def linear(rows, columns, scale=1.0):
            return rng.normal(scale=scale / np.sqrt(columns), size=(layers, rows, columns))

        def norm(d):
            return np.stack([_weight(rng, d) for _ in range(layers)])
        stacked = (norm(d_model), linear(heads * head_dim, d_model), linear(kv_heads * head_dim, d_model),
                   linear(kv_heads * head_dim, d_model), linear(d_model, heads * head_dim),
                   norm(head_dim) if qk_norm else None, norm(head_dim) if qk_norm else None,
                   norm(d_model), linear(d_ff, d_model, 2.0), linear(d_ff, d_model), linear(d_model, d_ff))
        embedding = rng.normal(size=(vocab, d_model)) * 0.7
        output = None if tied else rng.normal(scale=1 / np.sqrt(d_model), size=(vocab, d_model))
        ids = rng.integers(0, vocab, size=(batch, sum(chunks)))
        options = "".join(f", {name}={value:g}" for name, value in (("rope_theta", theta), ("eps", eps))
                          if value is not None)
        calls.append(Call((vocab, d_model, layers, heads, kv_heads, head_dim, d_ff, theta, qk_norm, eps, tied,
                           embedding) + stacked + (_weight(rng, d_model), output, ids.astype(np.int64),
                                                   np.array(chunks, dtype=np.int64)),
                          what=f"Model(vocab_size={vocab}, d_model={d_model}, layers={layers}, heads={heads}, "
                               f"kv_heads={kv_heads}, head_dim={head_dim}, d_ff={d_ff}{options}, qk_norm={qk_norm}, "
                               f"tie_embeddings={tied}) on ids of shape {ids.shape} fed "
                               f"{' + '.join(map(str, chunks))} tokens"))
    return calls


class _NeverTied(ref.Model):
    """tie_embeddings ignored: the output layer is always its own."""

    def __init__(self, *args, tie_embeddings=False, **kwargs):
        super().__init__(*args, **kwargs)


class _AlwaysTied(ref.Model):
    def __init__(self, *args, tie_embeddings=False, **kwargs):
        super().__init__(*args, tie_embeddings=True, **kwargs)


class _LastOnly(ref.Model):
    def forward(self, ids, cache=None):
        logits, caches = super().forward(ids, cache)
        return logits[:, -1:], caches


MODEL = Spec(
    id="modern_decoder-Model",
    submodules=("embedding", "layers.*", "norm", "output"),
    function="Model",
    depends=("modern_decoder-RMSNorm", "modern_decoder-DecoderLayer"),  # built of them
    inputs=_model_calls,
    reference=ref.Model,
    driver="modern_decoder.drive_model",
    parts=("logits", "cached keys", "cached values"),
    variant=_model_variant,
    rules=(
        Rule("the output layer tied to the embedding (tie_embeddings=True, Qwen 3's small models)",
             lambda call: bool(call.args[10])),
        Rule("an output layer of its own (tie_embeddings=False, Llama 3 8B)", lambda call: not call.args[10]),
        Rule("QK-norm (Qwen 3)", lambda call: call.args[8]),
        Rule("no QK-norm (Llama)", lambda call: not call.args[8]),
        Rule("several layers, each with its own cache", lambda call: call.args[2] >= 2),
        Rule("several tokens at once (a prompt): logits for every position", lambda call: _chunks(call)[0] > 1),
        Rule("one new token after a cache", lambda call: any(n == 1 for n in _chunks(call)[1:])),
        Rule("an eps given, as large as the mean squares (the final norm is built with it too)",
             lambda call: call.args[9] is not None and call.args[9] >= 0.5),
        Rule("final-norm and layer-norm weights of both signs, none near 1",
             lambda call: bool(np.min(np.abs(np.asarray(call.args[-4]) - 1)) > 0.1)),
    ),
    knobs=(
        Knob("final_norm", ((False, "there is no final norm: the output layer reads norm(x), the stream after the "
                                    "last layer normalized by the model's RMSNorm (transformers' model.norm)"),)),
        Knob("embed_scale", (("sqrt_d_model", "the embedding is scaled by sqrt(d_model), as Gemma (and the 2017 "
                                              "Transformer) do; Llama and Qwen feed the embedding as it is"),)),
        Knob("cache", (
            ("none", "the layers are called without their cache: the new tokens restart at position 0 and see "
                     "none of the earlier ones; hand layer i its own cache, layer(x, cache[i]), and return the "
                     "list of the caches the layers returned"),
            ("first", "the cache of layer 0 is handed to every layer: each layer has its own keys and values, "
                      "layer(x, cache[i]) for layer i"),
        )),
        Knob("eps_to", (
            ("not_to_layers", "the layers are built without the eps given (their default 1e-6): pass it on, "
                              "DecoderLayer(d_model, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps)"),
            ("not_to_norm", "the final norm is built without the eps given (its default 1e-6): RMSNorm(d_model, "
                            "eps)"),
        )),
    ),
    errors=(
        Raises("{what} raised {error}: the model returns logits for every position, (batch, new_len, vocab_size), "
               "not the last position's only (generation picks the last row itself)", example=_LastOnly,
               match="one row of logits per new token"),
        Raises("{what} raised {error}", example=_NeverTied, match="tie_embeddings=True, but output.weight"),
        Raises("{what} raised {error}", example=_AlwaysTied, match="output.weight is embedding.weight, but"),
    ),
    figures=("modern_decoder-Model-figure",),
)

SPECS = (RMS_NORM, SWIGLU, ATTENTION, DECODER_LAYER, MODEL)
