"""Drivers of notebook 15 (modern_decoder): build the learner's module, load the grader's weights
by name, call it, hand back the output.

They hold no reference and no secret, and judge nothing: their errors name kinds, names and
shapes, never values. The names are the notebook's (``weight`` of RMSNorm; ``W_gate``, ``W_up``,
``W_down`` of SwiGLU), which the notebook maps to transformers' (``weight``; ``gate_proj``,
``up_proj``, ``down_proj``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .encoder import _build, load_by_name
from .gpt import check_shared

# what to write in __init__ for each parameter's owner (the message of a missing or misshaped name)
_CREATE = {"weight": "self.weight, an nn.Parameter of d_model ones (torch.ones(d_model))",
           "W_gate": "self.W_gate = nn.Linear(d_model, d_ff, bias=False)",
           "W_up": "self.W_up = nn.Linear(d_model, d_ff, bias=False)",
           "W_down": "self.W_down = nn.Linear(d_ff, d_model, bias=False)",
           "W_q": "self.W_q = nn.Linear(d_model, heads * head_dim, bias=False)",
           "W_k": "self.W_k = nn.Linear(d_model, kv_heads * head_dim, bias=False)",
           "W_v": "self.W_v = nn.Linear(d_model, kv_heads * head_dim, bias=False)",
           "W_o": "self.W_o = nn.Linear(heads * head_dim, d_model, bias=False)",
           "q_norm": "self.q_norm, an RMSNorm(head_dim, eps), when qk_norm (and no q_norm otherwise)",
           "k_norm": "self.k_norm, an RMSNorm(head_dim, eps), when qk_norm (and no k_norm otherwise)",
           "input_norm": "self.input_norm, an RMSNorm(d_model, eps)",
           "post_attention_norm": "self.post_attention_norm, an RMSNorm(d_model, eps)",
           "attention": "self.attention, your Attention(d_model, heads, kv_heads, head_dim, rope_theta, qk_norm, eps)",
           "mlp": "self.mlp, your SwiGLU(d_model, d_ff)",
           "embedding": "self.embedding, an nn.Embedding(vocab_size, d_model)",
           "layers": "self.layers, an nn.ModuleList of `layers` DecoderLayer(d_model, heads, kv_heads, head_dim, d_ff, "
                     "rope_theta, qk_norm, eps)",
           "norm": "self.norm, the final RMSNorm(d_model, eps)",
           "output": "self.output, an nn.Linear(d_model, vocab_size) without bias",
           "gate": "self.gate, the router: an nn.Linear(d_model, experts) without bias",
           "experts": "self.experts, an nn.ModuleList of `experts` SwiGLU(d_model, d_ff)"}


def _check_names(module: Any, arrays: dict, owner: str, create: dict | None = None) -> None:
    """Every name sent is in ``module``'s state dict (tied names included) with the shape sent; a missing or
    misshaped name is told what to create (``create``: name -> what it is, default notebook 15's)."""
    create = _CREATE if create is None else create
    state = module.state_dict()
    for key in arrays:
        if key not in state:
            raise AttributeError(f"{owner} has no parameter {key}: create it in __init__ as "
                                 f"{create[key.split('.')[0]]}")
        if tuple(state[key].shape) != tuple(np.shape(arrays[key])):
            raise ValueError(f"{owner}.{key} should have shape {tuple(np.shape(arrays[key]))}, but it has "
                             f"{tuple(state[key].shape)}: {create[key.split('.')[0]]}")


def _load(module: Any, arrays: dict, owner: str, create: dict | None = None) -> None:
    import torch

    if isinstance(module, torch.nn.Module):
        _check_names(module, arrays, owner, create)
    load_by_name(module, arrays, owner)


def _forward(module: Any, x: Any) -> Any:
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
        return _forward(module, x)
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
        return _forward(module, x)
    return run


def _out_and_caches(answer: Any, size: int, name: str, returns: str, what: str, width: str) -> tuple:
    """(first, second) of a forward's pair, the first a (batch, size, width) tensor: one row per new token."""
    import torch

    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        kind = "nothing (None): is a `return` missing?" if answer is None else f"a {type(answer).__name__}"
        raise TypeError(f"{name}.forward should return {returns}, but it returned {kind}")
    first, second = answer
    if not isinstance(first, torch.Tensor) or first.dim() != 3 or first.shape[1] != size:
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__
        raise ValueError(f"{name}.forward on {size} new token(s) returned {what} of shape {shape}; expected "
                         f"(batch, {size}, {width}): one row {'of logits ' if width == 'vocab_size' else ''}per new "
                         "token")
    return first, second


def _step(answer: Any, size: int, name: str = "Attention") -> tuple:
    out, cache = _out_and_caches(answer, size, name, "(out, (keys, values))", "an output", "d_model")
    if not isinstance(cache, (tuple, list)) or len(cache) != 2:
        raise TypeError(f"{name}.forward should return (out, (keys, values)): the cache a pair (keys, values)")
    return out, tuple(cache)


def drive_attention(cls: Any) -> Any:
    """An Attention class -> fn(d_model, heads, kv_heads, head_dim, rope_theta, qk_norm, eps, W_q, W_k, W_v,
    W_o, q_norm, k_norm, x, chunks) returning (the outputs of every call concatenated, (batch, seq_len,
    d_model); the keys and the values of the cache the last call returned).

    The module is built as ``cls(d_model, heads, kv_heads, head_dim, rope_theta=..., qk_norm=..., eps=...)``
    (rope_theta or eps None: not passed, its default), the weights loaded by name (nn.Linear's layout;
    q_norm.weight and k_norm.weight only when qk_norm), x float32 (batch, seq_len, d_model) fed
    ``chunks[0]`` tokens with no cache, then each next chunk with the cache the previous call returned.
    """
    def run(d_model, heads, kv_heads, head_dim, rope_theta, qk_norm, eps, W_q, W_k, W_v, W_o, q_norm, k_norm, x,
            chunks):
        sizes = tuple(int(n) for n in (d_model, heads, kv_heads, head_dim))
        options = {"qk_norm": bool(qk_norm)}
        options.update({name: float(value) for name, value in (("rope_theta", rope_theta), ("eps", eps))
                        if value is not None})
        arrays = {"W_q.weight": W_q, "W_k.weight": W_k, "W_v.weight": W_v, "W_o.weight": W_o}
        if qk_norm:
            arrays.update({"q_norm.weight": q_norm, "k_norm.weight": k_norm})
        return _chunked(cls, sizes, options, arrays, x, chunks, "Attention")
    return run


def _feed(module: Any, inputs: Any, chunks: Any, step: Any) -> tuple:
    """``inputs`` (batch, seq_len, ...) fed to ``module`` chunk by chunk, each call after the first with the cache
    the previous one returned; ``step(answer, size)`` checks an answer and hands back (rows, cache). Returns
    (the rows of every call concatenated, the last cache)."""
    import torch

    outs, cache, start = [], None, 0
    with torch.no_grad():
        for size in np.asarray(chunks).tolist():
            piece = inputs[:, start:start + size]
            out, cache = step(module(piece) if cache is None else module(piece, cache), size)
            outs.append(out)
            start += size
    return torch.cat(outs, dim=1), cache


def _chunked(cls: Any, sizes: tuple, options: dict, arrays: dict, x: Any, chunks: Any, name: str) -> tuple:
    """Build ``cls(*sizes, **options)``, load ``arrays`` by name, feed x chunk by chunk with the cache."""
    import torch

    module = _build(cls, sizes, options)
    _load(module, arrays, f"{getattr(cls, '__name__', name)}{sizes}")
    out, cache = _feed(module, torch.tensor(np.asarray(x), dtype=torch.float32), chunks,
                       lambda answer, size: _step(answer, size, name))
    return out, torch.as_tensor(cache[0]), torch.as_tensor(cache[1])


def drive_decoder_layer(cls: Any) -> Any:
    """A DecoderLayer class -> fn(d_model, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps,
    input_norm, W_q, W_k, W_v, W_o, q_norm, k_norm, post_attention_norm, W_gate, W_up, W_down, x, chunks)
    returning what drive_attention's does: the module built as ``cls(d_model, heads, kv_heads, head_dim, d_ff,
    rope_theta=..., qk_norm=..., eps=...)``, the weights loaded by name (input_norm.weight,
    attention.W_q.weight, ..., attention.q_norm.weight and attention.k_norm.weight only when qk_norm,
    post_attention_norm.weight, mlp.W_gate.weight, ...), x fed chunk by chunk with the cache the previous
    call returned."""
    def run(d_model, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps, input_norm, W_q, W_k, W_v, W_o,
            q_norm, k_norm, post_attention_norm, W_gate, W_up, W_down, x, chunks):
        sizes = tuple(int(n) for n in (d_model, heads, kv_heads, head_dim, d_ff))
        options = {"qk_norm": bool(qk_norm)}
        options.update({name: float(value) for name, value in (("rope_theta", rope_theta), ("eps", eps))
                        if value is not None})
        arrays = {"input_norm.weight": input_norm, "attention.W_q.weight": W_q, "attention.W_k.weight": W_k,
                  "attention.W_v.weight": W_v, "attention.W_o.weight": W_o}
        if qk_norm:
            arrays.update({"attention.q_norm.weight": q_norm, "attention.k_norm.weight": k_norm})
        arrays.update({"post_attention_norm.weight": post_attention_norm, "mlp.W_gate.weight": W_gate,
                       "mlp.W_up.weight": W_up, "mlp.W_down.weight": W_down})
        return _chunked(cls, sizes, options, arrays, x, chunks, "DecoderLayer")
    return run


# the names of one DecoderLayer's weights, in the order drive_model receives them (stacked over the layers)
LAYER_NAMES = ("input_norm.weight", "attention.W_q.weight", "attention.W_k.weight", "attention.W_v.weight",
               "attention.W_o.weight", "attention.q_norm.weight", "attention.k_norm.weight",
               "post_attention_norm.weight", "mlp.W_gate.weight", "mlp.W_up.weight", "mlp.W_down.weight")
_TIE = "self.output.weight = self.embedding.weight (one nn.Parameter, not a copy)"


def _load_model(module: Any, arrays: dict, owner: str) -> None:
    """Copy ``arrays`` into ``module``'s parameters by name; a tied weight (output.weight is
    embedding.weight) is loaded through the one name sent. One-line errors name what to create
    when a name is missing or misshaped, when two names sent are one tensor (a layer repeated, or
    the output tied when tie_embeddings is False), or when a parameter has no name sent (an extra
    layer, or an output of its own when tie_embeddings is True)."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{owner} is not a torch.nn.Module: subclass nn.Module and call super().__init__() first")
    _check_names(module, arrays, owner)
    params = dict(module.named_parameters(remove_duplicate=False))
    groups: dict[int, list[str]] = {}
    for name, p in params.items():
        groups.setdefault(id(p), []).append(name)
    check_shared(groups.values(), arrays, owner, ("embedding", "output"),
                 "output.weight is embedding.weight, but tie_embeddings=False: tie them only when tie_embeddings "
                 "is True (Llama 3 8B's output layer is its own)",
                 "Give every layer its own parameters: nn.ModuleList([DecoderLayer(...) for _ in range(layers)])",
                 f"tie_embeddings=True, but output.weight is a parameter of its own: tie it, {_TIE}")
    with torch.no_grad():
        for key, array in arrays.items():
            params[key].copy_(torch.as_tensor(np.asarray(array), dtype=params[key].dtype))


def _model_step(answer: Any, size: int, layers: int) -> tuple:
    logits, caches = _out_and_caches(answer, size, "Model", "(logits, caches)", "logits", "vocab_size")
    if (not isinstance(caches, (tuple, list)) or len(caches) != layers
            or not all(isinstance(c, (tuple, list)) and len(c) == 2 for c in caches)):
        raise TypeError(f"Model.forward should return (logits, caches): caches a list of {layers} (keys, values) "
                        "pairs, one per layer, each as its DecoderLayer returned it")
    return logits, list(caches)


def drive_model(cls: Any) -> Any:
    """A Model class -> fn(vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps,
    tie_embeddings, embedding, *stacked, norm, output, ids, chunks) returning (the logits of every call
    concatenated, (batch, seq_len, vocab_size); the keys and the values of the caches the last call returned,
    stacked over the layers, (layers, batch, kv_heads, seq_len, head_dim)).

    The module is built as ``cls(vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta=...,
    qk_norm=..., eps=..., tie_embeddings=...)`` (rope_theta or eps None: its default); ``stacked`` are the 11
    weights of LAYER_NAMES, each (layers, ...) (q_norm and k_norm None without QK-norm), loaded as
    layers.<i>.<name>; output.weight is loaded only when not tied. ids (batch, seq_len) int64 are fed
    ``chunks[0]`` tokens with no cache, then each next chunk with the caches the previous call returned.
    """
    def run(vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps, tie_embeddings,
            embedding, *rest):
        import torch

        stacked, (norm, output, ids, chunks) = rest[:len(LAYER_NAMES)], rest[len(LAYER_NAMES):]
        sizes = tuple(int(n) for n in (vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff))
        options = {"qk_norm": bool(qk_norm), "tie_embeddings": bool(tie_embeddings)}
        options.update({name: float(value) for name, value in (("rope_theta", rope_theta), ("eps", eps))
                        if value is not None})
        arrays = {"embedding.weight": embedding, "norm.weight": norm}
        for i in range(sizes[2]):
            arrays.update({f"layers.{i}.{name}": weights[i] for name, weights in zip(LAYER_NAMES, stacked)
                           if weights is not None})
        if not tie_embeddings:
            arrays["output.weight"] = output
        module = _build(cls, sizes, options)
        _load_model(module, arrays, f"{getattr(cls, '__name__', 'Model')}{sizes}")
        logits, caches = _feed(module, torch.as_tensor(np.asarray(ids), dtype=torch.long), chunks,
                               lambda answer, size: _model_step(answer, size, sizes[2]))
        return (logits, torch.stack([torch.as_tensor(c[0]) for c in caches]),
                torch.stack([torch.as_tensor(c[1]) for c in caches]))
    return run


def drive_sparse_moe(cls: Any) -> Any:
    """A SparseMoE class -> fn(d_model, d_ff, experts, top_k, norm_topk_prob, gate, W_gate, W_up, W_down, x)
    returning (the output, (..., d_model); the router logits, (tokens, experts); the module's
    ``load_balancing_loss`` of those logits).

    The module is built as ``cls(d_model, d_ff, experts, top_k)`` (norm_topk_prob None: its default) or
    ``cls(d_model, d_ff, experts, top_k, norm_topk_prob=...)``, the weights loaded by name (gate.weight,
    (experts, d_model); experts.E.W_gate.weight, ... from the stacked W_gate (experts, d_ff, d_model), W_up
    and W_down (experts, d_model, d_ff)), x float32 of shape (..., d_model)."""
    def run(d_model, d_ff, experts, top_k, norm_topk_prob, gate, W_gate, W_up, W_down, x):
        import torch

        sizes = tuple(int(n) for n in (d_model, d_ff, experts, top_k))
        module = _build(cls, sizes, {} if norm_topk_prob is None else {"norm_topk_prob": bool(norm_topk_prob)})
        arrays = {"gate.weight": gate}
        for e in range(sizes[2]):
            arrays.update({f"experts.{e}.W_gate.weight": W_gate[e], f"experts.{e}.W_up.weight": W_up[e],
                           f"experts.{e}.W_down.weight": W_down[e]})
        _load(module, arrays, f"{getattr(cls, '__name__', 'SparseMoE')}{sizes}")
        with torch.no_grad():
            answer = module(torch.tensor(np.asarray(x), dtype=torch.float32))
            if not isinstance(answer, (tuple, list)) or len(answer) != 2:
                kind = "nothing (None): is a `return` missing?" if answer is None else f"a {type(answer).__name__}"
                raise TypeError(f"SparseMoE.forward should return (out, router_logits), but it returned {kind}")
            out, logits = answer
            if not isinstance(logits, torch.Tensor) or logits.shape[-1] != sizes[2]:
                shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
                raise ValueError(f"SparseMoE.forward returned router logits of shape {shape}; expected (tokens, "
                                 f"experts): one row of {sizes[2]} logits per token, the tokens flattened in order")
            logits = logits.reshape(-1, sizes[2])
            if not callable(getattr(module, "load_balancing_loss", None)):
                raise AttributeError("SparseMoE has no method load_balancing_loss: define "
                                     "def load_balancing_loss(self, router_logits) returning the scalar loss")
            return out, logits, module.load_balancing_loss(logits)
    return run
