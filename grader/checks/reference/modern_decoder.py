"""References of notebook 15, modern_decoder: the parts of the decoder of today's open models
(Llama 3, Qwen 3, Mistral), each the computation of Hugging Face transformers' module of the
same part: ``RMSNorm`` is ``LlamaRMSNorm``'s, ``SwiGLU`` is ``LlamaMLP``'s (no biases,
``hidden_act="silu"``). Linear weights are in nn.Linear's layout, (out_features, in_features).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """(..., d_model) -> (..., d_model): x / sqrt(mean(x^2) + eps) * weight over the last axis
    (Zhang and Sennrich 2019; LlamaRMSNorm). No mean is subtracted and there is no bias."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    """(..., d_model) -> (..., d_model): W_down(silu(W_gate(x)) * W_up(x)) (Shazeer 2020, FFN_SwiGLU
    without biases; LlamaMLP's gate_proj, up_proj and down_proj)."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.W_gate = nn.Linear(d_model, d_ff, bias=False)
        self.W_up = nn.Linear(d_model, d_ff, bias=False)
        self.W_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.W_down(F.silu(self.W_gate(x)) * self.W_up(x))
