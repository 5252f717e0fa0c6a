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

import numpy as np

from ._core import CheckFailed, Question, Raised, exercise, judge, to_array
from ._core import value as answer_value

LINEARS = ("W_q", "W_k", "W_v", "W_o")


# ---------------------------------------------------------------- split and merge

def _split(x: np.ndarray, heads: int, how: str = "right") -> np.ndarray:
    """(batch, seq_len, d_model) -> (batch, heads, seq_len, d_k), or one of the known mistakes."""
    b, s, d = x.shape
    d_k = d // heads
    if how == "no_transpose":  # reshape straight into the target shape: mixes tokens between heads
        return x.reshape(b, heads, s, d_k)
    if how == "interleaved":  # head j takes the columns j, j + heads, j + 2 heads, ...
        return x.reshape(b, s, d_k, heads).transpose(0, 3, 1, 2)
    if how == "d_k_last_swapped":  # (batch, heads, d_k, seq_len)
        return x.reshape(b, s, heads, d_k).transpose(0, 2, 3, 1)
    if how == "no_swap":  # (batch, seq_len, heads, d_k): split, but the heads axis not moved
        return x.reshape(b, s, heads, d_k)
    return x.reshape(b, s, heads, d_k).transpose(0, 2, 1, 3)


def _merge(x: np.ndarray, how: str = "right") -> np.ndarray:
    """(batch, heads, seq_len, d_k) -> (batch, seq_len, heads * d_k), or one of the known mistakes."""
    b, h, s, d_k = x.shape
    if how == "no_transpose":
        return x.reshape(b, s, h * d_k)
    if how == "sum":
        return x.sum(axis=1)
    if how == "mean":
        return x.mean(axis=1)
    if how == "interleaved":  # (batch, seq_len, d_k, heads) flattened: column i * heads + j
        return x.transpose(0, 2, 3, 1).reshape(b, s, h * d_k)
    if how == "reversed":
        return x[:, ::-1].transpose(0, 2, 1, 3).reshape(b, s, h * d_k)
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d_k)


NUMPY_RETURNED = "returns a numpy array for a torch tensor input"


def _shape_hint(message: str) -> str:
    if "is invalid for input of size" in message or "cannot reshape" in message:
        return (". A reshape must keep the number of entries: split d_model into (heads, d_k) with "
                "d_k = d_model // heads, not d_model")
    if "view size is not compatible" in message:
        return (". .view cannot merge axes that are no longer adjacent in memory (after a transpose): "
                "use .reshape or .contiguous().view")
    if "transpose()" in message and ("invalid combination" in message or "positional argument" in message):
        return (": torch's x.transpose swaps two axes, x.transpose(1, 2); to reorder every axis use "
                "x.permute(0, 2, 1, 3)")
    return ""


def _raised_split_merge(got: object, what: str) -> None:
    """A diagnosis for an exception (not NotImplementedError) or a numpy answer to a tensor."""
    if not isinstance(got, Raised) or got.message.startswith("NotImplementedError"):
        return
    if NUMPY_RETURNED in got.message:
        raise CheckFailed(f"{what} {NUMPY_RETURNED}: in this notebook everything is PyTorch, and your "
                          "module calls it on tensors. Use tensor methods (.reshape, .transpose, .permute, "
                          "torch.stack, torch.cat) and no np. functions")
    raise CheckFailed(f"{what} raised {got.message}{_shape_hint(got.message)}")


def _judge_split(got: object, x: np.ndarray, heads: int, what: str) -> None:
    _raised_split_merge(got, what)
    mistakes = [
        ("it reshapes straight to (batch, heads, seq_len, d_k) without a transpose, which mixes the "
         "tokens between heads: reshape to (batch, seq_len, heads, d_k) first, then .transpose(1, 2)",
         _split(x, heads, "no_transpose")),
        ("head j gets the columns j, j + heads, j + 2 heads, ...: it splits d_model as (d_k, heads). "
         "Head j owns the d_k consecutive columns j*d_k ... (j+1)*d_k - 1: reshape to "
         "(batch, seq_len, heads, d_k)", _split(x, heads, "interleaved")),
        ("it returns (batch, heads, d_k, seq_len): after the reshape to (batch, seq_len, heads, d_k) "
         "swap only axes 1 and 2, .transpose(1, 2)", _split(x, heads, "d_k_last_swapped")),
        ("it returns (batch, seq_len, heads, d_k): the heads axis must come before seq_len, "
         ".transpose(1, 2) after the reshape", _split(x, heads, "no_swap")),
    ]
    judge(got, _split(x, heads), what, mistakes)


def _judge_bad_heads(got: object, what: str, name: str = "split_heads", where: str = "first") -> None:
    """heads does not divide d_model: the docstring promises ValueError, nothing else."""
    if isinstance(got, Raised):
        if got.message.startswith("ValueError"):
            return
        if got.message.startswith("NotImplementedError"):
            answer_value(got, name)  # its own diagnosis: not answered yet
        if got.message.startswith("RuntimeError"):
            raise CheckFailed(f"{what} raised {got.message}; it should raise ValueError, as the docstring "
                              f"says (torch's own reshape error is a RuntimeError): check d_model % heads {where} "
                              "and raise ValueError yourself")
        raise CheckFailed(f"{what} raised {got.message}; it should raise ValueError, as the docstring "
                          f"says: check d_model % heads {where}")
    raise CheckFailed(f"{what} returned a value; heads does not divide d_model there, so it should "
                      f"raise ValueError, as the docstring says: check d_model % heads {where}")


@exercise("multi_head-split_heads", "split_heads", driver="tensors")
def split_heads_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # (batch 2, seq_len 5, d_model 12 = 3 heads x d_k 4); (3, 7, 8 = 4 x 2); heads=1 by keyword.
    for shape, heads, by_keyword in [((2, 5, 12), 3, False), ((3, 7, 8), 4, False), ((4, 3, 10), 1, True)]:
        x = rng.normal(size=shape)
        what = f"split_heads(x, heads={heads}) for x of shape {shape}"
        args, kwargs = ((x,), {"heads": heads}) if by_keyword else ((x, heads), {})
        asked.append(Question(args, lambda got, x=x, h=heads, w=what: _judge_split(got, x, h, w), kwargs))
    # heads = 5 does not divide d_model = 12: ValueError, not torch's RuntimeError from a reshape
    # (and a reshape to (2, -1, 5, 2) would even succeed)
    x = rng.normal(size=(2, 5, 12))
    what = "split_heads(x, heads=5) for x of shape (2, 5, 12)"
    asked.append(Question((x, 5), lambda got: _judge_bad_heads(got, what)))
    return asked


def _judge_merge(got: object, x: np.ndarray, what: str) -> None:
    _raised_split_merge(got, what)
    mistakes = [
        ("it reshapes (batch, heads, seq_len, d_k) straight to (batch, seq_len, heads * d_k) without a "
         "transpose, which mixes tokens: .transpose(1, 2) first, then reshape", _merge(x, "no_transpose")),
        ("it sums the heads; concatenate them: each token gets heads * d_k features, head j in the "
         "columns j*d_k ... (j+1)*d_k - 1", _merge(x, "sum")),
        ("it averages the heads; concatenate them: each token gets heads * d_k features, head j in "
         "the columns j*d_k ... (j+1)*d_k - 1", _merge(x, "mean")),
        ("the heads are interleaved (column i*heads + j holds entry i of head j): it moves the heads "
         "axis last before the reshape. Use .transpose(1, 2) only, to (batch, seq_len, heads, d_k)",
         _merge(x, "interleaved")),
        ("the heads are concatenated in reverse order: head 0 comes first", _merge(x, "reversed")),
    ]
    judge(got, _merge(x), what, mistakes)


@exercise("multi_head-merge_heads", "merge_heads", driver="tensors")
def merge_heads_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for shape in [(2, 3, 5, 4), (3, 4, 7, 2), (2, 1, 6, 5)]:
        x = rng.normal(size=shape)
        what = f"merge_heads(x) for x of shape {shape}"
        asked.append(Question((x,), lambda got, x=x, w=what: _judge_merge(got, x, w)))
    return asked


# ---------------------------------------------------------------- the module

def _softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _mha(p: dict, query, key, value, mask, *, divisor=None, split="right", merge="right", w_o=True,
         inputs="qkv", projections="qkv", invert=False, fill=-np.inf, after_softmax=False):
    """Multi-head attention in float64 with knobs for the known mistakes; defaults are the reference.

    p holds heads and the weights (nn.Linear layout: y = x @ W.T + b). inputs / projections
    name which input (q, k, v) feeds the query, key and value projection and which projection
    (q, k, v) serves each role.
    """
    with np.errstate(all="ignore"):
        heads = p["heads"]
        source = dict(q=query, k=key, v=value)
        proj = {r: (lambda x, n=n: x @ p[f"W_{n}"].T + p[f"b_{n}"]) for r, n in zip("qkv", projections)}
        q, k, v = (proj[r](source[i]) for r, i in zip("qkv", inputs))
        q, k, v = (_split(t, heads, split) for t in (q, k, v))
        d_k = q.shape[-1]
        scores = q @ np.swapaxes(k, -1, -2) / (np.sqrt(d_k) if divisor is None else divisor)
        if mask is not None:
            m = mask[:, None] if mask.ndim == 3 else mask
            m = ~m if invert else m
            if not after_softmax:
                scores = np.where(m, scores, fill)
        weights = _softmax(scores)
        if mask is not None and after_softmax:  # zeroed after the softmax, rows not renormalized
            weights = np.where(m, weights, 0.0)
        merged = _merge(weights @ v, merge)
        out = merged @ p["W_o"].T + p["b_o"] if w_o else merged
        return out, weights


def _raised_module(got: object, what: str, mask, d_k: int) -> None:
    if not isinstance(got, Raised) or got.message.startswith("NotImplementedError"):
        return
    message = got.message.rstrip(".")
    if "must match the size of tensor" in message or "broadcast" in message:
        if mask is not None and mask.ndim == 3:
            raise CheckFailed(f"{what} raised {message}. The mask {mask.shape} has no heads axis: give it "
                              "one, mask.unsqueeze(1) -> (batch, 1, q_len or 1, k_len), so that it "
                              "broadcasts over the heads of the scores (batch, heads, q_len, k_len)")
        if mask is not None and mask.ndim == 2:
            raise CheckFailed(f"{what} raised {message}. A (q_len, k_len) mask broadcasts over batch and "
                              "heads as it is: add the heads axis to a 3-D mask only (or use "
                              "mask.unsqueeze(-3), which suits both)")
    if "shapes cannot be multiplied" in message and f"x{d_k} and" in message:
        raise CheckFailed(f"{what} raised {message}: a linear layer got d_k = {d_k} features where it "
                          "expects d_model. Are the heads summed or averaged? Concatenate them back to "
                          "(batch, q_len, d_model) (merge_heads) before W_o")
    if "batch2 tensor" in message or "mismatch in its core dimension" in message:
        raise CheckFailed(f"{what} raised {message}: the weights (..., q_len, k_len) do not fit the values "
                          "(..., k_len, d_k). Are query and key swapped? Q = W_q(query), K = W_k(key), "
                          "V = W_v(value)")
    if "NoneType" in message:
        raise CheckFailed(f"{what} raised {message}: something it uses returned None. Does your "
                          "split_heads or merge_heads miss a `return`? Fix that one first")
    if "view size is not compatible" in message:
        raise CheckFailed(f"{what} raised {message}. After a transpose the tensor is not contiguous: "
                          "use .reshape(...) or .contiguous().view(...)")
    if "has no attribute W_" in message or "should be nn.Linear" in message or "has no bias" in message:
        raise CheckFailed(f"{what}: the grader could not load weights into your module: {message}")
    if any(f"has no attribute {n}" in message or f".{n} should be the int" in message
           for n in ("d_model", "heads", "d_k")):
        raise CheckFailed(f"{what}: {message}")
    raise CheckFailed(f"{what} raised {message}")


def _judge_module(got: object, p: dict, query, key, value, mask, what: str) -> None:
    d_k = p["d_model"] // p["heads"]
    _raised_module(got, what, mask, d_k)
    got = answer_value(got, "MultiHeadAttention")
    if not isinstance(got, tuple) or len(got) != 2:
        kind = f"a tuple of {len(got)} items" if isinstance(got, tuple) else "one array"
        raise CheckFailed(f"{what} should return a tuple (output, weights), but it returns {kind}")
    output, weights = _mha(p, query, key, value, mask)
    first, second = (to_array(a, what) for a in got)
    if first.shape == weights.shape and second.shape == output.shape:
        raise CheckFailed(f"{what} returns (weights, output); return (output, weights)")
    if second.shape == weights.shape[:1] + weights.shape[2:] and np.allclose(second, weights.mean(1), atol=1e-5):
        raise CheckFailed(f"the weights of {what} are averaged over the heads, {second.shape}: return "
                          "each head's weights, (batch, heads, q_len, k_len); torch's "
                          "MultiheadAttention averages them only when asked (average_attn_weights)")

    def alt(**knobs):
        """A known mistake's (output, weights), or (None, None) where its shapes do not fit."""
        try:
            return _mha(p, query, key, value, mask, **knobs)
        except ValueError:
            return None, None

    d_model = p["d_model"]
    mistakes = [
        ("it divides the scores by sqrt(d_model); each head's scores are divided by sqrt(d_k), "
         "d_k = d_model / heads", alt(divisor=np.sqrt(d_model))),
        ("it does not scale the scores: divide them by sqrt(d_k)", alt(divisor=1.0)),
        ("it divides the scores by d_k; divide by sqrt(d_k)", alt(divisor=float(d_k))),
        ("it splits the heads with a reshape straight to (batch, heads, seq_len, d_k), no transpose, "
         "which mixes tokens between heads: reshape to (batch, seq_len, heads, d_k), then "
         ".transpose(1, 2) (your split_heads)", alt(split="no_transpose")),
        ("head j gets the columns j, j + heads, ...: split d_model as (heads, d_k), head j owning "
         "d_k consecutive columns", alt(split="interleaved")),
    ]
    if mask is not None:
        mistakes += [
            ("the mask is inverted: in this course True means the query may attend to the key "
             "(torch.nn.MultiheadAttention's masks mean the opposite); fill the scores where the mask "
             "is False", alt(invert=True)),
            ("it ignores the mask: fill the scores where the mask is False with -inf before the softmax",
             _mha(p, query, key, value, None)),
            ("it sets the masked scores to 0; set them to -inf (e^0 = 1 keeps their weight)",
             alt(fill=0.0)),
            ("it masks after the softmax: fill the scores with -inf before the softmax; don't zero the "
             "weights after it (the rows no longer sum to 1)", alt(after_softmax=True)),
        ]
    mistakes += [
        ("the query, key and value projections are applied to the wrong inputs: W_q to query, W_k "
         "to key, W_v to value", alt(inputs="kqv")),
        ("the query, key and value projections are applied to the wrong inputs: W_k to key, W_v to "
         "value (key and value are swapped)", alt(inputs="qvk")),
        ("the query, key and value projections are applied to the wrong inputs: W_q to query, not "
         "to value", alt(inputs="vkq")),
        ("W_k and W_v are swapped: keys come from W_k, values from W_v", alt(projections="qvk")),
        ("W_q and W_k are swapped: queries come from W_q, keys from W_k", alt(projections="kqv")),
    ]
    judge(second, weights, f"the weights of {what}", [(m, w[1]) for m, w in mistakes if w[1] is not None], hints=[
        lambda w: ("each query's weights over the keys should sum to 1: softmax over the last axis"
                   if w.shape == weights.shape and not np.allclose(w.sum(-1), 1.0, atol=1e-4) else None)])
    mistakes += [
        ("the output skips W_o: after concatenating the heads, apply the output projection W_o",
         alt(w_o=False)),
        ("it concatenates the heads with a reshape of (batch, heads, q_len, d_k) straight to "
         "(batch, q_len, d_model), no transpose, which mixes tokens: .transpose(1, 2) first "
         "(your merge_heads)", alt(merge="no_transpose")),
        ("the heads are interleaved when concatenated: .transpose(1, 2) only, then reshape "
         "(your merge_heads)", alt(merge="interleaved")),
        ("it concatenates the heads in reverse order", alt(merge="reversed")),
        ("the values come from the key input: V = W_v(value)", alt(inputs="qkk")),
    ]
    judge(first, output, f"the output of {what}", [(m, w[0]) for m, w in mistakes if w[0] is not None])


def _weights(rng: np.random.Generator, d_model: int) -> dict:
    scale = 1.0 / np.sqrt(d_model)
    p = {"d_model": d_model}
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


@exercise("multi_head-MultiHeadAttention", "MultiHeadAttention", driver="attention_module")
def multi_head_attention_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    d_model, heads, batch, q_len, k_len = 12, 3, 2, 5, 6

    def ask(query, key, value, mask, note):
        p = dict(_weights(rng, d_model), heads=heads)
        what = (f"MultiHeadAttention(d_model={d_model}, heads={heads}) on query {query.shape}, key "
                f"{key.shape}, value {value.shape}{note}")
        args = (d_model, heads) + tuple(p[f"{kind}_{n}"] for n in "qkvo" for kind in ("W", "b")) + (
            query, key, value, mask)
        asked.append(Question(args, lambda got: _judge_module(got, p, query, key, value, mask, what)))

    # 1. Cross-attention, no mask: distinct query, key and value inputs, q_len 5 != k_len 6.
    ask(rng.normal(size=(batch, q_len, d_model)), rng.normal(size=(batch, k_len, d_model)),
        rng.normal(size=(batch, k_len, d_model)), None, ", no mask")
    # 2. A padding mask (batch, 1, k_len) from two lengths: it must broadcast over the heads.
    lengths = rng.permutation([3, 4, 5])[:2]
    padding = (np.arange(k_len) < lengths[:, None])[:, None, :]
    ask(rng.normal(size=(batch, q_len, d_model)), rng.normal(size=(batch, k_len, d_model)),
        rng.normal(size=(batch, k_len, d_model)), padding, f", padding mask {padding.shape}")
    # 3. Self-attention (one input) with a causal mask (q_len, q_len).
    x = rng.normal(size=(batch, q_len, d_model))
    ask(x, x, x, np.tril(np.ones((q_len, q_len), dtype=bool)), f", self-attention, causal mask ({q_len}, {q_len})")
    # 4. Cross-attention with a full (batch, q_len, k_len) mask.
    ask(rng.normal(size=(batch, q_len, d_model)), rng.normal(size=(batch, k_len, d_model)),
        rng.normal(size=(batch, k_len, d_model)), _mask_rows(rng, (batch, q_len, k_len)),
        f", mask ({batch}, {q_len}, {k_len})")
    # 5. heads = 4 does not divide d_model = 10: __init__ raises ValueError (the driver only builds).
    what = "MultiHeadAttention(d_model=10, heads=4)"
    asked.append(Question((10, 4), lambda got: _judge_bad_heads(got, what, "MultiHeadAttention",
                                                                "in __init__")))
    return asked


# ---------------------------------------------------------------- loading torch's weights

def _judge_loaded(got: object, p: dict, what: str) -> None:
    if isinstance(got, Raised):
        got = Raised(got.message.rstrip("."))
        if "leaf Variable that requires grad" in got.message:
            raise CheckFailed(f"{what} raised {got.message}: copy into parameters inside "
                              "`with torch.no_grad():`")
        if "has no attribute W_" in got.message or "should be nn.Linear" in got.message:
            raise CheckFailed(f"{what} raised {got.message}: copy into the module's existing layers "
                              "(module.W_q.weight, module.W_q.bias, ...)")
        if "must match the size" in got.message or "expanded size" in got.message:
            raise CheckFailed(f"{what} raised {got.message}: in_proj_weight is (3 d_model, d_model), the "
                              "rows of W_q, then W_k, then W_v; split it into three (d_model, d_model) "
                              "chunks along dim 0")
    got = answer_value(got, "load_torch_weights")
    if not isinstance(got, tuple) or len(got) != 9:
        raise CheckFailed(f"{what}: the grader could not read the module's layers back")
    d = p["d_model"]
    chunks = {"query": p["in_w"][:d], "key": p["in_w"][d:2 * d], "value": p["in_w"][2 * d:]}
    bias_chunks = {"query": p["in_b"][:d], "key": p["in_b"][d:2 * d], "value": p["in_b"][2 * d:]}
    roles = dict(zip(LINEARS, ["query", "key", "value", "out"]))
    for i, name in enumerate(LINEARS):
        role = roles[name]
        weight, bias = got[2 * i], got[2 * i + 1]
        if role == "out":
            want_w, want_b = p["out_w"], p["out_b"]
            source_w, source_b = "out_proj.weight", "out_proj.bias"
        else:
            want_w, want_b = chunks[role], bias_chunks[role]
            source_w, source_b = f"the {role} rows of in_proj_weight", f"the {role} part of in_proj_bias"
        w_mistakes = [(f"it is still all zeros: nothing was copied from {source_w}",
                       np.zeros_like(want_w)),
                      (f"it holds the transpose of {source_w}: nn.Linear and in_proj_weight both store "
                       "(out_features, in_features), copy without .T", want_w.T)]
        b_mistakes = [(f"it is still all zeros: nothing was copied from {source_b} (copy the biases too)",
                       np.zeros_like(want_b))]
        if role != "out":
            for other in ("query", "key", "value"):
                if other != role:
                    w_mistakes.append((f"it holds the {other} rows of in_proj_weight; in_proj_weight "
                                       "stacks the rows of query, key, value in that order (chunk 0, 1, 2)",
                                       chunks[other]))
                    w_mistakes.append((f"it holds the transposed {other} rows of in_proj_weight: "
                                       "chunks in the order query, key, value, and no .T", chunks[other].T))
                    b_mistakes.append((f"it holds the {other} part of in_proj_bias; in_proj_bias stacks "
                                       "query, key, value in that order", bias_chunks[other]))
        judge(weight, want_w, f"{what}: module.{name}.weight", w_mistakes)
        judge(bias, want_b, f"{what}: module.{name}.bias", b_mistakes)
    if not bool(np.asarray(got[8])):
        raise CheckFailed(f"{what}: the weights are right, but load_torch_weights should return the module "
                          "it loaded into (`return module`), as the docstring says")


@exercise("multi_head-load_torch_weights", "load_torch_weights", driver="weight_loader")
def load_torch_weights_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for d_model, heads in [(12, 3), (10, 2)]:
        p = {"d_model": d_model,
             "in_w": rng.normal(scale=0.4, size=(3 * d_model, d_model)),
             "in_b": rng.normal(scale=0.4, size=(3 * d_model,)),
             "out_w": rng.normal(scale=0.4, size=(d_model, d_model)),
             "out_b": rng.normal(scale=0.4, size=(d_model,))}
        what = f"load_torch_weights(module, torch_mha) for d_model={d_model}, heads={heads}"
        args = (d_model, heads, p["in_w"], p["in_b"], p["out_w"], p["out_b"])
        asked.append(Question(args, lambda got, p=p, w=what: _judge_loaded(got, p, w)))
    return asked
