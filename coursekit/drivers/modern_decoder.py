"""Drivers of notebook 15 (modern_decoder): build the learner's module, load the grader's weights
by name, call it, hand back the output.

They hold no reference and no secret, and judge nothing: their errors name kinds, names and
shapes, never values. The names are the notebook's (``weight`` of RMSNorm; ``W_gate``, ``W_up``,
``W_down`` of SwiGLU), which the notebook maps to transformers' (``weight``; ``gate_proj``,
``up_proj``, ``down_proj``).
"""
from __future__ import annotations

from typing import Any

from .encoder import _build, load_by_name

# what to write in __init__ for each parameter's owner (the message of a missing or misshaped name)
_CREATE = {"weight": "self.weight = nn.Parameter(torch.ones(d_model))",
           "W_gate": "self.W_gate = nn.Linear(d_model, d_ff, bias=False)",
           "W_up": "self.W_up = nn.Linear(d_model, d_ff, bias=False)",
           "W_down": "self.W_down = nn.Linear(d_ff, d_model, bias=False)"}


def _load(module: Any, arrays: dict, owner: str) -> None:
    import torch

    if isinstance(module, torch.nn.Module):
        state = module.state_dict()
        for key in arrays:
            if key not in state:
                raise AttributeError(f"{owner} has no parameter {key}: create it in __init__ as "
                                     f"{_CREATE[key.split('.')[0]]}")
    load_by_name(module, arrays, owner)


def _call(module: Any, x: Any) -> Any:
    import torch

    with torch.no_grad():
        return module(torch.tensor(x, dtype=torch.float32))


def drive_rms_norm(cls: Any) -> Any:
    """An RMSNorm class -> fn(d_model, eps, weight, x) returning ``module(x)``: the module built as
    ``cls(d_model)`` (eps None: its default) or ``cls(d_model, eps=eps)``, ``weight`` loaded by name,
    x float32 of shape (..., d_model)."""
    def run(d_model, eps, weight, x):
        d_model = int(d_model)
        module = _build(cls, (d_model,), {} if eps is None else {"eps": float(eps)})
        _load(module, {"weight": weight}, f"{getattr(cls, '__name__', 'RMSNorm')}({d_model})")
        return _call(module, x)
    return run


def drive_swiglu(cls: Any) -> Any:
    """A SwiGLU class -> fn(d_model, d_ff, W_gate, W_up, W_down, x) returning ``module(x)``: the module
    built as ``cls(d_model, d_ff)``, the three weights loaded as W_gate.weight, W_up.weight and
    W_down.weight (nn.Linear's layout, no biases), x float32 of shape (..., d_model)."""
    def run(d_model, d_ff, W_gate, W_up, W_down, x):
        d_model, d_ff = int(d_model), int(d_ff)
        module = _build(cls, (d_model, d_ff), {})
        _load(module, {"W_gate.weight": W_gate, "W_up.weight": W_up, "W_down.weight": W_down},
              f"{getattr(cls, '__name__', 'SwiGLU')}({d_model}, {d_ff})")
        return _call(module, x)
    return run
