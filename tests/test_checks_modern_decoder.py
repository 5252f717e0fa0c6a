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
    """The reference solutions of notebook 15 (RMSNorm, SwiGLU)."""
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
}

VARIANTS = {
    "modern_decoder-RMSNorm": [HuggingFaceStyle, TorchFunctional, FromTheNorm],
    "modern_decoder-SwiGLU": [HandWrittenSiLU, Functional, Einsum],
}

globals().update(shared_tests("modern_decoder", MISTAKES, VARIANTS, solutions="modern_decoder_notebook", seeds=6))
