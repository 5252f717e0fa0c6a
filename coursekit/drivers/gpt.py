"""Drivers of notebook 12 (gpt): build, load by name, call, hand back tensors.

They hold no reference and no secret; the grader judges what comes back. Their error
messages reach the learner as the diagnosis, so they name what to create or fix.

- ``gpt.block``: a ``Block`` class, built with dropout 0.3, loaded with the grader's
  parameters by name (attn.W_q ... attn.W_o, norm1, norm2, linear1, linear2), called twice
  in eval mode.
- ``gpt.model``: a ``GPT`` class, built with dropout 0.3 and ``tie_weights`` as asked, loaded
  by name (tok_embed, pos_embed, blocks.<i>..., norm, and lm_head when not tied), called twice
  in eval mode; it also reports whether lm_head shares tok_embed's weight.
- ``gpt.evaluation``: a ``perplexity`` function, handed a bigram stand-in language model
  (``BigramLM``) with dropout, left in training mode, and a list of batches.
- ``gpt.initialised``: a ``gpt2_init`` function, handed a GPT's layout with PyTorch's initial
  values; it hands back each parameter's root mean square, mean and standard deviation after it.
- ``gpt.groups``: a ``param_groups`` function, handed a GPT's layout (``layout``: the notebook's
  names, tied or not) and a weight decay; it hands back each parameter's count and decay.
- ``gpt.cached``: a ``forward_cached`` function, handed the parts of a GPT (``parts_of``:
  modules without a forward of their own) and fed a prompt, then one token at a time.
- ``gpt.beam``: a ``beam_search`` function, handed a bigram stand-in language model.
- ``gpt.beam_cached``: a ``beam_search_cached`` function, handed the parts of a GPT; it also
  reports the shape of every batch of token ids the parts embedded (one per forward pass).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from .encoder import _build
from .transformer import _unpack

# what to write in __init__ for the owner of each parameter (the first part of its name)
_CREATE = {
    "attn": "self.attn = MultiHeadAttention(d_model, heads) (notebook 06's, in the helper cell)",
    "norm1": "self.norm1 = nn.LayerNorm(d_model)",
    "norm2": "self.norm2 = nn.LayerNorm(d_model)",
    "linear1": "self.linear1 = nn.Linear(d_model, d_ff)",
    "linear2": "self.linear2 = nn.Linear(d_ff, d_model)",
    "tok_embed": "self.tok_embed = nn.Embedding(vocab_size, d_model)",
    "pos_embed": "self.pos_embed = nn.Embedding(max_len, d_model) (learned positions, one row per position)",
    "blocks": "self.blocks = nn.ModuleList([Block(d_model, heads, d_ff, dropout) for _ in range(layers)])",
    "norm": "self.norm = nn.LayerNorm(d_model) (the final norm)",
    "lm_head": "self.lm_head = nn.Linear(d_model, vocab_size, bias=False)",
}
TIE = "tie them with self.lm_head.weight = self.tok_embed.weight (one nn.Parameter, not a copy)"


def _how(name: str) -> str:
    """Where and how to create the owner of parameter ``name`` (kept short: the kernel cuts long messages)."""
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 2 and parts[2] in _CREATE:
        return f"in Block.__init__ as {_CREATE[parts[2]]}"
    return f"in __init__ as {_CREATE[parts[0]]}" if parts[0] in _CREATE else "as the docstring says"


def check_shared(groups: Any, arrays: dict, owner: str, pair: tuple, tied: str, repeated: str, tie: str) -> None:
    """Each group of names of one tensor (``groups``) must hold exactly one name the grader sends
    (``arrays``). Two names sent that are one tensor: the embedding and the output layer of ``pair``
    (their owners) tied when they should not be (error ``tied``), or a layer repeated (``repeated``);
    no name sent: the output layer untied when it should be tied (``tie``, the hint), or an extra
    parameter."""
    for group in groups:
        sent = [n for n in group if n in arrays]
        if len(sent) > 1:
            if {n.split(".")[0] for n in sent} == set(pair):
                raise ValueError(f"{owner}: {tied}")
            raise ValueError(f"{owner}: {sent[0]} and {sent[1]} are one tensor. {repeated}")
        if not sent:
            extra = group[0]
            hint = tie if extra == f"{pair[1]}.weight" else "use only the layers the docstring names"
            raise ValueError(f"{owner} has a parameter the docstring does not name, {extra}: {hint}")


def load_by_name(module: Any, arrays: dict, owner: str) -> None:
    """Copy ``arrays`` (dotted name -> array) into ``module``'s parameters of those names.

    A parameter may have several names (tied weights: lm_head.weight is tok_embed.weight);
    it is loaded through the one name the grader sends. One-line errors name what to create
    when a name is missing or misshaped, when two names the grader sends share one tensor
    (one Block object repeated, or weights tied that should not be), and when a parameter
    has no name the grader sends (an extra layer, a bias, an untied lm_head).
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{owner} is not a torch.nn.Module: subclass nn.Module and call super().__init__() first")
    names: dict[int, list[str]] = {}
    params = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        params[name] = p
    for key, array in arrays.items():
        if key not in params:
            raise AttributeError(f"{owner} has no parameter {key}: create it {_how(key)}")
        if tuple(params[key].shape) != tuple(np.shape(array)):
            raise ValueError(f"{owner}.{key} should have shape {tuple(np.shape(array))}, but it has "
                             f"{tuple(params[key].shape)}: {_how(key)}")
    check_shared(names.values(), arrays, owner, ("tok_embed", "lm_head"),
                 "lm_head.weight is tok_embed.weight, but tie_weights=False: tie them only when tie_weights is True",
                 "Give every block its own parameters: a new Block per layer, nn.ModuleList([Block(...) for _ in "
                 "range(layers)])", TIE)
    with torch.no_grad():
        for key, array in arrays.items():
            params[key].copy_(torch.as_tensor(np.asarray(array), dtype=params[key].dtype))


def block(cls: Any) -> Any:
    """A Block class -> fn(spec, flat, x) returning forward(x) twice in eval mode, as float32
    (batch, seq_len, d_model) tensors.

    spec is JSON with d_model, heads, d_ff and the parameters' names and shapes; flat holds
    their values in order. Builds ``cls(d_model, heads, d_ff, dropout=0.3)``.
    """
    import torch

    def run(spec, flat, x):
        config = json.loads(spec)
        sizes = [int(config[k]) for k in ("d_model", "heads", "d_ff")]
        module = _build(cls, sizes, {"dropout": DROPOUT})
        owner = cls.__name__   # (the grader's diagnosis names the sizes)
        load_by_name(module, _unpack(spec, flat), owner)
        module.eval()
        x = torch.tensor(x, dtype=torch.float32)
        with torch.no_grad():
            return module(x), module(x)

    return run


DROPOUT = 0.3  # what the block and the model are built with


def model(cls: Any) -> Any:
    """A GPT class -> fn(spec, flat, ids) returning (logits, logits again, [lm_head shares
    tok_embed's weight, number of parameters, number of nn.Dropout modules whose p is not the
    dropout given]) in eval mode; logits (batch, seq_len, vocab_size). (Eval mode switches dropout
    off, so a Block built without the dropout shows only in its modules.)

    spec is JSON with the constructor's sizes, tie_weights and the parameters' names and shapes.
    Builds ``cls(vocab_size, d_model, heads, d_ff, layers, max_len, tie_weights=..., dropout=0.3)``.
    """
    import torch

    def run(spec, flat, ids):
        config = json.loads(spec)
        sizes = [int(config[k]) for k in ("vocab_size", "d_model", "heads", "d_ff", "layers", "max_len")]
        tie = bool(config["tie_weights"])
        module = _build(cls, sizes, {"tie_weights": tie, "dropout": DROPOUT})
        owner = cls.__name__   # (the grader's diagnosis names the sizes)
        load_by_name(module, _unpack(spec, flat), owner)
        module.eval()
        ids = torch.tensor(ids, dtype=torch.int64)
        head, embed = getattr(module, "lm_head", None), getattr(module, "tok_embed", None)
        tied = getattr(head, "weight", None) is not None and getattr(head, "weight", None) is getattr(embed, "weight", 0)
        count = sum(p.numel() for p in module.parameters())
        other_p = sum(isinstance(m, torch.nn.Dropout) and m.p != DROPOUT for m in module.modules())
        with torch.no_grad():
            return module(ids), module(ids), np.array([tied, count, other_p], dtype=np.int64)

    return run


# ---------------------------------------------------------------- perplexity

def _bigram(table: np.ndarray, dropout: float):
    import torch

    class BigramLM(torch.nn.Module):
        """A stand-in language model: the logits after token t are row t of a fixed table,
        with dropout on them in training mode. It records the mode of each call."""

        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.tensor(table, dtype=torch.float32))
            self.dropout = torch.nn.Dropout(dropout)
            self.modes: list[bool] = []

        def forward(self, ids):
            self.modes.append(self.training)
            return self.dropout(self.table[ids])

    return BigramLM()


def _batches(ids: np.ndarray, shapes: np.ndarray) -> list:
    """The batches packed in ``ids`` (n, rows, cols), each cut to its (rows, cols) in ``shapes``."""
    import torch

    return [torch.tensor(ids[i, :r, :c], dtype=torch.int64) for i, (r, c) in enumerate(shapes.tolist())]


def evaluation(fn: Any) -> Any:
    """A perplexity function -> fn(table, ids, shapes, pad_id) returning (the perplexity as a
    float64 array, [the model was in training mode at some call, calls]) for a ``BigramLM``
    with dropout 0.5, handed over in training mode, and the batches packed in ids."""
    import torch

    def run(table, ids, shapes, pad_id):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        lm = _bigram(table, 0.5)
        lm.train()
        torch.manual_seed(0)   # a learner who leaves dropout on gets the same draws as the catalogue
        value = fn(lm, _batches(ids, shapes), int(pad_id))
        if isinstance(value, torch.Tensor):
            value = value.detach()
        if value is None:
            raise TypeError("perplexity returns nothing (None): is a `return` missing? It returns one number")
        if isinstance(value, (tuple, list, dict, str)):
            raise TypeError(f"perplexity should return one number (a float), not a {type(value).__name__}")
        return np.asarray(float(value)), np.array([any(lm.modes), len(lm.modes)], dtype=np.int64)

    return run


# ---------------------------------------------------------------- GPT-2's initialisation

def initialised(fn: Any) -> Any:
    """A gpt2_init function -> fn(spec, seed) returning (for each name of a GPT's parameters,
    ``layout(spec)`` with PyTorch's initial values drawn after torch.manual_seed(seed), a float64
    row [root mean square, mean, standard deviation] after fn(model): (names, 3); [fn returned
    the model itself])."""
    import torch

    def run(spec, seed):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        torch.manual_seed(int(seed))
        model = layout(json.loads(spec))
        answer = fn(model)
        rows = []
        for _, parameter in model.named_parameters(remove_duplicate=False):
            x = parameter.detach().double().reshape(-1)
            rows.append([float(x.square().mean().sqrt()), float(x.mean()), float(x.std(unbiased=False))])
        return np.array(rows, dtype=np.float64), np.array([answer is model], dtype=np.int64)

    return run


# ---------------------------------------------------------------- weight decay's parameter groups

def groups(fn: Any) -> Any:
    """A param_groups function -> fn(spec, weight_decay) returning, for each name of a GPT's
    parameters (``layout(spec)``, named_parameters(remove_duplicate=False): a tied weight has two
    names), a float64 row [in how many of the returned groups' params the tensor is, the
    weight_decay of the first group holding it (-1 if none)]: (names, 2)."""
    import torch

    def run(spec, weight_decay):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        model = layout(json.loads(spec))
        answer = fn(model, float(weight_decay))
        if answer is None:
            raise TypeError("param_groups returns nothing (None): is a `return` missing? It returns a list of "
                            "two dicts {'params': [...], 'weight_decay': ...}")
        if isinstance(answer, dict) or not isinstance(answer, (list, tuple)):
            raise TypeError(f"param_groups should return a list of dicts (AdamW's parameter groups), not a "
                            f"{type(answer).__name__}")
        held: list[tuple[list, float]] = []
        for group in answer:
            if not isinstance(group, dict) or "params" not in group:
                raise TypeError("each parameter group is a dict {'params': [tensors], 'weight_decay': float}")
            if "weight_decay" not in group:
                raise ValueError("a group without 'weight_decay' gets AdamW's default (0.01): give each group "
                                 "its own, weight_decay or 0.0")
            params = group["params"]
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            if any(not isinstance(p, torch.Tensor) for p in params):
                raise TypeError("'params' holds the parameters themselves (nn.Parameter tensors), not their names")
            held.append((params, float(group["weight_decay"])))
        rows = []
        for _, parameter in model.named_parameters(remove_duplicate=False):
            counts = [sum(p is parameter for p in params) for params, _ in held]
            decay = next((d for (_, d), n in zip(held, counts) if n), -1.0)
            rows.append([sum(counts), decay])
        return np.array(rows, dtype=np.float64)

    return run


# ---------------------------------------------------------------- the KV cache

def _parts(torch: Any):
    class Parts(torch.nn.Module):
        """A GPT or Block holding its layers only: forward_cached runs the parts itself."""

        def forward(self, *args, **kwargs):
            raise TypeError("forward_cached calls the model's parts (model.tok_embed, block.attn.W_q, "
                            "block.norm1, ...), not model(...) or block(...)")

    return Parts


def parts_of(config: dict, arrays: dict):
    """A GPT's parts as plain modules with the notebook's names, loaded with ``arrays``:
    tok_embed, pos_embed, blocks[i] (attn with W_q, W_k, W_v, W_o and the ints d_model,
    heads, d_k; norm1, norm2, linear1, linear2), norm, lm_head tied to tok_embed. Calling the
    model or a block raises TypeError: only the parts compute."""
    gpt = layout(config)
    load_by_name(gpt, arrays, "the model")
    return gpt.eval()


def layout(config: dict):
    """A GPT's parts as plain modules with the notebook's names, in the notebook's order (tok_embed,
    pos_embed, blocks, norm, lm_head), not loaded: PyTorch's initial values. lm_head is tied to
    tok_embed unless ``config["tie_weights"]`` is false."""
    import torch
    from torch import nn

    Parts = _parts(torch)
    d, h, f = (int(config[k]) for k in ("d_model", "heads", "d_ff"))
    gpt = Parts()
    gpt.tok_embed = nn.Embedding(int(config["vocab_size"]), d)
    gpt.pos_embed = nn.Embedding(int(config["max_len"]), d)
    gpt.blocks = nn.ModuleList()
    for _ in range(int(config["layers"])):
        layer = Parts()
        layer.attn = nn.Module()
        layer.attn.d_model, layer.attn.heads, layer.attn.d_k = d, h, d // h
        for name in ("W_q", "W_k", "W_v", "W_o"):
            setattr(layer.attn, name, nn.Linear(d, d))
        layer.norm1, layer.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        layer.linear1, layer.linear2 = nn.Linear(d, f), nn.Linear(f, d)
        gpt.blocks.append(layer)
    gpt.norm = nn.LayerNorm(d)
    gpt.lm_head = nn.Linear(d, int(config["vocab_size"]), bias=False)
    if config.get("tie_weights", True):
        gpt.lm_head.weight = gpt.tok_embed.weight
    return gpt


def _cache_shapes(cache: Any) -> np.ndarray:
    """(layers, 2, 4): the shape of each layer's keys and values, -1 where one is not a 4-d tensor."""
    import torch

    if not isinstance(cache, (list, tuple)):
        raise TypeError(f"forward_cached should return (logits, cache) with cache a list of (keys, values) per "
                        f"block, but the cache is a {type(cache).__name__}")
    out = np.full((len(cache), 2, 4), -1, dtype=np.int64)
    for i, pair in enumerate(cache):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError("each item of the cache should be one block's (keys, values)")
        for j, t in enumerate(pair):
            if isinstance(t, torch.Tensor) and t.dim() == 4:
                out[i, j] = t.shape
    return out


def cached(fn: Any) -> Any:
    """A forward_cached function -> fn(spec, flat, ids, chunks) returning (the logits of every
    position, concatenated over the calls (batch, seq_len, vocab_size); the shapes of the cache
    after each call (calls, layers, 2, 4)).

    The parts of a GPT (``parts_of``) are loaded with the grader's weights; the first call gets
    ``ids[:, :chunks[0]]`` and no cache, each later call the next ``chunks[i]`` tokens and the
    cache the previous call returned.
    """
    import torch

    def run(spec, flat, ids, chunks):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        gpt = parts_of(json.loads(spec), _unpack(spec, flat))
        ids = torch.tensor(ids, dtype=torch.int64)
        logits, shapes, cache, start = [], [], None, 0
        with torch.no_grad():
            for size in np.asarray(chunks).tolist():
                answer = fn(gpt, ids[:, start:start + size], cache)
                if answer is None:
                    raise TypeError("forward_cached returns nothing (None): is a `return` missing? It returns "
                                    "(logits, cache)")
                if not isinstance(answer, (tuple, list)) or len(answer) != 2:
                    raise TypeError("forward_cached should return a pair (logits, cache)")
                step, cache = answer
                if not isinstance(step, torch.Tensor) or step.dim() != 3 or step.shape[1] != size:
                    shape = tuple(step.shape) if isinstance(step, torch.Tensor) else type(step).__name__
                    raise ValueError(f"forward_cached(model, ids, cache) for ids of {size} new token(s) returned "
                                     f"logits of shape {shape}; expected (batch, {size}, vocab_size): the logits "
                                     "of every new position")
                logits.append(step)
                shapes.append(_cache_shapes(cache))
                start += size
        return torch.cat(logits, dim=1), np.stack(shapes)

    return run


# ---------------------------------------------------------------- beam search

def _tokens_and_score(answer: Any, name: str) -> tuple:
    """A beam search's (tokens, score) as a tensor and a float64 array; TypeError names what to return."""
    import torch

    if answer is None:
        raise TypeError(f"{name} returns nothing (None): is a `return` missing? It returns (tokens, score)")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise TypeError(f"{name} should return a pair (tokens, score)")
    tokens, score = answer
    if isinstance(score, torch.Tensor):
        score = score.detach()
    return torch.as_tensor(tokens), np.asarray(float(score))


def beam(fn: Any) -> Any:
    """A beam_search function -> fn(table, prompt, beam_size, max_new_tokens, eos_id, alpha)
    returning (tokens, score) for a bigram stand-in model (no dropout) whose logits after token t
    are row t of ``table``."""
    import torch

    def run(table, prompt, beam_size, max_new_tokens, eos_id, alpha):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        lm = _bigram(table, 0.0).eval()
        answer = fn(lm, torch.tensor(prompt, dtype=torch.int64), int(beam_size), int(max_new_tokens),
                    int(eos_id), float(alpha))
        return _tokens_and_score(answer, "beam_search")

    return run


# ---------------------------------------------------------------- batched generation

def batched(fn: Any) -> Any:
    """A generate_batch function -> fn(spec, flat, prompts, max_new_tokens, eos_id, pad_id) returning
    the new tokens, an int64 tensor (batch, max_new_tokens).

    The parts of a GPT (``parts_of``) are loaded with the grader's weights; ``prompts`` (batch,
    longest) holds the prompts, each followed by -1 where it is shorter than the longest, and the
    function gets them as a list of 1-d int64 tensors of their own lengths.
    """
    import torch

    def run(spec, flat, prompts, max_new_tokens, eos_id, pad_id):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        gpt = parts_of(json.loads(spec), _unpack(spec, flat))
        given = [torch.tensor([int(i) for i in row if i >= 0], dtype=torch.int64) for row in np.asarray(prompts)]
        batch, steps = len(given), int(max_new_tokens)
        with torch.no_grad():
            tokens = fn(gpt, given, steps, int(eos_id), int(pad_id))
        if tokens is None:
            raise TypeError("generate_batch returns nothing (None): is a `return` missing? It returns the new "
                            "tokens, (batch, max_new_tokens)")
        if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tuple(tokens.shape) != (
                batch, steps):
            shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"generate_batch returned {shape}; expected an int64 tensor ({batch}, {steps}), "
                             "(batch, max_new_tokens): one row per prompt, pad_id after a row's eos_id")
        return tokens.to(torch.int64)

    return run


# ---------------------------------------------------------------- beam search with the cache

def beam_cached(fn: Any) -> Any:
    """A beam_search_cached function -> fn(spec, flat, prompt, beam_size, max_new_tokens, eos_id,
    alpha) returning (tokens, score, forwarded): forwarded (calls, 2) int64, the (rows, columns) of
    the ids each forward pass embedded (a forward hook on tok_embed), in order.

    The parts of a GPT (``parts_of``) are loaded with the grader's weights; calling the model or a
    block raises TypeError (beam_search_cached runs it through forward_cached).
    """
    import torch

    def run(spec, flat, prompt, beam_size, max_new_tokens, eos_id, alpha):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        gpt = parts_of(json.loads(spec), _unpack(spec, flat))
        forwarded: list = []
        gpt.tok_embed.register_forward_hook(lambda module, inputs, output: forwarded.append(
            tuple(inputs[0].shape[-2:]) if inputs[0].dim() >= 2 else (1, inputs[0].numel())))
        with torch.no_grad():
            answer = fn(gpt, torch.tensor(prompt, dtype=torch.int64), int(beam_size), int(max_new_tokens),
                        int(eos_id), float(alpha))
        return (*_tokens_and_score(answer, "beam_search_cached"),
                np.array(forwarded, dtype=np.int64).reshape(-1, 2))

    return run
