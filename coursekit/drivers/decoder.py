"""Drivers of notebook 08 (decoder): build the learner's module, load the grader's weights
into it by name, call it in eval mode, hand back tensors. No reference, no secret.

- ``decoder.decoder_layer``: a ``DecoderLayer`` class, loaded with the parameters of a
  torch.nn.TransformerDecoderLayer (the same names), called on several (y, memory) pairs.
- ``decoder.decoder_stack``: a ``Decoder`` class (embedding, positional encoding, a
  ModuleList of layers), loaded by name, called on several (tgt_in, memory) pairs.
- ``decoder.influence_probe``: a ``future_influence(decoder, tgt_in, memory, position,
  new_token)`` function, handed a small deterministic decoder built here from the given
  arrays (a stand-in, not a Transformer), whose causality the grader chose.
"""
from __future__ import annotations

import numpy as np

# The parameters of torch.nn.TransformerDecoderLayer, in the order the grader sends them.
LAYER_PARAMS = (
    "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
    "multihead_attn.in_proj_weight", "multihead_attn.in_proj_bias", "multihead_attn.out_proj.weight",
    "multihead_attn.out_proj.bias",
    "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
    "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "norm3.weight", "norm3.bias",
)

_HOW = {
    "self_attn": "self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)",
    "multihead_attn": "self.multihead_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)",
    "linear1": "self.linear1 = nn.Linear(d_model, d_ff)",
    "linear2": "self.linear2 = nn.Linear(d_ff, d_model)",
    "norm1": "self.norm1 = nn.LayerNorm(d_model)", "norm2": "self.norm2 = nn.LayerNorm(d_model)",
    "norm3": "self.norm3 = nn.LayerNorm(d_model)",
    "embed": "self.embed = nn.Embedding(vocab_size, d_model)",
    "layers": "self.layers = nn.ModuleList([DecoderLayer(...) for _ in range(layers)])",
}


def _load(module, owner: str, names, arrays) -> None:
    """Copy each array into the parameter of that dotted name; a one-line error names what is missing."""
    import torch

    for name, array in zip(names, arrays):
        target, parts = module, name.split(".")
        for depth, part in enumerate(parts):
            child = getattr(target, part, None)
            if child is None and isinstance(target, torch.nn.ModuleList) and part.isdigit():
                child = target[int(part)] if int(part) < len(target) else None
            if child is None:
                path = ".".join(parts[:depth + 1])
                if parts[0] == "layers" and depth == 1:
                    raise AttributeError(f"{owner}.layers has no layer {part}: build one DecoderLayer per layer "
                                         f"({_HOW['layers']})")
                if part in _HOW:
                    raise AttributeError(f"{owner} has no attribute {path} (the grader loads the weights of "
                                         f"torch's TransformerDecoderLayer by name): create it in __init__ as "
                                         f"{_HOW[part]}")
                owner_part = parts[depth - 1] if depth else owner
                raise AttributeError(f"{owner}.{'.'.join(parts[:depth])} has no {part}: it should be "
                                     f"{_HOW.get(owner_part, 'a torch layer').split(' = ')[-1]}")
            target = child
        if not isinstance(target, torch.Tensor):
            raise TypeError(f"{owner}.{name} should be a parameter tensor, but it is a {type(target).__name__}")
        if tuple(target.shape) != tuple(np.shape(array)):
            raise ValueError(f"{owner}.{name} has shape {tuple(target.shape)}; torch's TransformerDecoderLayer "
                             f"has {tuple(np.shape(array))} there ({_HOW.get(name.split('.')[-2], name)})")
        target.copy_(torch.as_tensor(array, dtype=target.dtype))


def _one_tensor(result, owner: str):
    import torch

    if isinstance(result, (tuple, list)):
        raise TypeError(f"{owner}.forward returns a {type(result).__name__} of {len(result)} items; return one "
                        "tensor, the output (batch, tgt_len, d_model)")
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"{owner}.forward should return a torch tensor, but it returns a {type(result).__name__}")
    return result


def _mask(array):
    import torch

    return None if array is None else torch.tensor(np.asarray(array), dtype=torch.bool)


def decoder_layer(cls):
    """A DecoderLayer class -> fn(d_model, heads, d_ff, dropout, norm_first, *18 params, ys, memories,
    tgt_mask, memory_padding_mask) returning k + 1 outputs: forward(ys[i], memories[i], tgt_mask=...,
    memory_padding_mask=...) for each of the k pairs, then pair 0 once more (eval mode twice: equal
    unless dropout is still on).

    Builds ``cls(d_model, heads, d_ff, dropout=dropout, norm_first=norm_first)``, copies the
    parameters into the attributes of torch.nn.TransformerDecoderLayer's names (``LAYER_PARAMS``),
    switches to eval mode and calls it on float32 tensors without autograd.
    """
    import torch

    def run(d_model, heads, d_ff, dropout, norm_first, *rest):
        if not isinstance(cls, type):
            raise TypeError(f"it should be a class (an nn.Module subclass), but it is a {type(cls).__name__}")
        params, (ys, memories, tgt_mask, memory_mask) = rest[:len(LAYER_PARAMS)], rest[len(LAYER_PARAMS):]
        owner = f"{cls.__name__}({d_model}, {heads}, {d_ff}, dropout={dropout}, norm_first={norm_first})"
        module = cls(int(d_model), int(heads), int(d_ff), dropout=float(dropout), norm_first=bool(norm_first))
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"{owner} is not a torch.nn.Module: subclass nn.Module and call super().__init__() first")
        with torch.no_grad():
            _load(module, cls.__name__, LAYER_PARAMS, params)
            module.eval()
            outputs = []
            for y, memory in list(zip(ys, memories)) + [(ys[0], memories[0])]:
                out = module(torch.tensor(y, dtype=torch.float32), torch.tensor(memory, dtype=torch.float32),
                             tgt_mask=_mask(tgt_mask), memory_padding_mask=_mask(memory_mask))
                outputs.append(_one_tensor(out, cls.__name__))
            return tuple(outputs)

    return run


def decoder_stack(cls):
    """A Decoder class -> fn(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout,
    embed_weight, *layer params (LAYER_PARAMS of layer 0, then of layer 1, ...), tgt_ins, memories,
    memory_padding_mask) returning k + 1 outputs, as ``decoder_layer`` does.

    Builds ``cls(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout=dropout)``,
    copies ``embed.weight`` and ``layers.<i>.<name>`` by name, eval mode, no autograd.
    """
    import torch

    def run(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout, *rest):
        if not isinstance(cls, type):
            raise TypeError(f"it should be a class (an nn.Module subclass), but it is a {type(cls).__name__}")
        n = 1 + int(layers) * len(LAYER_PARAMS)
        params, (tgt_ins, memories, memory_mask) = rest[:n], rest[n:]
        owner = cls.__name__
        module = cls(int(vocab_size), int(d_model), int(heads), int(d_ff), int(layers), int(max_len), int(pad_id),
                     dropout=float(dropout))
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"{owner}(...) is not a torch.nn.Module: subclass nn.Module and call super().__init__() "
                            "first")
        names = ["embed.weight"] + [f"layers.{i}.{p}" for i in range(int(layers)) for p in LAYER_PARAMS]
        with torch.no_grad():
            _load(module, owner, names, params)
            module.eval()
            outputs = []
            for tgt_in, memory in list(zip(tgt_ins, memories)) + [(tgt_ins[0], memories[0])]:
                out = module(torch.tensor(tgt_in, dtype=torch.int64), torch.tensor(memory, dtype=torch.float32),
                             memory_padding_mask=_mask(memory_mask))
                outputs.append(_one_tensor(out, owner))
            return tuple(outputs)

    return run


def influence_probe(fn):
    """A ``future_influence`` function -> fn(E, L, W, U, tgt_in, memory, position, new_token)
    returning (what it returns, whether tgt_in was left unchanged).

    The decoder handed to it is a stand-in built from the arrays: for ids (batch, T) and memory
    (batch, S, d), ``tanh((L @ E[ids]) @ W + mean_s(memory) @ U)``, float32, (batch, T, d).
    Position s of the output reads the tokens t with L[s, t] != 0, so the grader chooses how
    causal it is. tgt_in is a torch int64 tensor, memory a float32 tensor.
    """
    import torch

    def run(E, L, W, U, tgt_in, memory, position, new_token):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        E_, L_, W_, U_ = (torch.tensor(a, dtype=torch.float32) for a in (E, L, W, U))

        def decoder(ids, mem):
            ids = torch.as_tensor(ids).long()
            mem = torch.as_tensor(mem, dtype=torch.float32)
            return torch.tanh((L_ @ E_[ids]) @ W_ + (mem.mean(dim=1) @ U_)[:, None, :])

        ids = torch.tensor(tgt_in, dtype=torch.int64)
        before = ids.clone()
        result = fn(decoder, ids, torch.tensor(memory, dtype=torch.float32), int(position), int(new_token))
        return result, np.bool_(torch.equal(ids, before))

    return run
