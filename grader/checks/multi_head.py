"""Hidden checks of notebook 06, multi_head: split and merge heads, multi-head attention, torch weights.

Sizes are pairwise distinct (batch 2, heads 3, d_k 4, so d_model 12; q_len 5, k_len 6)
so that a reshape without a transpose, a swapped axis or a division by the wrong size
either raises or shows. The attention module and the weight loader are classes and
functions of modules, not functions of arrays: they are called through the drivers of
``coursekit.probe`` (``attention_module``, ``weight_loader``), which load the weights
drawn here into the learner's nn.Linear layers by name, so that no answer depends on the
order in which layers are created or on random initialization. In notebook 06 everything
is PyTorch: split_heads and merge_heads are called on torch tensors (driver ``tensors``),
never on numpy arrays. Masks follow the course
convention (True = the query may attend to the key) and never mask a whole row, not
even when inverted.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from coursekit.protocol import Raised, Unsupported

from ._core import (Call, Case, CheckFailed, Hint, Knob, Mistake, Probe, Raises, Rule, Spec, _equal, catalogued, close,
                    judge_case, to_array, value)
from ._probes import sums_to_one
from .softmax import OVER_KEYS
from .reference import multi_head as ref

D_MODEL, HEADS, BATCH, Q_LEN, K_LEN = 12, 3, 2, 5, 6
D_K = D_MODEL // HEADS
NUMPY_RETURNED = "returns a numpy array for a torch tensor input"


def _bad_heads(case: Case, where: str) -> None:
    """heads does not divide d_model: the docstring promises ValueError, nothing else."""
    got, what = case.answer, case.what
    if isinstance(got, Raised):
        if got.message.startswith("ValueError"):
            return
        if got.message.startswith("NotImplementedError"):
            value(got, case.spec.function)  # its own diagnosis: not answered yet
        if got.message.startswith("RuntimeError"):
            raise CheckFailed(f"{what} raised {got.message}; it should raise ValueError, as the docstring "
                              f"says (torch's own reshape error is a RuntimeError): check d_model % heads {where} "
                              "and raise ValueError yourself")
        raise CheckFailed(f"{what} raised {got.message}; it should raise ValueError, as the docstring "
                          f"says: check d_model % heads {where}")
    raise CheckFailed(f"{what} returned a value; heads does not divide d_model there, so it should "
                      f"raise ValueError, as the docstring says: check d_model % heads {where}")


def _judge_tensors(case: Case) -> None:
    """split_heads and merge_heads: a numpy answer to a tensor is named before anything else."""
    if case.call.raises:
        _bad_heads(case, "first")
        return
    if isinstance(case.answer, Unsupported):
        value(case.answer, case.what)  # named with the call that returned it
    if isinstance(case.answer, Raised) and NUMPY_RETURNED in case.answer.message:
        raise CheckFailed(f"{case.what} {NUMPY_RETURNED}: in this notebook everything is PyTorch, and your "
                          "module calls it on tensors. Use tensor methods (.reshape, .transpose, .permute, "
                          "torch.stack, torch.cat) and no np. functions")
    judge_case(case)


def _reshape_errors(invalid_size, not_contiguous, numpy_transpose) -> tuple[Raises, ...]:
    """torch's reshape, view and transpose errors, explained; one example of each per exercise."""
    return (
        Raises("{what} raised {error}. A reshape must keep the number of entries: split d_model into "
               "(heads, d_k) with d_k = d_model // heads, not d_model",
               match="is invalid for input of size|cannot reshape", example=invalid_size),
        Raises("{what} raised {error}. .view cannot merge axes that are no longer adjacent in memory (after a "
               "transpose): use .reshape or .contiguous().view", match="view size is not compatible",
               example=not_contiguous),
        Raises("{what} raised {error}: torch's x.transpose swaps two axes, x.transpose(1, 2); to reorder every "
               "axis use x.permute(0, 2, 1, 3)",
               match=r"(?s)^(?=.*transpose\(\))(?=.*(?:invalid combination|positional argument))",
               example=numpy_transpose),
    )


# ---------------------------------------------------------------- split and merge

def _rearranged(got: np.ndarray, call: Call) -> bool:
    """The answer holds the input's numbers, each once, in other places: axes moved or read in
    another order, nothing computed."""
    x = np.asarray(call.args[0], dtype=np.float64)
    return got.size == x.size and bool(np.allclose(np.sort(got.ravel()), np.sort(x.ravel())))


REARRANGED = ("it holds the right numbers in the wrong places: axes swapped or read in another order. A reshape "
              "reads the entries in memory order, so {order}")


def _split(arrange):
    """A learner's split_heads: ``arrange(x, batch, seq_len, heads, d_k)`` after the check."""
    def split_heads(x, heads):
        batch, seq_len, d_model = x.shape
        if d_model % heads:
            raise ValueError("heads must divide d_model")
        return arrange(x, batch, seq_len, heads, d_model // heads)
    return split_heads


_SPLIT_NO_TRANSPOSE = _split(lambda x, b, s, h, d_k: x.reshape(b, h, s, d_k))
_SPLIT_INTERLEAVED = _split(lambda x, b, s, h, d_k: x.reshape(b, s, d_k, h).permute(0, 3, 1, 2))
_SPLIT_TRANSPOSED_FIRST = _split(lambda x, b, s, h, d_k: x.transpose(1, 2).reshape(b, h, s, d_k))
SPLIT_TRANSPOSED_FIRST = ("it transposes x to (batch, d_model, seq_len) before the reshape: a reshape reads the "
                          "entries in memory order, so head j's (seq_len, d_k) block is filled from its d_k "
                          "features' rows of x transposed, which mixes positions and features. Reshape first, to "
                          "(batch, seq_len, heads, d_k), then .transpose(1, 2)")


def _heads(call: Call) -> int:
    return call.kwargs.get("heads", call.args[-1])


def _split_calls(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (batch 2, seq_len 5, d_model 12 = 3 heads x d_k 4); (3, 7, 8 = 4 x 2); heads=1 by keyword.
    for shape, heads, by_keyword in [((2, 5, 12), 3, False), ((3, 7, 8), 4, False), ((4, 3, 10), 1, True)]:
        x = rng.normal(size=shape)
        what = f"split_heads(x, heads={heads}) for x of shape {shape}"
        calls.append(Call((x,), {"heads": heads}, what) if by_keyword else Call((x, heads), what=what))
    # heads = 5 does not divide d_model = 12: ValueError, not torch's RuntimeError from a reshape
    # (and a reshape to (2, -1, 5, 2) would even succeed)
    calls.append(Call((rng.normal(size=(2, 5, 12)), 5), what="split_heads(x, heads=5) for x of shape (2, 5, 12)",
                      raises="ValueError"))
    return calls


SPLIT_HEADS = Spec(
    id="multi_head-split_heads",
    function="split_heads",
    inputs=_split_calls,
    reference=ref.split_heads,
    driver="tensors",
    judge=_judge_tensors,
    rules=(
        Rule("several heads of several features (heads > 1, d_k > 1), batch, seq_len, heads and d_k distinct",
             lambda call: not call.raises and _heads(call) > 1 and call.args[0].shape[-1] // _heads(call) > 1
             and len({*call.args[0].shape[:2], _heads(call), call.args[0].shape[-1] // _heads(call)}) == 4),
        Rule("heads = 1", lambda call: _heads(call) == 1),
        Rule("heads does not divide d_model: ValueError", lambda call: call.raises == "ValueError"),
    ),
    mistakes=(
        Mistake("no_transpose", "it reshapes straight to (batch, heads, seq_len, d_k) without a transpose, which "
                "mixes the tokens between heads: reshape to (batch, seq_len, heads, d_k) first, then .transpose(1, 2)",
                _SPLIT_NO_TRANSPOSE),
        Mistake("interleaved", "head j gets the columns j, j + heads, j + 2 heads, ...: it splits d_model as "
                "(d_k, heads). Head j owns the d_k consecutive columns j*d_k ... (j+1)*d_k - 1: reshape to "
                "(batch, seq_len, heads, d_k)", _SPLIT_INTERLEAVED),
        Mistake("d_k_last_swapped", "it returns (batch, heads, d_k, seq_len): after the reshape to (batch, seq_len, "
                "heads, d_k) swap only axes 1 and 2, .transpose(1, 2)",
                _split(lambda x, b, s, h, d_k: x.reshape(b, s, h, d_k).permute(0, 2, 3, 1))),
        Mistake("no_swap", "it returns (batch, seq_len, heads, d_k): the heads axis must come before seq_len, "
                ".transpose(1, 2) after the reshape", _split(lambda x, b, s, h, d_k: x.reshape(b, s, h, d_k))),
        Mistake("transposed_first", SPLIT_TRANSPOSED_FIRST, _SPLIT_TRANSPOSED_FIRST),
    ),
    hints=(Hint(REARRANGED.format(order="reshape first, (batch, seq_len, d_model) -> (batch, seq_len, heads, "
                                        "d_k), then swap seq_len and heads, .transpose(1, 2)"), _rearranged,
                example=_split(lambda x, b, s, h, d_k: x.reshape(b, d_k, s, h).permute(0, 3, 2, 1))),),
    errors=_reshape_errors(
        invalid_size=lambda x, heads: x.reshape(*x.shape[:2], heads, x.shape[-1]).transpose(1, 2),
        not_contiguous=lambda x, heads: x.transpose(1, 2).view(*x.shape[:2], heads, -1),
        numpy_transpose=_split(lambda x, b, s, h, d_k: x.reshape(b, s, h, d_k).transpose(0, 2, 1, 3))),
    diagnosed=(
        Mistake("returns_numpy", f"{NUMPY_RETURNED}: in this notebook everything is PyTorch",
                lambda x, heads: np.stack(np.split(np.asarray(x), heads, axis=-1), axis=1)),
        Mistake("no_check", "returned a value; heads does not divide d_model there, so it should raise ValueError",
                lambda x, heads: x.reshape(x.shape[0], -1, heads, x.shape[-1] // heads).transpose(1, 2)),
        Mistake("torch_error", "it should raise ValueError, as the docstring says (torch's own reshape error is "
                "a RuntimeError)", lambda x, heads: x.reshape(*x.shape[:2], heads, x.shape[-1] // heads).transpose(1, 2)),
    ),
)


def _merge(arrange):
    """A learner's merge_heads: ``arrange(x, batch, heads, seq_len, d_k)``."""
    return lambda x: arrange(x, *x.shape)


_MERGE_NO_TRANSPOSE = _merge(lambda x, b, h, s, d_k: x.reshape(b, s, h * d_k))
_MERGE_INTERLEAVED = _merge(lambda x, b, h, s, d_k: x.permute(0, 2, 3, 1).reshape(b, s, h * d_k))
_MERGE_REVERSED = _merge(lambda x, b, h, s, d_k: ref.merge_heads(x.flip(1)))
_MERGE_VIEW = _merge(lambda x, b, h, s, d_k: x.transpose(1, 2).view(b, s, h * d_k))
_MERGE_SEQ_D_K = _merge(lambda x, b, h, s, d_k: x.transpose(2, 3).reshape(b, s, h * d_k))
_MERGE_RESHAPE_FIRST = _merge(lambda x, b, h, s, d_k: x.reshape(b, h * d_k, s).transpose(1, 2))
MERGE_SEQ_D_K = ("it swaps seq_len and d_k (.transpose(2, 3), or -1 and -2) before the reshape; the axes to swap are "
                 "heads and seq_len, .transpose(1, 2), so that each token's heads sit side by side")
MERGE_RESHAPE_FIRST = ("it reshapes (batch, heads, seq_len, d_k) to (batch, d_model, seq_len) and transposes after: a "
                       "reshape reads the entries in memory order, so it mixes positions and features. Transpose "
                       "first, .transpose(1, 2), then reshape to (batch, seq_len, d_model)")


def _merge_calls(rng: np.random.Generator) -> list[Call]:
    return [Call((rng.normal(size=shape),), what=f"merge_heads(x) for x of shape {shape}")
            for shape in [(2, 3, 5, 4), (3, 4, 7, 2), (2, 1, 6, 5)]]


MERGE_HEADS = Spec(
    id="multi_head-merge_heads",
    function="merge_heads",
    inputs=_merge_calls,
    reference=ref.merge_heads,
    driver="tensors",
    judge=_judge_tensors,
    rules=(
        Rule("several heads, batch, heads, seq_len and d_k distinct", lambda call: call.args[0].shape[1] > 1
             and len(set(call.args[0].shape)) == 4),
        Rule("heads = 1", lambda call: call.args[0].shape[1] == 1),
    ),
    mistakes=(
        Mistake("no_transpose", "it reshapes (batch, heads, seq_len, d_k) straight to (batch, seq_len, heads * d_k) "
                "without a transpose, which mixes tokens: .transpose(1, 2) first, then reshape", _MERGE_NO_TRANSPOSE),
        Mistake("sum", "it sums the heads; concatenate them: each token gets heads * d_k features, head j in the "
                "columns j*d_k ... (j+1)*d_k - 1", lambda x: x.sum(dim=1)),
        Mistake("mean", "it averages the heads; concatenate them: each token gets heads * d_k features, head j in "
                "the columns j*d_k ... (j+1)*d_k - 1", lambda x: x.mean(dim=1)),
        Mistake("interleaved", "the heads are interleaved (column i*heads + j holds entry i of head j): it moves the "
                "heads axis last before the reshape. Use .transpose(1, 2) only, to (batch, seq_len, heads, d_k)",
                _MERGE_INTERLEAVED),
        Mistake("reversed", "the heads are concatenated in reverse order: head 0 comes first", _MERGE_REVERSED),
        Mistake("seq_d_k_swapped", MERGE_SEQ_D_K, _MERGE_SEQ_D_K),
        Mistake("reshape_first", MERGE_RESHAPE_FIRST, _MERGE_RESHAPE_FIRST),
    ),
    hints=(Hint(REARRANGED.format(order="first swap heads and seq_len, .transpose(1, 2) -> (batch, seq_len, heads, "
                                        "d_k), then reshape to (batch, seq_len, heads * d_k)"), _rearranged,
                example=_merge(lambda x, b, h, s, d_k: x.transpose(0, 2).reshape(b, s, h * d_k))),),
    errors=_reshape_errors(
        invalid_size=_merge(lambda x, b, h, s, d_k: x.transpose(1, 2).reshape(b, s, h)),
        not_contiguous=_MERGE_VIEW,
        numpy_transpose=_merge(lambda x, b, h, s, d_k: x.transpose(0, 2, 1, 3).reshape(b, s, h * d_k))),
    diagnosed=(
        Mistake("returns_numpy", f"{NUMPY_RETURNED}: in this notebook everything is PyTorch",
                lambda x: np.concatenate(list(np.asarray(x).transpose(1, 0, 2, 3)), axis=-1)),
        Mistake("no_return", "merge_heads(x) for x of shape (2, 3, 5, 4) returns nothing (None): is a `return` "
                "missing?", lambda x: None),
    ),
)


# ---------------------------------------------------------------- the module

def _mha(scale=lambda d_k, d_model: math.sqrt(d_k), split=ref.split_heads, merge=ref.merge_heads, w_o=True,
         inputs="qkv", projections="qkv", heads_axis=lambda m: m.unsqueeze(-3), use_mask=True, invert=False,
         fill=float("-inf"), after_softmax=False, softmax_dim=-1):
    """A learner's MultiHeadAttention (the reference's __init__) with one forward knob per known mistake.

    ``inputs`` / ``projections`` name which input (q, k, v) feeds the query, key and value
    projection and which projection (q, k, v) serves each role; ``heads_axis`` is what the
    learner does to the mask before it meets the scores (batch, heads, q_len, k_len).
    """
    class MultiHeadAttention(ref.MultiHeadAttention):
        def forward(self, query, key, value, mask=None):
            source = dict(q=query, k=key, v=value)
            layer = dict(q=self.W_q, k=self.W_k, v=self.W_v)
            q, k, v = (split(layer[p](source[i]), self.heads) for p, i in zip(projections, inputs))
            scores = q @ k.transpose(-2, -1) / scale(self.d_k, self.d_model)
            keep = None if mask is None or not use_mask else heads_axis(mask)
            if keep is not None and invert:
                keep = ~keep
            if keep is not None and not after_softmax:
                scores = scores.masked_fill(~keep, fill)
            weights = torch.softmax(scores, dim=softmax_dim)
            if keep is not None and after_softmax:  # zeroed after the softmax, rows not renormalized
                weights = weights.masked_fill(~keep, 0.0)
            out = merge(weights @ v)
            return (self.W_o(out) if w_o else out), weights
    return MultiHeadAttention


_SCALES = {"sqrt_d_k": {}, "sqrt_d_model": {"scale": lambda d_k, d_model: math.sqrt(d_model)},
           "none": {"scale": lambda d_k, d_model: 1.0}, "d_k": {"scale": lambda d_k, d_model: float(d_k)}}
_SPLITS = {"right": {}, "no_transpose": {"split": _SPLIT_NO_TRANSPOSE}, "interleaved": {"split": _SPLIT_INTERLEAVED},
           "transposed_first": {"split": _SPLIT_TRANSPOSED_FIRST}}
_MASKINGS = {"right": {}, "inverted": {"invert": True}, "ignored": {"use_mask": False}, "fill_0": {"fill": 0.0},
             "after_softmax": {"after_softmax": True}}
_MERGES = {"right": {}, "no_transpose": {"merge": _MERGE_NO_TRANSPOSE}, "interleaved": {"merge": _MERGE_INTERLEAVED},
           "reversed": {"merge": _MERGE_REVERSED}, "seq_d_k_swapped": {"merge": _MERGE_SEQ_D_K},
           "reshape_first": {"merge": _MERGE_RESHAPE_FIRST}}


def _mha_variant(scale="sqrt_d_k", split="right", masking="right", merge="right", w_o=True):
    """MultiHeadAttention with the spec's knobs: the scale, split_heads, the mask, merge_heads, W_o."""
    return _mha(**_SCALES[scale], **_SPLITS[split], **_MASKINGS[masking], **_MERGES[merge], w_o=w_o)


def _unmasked(rng: np.random.Generator) -> list[Call]:
    """Which axis the weights sum to one over: cross-attention without a mask, sizes distinct."""
    p = _weights(rng, D_MODEL)
    args = (D_MODEL, HEADS) + tuple(p[f"{kind}_{n}"] for n in "qkvo" for kind in ("W", "b")) + (
        rng.normal(size=(BATCH, Q_LEN, D_MODEL)), rng.normal(size=(BATCH, K_LEN, D_MODEL)),
        rng.normal(size=(BATCH, K_LEN, D_MODEL)), None)
    return [Call(args, what="MultiHeadAttention on distinct sizes, no mask")]


def _weights(rng: np.random.Generator, d_model: int) -> dict:
    scale = 1.0 / np.sqrt(d_model)
    p = {}
    for name in "qkvo":
        p[f"W_{name}"] = rng.normal(scale=scale * 1.5, size=(d_model, d_model))
        p[f"b_{name}"] = rng.normal(scale=0.3, size=(d_model,))
    return p


def _mask_rows(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """A random bool mask whose every row along the last axis keeps one key and drops one."""
    mask = rng.random(shape) < 0.6
    n = shape[-1]
    keep = rng.integers(n, size=shape[:-1] + (1,))
    drop = (keep + rng.integers(1, n, size=shape[:-1] + (1,))) % n
    np.put_along_axis(mask, keep, True, axis=-1)
    np.put_along_axis(mask, drop, False, axis=-1)
    return mask


PADDING_MASK, FULL_MASK = (BATCH, 1, K_LEN), (BATCH, Q_LEN, K_LEN)


def _module_calls(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(query, key, value, mask, note):
        p = _weights(rng, D_MODEL)
        what = (f"MultiHeadAttention(d_model={D_MODEL}, heads={HEADS}) on query {query.shape}, key "
                f"{key.shape}, value {value.shape}{note}")
        args = (D_MODEL, HEADS) + tuple(p[f"{kind}_{n}"] for n in "qkvo" for kind in ("W", "b")) + (
            query, key, value, mask)
        calls.append(Call(args, what=what))

    # 1. Cross-attention, no mask: distinct query, key and value inputs, q_len 5 != k_len 6.
    ask(rng.normal(size=(BATCH, Q_LEN, D_MODEL)), rng.normal(size=(BATCH, K_LEN, D_MODEL)),
        rng.normal(size=(BATCH, K_LEN, D_MODEL)), None, ", no mask")
    # 2. A padding mask (batch, 1, k_len) from two lengths: it must broadcast over the heads.
    lengths = rng.permutation([3, 4, 5])[:2]
    padding = (np.arange(K_LEN) < lengths[:, None])[:, None, :]
    ask(rng.normal(size=(BATCH, Q_LEN, D_MODEL)), rng.normal(size=(BATCH, K_LEN, D_MODEL)),
        rng.normal(size=(BATCH, K_LEN, D_MODEL)), padding, f", padding mask {padding.shape}")
    # 3. Self-attention (one input) with a causal mask (q_len, q_len).
    x = rng.normal(size=(BATCH, Q_LEN, D_MODEL))
    ask(x, x, x, np.tril(np.ones((Q_LEN, Q_LEN), dtype=bool)), f", self-attention, causal mask ({Q_LEN}, {Q_LEN})")
    # 4. Cross-attention with a full (batch, q_len, k_len) mask.
    ask(rng.normal(size=(BATCH, Q_LEN, D_MODEL)), rng.normal(size=(BATCH, K_LEN, D_MODEL)),
        rng.normal(size=(BATCH, K_LEN, D_MODEL)), _mask_rows(rng, FULL_MASK), f", mask {FULL_MASK}")
    # 5. heads = 4 does not divide d_model = 10: __init__ raises ValueError (the driver only builds).
    calls.append(Call((10, 4), what="MultiHeadAttention(d_model=10, heads=4)", raises="ValueError"))
    return calls


def _mask_shape(call: Call) -> tuple | None:
    mask = call.args[-1] if len(call.args) > 2 else None
    return None if mask is None else mask.shape


PARTS = ("output", "weights")


def _judge_module(case: Case) -> None:
    """Raised errors through the rules; the return order and averaged weights by shape; then each
    part on its own, the weights first (the output follows from them): a catalogued mistake whose
    weights are the learner's names the weights, even when the output is wrong in another way too."""
    if case.call.raises:
        _bad_heads(case, "in __init__")
        return
    got = case.answer
    if isinstance(got, tuple) and len(got) == 2:
        parts = [to_array(a, case.what) for a in got]
        output, weights = (np.asarray(e, dtype=np.float64) for e in case.expected)
        if parts[0].shape == weights.shape and parts[1].shape == output.shape:
            raise CheckFailed(f"{case.what} returns (weights, output); return (output, weights)")
        averaged = weights.shape[:1] + weights.shape[2:]
        if parts[1].shape == averaged and np.allclose(parts[1], weights.mean(1), atol=1e-5):
            raise CheckFailed(f"the weights of {case.what} are averaged over the heads, {parts[1].shape}: return "
                              "each head's weights, (batch, heads, q_len, k_len); torch's "
                              "MultiheadAttention averages them only when asked (average_attn_weights)")
        if not _equal(got, case.expected, case.spec.rtol, case.spec.atol):
            found = catalogued(case, got)  # the whole answer: one mistake, two knobs, what the probes find
            if found:
                case.fail(found)
        for i in (1, 0):
            if close(parts[i], (output, weights)[i]):
                continue
            for mistake, wrong in case.mistaken():
                if (isinstance(wrong, tuple) and len(wrong) == 2 and isinstance(wrong[i], np.ndarray)
                        and close(parts[i], wrong[i].astype(np.float64))):
                    raise CheckFailed(f"the {PARTS[i]} of {case.what}: {mistake.diagnosis}")
            break
    judge_case(case)


class _AveragedWeights(ref.MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        output, weights = super().forward(query, key, value, mask)
        return output, weights.mean(dim=1)


class _WeightsFirst(ref.MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        return tuple(reversed(super().forward(query, key, value, mask)))


class _NoSizeCheck(ref.MultiHeadAttention):
    def __init__(self, d_model, heads):
        super().__init__(d_model, heads - d_model % heads)  # the layers all the same, whatever heads is
        self.heads, self.d_k = heads, d_model // heads


class _NoBias(ref.MultiHeadAttention):
    def __init__(self, d_model, heads):
        super().__init__(d_model, heads)
        self.W_o = nn.Linear(d_model, d_model, bias=False)


class _NoSizes(ref.MultiHeadAttention):
    def __init__(self, d_model, heads):
        super().__init__(d_model, heads)
        del self.d_model


MULTI_HEAD_ATTENTION = Spec(
    id="multi_head-MultiHeadAttention",
    submodules=("W_q", "W_k", "W_v", "W_o"),
    function="MultiHeadAttention",
    depends=("multi_head-split_heads", "multi_head-merge_heads"),  # its solution calls them
    inputs=_module_calls,
    reference=ref.MultiHeadAttention,
    driver="attention_module",
    judge=_judge_module,
    rules=(
        Rule("cross-attention, q_len != k_len", lambda call: not call.raises and call.args[-4].shape[1]
             != call.args[-3].shape[1]),
        Rule("self-attention: one input as query, key and value", lambda call: not call.raises
             and call.args[-4] is call.args[-3] is call.args[-2]),
        Rule("no mask", lambda call: not call.raises and call.args[-1] is None),
        Rule("a padding mask (batch, 1, k_len)", lambda call: _mask_shape(call) == PADDING_MASK),
        Rule("a causal mask (q_len, q_len)", lambda call: len(_mask_shape(call) or ()) == 2),
        Rule("a mask (batch, q_len, k_len)", lambda call: _mask_shape(call) == FULL_MASK),
        Rule("heads does not divide d_model: ValueError in __init__", lambda call: call.raises == "ValueError"),
    ),
    parts=PARTS,
    order=(1, 0),
    variant=_mha_variant,
    knobs=(
        Knob("scale", (
            ("sqrt_d_model", "it divides the scores by sqrt(d_model); each head's scores are divided by sqrt(d_k), "
                             "d_k = d_model / heads"),
            ("none", "it does not scale the scores: divide them by sqrt(d_k)"),
            ("d_k", "it divides the scores by d_k; divide by sqrt(d_k)"),
        )),
        Knob("split", (
            ("no_transpose", "it splits the heads with a reshape straight to (batch, heads, seq_len, d_k), no "
                             "transpose, which mixes tokens between heads: reshape to (batch, seq_len, heads, d_k), "
                             "then .transpose(1, 2) (your split_heads)"),
            ("interleaved", "head j gets the columns j, j + heads, ...: split d_model as (heads, d_k), head j owning "
                            "d_k consecutive columns"),
            ("transposed_first", f"its split of the heads: {SPLIT_TRANSPOSED_FIRST} (your split_heads)"),
        )),
        Knob("masking", (
            ("inverted", "the mask is inverted: in this course True means the query may attend to the key "
                         "(torch.nn.MultiheadAttention's masks mean the opposite); fill the scores where the mask is "
                         "False"),
            ("ignored", "it ignores the mask: fill the scores where the mask is False with -inf before the softmax"),
            ("fill_0", "it sets the masked scores to 0; set them to -inf (e^0 = 1 keeps their weight)"),
            ("after_softmax", "it masks after the softmax: fill the scores with -inf before the softmax; don't zero "
                              "the weights after it (the rows no longer sum to 1)"),
        )),
        Knob("merge", (
            ("no_transpose", "it concatenates the heads with a reshape of (batch, heads, q_len, d_k) straight to "
                             "(batch, q_len, d_model), no transpose, which mixes tokens: .transpose(1, 2) first "
                             "(your merge_heads)"),
            ("interleaved", "the heads are interleaved when concatenated: .transpose(1, 2) only, then reshape (your "
                            "merge_heads)"),
            ("reversed", "it concatenates the heads in reverse order"),
            ("seq_d_k_swapped", f"its concatenation of the heads: {MERGE_SEQ_D_K} (your merge_heads)"),
            ("reshape_first", f"its concatenation of the heads: {MERGE_RESHAPE_FIRST} (your merge_heads)"),
        )),
        Knob("w_o", ((False, "the output skips W_o: after concatenating the heads, apply the output projection "
                             "W_o"),)),
    ),
    # (query and key, or value, fed from each other's inputs raise on cross-attention (q_len 5,
    # k_len 6) and are right on self-attention: the error rule names them, no value can)
    mistakes=(
        Mistake("inputs_qvk", "the query, key and value projections are applied to the wrong inputs: W_k to key, "
                "W_v to value (key and value are swapped)", _mha(inputs="qvk")),
        Mistake("w_k_w_v_swapped", "W_k and W_v are swapped: keys come from W_k, values from W_v",
                _mha(projections="qvk")),
        Mistake("w_q_w_k_swapped", "W_q and W_k are swapped: queries come from W_q, keys from W_k",
                _mha(projections="kqv")),
        Mistake("values_from_key", "the values come from the key input: V = W_v(value)", _mha(inputs="qkk")),
    ),
    # which axes the weights sum to one over, whatever else is wrong
    probes=(Probe("axis", _unmasked, describe=sums_to_one({4: ("batch", "heads", "query", "key")}, want=(-1,), part=1,
                                                          fix=OVER_KEYS)),),
    errors=(
        *(Raises(f"{{what}} raised {{error}}. The mask {shape} has no heads axis: give it one, mask.unsqueeze(1) "
                 "-> (batch, 1, q_len or 1, k_len), so that it broadcasts over the heads of the scores "
                 "(batch, heads, q_len, k_len)", match="must match the size of tensor|broadcast",
                 when=lambda call, shape=shape: _mask_shape(call) == shape,
                 example=_mha(heads_axis=lambda m, shape=shape: m if m.shape == shape else m.unsqueeze(-3)))
          for shape in (PADDING_MASK, FULL_MASK)),
        Raises("{what} raised {error}. A (q_len, k_len) mask broadcasts over batch and heads as it is: add the heads "
               "axis to a 3-D mask only (or use mask.unsqueeze(-3), which suits both)",
               match="must match the size of tensor|broadcast", when=lambda call: len(_mask_shape(call) or ()) == 2,
               example=_mha(heads_axis=lambda m: m.unsqueeze(1))),
        Raises(f"{{what}} raised {{error}}: a linear layer got d_k = {D_K} features where it expects d_model. Are "
               "the heads summed or averaged? Concatenate them back to (batch, q_len, d_model) (merge_heads) "
               "before W_o", match=f"shapes cannot be multiplied.*x{D_K} and", example=_mha(merge=lambda o: o.sum(1))),
        Raises("{what} raised {error}: the weights (..., q_len, k_len) do not fit the values (..., k_len, d_k). "
               "Are query and key swapped? Q = W_q(query), K = W_k(key), V = W_v(value)",
               match="batch2 tensor|mismatch in its core dimension", example=_mha(inputs="kqv")),
        Raises("{what} raised {error}: something it uses returned None. Does your split_heads or merge_heads miss "
               "a `return`? Fix that one first", match="NoneType", example=_mha(merge=lambda o: None)),
        Raises("{what} raised {error}. After a transpose the tensor is not contiguous: use .reshape(...) or "
               ".contiguous().view(...)", match="view size is not compatible", example=_mha(merge=_MERGE_VIEW)),
        Raises("{what}: the grader could not load weights into your module: {error}",
               match="has no attribute W_|should be nn.Linear|has no bias",
               example=_NoBias),
        Raises("{what}: {error}", match=r"has no attribute (d_model|heads|d_k)|\.(d_model|heads|d_k) should be the int",
               example=_NoSizes),
    ),
    hints=(
        Hint(OVER_KEYS, lambda w, call: bool(np.all(np.isfinite(w))) and not np.allclose(w.sum(-1), 1.0, atol=1e-4),
             example=_mha(softmax_dim=-2), part=1),
    ),
    diagnosed=(
        Mistake("weights_first", "returns (weights, output); return (output, weights)", _WeightsFirst),
        Mistake("averaged_weights", "are averaged over the heads", _AveragedWeights),
        Mistake("no_size_check", "MultiHeadAttention(d_model=10, heads=4) returned a value; heads does not divide "
                "d_model there, so it should raise ValueError", _NoSizeCheck),
    ),
)


# ---------------------------------------------------------------- loading torch's weights

LINEARS = ("W_q", "W_k", "W_v", "W_o")
ROLES = ("query", "key", "value")
# What the learner's loader did to a parameter it never wrote (it keeps nn.Linear's initial values)
UNWRITTEN = "load_torch_weights never writes it, so it keeps the layer's initial values"


def _loader(order=(0, 1, 2), transpose=False, biases=True, out_proj=True, returns=True):
    """A learner's load_torch_weights: chunk ``order[j]`` of in_proj into the j-th of W_q, W_k, W_v."""
    def load_torch_weights(module, torch_mha):
        weights, packed_biases = torch_mha.in_proj_weight.chunk(3), torch_mha.in_proj_bias.chunk(3)
        with torch.no_grad():
            for layer, j in zip((module.W_q, module.W_k, module.W_v), order):
                layer.weight.copy_(weights[j].T if transpose else weights[j])
                if biases:
                    layer.bias.copy_(packed_biases[j])
            if out_proj:
                module.W_o.weight.copy_(torch_mha.out_proj.weight.T if transpose else torch_mha.out_proj.weight)
                module.W_o.bias.copy_(torch_mha.out_proj.bias)
        return module if returns else None
    return load_torch_weights


def _loader_calls(rng: np.random.Generator) -> list[Call]:
    calls = []
    for d_model, heads in [(12, 3), (10, 2)]:
        in_w = rng.normal(scale=0.4, size=(3 * d_model, d_model))
        in_b = rng.normal(scale=0.4, size=(3 * d_model,))
        out_w = rng.normal(scale=0.4, size=(d_model, d_model))
        out_b = rng.normal(scale=0.4, size=(d_model,))
        calls.append(Call((d_model, heads, in_w, in_b, out_w, out_b),
                          what=f"load_torch_weights(module, torch_mha) for d_model={d_model}, heads={heads}"))
    return calls


def _tensor(got: object, want: np.ndarray, what: str, wrong: list[tuple[str, np.ndarray]]) -> None:
    """One layer's weight or bias: right, a named mistake, or the plain difference."""
    got = to_array(got, what)
    if close(got, want):
        return
    for message, array in wrong:
        if close(got, array):
            raise CheckFailed(f"{what}: {message}")
    if got.shape != want.shape:
        raise CheckFailed(f"{what} has shape {got.shape}; expected {want.shape}")
    if not np.all(np.isfinite(got)):
        raise CheckFailed(f"{what} contains NaN or infinity where every value should be finite")
    raise CheckFailed(f"{what} has the right shape {want.shape} but wrong values")


def _judge_layers(case: Case) -> None:
    """Every layer's weight and bias, in module order, against what each could have been copied from:
    a mix of mistakes no catalogue lists is still named, tensor by tensor."""
    d_model, _, in_w, in_b, out_w, out_b = case.call.args
    what = case.what
    chunks = dict(zip(ROLES, np.split(in_w, 3)))
    bias_chunks = dict(zip(ROLES, np.split(in_b, 3)))
    for i, (name, role) in enumerate(zip(LINEARS, ROLES + ("out",))):
        weight, bias = case.answer[2 * i], case.answer[2 * i + 1]
        if role == "out":
            want_w, want_b, source_w, source_b = out_w, out_b, "out_proj.weight", "out_proj.bias"
        else:
            want_w, want_b = chunks[role], bias_chunks[role]
            source_w, source_b = f"the {role} rows of in_proj_weight", f"the {role} part of in_proj_bias"
        # (the driver's module starts at zero, a value no copy gives: zero means never written)
        w_wrong = [(f"{UNWRITTEN}: nothing was copied from {source_w}", np.zeros_like(want_w)),
                   (f"it holds the transpose of {source_w}: nn.Linear and in_proj_weight both store "
                    "(out_features, in_features), copy without .T", want_w.T)]
        b_wrong = [(f"{UNWRITTEN}: nothing was copied from {source_b} (copy the biases too)",
                    np.zeros_like(want_b))]
        for other in ROLES if role != "out" else ():
            if other != role:
                w_wrong.append((f"it holds the {other} rows of in_proj_weight; in_proj_weight stacks the rows of "
                                "query, key, value in that order (chunk 0, 1, 2)", chunks[other]))
                w_wrong.append((f"it holds the transposed {other} rows of in_proj_weight: chunks in the order "
                                "query, key, value, and no .T", chunks[other].T))
                b_wrong.append((f"it holds the {other} part of in_proj_bias; in_proj_bias stacks query, key, "
                                "value in that order", bias_chunks[other]))
        _tensor(weight, want_w, f"{what}: module.{name}.weight", w_wrong)
        _tensor(bias, want_b, f"{what}: module.{name}.bias", b_wrong)


def _judge_loaded(case: Case) -> None:
    if isinstance(case.answer, Raised):
        judge_case(case)
    got = value(case.answer, case.spec.function)
    if not isinstance(got, tuple) or len(got) != 9:
        raise CheckFailed(f"{case.what}: the grader could not read the module's layers back")
    if not all(close(to_array(a, case.what), to_array(e, case.what)) for a, e in zip(got, case.expected)):
        for mistake, wrong in case.mistaken():
            if isinstance(wrong, tuple) and len(wrong) == 9 and all(
                    close(to_array(a, case.what), np.asarray(w, dtype=np.float64)) for a, w in zip(got, wrong)):
                case.fail(mistake.diagnosis)
    _judge_layers(case)
    if not bool(np.asarray(got[8])):
        raise CheckFailed(f"{case.what}: the weights are right, but load_torch_weights should return the module "
                          "it loaded into (`return module`), as the docstring says")


def _whole_in_proj_into_w_q(module, torch_mha):
    with torch.no_grad():
        module.W_q.weight.copy_(torch_mha.in_proj_weight)
    return module


def _packed_layer(module, torch_mha):
    d = torch_mha.embed_dim
    module.W_q = nn.Linear(d, 3 * d)
    with torch.no_grad():
        module.W_q.weight.copy_(torch_mha.in_proj_weight)
        module.W_q.bias.copy_(torch_mha.in_proj_bias)
    return module


def _without_no_grad(module, torch_mha):
    module.W_q.weight.copy_(torch_mha.in_proj_weight.chunk(3)[0])
    return module


LOAD_TORCH_WEIGHTS = Spec(
    id="multi_head-load_torch_weights",
    function="load_torch_weights",
    inputs=_loader_calls,
    reference=ref.load_torch_weights,
    driver="weight_loader",
    judge=_judge_loaded,
    rules=(
        Rule("the query, key and value rows of in_proj_weight all differ, and none is its own transpose",
             lambda call: all(not np.allclose(a, b) for a, b in itertools.combinations(np.split(call.args[2], 3), 2))
             and not any(np.allclose(a, a.T) for a in np.split(call.args[2], 3))),
        Rule("nonzero biases", lambda call: bool(np.all(call.args[3] != 0) and np.all(call.args[5] != 0))),
    ),
    mistakes=(
        Mistake("key_first", "module.W_q.weight: it holds the key rows of in_proj_weight; in_proj_weight stacks "
                "the rows of query, key, value in that order (chunk 0, 1, 2)", _loader(order=(1, 0, 2))),
        Mistake("reversed", "module.W_q.weight: it holds the value rows of in_proj_weight; in_proj_weight stacks "
                "the rows of query, key, value in that order (chunk 0, 1, 2)", _loader(order=(2, 1, 0))),
        Mistake("transposed", "module.W_q.weight: it holds the transpose of the query rows of in_proj_weight: "
                "nn.Linear and in_proj_weight both store (out_features, in_features), copy without .T",
                _loader(transpose=True)),
        Mistake("no_biases", f"module.W_q.bias: {UNWRITTEN}: nothing was copied from the query part of "
                "in_proj_bias (copy the biases too)", _loader(biases=False)),
        Mistake("no_out_proj", f"module.W_o.weight: {UNWRITTEN}: nothing was copied from out_proj.weight",
                _loader(out_proj=False)),
        Mistake("nothing", f"module.W_q.weight: {UNWRITTEN}: nothing was copied from the query rows of "
                "in_proj_weight", lambda module, torch_mha: module),
        Mistake("no_return", "the weights are right, but load_torch_weights should return the module it loaded "
                "into (`return module`), as the docstring says", _loader(returns=False)),
    ),
    errors=(
        Raises("{what} raised {error}: copy into parameters inside `with torch.no_grad():`",
               match="leaf Variable that requires grad", example=_without_no_grad),
        Raises("{what} raised {error}: copy into the module's existing layers (module.W_q.weight, "
               "module.W_q.bias, ...)", match="has no attribute W_|should be nn.Linear", example=_packed_layer),
        Raises("{what} raised {error}: in_proj_weight is (3 d_model, d_model), the rows of W_q, then W_k, then "
               "W_v; split it into three (d_model, d_model) chunks along dim 0",
               match="must match the size|expanded size", example=_whole_in_proj_into_w_q),
    ),
)

SPECS = (SPLIT_HEADS, MERGE_HEADS, MULTI_HEAD_ATTENTION, LOAD_TORCH_WEIGHTS)
