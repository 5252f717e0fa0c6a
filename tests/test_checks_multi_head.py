"""Mistake and variant cases of notebook 06's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6). The module and the weight loader go
through the drivers of coursekit.probe, as they do while grading.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.check_cases import shared_tests
from tests.conftest import solution_namespace


@pytest.fixture(scope="module")
def multi_head_notebook() -> dict:
    """The reference solutions of notebook 06 (split_heads, merge_heads, MultiHeadAttention, ...)."""
    return solution_namespace("06_multi_head")


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- split_heads
# Notebook 06 is PyTorch throughout: the checks call split_heads and merge_heads on tensors.

def _split(x, heads):
    b, s, d = x.shape
    if d % heads:
        raise ValueError("heads must divide d_model")
    return x.reshape(b, s, heads, d // heads).transpose(1, 2)


def _split_no_transpose(x, heads):
    b, s, d = x.shape
    if d % heads:
        raise ValueError("heads must divide d_model")
    return x.reshape(b, heads, s, d // heads)


def _split_interleaved(x, heads):
    b, s, d = x.shape
    if d % heads:
        raise ValueError("heads must divide d_model")
    return x.reshape(b, s, d // heads, heads).permute(0, 3, 1, 2)


def _split_d_k_is_d_model(x, heads):
    b, s, d = x.shape
    return x.reshape(b, s, heads, d).transpose(1, 2)


def _split_wrong_transpose(x, heads):
    b, s, d = x.shape
    if d % heads:
        raise ValueError("heads must divide d_model")
    return x.reshape(b, s, heads, d // heads).permute(0, 2, 3, 1)


def _split_no_swap(x, heads):
    b, s, d = x.shape
    if d % heads:
        raise ValueError("heads must divide d_model")
    return x.reshape(b, s, heads, d // heads)


def _split_no_check(x, heads):
    """reshape(b, -1, h, d_k): silently fine when heads does not divide d_model."""
    b, s, d = x.shape
    return x.reshape(b, -1, heads, d // heads).transpose(1, 2)


def _split_relies_on_reshape(x, heads):
    """No check of its own: torch's reshape raises RuntimeError, not the promised ValueError."""
    b, s, d = x.shape
    return x.reshape(b, s, heads, d // heads).transpose(1, 2)


def _split_numpy_transpose(x, heads):
    """numpy's transpose signature on a tensor: torch's transpose swaps two axes."""
    b, s, d = x.shape
    if d % heads:
        raise ValueError("heads must divide d_model")
    return x.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)


def _split_returns_numpy(x, heads):
    """np.split / np.stack: a numpy array comes back for a tensor."""
    if x.shape[-1] % heads:
        raise ValueError("heads must divide d_model")
    return np.stack(np.split(np.asarray(x), heads, axis=-1), axis=1)


def _split_view_permute(x, heads):
    """PyTorch's .view (x is contiguous) and .permute."""
    b, s, d = x.size()
    if d % heads != 0:
        raise ValueError(f"{heads} heads do not divide d_model = {d}")
    return x.view(b, s, heads, d // heads).permute(0, 2, 1, 3)


def _split_loop_float32(x, heads):
    x = x.float()
    d = x.shape[-1]
    if d % heads:
        raise ValueError("heads must divide d_model")
    d_k = d // heads
    return torch.stack([x[..., j * d_k:(j + 1) * d_k] for j in range(heads)], dim=1)


def _split_chunk_stack(x, heads):
    if x.shape[-1] % heads:
        raise ValueError("heads must divide d_model")
    return torch.stack(x.chunk(heads, dim=-1), dim=1)


def _split_unflatten_swapaxes(x, heads):
    if x.shape[-1] % heads:
        raise ValueError("heads must divide d_model")
    return x.unflatten(-1, (heads, -1)).swapaxes(1, 2)


# ---------------------------------------------------------------- merge_heads

def _merge(x):
    b, h, s, d_k = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d_k)


def _merge_contiguous_view(x):
    b, h, s, d_k = x.size()
    return x.transpose(1, 2).contiguous().view(b, s, h * d_k)


def _merge_view_no_contiguous(x):
    b, h, s, d_k = x.size()
    return x.transpose(1, 2).view(b, s, h * d_k)


def _merge_loop_cat(x):
    return torch.cat([x[:, j] for j in range(x.shape[1])], dim=-1)


def _merge_unbind_cat_float32(x):
    return torch.cat(x.float().unbind(dim=1), dim=-1)


def _merge_permute_flatten(x):
    return x.permute(0, 2, 1, 3).flatten(-2)


def _merge_numpy(x):
    x = np.asarray(x)
    return x.swapaxes(1, 2).reshape(x.shape[0], x.shape[2], -1)


# ---------------------------------------------------------------- MultiHeadAttention

def _attention(q, k, v, mask=None, fill=float("-inf"), scale=None, after_softmax=False):
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None and not after_softmax:
        scores = scores.masked_fill(~mask, fill)
    w = torch.softmax(scores, dim=-1)
    if mask is not None and after_softmax:
        w = w.masked_fill(~mask, 0.0)
        if after_softmax == "renormalize":  # valid: equal to masking before the softmax
            w = w / w.sum(-1, keepdim=True)
    return w @ v, w


def make_mha(*, scale="d_k", split="right", merge="right", heads_mode="concat", mask_mode="unsqueeze3",
             w_o=True, inputs="qkv", invert=False, average=False, swap_return=False, bias=True,
             names=("W_q", "W_k", "W_v", "W_o"), check=True, sizes=("d_model", "heads", "d_k"),
             after_softmax=False):
    """A learner-style module with knobs for the mistakes learners make."""

    class MHA(nn.Module):
        def __init__(self, d_model, heads):
            super().__init__()
            if check and d_model % heads:
                raise ValueError("heads must divide d_model")
            for name, size in [("d_model", d_model), ("heads", heads), ("d_k", d_model // heads)]:
                if name in sizes:
                    setattr(self, name, size)
            self._h = heads
            for name in names:
                setattr(self, name, nn.Linear(d_model, d_model, bias=bias))

        def forward(self, query, key, value, mask=None):
            b, q_len, d = query.shape
            h, d_k = self._h, d // self._h
            src = dict(q=query, k=key, v=value)
            layers = [getattr(self, n) for n in names]
            Q, K, V = (layer(src[i]) for layer, i in zip(layers[:3], inputs))

            def split_(t):
                if split == "no_transpose":
                    return t.reshape(b, h, t.shape[1], d_k)
                if split == "transpose_first":
                    return t.transpose(1, 2).reshape(b, h, t.shape[1], d_k)
                return t.reshape(b, t.shape[1], h, d_k).transpose(1, 2)

            Q, K, V = split_(Q), split_(K), split_(V)
            if mask is not None:
                if mask_mode == "unsqueeze3" and mask.dim() == 3:
                    mask = mask.unsqueeze(1)
                elif mask_mode == "always":
                    mask = mask.unsqueeze(1)
                if invert:
                    mask = ~mask
            scale_ = {"d_k": None, "d_model": d ** -0.5}[scale]
            out, w = _attention(Q, K, V, mask, scale=scale_, after_softmax=after_softmax)
            if heads_mode == "sum":
                merged = out.sum(dim=1)
            elif merge == "none":  # a merge_heads that forgot its return
                merged = None
            elif merge == "no_transpose":
                merged = out.reshape(b, q_len, d)
            elif merge == "last_axes":
                merged = out.transpose(-1, -2).reshape(b, q_len, d)
            else:
                merged = out.transpose(1, 2).reshape(b, q_len, d)
            result = layers[3](merged) if w_o else merged
            if average:
                w = w.mean(dim=1)
            return (w, result) if swap_return else (result, w)

    return MHA


class EinsumMHA(nn.Module):
    """Valid: einsum everywhere, float64 inside, a -1e9 fill, mask.unsqueeze(-3)."""

    def __init__(self, d_model, heads):
        super().__init__()
        if d_model % heads:
            raise ValueError("heads must divide d_model")
        self.d_model, self.heads, self.d_k = d_model, heads, d_model // heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask=None):
        def heads(t):
            return t.double().unflatten(-1, (self.heads, -1))      # (b, len, h, d_k)
        q, k, v = heads(self.W_q(query)), heads(self.W_k(key)), heads(self.W_v(value))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask.unsqueeze(-3), -1e9)
        w = scores.softmax(dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", w, v).flatten(-2)
        return self.W_o(out.float()), w.float()


class LoopMHA(nn.Module):
    """Valid: one head at a time with column slices, W_o applied as a sum of per-head blocks;
    the weights masked after the softmax and renormalized (the same as before it)."""

    def __init__(self, d_model, heads):
        super().__init__()
        if d_model % heads != 0:
            raise ValueError(f"{heads} heads do not divide d_model = {d_model}")
        self.d_model = d_model
        self.heads = heads
        self.d_k = d_model // heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        Q, K, V = self.W_q(query), self.W_k(key), self.W_v(value)
        d_k = Q.shape[-1] // self.heads
        out, maps = self.W_o.bias, []
        for j in range(self.heads):                  # per-head scores are (batch, q_len, k_len): masks fit as given
            cols = slice(j * d_k, (j + 1) * d_k)
            o, w = _attention(Q[..., cols], K[..., cols], V[..., cols], mask, after_softmax="renormalize")
            out = out + o @ self.W_o.weight[:, cols].T
            maps.append(w)
        return out, torch.stack(maps, dim=1)


class FunctionalMHA(nn.Module):
    """Valid: torch's F.scaled_dot_product_attention for the output, weights beside it."""

    def __init__(self, d_model, heads):
        super().__init__()
        if d_model % heads:
            raise ValueError("heads must divide d_model")
        self.d_model, self.heads, self.d_k = d_model, heads, d_model // heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask=None):
        import torch.nn.functional as F
        b = query.shape[0]
        q, k, v = (layer(t).view(b, -1, self.heads, self.d_k).permute(0, 2, 1, 3)
                   for layer, t in [(self.W_q, query), (self.W_k, key), (self.W_v, value)])
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        _, w = _attention(q, k, v, mask)
        return self.W_o(out.transpose(1, 2).reshape(b, -1, query.shape[-1])), w


class ChunkStackMHA(nn.Module):
    """Valid: heads cut with chunk/stack and put back with cat/unbind, in float64 inside."""

    def __init__(self, d_model, heads):
        super().__init__()
        if d_model % heads:
            raise ValueError("heads must divide d_model")
        self.d_model, self.heads, self.d_k = d_model, heads, d_model // heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        q, k, v = (torch.stack(layer(t).double().chunk(self.heads, dim=-1), dim=1)
                   for layer, t in [(self.W_q, query), (self.W_k, key), (self.W_v, value)])
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]
        out, w = _attention(q, k, v, mask)
        return self.W_o(torch.cat(out.float().unbind(1), dim=-1)), w.float()


class NotAModule:
    def __init__(self, d_model, heads):
        self.W_q = self.W_k = self.W_v = self.W_o = nn.Linear(d_model, d_model)


# ---------------------------------------------------------------- load_torch_weights

def _loader(order=(0, 1, 2), transpose=False, biases=True, out_proj=True, no_grad=True, returns=True):
    def load(module, torch_mha):
        d = torch_mha.embed_dim
        w = torch_mha.in_proj_weight.split(d)
        b = torch_mha.in_proj_bias.split(d)
        pairs = [(module.W_q, w[order[0]], b[order[0]]), (module.W_k, w[order[1]], b[order[1]]),
                 (module.W_v, w[order[2]], b[order[2]])]
        if out_proj:
            pairs.append((module.W_o, torch_mha.out_proj.weight, torch_mha.out_proj.bias))

        def copy():
            for layer, weight, bias in pairs:
                layer.weight.copy_(weight.T if transpose else weight)
                if biases:
                    layer.bias.copy_(bias)
        if no_grad:
            with torch.no_grad():
                copy()
        else:
            copy()
        return module if returns else None
    return load


def _load_by_module_d_model(module, torch_mha):
    """Valid: sizes read from the module (the docstring says it has d_model, heads, d_k)."""
    d = module.d_model
    with torch.no_grad():
        for i, layer in enumerate([module.W_q, module.W_k, module.W_v]):
            layer.weight.copy_(torch_mha.in_proj_weight[i * d:(i + 1) * d])
            layer.bias.copy_(torch_mha.in_proj_bias[i * d:(i + 1) * d])
        module.W_o.load_state_dict(torch_mha.out_proj.state_dict())
    return module


def _load_data_attribute(module, torch_mha):
    d = torch_mha.embed_dim
    for i, layer in enumerate([module.W_q, module.W_k, module.W_v]):
        layer.weight.data = torch_mha.in_proj_weight.data[i * d:(i + 1) * d].clone()
        layer.bias.data = torch_mha.in_proj_bias.data[i * d:(i + 1) * d].clone()
    module.W_o.weight.data = torch_mha.out_proj.weight.data.clone()
    module.W_o.bias.data = torch_mha.out_proj.bias.data.clone()
    return module


def _load_state_dict(module, torch_mha):
    w_q, w_k, w_v = torch_mha.in_proj_weight.detach().chunk(3)
    b_q, b_k, b_v = torch_mha.in_proj_bias.detach().chunk(3)
    module.load_state_dict({"W_q.weight": w_q, "W_q.bias": b_q, "W_k.weight": w_k, "W_k.bias": b_k,
                            "W_v.weight": w_v, "W_v.bias": b_v,
                            "W_o.weight": torch_mha.out_proj.weight.detach(),
                            "W_o.bias": torch_mha.out_proj.bias.detach()})
    return module


def _load_new_parameters(module, torch_mha):
    d = torch_mha.embed_dim
    for i, name in enumerate(["W_q", "W_k", "W_v"]):
        layer = getattr(module, name)
        layer.weight = nn.Parameter(torch_mha.in_proj_weight[i * d:(i + 1) * d].detach().clone())
        layer.bias = nn.Parameter(torch_mha.in_proj_bias[i * d:(i + 1) * d].detach().clone())
    module.W_o.weight = nn.Parameter(torch_mha.out_proj.weight.detach().clone())
    module.W_o.bias = nn.Parameter(torch_mha.out_proj.bias.detach().clone())
    return module


def _split_transpose_then_reshape(x, heads):
    """Transposed to (batch, d_model, seq_len) first, then reshaped into the heads."""
    b, s, d = x.shape
    if d % heads:
        raise ValueError("heads must divide d_model")
    return x.transpose(1, 2).reshape(b, heads, s, d // heads)


def _merge_last_axes_swapped(x):
    """.transpose(-1, -2) where .transpose(1, 2) is due."""
    b, h, s, d_k = x.shape
    return x.transpose(-1, -2).reshape(b, s, h * d_k)


def _merge_reshape_then_transpose(x):
    b, h, s, d_k = x.shape
    return x.reshape(b, h * d_k, s).transpose(1, 2)


def _merge_heads_axis_first(x):
    """The heads moved to the front of each token's features by the wrong permutation."""
    b, h, s, d_k = x.shape
    return x.permute(2, 0, 1, 3).reshape(b, s, h * d_k)


def _split_features_outer(x, heads):
    """d_model split as (d_k, heads), the heads then moved forward with one permute."""
    b, s, d = x.shape
    if d % heads:
        raise ValueError("heads must divide d_model")
    return x.reshape(b, d // heads, s, heads).permute(0, 3, 2, 1)


MISTAKES = {
    "multi_head-split_heads": [
        (_split_no_transpose, "without a transpose, which mixes the tokens between heads"),
        (_split_interleaved, "head j gets the columns j, j + heads"),
        (_split_d_k_is_d_model, "d_k = d_model // heads, not d_model"),
        (_split_wrong_transpose, "returns (batch, heads, d_k, seq_len)"),
        (_split_no_swap, "returns (batch, seq_len, heads, d_k)"),
        (_split_transpose_then_reshape, "it transposes x to (batch, d_model, seq_len) before the reshape"),
        (_split_features_outer, "it holds the right numbers in the wrong places"),
        (_split_no_check, "returned a value; heads does not divide d_model"),
        (_split_relies_on_reshape, "torch's own reshape error is a RuntimeError"),
        (_split_numpy_transpose, "to reorder every axis use x.permute(0, 2, 1, 3)"),
        (_split_returns_numpy, "returns a numpy array for a torch tensor input"),
        (lambda x, heads: _split(x, heads)[..., :1], "expected (2, 3, 5, 4)"),
        (stub, "not answered yet"),
    ],
    "multi_head-merge_heads": [
        (lambda x: x.reshape(x.shape[0], x.shape[2], -1), "without a transpose, which mixes tokens"),
        (lambda x: x.sum(dim=1), "it sums the heads; concatenate them"),
        (lambda x: x.mean(dim=1), "it averages the heads; concatenate them"),
        (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), "the heads are interleaved"),
        (lambda x: _merge(x.flip(1)), "concatenated in reverse order"),
        (_merge_last_axes_swapped, "it swaps seq_len and d_k"),
        (_merge_heads_axis_first, "it holds the right numbers in the wrong places"),
        (_merge_reshape_then_transpose, "reshapes (batch, heads, seq_len, d_k) to (batch, d_model, seq_len) and "
                                        "transposes after"),
        (_merge_view_no_contiguous, "use .reshape or .contiguous().view"),
        (_merge_numpy, "returns a numpy array for a torch tensor input"),
        (stub, "not answered yet"),
    ],
    "multi_head-MultiHeadAttention": [
        (make_mha(scale="d_model"), "divides the scores by sqrt(d_model)"),
        (make_mha(heads_mode="sum"), "Are the heads summed or averaged?"),
        (make_mha(split="no_transpose"), "splits the heads with a reshape straight to"),
        (make_mha(split="transpose_first"), "it transposes x to (batch, d_model, seq_len) before the reshape"),
        (make_mha(merge="last_axes"), "it swaps seq_len and d_k"),
        (make_mha(merge="no_transpose"), "concatenates the heads with a reshape of (batch, heads, q_len, d_k) straight"),
        (make_mha(mask_mode="never"), "has no heads axis: give it one, mask.unsqueeze(1)"),
        (make_mha(mask_mode="always"), "A (q_len, k_len) mask broadcasts over batch and heads as it is"),
        (make_mha(w_o=False), "the output skips W_o"),
        (make_mha(merge="none"), "miss a `return`"),
        (make_mha(inputs="kqv"), "Are query and key swapped?"),
        (make_mha(names=("W_k", "W_q", "W_v", "W_o")), "W_q and W_k are swapped"),
        (make_mha(names=("W_q", "W_v", "W_k", "W_o")), "W_k and W_v are swapped"),
        (make_mha(inputs="qvk"), "key and value are swapped"),
        (make_mha(invert=True), "the mask is inverted"),
        (make_mha(average=True), "averaged over the heads"),
        (make_mha(swap_return=True), "returns (weights, output)"),
        (make_mha(bias=False), "has no bias"),
        (make_mha(names=("w_q", "w_k", "w_v", "w_o")), "has no attribute W_q"),
        (NotAModule, "is not a torch.nn.Module"),
        (make_mha(scale="d_model"), "sqrt(d_k), d_k = d_model / heads"),
        (make_mha(check=False), "MultiHeadAttention(d_model=10, heads=4) returned a value"),
        (make_mha(after_softmax=True), "it masks after the softmax: fill the scores with -inf before"),
        (make_mha(sizes=("heads",)), "has no attribute d_model: set self.d_model, self.heads and self.d_k"),
        (stub, "it should be a class"),
        (type("Stub", (nn.Module,), {"__init__": lambda self, d, h: stub()}), "not answered yet"),
    ],
    "multi_head-load_torch_weights": [
        (_loader(order=(1, 0, 2)), "holds the key rows of in_proj_weight"),
        (_loader(order=(2, 1, 0)), "holds the value rows of in_proj_weight"),
        (_loader(transpose=True), "holds the transpose of the query rows"),
        (_loader(biases=False), "nothing was copied from the query part of in_proj_bias (copy the biases too)"),
        (_loader(out_proj=False), "nothing was copied from out_proj.weight"),
        (_loader(no_grad=False), "inside `with torch.no_grad():`"),
        (lambda module, torch_mha: None, "nothing was copied from the query rows of in_proj_weight"),
        (_loader(returns=False), "load_torch_weights should return the module it loaded into"),
        (stub, "not answered yet"),
    ],
}

VARIANTS = {
    "multi_head-split_heads": [_split, _split_view_permute, _split_loop_float32, _split_chunk_stack,
                               _split_unflatten_swapaxes],
    "multi_head-merge_heads": [_merge, _merge_contiguous_view, _merge_loop_cat, _merge_unbind_cat_float32,
                               _merge_permute_flatten],
    "multi_head-MultiHeadAttention": [make_mha(), EinsumMHA, LoopMHA, FunctionalMHA, ChunkStackMHA],
    "multi_head-load_torch_weights": [_loader(), _load_by_module_d_model, _load_data_attribute, _load_state_dict,
                                      _load_new_parameters],
}


globals().update(shared_tests("multi_head", MISTAKES, VARIANTS, solutions="multi_head_notebook", seeds=40))


def test_reference_module_matches_torch(multi_head_notebook):
    """The notebook's claim: loaded with a torch module's weights, the reference matches it
    to 1e-5, outputs and head-averaged weights, with and without a key padding mask."""
    ns = multi_head_notebook
    torch.manual_seed(3)
    theirs = nn.MultiheadAttention(12, 3, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    mine = ns["load_torch_weights"](ns["MultiHeadAttention"](12, 3), theirs).eval()
    x, memory = torch.randn(2, 5, 12), torch.randn(2, 6, 12)
    keep = torch.arange(6) < torch.tensor([[6], [2]])
    with torch.no_grad():
        for mask in (None, keep):
            out, w = mine(x, memory, memory, None if mask is None else mask[:, None, :])
            ref, ref_w = theirs(x, memory, memory, key_padding_mask=None if mask is None else ~mask)
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
            torch.testing.assert_close(w.mean(1), ref_w, rtol=0, atol=1e-5)


def test_a_parameter_the_loader_never_writes_is_named_by_what_the_loader_did():
    """The grader's module starts at zero, the learner's at nn.Linear's random values: the
    diagnosis says what the learner's loader did (it never wrote the parameter), not what
    the grader's module held ("still all zeros" is true of the grader's module only)."""
    from grader.checks import CheckFailed, check

    def loads_the_key_rows_only(module, torch_mha):
        with torch.no_grad():
            module.W_k.weight.copy_(torch_mha.in_proj_weight.chunk(3)[1])
        return module

    for loader, parameter in [(_loader(biases=False), "module.W_q.bias"), (_loader(out_proj=False), "module.W_o.weight"),
                              (loads_the_key_rows_only, "module.W_q.weight")]:
        with pytest.raises(CheckFailed) as failure:
            check("multi_head-load_torch_weights", loader)
        message = str(failure.value)
        assert f"{parameter}: load_torch_weights never writes it, so it keeps the layer's initial values" in message
        assert "zeros" not in message, message
