"""Drivers of notebook 09 (transformer): build, load by name, call, hand back tensors.

They hold no reference and no secret; the grader judges what comes back.

- ``transformer.model``: a ``Transformer`` class, built with dropout 0.3, loaded with the
  grader's parameters by name (src_embed, tgt_embed, encoder_layers.<i>.<...>,
  decoder_layers.<i>.<...>, generator), called in eval mode: forward twice, then
  decode(encode(...)).
- ``transformer.greedy``: a ``greedy_decode`` function, handed a scripted stand-in model
  (``ScriptedModel``) whose next token the grader chose for every correct prefix.
- ``transformer.training``: a ``train_step`` function, handed a tiny stand-in model
  (``TinySeq2Seq``), an SGD optimizer, a LambdaLR scheduler and a plain cross-entropy
  loss_fn (no label smoothing), all of which record what they were given.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

# what to write in __init__ for each top-level name of the Transformer
_CREATE = {
    "src_embed": "self.src_embed = nn.Embedding(src_vocab, d_model)",
    "tgt_embed": "self.tgt_embed = nn.Embedding(tgt_vocab, d_model)",
    "encoder_layers": "self.encoder_layers = nn.ModuleList([EncoderLayer(d_model, heads, d_ff, dropout) "
                      "for _ in range(layers)])",
    "decoder_layers": "self.decoder_layers = nn.ModuleList([DecoderLayer(d_model, heads, d_ff, dropout) "
                      "for _ in range(layers)])",
    "generator": "self.generator = nn.Linear(d_model, tgt_vocab)",
}


def _unpack(spec: str, flat: np.ndarray) -> dict:
    """The grader's parameters: spec is JSON {"params": [[name, shape], ...], ...}; flat holds them in order."""
    out, start = {}, 0
    for name, shape in json.loads(spec)["params"]:
        size = int(np.prod(shape))
        out[name] = np.asarray(flat[start:start + size]).reshape(shape)
        start += size
    return out


def load_by_name(module: Any, arrays: dict, owner: str) -> None:
    """Copy ``arrays`` (dotted name -> array) into ``module``'s parameters of those names.

    One-line errors name what to create when a name is missing or has another shape, when
    the module has parameters the grader did not expect, or when two names share one tensor
    (tied weights, or one layer object repeated). Buffers are kept as they are.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{owner} is not a torch.nn.Module: subclass nn.Module and call super().__init__() first")
    every = list(module.named_parameters(remove_duplicate=False))
    if len({id(p) for _, p in every}) < len(every):
        seen, shared = {}, []
        for name, p in every:
            if id(p) in seen:
                shared.append(f"{seen[id(p)]} and {name}")
            seen.setdefault(id(p), name)
        raise ValueError(f"{owner}: {shared[0]} are one tensor. Give every layer its own parameters (a new "
                         "layer object per position, nn.ModuleList([... for _ in range(layers)])) and do not tie "
                         "the generator to the target embedding in this notebook")
    params = dict(every)
    for key, array in arrays.items():
        if key not in params:
            top = key.split(".")[0]
            how = _CREATE.get(top, "")
            raise AttributeError(f"{owner} has no parameter {key}" + (f": create it in __init__ as {how}" if how else ""))
        if tuple(params[key].shape) != tuple(np.shape(array)):
            top = key.split(".")[0]
            raise ValueError(f"{owner}.{key} should have shape {tuple(np.shape(array))}, but it has "
                             f"{tuple(params[key].shape)}: {_CREATE.get(top, 'see the docstring')}")
    extra = [name for name in params if name not in arrays]
    if extra:
        raise ValueError(f"{owner} has parameters the docstring does not name: {', '.join(extra[:3])}"
                         f"{' ...' if len(extra) > 3 else ''}. Use only src_embed, tgt_embed, encoder_layers, "
                         "decoder_layers and generator (the positional encoding is a buffer, not a parameter)")
    with torch.no_grad():
        for key, array in arrays.items():
            params[key].copy_(torch.as_tensor(np.asarray(array), dtype=params[key].dtype))


def model(cls: Any) -> Any:
    """A Transformer class -> fn(spec, flat_params, src, tgt_in) returning three (batch, tgt_len,
    tgt_vocab) tensors: forward(src, tgt_in) twice in eval mode (equal unless dropout is on),
    then decode(encode(src, src_mask), src_mask, tgt_in) with src_mask = src != pad_id.

    spec is JSON with the constructor's sizes and the parameters' names and shapes. Builds
    ``cls(src_vocab, tgt_vocab, d_model, heads, d_ff, layers, max_len, pad_id, dropout=0.3)``.
    """
    import torch

    def run(spec, flat, src, tgt_in):
        if not isinstance(cls, type):
            raise TypeError(f"it should be a class (an nn.Module subclass), but it is a {type(cls).__name__}")
        config = json.loads(spec)
        sizes = [int(config[k]) for k in ("src_vocab", "tgt_vocab", "d_model", "heads", "d_ff", "layers",
                                          "max_len", "pad_id")]
        module = cls(*sizes, dropout=0.3)
        owner = (f"{cls.__name__}(src_vocab={sizes[0]}, tgt_vocab={sizes[1]}, d_model={sizes[2]}, heads={sizes[3]}, "
                 f"d_ff={sizes[4]}, layers={sizes[5]}, ...)")
        load_by_name(module, _unpack(spec, flat), owner)
        for name in ("encode", "decode"):
            if not callable(getattr(module, name, None)):
                raise AttributeError(f"{owner} has no method {name}: greedy_decode calls model.encode(src, src_mask) "
                                     "and model.decode(memory, src_mask, tgt_in); forward uses them too")
        module.eval()
        src = torch.tensor(src, dtype=torch.int64)
        tgt_in = torch.tensor(tgt_in, dtype=torch.int64)
        with torch.no_grad():
            first = module(src, tgt_in)
            second = module(src, tgt_in)
            src_mask = src != sizes[7]
            third = module.decode(module.encode(src, src_mask), src_mask, tgt_in)
        return first, second, third

    return run


# ---------------------------------------------------------------- greedy decoding

class ScriptedModel:
    """A stand-in for a trained Transformer whose next token is fixed by ``plan``.

    ``plan`` (batch, steps) holds the token sentence b should produce at step t. Given a
    prefix tgt_in[b, :t+1] equal to [bos, plan[b, 0], ..., plan[b, t-1]], position t's
    logits peak at plan[b, t]; at any other prefix they peak at ``junk``. Every logit row
    carries a small fixed pattern so that no two logits tie. It counts its calls, and
    records whether each call received src_mask == (src != pad_id). After ``max_calls``
    calls to decode it raises (a decoding loop that never ends).
    """

    def __init__(self, plan, src, bos_id, pad_id, vocab, junk, max_calls):
        import torch

        self.plan, self.bos_id, self.vocab, self.junk = plan.tolist(), int(bos_id), int(vocab), int(junk)
        self.expected_mask = torch.as_tensor(src) != int(pad_id)
        self.encode_calls, self.decode_calls, self.mask_ok, self.max_calls = 0, 0, True, max_calls
        self.training = False

    def eval(self):
        return self

    def parameters(self):
        import torch

        return iter([torch.zeros(1)])

    def _check_mask(self, src_mask):
        import torch

        ok = (isinstance(src_mask, torch.Tensor) and src_mask.dtype == torch.bool
              and tuple(src_mask.shape) == tuple(self.expected_mask.shape) and bool((src_mask == self.expected_mask).all()))
        self.mask_ok = self.mask_ok and ok

    def encode(self, src, src_mask):
        import torch

        self.encode_calls += 1
        self._check_mask(src_mask)
        return torch.zeros(src.shape[0], src.shape[1], 4)

    def decode(self, memory, src_mask, tgt_in):
        import torch

        self.decode_calls += 1
        if self.decode_calls > self.max_calls:
            raise RuntimeError(f"model.decode was called more than {self.max_calls} times: the decoding loop must "
                               "stop after max_len steps")
        self._check_mask(src_mask)
        ids = torch.as_tensor(tgt_in).tolist()
        batch, length = len(ids), len(ids[0]) if ids else 0
        logits = torch.zeros(batch, length, self.vocab)
        for b in range(batch):
            for t in range(length):
                want = [self.bos_id] + self.plan[b][:t]
                top = self.plan[b][t] if t < len(self.plan[b]) and ids[b][:t + 1] == want else self.junk
                row = [0.1 * ((3 * b + 5 * t + 7 * v) % 11) for v in range(self.vocab)]
                row[top] = 4.0 + 0.01 * t
                logits[b, t] = torch.tensor(row)
        return logits

    def __call__(self, *args, **kwargs):
        raise TypeError("greedy_decode should call model.encode(src, src_mask) once and then "
                        "model.decode(memory, src_mask, tgt_in), not model(...)")


def greedy(fn: Any) -> Any:
    """A greedy_decode function -> fn(plan, src, bos_id, eos_id, pad_id, max_len, vocab, junk)
    returning (tokens, [encode calls, decode calls], [src_mask right]) for a ``ScriptedModel``.
    """
    import torch

    def run(plan, src, bos_id, eos_id, pad_id, max_len, vocab, junk):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        src = torch.tensor(src, dtype=torch.int64)
        stand_in = ScriptedModel(np.asarray(plan), src, bos_id, pad_id, vocab, junk, max_calls=int(max_len) + 3)
        tokens = fn(stand_in, src, int(bos_id), int(eos_id), int(pad_id), int(max_len))
        return (tokens, np.array([stand_in.encode_calls, stand_in.decode_calls], dtype=np.int64),
                np.array([stand_in.mask_ok]))

    return run


# ---------------------------------------------------------------- one training step

def _tiny_model(arrays: dict):
    import torch

    class TinySeq2Seq(torch.nn.Module):
        """A stand-in seq2seq model: logits[b, t] = out(tanh(tgt_embed[tgt_in[b, t]] + mean of
        src_embed over the real source tokens of sentence b)). It records each call's tgt_in
        and whether it was in training mode."""

        def __init__(self):
            super().__init__()
            self.src_embed = torch.nn.Parameter(torch.tensor(arrays["src_embed"]))
            self.tgt_embed = torch.nn.Parameter(torch.tensor(arrays["tgt_embed"]))
            self.out_weight = torch.nn.Parameter(torch.tensor(arrays["out_weight"]))
            self.out_bias = torch.nn.Parameter(torch.tensor(arrays["out_bias"]))
            self.pad_id = int(arrays["pad_id"])
            self.seen_tgt_in, self.seen_training = [], []

        def forward(self, src, tgt_in):
            self.seen_tgt_in.append(tgt_in.detach().clone())
            self.seen_training.append(self.training)
            real = (src != self.pad_id).to(self.src_embed.dtype)
            context = (self.src_embed[src] * real[..., None]).sum(1) / real.sum(1, keepdim=True)
            hidden = torch.tanh(self.tgt_embed[tgt_in] + context[:, None])
            return hidden @ self.out_weight.T + self.out_bias

    return TinySeq2Seq()


def training(fn: Any) -> Any:
    """A train_step function -> fn(spec, flat, srcs, tgts, lrs, optimizer_name) running one
    train_step per (src, tgt) batch on a fresh ``TinySeq2Seq`` (float64), put in eval mode
    first. Returns (returned losses (steps,), parameters after each step (steps, n), tgt_in the
    model got at step 0, target loss_fn got at step 0, [training mode at each step],
    [forward calls, loss_fn calls]).

    optimizer_name "sgd": SGD(lr=1) whose LambdaLR scheduler gives lrs[k] after k scheduler
    steps; "adam": Adam(lr=1) with the same scheduler.
    """
    import torch

    def run(spec, flat, srcs, tgts, lrs, optimizer_name):
        if not callable(fn):
            raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")
        arrays = _unpack(spec, flat)
        arrays["pad_id"] = json.loads(spec)["pad_id"]
        net = _tiny_model(arrays)
        net.eval()
        schedule = [float(v) for v in lrs]
        if optimizer_name == "adam":
            optimizer = torch.optim.Adam(net.parameters(), lr=1.0)
        else:
            optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: schedule[min(k, len(schedule) - 1)])
        targets = []

        def loss_fn(logits, target):
            targets.append(target.detach().clone())
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                     ignore_index=net.pad_id)

        losses, snapshots = [], []
        for src, tgt in zip(srcs, tgts):
            loss = fn(net, torch.tensor(src, dtype=torch.int64), torch.tensor(tgt, dtype=torch.int64),
                      optimizer, scheduler, loss_fn)
            if isinstance(loss, torch.Tensor):
                if loss.numel() != 1:
                    raise ValueError(f"train_step returned a tensor of shape {tuple(loss.shape)}; return the "
                                     "loss as a float, loss.item()")
                loss = loss.item()
            if not isinstance(loss, (float, int, np.floating)):
                raise TypeError(f"train_step should return the loss as a float (loss.item()), not "
                                f"{type(loss).__name__}")
            losses.append(float(loss))
            snapshots.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
        first_in = net.seen_tgt_in[0] if net.seen_tgt_in else torch.zeros(0, dtype=torch.int64)
        first_target = targets[0] if targets else torch.zeros(0, dtype=torch.int64)
        return (np.array(losses), torch.stack(snapshots), first_in, first_target,
                np.array(net.seen_training, dtype=bool).reshape(-1),
                np.array([len(net.seen_tgt_in), len(targets)], dtype=np.int64))

    return run
