"""Drivers of notebook 07 (encoder): build, load by name, call in eval mode, hand back tensors.

They hold no reference and no secret. Parameter names are those of
torch.nn.TransformerEncoderLayer (self_attn, linear1, linear2, norm1, norm2), so that a
learner's layer and torch's load the same state dict. Each module is built with
dropout=0.5 and called twice in eval mode: the grader compares both outputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

LAYER_KEYS = ("self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
              "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
              "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias")

# what to write in __init__ for each parameter's owner (the message of a missing or misshaped name)
_CREATE = {
    "self_attn": "self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)",
    "linear1": "self.linear1 = nn.Linear(d_model, d_ff)",
    "linear2": "self.linear2 = nn.Linear(d_ff, d_model)",
    "norm1": "self.norm1 = nn.LayerNorm(d_model)",
    "norm2": "self.norm2 = nn.LayerNorm(d_model)",
    "embed": "self.embed = nn.Embedding(vocab_size, d_model)",
    "layers": "self.layers = nn.ModuleList([EncoderLayer(d_model, heads, d_ff, dropout) for _ in range(layers)])",
}


def _how(key: str) -> str:
    parts = key.split(".")
    if parts[0] == "layers":
        if len(parts) > 2 and parts[2] in _CREATE:
            return f"{_CREATE['layers']}, each layer with {_CREATE[parts[2]]}"
        return _CREATE["layers"]
    return _CREATE.get(parts[0], "")


def load_by_name(module: Any, arrays: dict, owner: str) -> None:
    """Copy ``arrays`` (name -> array) into ``module``'s parameters of the same names.

    Raises a one-line error naming what to create when a name is missing, has another
    shape, when the module has parameters torch's layer does not have, or when layers
    share their parameters. Buffers (e.g. a positional-encoding table) are kept as they are.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{owner} is not a torch.nn.Module: subclass nn.Module and call super().__init__() first")
    every = list(module.named_parameters(remove_duplicate=False))
    if len({id(p) for _, p in every}) < len(every):
        raise ValueError(f"{owner}: some layers share their parameters (the same module object appears twice, "
                         "e.g. [layer] * N). Build a new layer for each position: nn.ModuleList([EncoderLayer(...) "
                         "for _ in range(layers)])")
    state = module.state_dict()
    for key, array in arrays.items():
        if key not in state:
            raise AttributeError(f"{owner} has no parameter {key}: create it in __init__ as {_how(key)}")
        if tuple(state[key].shape) != tuple(np.shape(array)):
            raise ValueError(f"{owner}.{key} should have shape {tuple(np.shape(array))}, but it has "
                             f"{tuple(state[key].shape)}: {_how(key)}")
    extra = [name for name, _ in every if name not in arrays]
    if extra:
        raise ValueError(f"{owner} has parameters that torch's layer does not have: {', '.join(extra[:4])}"
                         f"{' ...' if len(extra) > 4 else ''}. Use only the layers the docstring names")
    for key, array in arrays.items():
        state[key] = torch.as_tensor(np.asarray(array), dtype=state[key].dtype)
    module.load_state_dict(state, strict=True)


def _build(cls: Any, args: tuple, kwargs: dict) -> Any:
    if not isinstance(cls, type):
        raise TypeError(f"it should be a class (an nn.Module subclass), but it is a {type(cls).__name__}")
    return cls(*args, **kwargs)


def _twice(module: Any, *inputs: Any) -> tuple:
    import torch

    module.eval()
    with torch.no_grad():
        return module(*inputs), module(*inputs)


def drive_sublayer_connection(fn: Any) -> Any:
    """A sublayer_connection function -> fn(x, W, b, gamma, beta, eps, norm_first) returning
    ``sublayer_connection(x, sublayer, norm[, norm_first=norm_first])``.

    The sublayer is ``t -> tanh(t @ W.T + b)`` and the norm an nn.LayerNorm(d, eps) holding
    gamma and beta, both float32 and without autograd; norm_first None is not passed
    (the default is used).
    """
    import torch

    def run_connection(x, W, b, gamma, beta, eps, norm_first=None):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        W, b = torch.tensor(W, dtype=torch.float32), torch.tensor(b, dtype=torch.float32)

        def tanh_affine(t):
            return torch.tanh(t @ W.T + b)

        norm = torch.nn.LayerNorm(len(gamma), eps=float(eps))
        with torch.no_grad():
            norm.weight.copy_(torch.as_tensor(gamma))
            norm.bias.copy_(torch.as_tensor(beta))
            x = torch.tensor(x, dtype=torch.float32)
            if norm_first is None:
                return fn(x, tanh_affine, norm)
            return fn(x, tanh_affine, norm, norm_first=bool(norm_first))

    return run_connection


def drive_encoder_layer(cls: Any) -> Any:
    """An EncoderLayer class -> fn(d_model, heads, d_ff, norm_first, <12 arrays in LAYER_KEYS order>,
    x, padding_mask) returning the outputs of two calls in eval mode.

    Builds ``cls(d_model, heads, d_ff, dropout=0.5, norm_first=norm_first)``, loads the arrays
    by name and calls ``module(x)`` or ``module(x, padding_mask)`` (bool, True = real token).
    """
    import torch

    def run_layer(d_model, heads, d_ff, norm_first, *arrays):
        params, (x, mask) = arrays[:len(LAYER_KEYS)], arrays[len(LAYER_KEYS):]
        d_model, heads, d_ff = int(d_model), int(heads), int(d_ff)
        module = _build(cls, (d_model, heads, d_ff), {"dropout": 0.5, "norm_first": bool(norm_first)})
        owner = f"{getattr(cls, '__name__', 'EncoderLayer')}({d_model}, {heads}, {d_ff})"
        load_by_name(module, dict(zip(LAYER_KEYS, params)), owner)
        x = torch.tensor(x, dtype=torch.float32)
        if mask is None:
            return _twice(module, x)
        return _twice(module, x, torch.tensor(mask, dtype=torch.bool))

    return run_layer


def drive_encoder(cls: Any) -> Any:
    """An Encoder class -> fn(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, embed.weight,
    <12 arrays per layer in LAYER_KEYS order>, src) returning the outputs of two calls in eval mode.

    Builds ``cls(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id=pad_id, dropout=0.5)``,
    loads the arrays by name (embed.weight, layers.<i>.<name>) and calls ``module(src)`` on int64 ids.
    """
    import torch

    def run_encoder(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, *arrays):
        sizes = tuple(int(v) for v in (vocab_size, d_model, heads, d_ff, layers, max_len))
        module = _build(cls, sizes, {"pad_id": int(pad_id), "dropout": 0.5})
        keys = ["embed.weight"] + [f"layers.{i}.{k}" for i in range(sizes[4]) for k in LAYER_KEYS]
        owner = f"{getattr(cls, '__name__', 'Encoder')}(vocab_size={sizes[0]}, d_model={sizes[1]}, ...)"
        load_by_name(module, dict(zip(keys, arrays[:-1])), owner)
        return _twice(module, torch.tensor(arrays[-1], dtype=torch.int64))

    return run_encoder
