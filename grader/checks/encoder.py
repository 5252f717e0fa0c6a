"""Hidden checks of notebook 07, encoder: layer norm, feed-forward, sublayer connection, layer, stack.

Everything in notebook 07 is PyTorch. ``layer_norm`` and ``feed_forward`` are called on
torch tensors (driver ``tensors``); ``sublayer_connection``, ``EncoderLayer`` and
``Encoder`` go through the drivers of ``coursekit/drivers/encoder.py``, which build the
sublayer and norm (or the learner's module) kernel-side, load the weights drawn here BY
NAME (the names of torch.nn.TransformerEncoderLayer), switch to eval mode and call twice
(dropout left on in eval mode makes the two calls differ).

The references are ``reference/encoder.py``; each catalogued mistake is a reference with
one piece done wrong. Sizes are pairwise distinct (batch 2, seq_len 5, heads 3, d_k 4,
d_model 12, d_ff 20), every LayerNorm has a non-unit gamma and a nonzero beta, every
sublayer a bias and a nonlinearity, and every padded sentence keeps at least one real
token and one padding token (so that an inverted mask never masks a whole row).
"""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from coursekit.drivers.encoder import LAYER_KEYS

from ._core import (Call, Case, CheckFailed, Knob, Mistake, Raised, Raises, Spec, Unsupported, judge_case, to_array,
                    value)
from .reference import encoder as ref

STACK_ATOL = 1e-4  # deep stacks in float32 (exercise-standard.md)
_OUTPUT = "the output of "


def _named(what: str) -> str:
    return what.removeprefix(_OUTPUT)


def _raising(told: tuple[tuple[str, str], ...] = (), judge=judge_case, by_call: bool = False):
    """A judge hook: a raised error by ``told``, (pattern, template) pairs whose template
    quotes the driver's own sentence as ``{detail}``, else by the spec's rules (``{error}``
    without its final period, ``{what}`` the call, not its output); else ``judge``.
    ``by_call``: non-data and a NotImplementedError are named by the call, not the function."""

    def judged(case: Case) -> None:
        answer = case.answer
        if by_call and (isinstance(answer, Unsupported) or isinstance(answer, Raised)
                        and answer.message.startswith("NotImplementedError")):
            value(answer, case.what)
        if isinstance(answer, Raised) and not answer.message.startswith("NotImplementedError"):
            message, what = answer.message.rstrip("."), _named(case.what)
            for pattern, template in told:
                if re.search(pattern, message):
                    raise CheckFailed(template.format(what=what, detail=message.split(": ", 1)[-1]))
            for rule in case.spec.errors:
                if re.search(rule.match, message):
                    raise CheckFailed(rule.diagnosis.format(error=message, what=what))
            raise CheckFailed(f"{what} raised {message}")
        judge(case)

    return judged


_NUMPY = ("returns a numpy array for a torch tensor input",
          "{what} returns a numpy array for torch tensor inputs: in this notebook everything is PyTorch. "
          "Use tensor operations (x.mean, x.var, torch.relu, @) and no np. functions")
_NUMPY_SAID = _NUMPY[1].removeprefix("{what} ")


# ---------------------------------------------------------------- layer_norm

def _rows(rng, shape, small_row=False):
    """Rows (tokens) with different means and scales; one row of tiny variance if asked."""
    offsets = rng.uniform(-3, 3, size=shape[:-1] + (1,))
    scales = rng.uniform(0.3, 3.0, size=shape[:-1] + (1,))
    x = offsets + scales * rng.normal(size=shape)
    if small_row:
        # spread 0.004 (variance ~ eps): eps inside or outside the root differ. Centred near 0, so that
        # float32 answers lose no digits to cancellation.
        x.reshape(-1, shape[-1])[0] = rng.uniform(-0.01, 0.01) + 0.004 * rng.normal(size=shape[-1])
    return x


def _layer_norm_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # 1. (batch 2, seq_len 3, d_model 5), default eps; one token with a tiny spread, where eps matters.
    # 2. (4, 6) with eps=0.1 by keyword: eps inside or outside the square root, or ignored.
    # 3. (3, 4, 7), eps=1e-3 positionally.
    for shape, eps, how in [((2, 3, 5), None, "default"), ((4, 6), 0.1, "keyword"), ((3, 4, 7), 1e-3, "positional")]:
        x = _rows(rng, shape, small_row=True)
        d = shape[-1]
        gamma = rng.uniform(0.5, 2.0, size=d) * rng.choice([-1, 1], size=d)
        beta = rng.normal(scale=0.8, size=d)
        what = f"layer_norm(x, gamma, beta{'' if eps is None else f', eps={eps}'}) for x of shape {shape}"
        args, kwargs = ((x, gamma, beta, eps), {}) if how == "positional" else ((x, gamma, beta), {})
        if how == "keyword":
            kwargs = {"eps": eps}
        calls.append(Call(args, kwargs, what))
    return calls


def _ln(x, gamma, beta, eps=1e-5, *, dim=-1, correction=0, root=torch.sqrt, affine=lambda h, g, b: h * g + b):
    """layer_norm with one piece changed (a catalogued mistake)."""
    centred = x - x.mean(dim=dim, keepdim=True)
    return affine(centred / root(x.var(dim=dim, keepdim=True, correction=correction) + eps), gamma, beta)


def _eps_outside(x, gamma, beta, eps=1e-5):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, correction=0).sqrt() + eps) * gamma + beta


LAYER_NORM = Spec(
    id="encoder-layer_norm",
    function="layer_norm",
    inputs=_layer_norm_inputs,
    reference=ref.layer_norm,
    driver="tensors",
    mistakes=(
        Mistake("unbiased", "it divides by the unbiased standard deviation (n - 1 in the variance); nn.LayerNorm "
                "uses the biased variance, the mean of the squared deviations (x.var(dim=-1, unbiased=False), or "
                "correction=0)", lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, correction=1)),
        Mistake("eps_outside", "eps is added outside the square root, (x - mean) / (std + eps); nn.LayerNorm adds "
                "it inside: (x - mean) / sqrt(var + eps)", _eps_outside),
        Mistake("no_root", "it divides by the variance, not by its square root: (x - mean) / sqrt(var + eps)",
                lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, root=lambda v: v)),
        Mistake("swapped_affine", "gamma and beta are swapped: the result is x_hat * gamma + beta (gamma scales, "
                "beta shifts)", lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, affine=lambda h, g, b: h * b + g)),
        Mistake("no_gamma", "gamma is missing: scale the normalized x by gamma, then add beta",
                lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, affine=lambda h, g, b: h + b)),
        Mistake("no_beta", "beta is missing: add beta after scaling by gamma",
                lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, affine=lambda h, g, b: h * g)),
        Mistake("no_affine", "gamma and beta are missing: return x_hat * gamma + beta, not x_hat alone",
                lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, affine=lambda h, g, b: h)),
        # (asked with eps=0.1 and 1e-3: with the default eps the answer is right)
        Mistake("fixed_eps", "it ignores the eps argument (it uses 1e-5 whatever eps is given): use eps",
                lambda x, g, b, eps=1e-5: ref.layer_norm(x, g, b)),
        # (the first question is 3-D: a wrong axis shows there, the 2-D one has no sequence axis)
        Mistake("sequence_axis", "it normalizes over the sequence axis (dim=1); layer norm normalizes each token's "
                "d_model features: mean and variance over the LAST axis, dim=-1, keepdim=True",
                lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, dim=1)),
        Mistake("batch_axis", "it normalizes over the batch axis (dim=0); layer norm normalizes each token's "
                "d_model features: mean and variance over the LAST axis, dim=-1, keepdim=True",
                lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, dim=0)),
    ),
    errors=(
        Raises("{what} raised {error}: the signature is layer_norm(x, gamma, beta, eps=1e-5)",
               example=lambda x, g, b: ref.layer_norm(x, g, b), match="unexpected keyword argument 'eps'"),
    ),
    judge=_raising((_NUMPY,), by_call=True),
    diagnosed=(
        Mistake("numpy", _NUMPY_SAID, lambda x, g, b, eps=1e-5: ref.layer_norm(x, g, b, eps).numpy()),
    ),
)


# ---------------------------------------------------------------- feed_forward

def _feed_forward_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for shape, d_ff in [((2, 5, 6), 10), ((3, 4), 9), ((2, 3, 4, 7), 5)]:
        d = shape[-1]
        x = rng.normal(size=shape)
        W1 = rng.normal(scale=1 / np.sqrt(d), size=(d_ff, d))
        b1 = rng.normal(scale=0.5, size=d_ff)
        W2 = rng.normal(scale=1 / np.sqrt(d_ff), size=(d, d_ff))
        b2 = rng.normal(scale=0.5, size=d)
        calls.append(Call((x, W1, b1, W2, b2), what=f"feed_forward(x, W1, b1, W2, b2) for x of shape {shape}, W1 "
                          f"{W1.shape} and W2 {W2.shape} (nn.Linear layout)"))
    return calls


_ACTIVATIONS = {"relu": torch.relu, "none": lambda h: h, "gelu": F.gelu,
                "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "tanh": torch.tanh,
                "sigmoid": torch.sigmoid, "silu": F.silu, "leaky_relu": F.leaky_relu}


def _feed_forward_variant(activation="relu", biases="both"):
    """feed_forward with another activation between the layers, or without ``biases`` (the
    ones kept: "both", "b1", "b2", "neither")."""
    act = _ACTIVATIONS[activation]

    def feed_forward(x, W1, b1, W2, b2):
        b1 = b1 if biases in ("both", "b1") else 0 * b1
        b2 = b2 if biases in ("both", "b2") else 0 * b2
        return act(x @ W1.T + b1) @ W2.T + b2

    return feed_forward


FEED_FORWARD = Spec(
    id="encoder-feed_forward",
    function="feed_forward",
    inputs=_feed_forward_inputs,
    reference=ref.feed_forward,
    driver="tensors",
    # The activation and the biases are knobs: each wrong setting is a catalogued mistake, and
    # two wrong at once (GELU and no b1) are named together.
    variant=_feed_forward_variant,
    knobs=(
        Knob("activation", (
            ("none", "the ReLU is missing: FFN(x) = max(0, x W1^T + b1) W2^T + b2, the ReLU between the two "
                     "layers"),
            ("gelu", "it applies GELU (x Phi(x), the activation of BERT and GPT) between the layers; the paper's "
                     "FFN uses ReLU, max(0, x): torch.relu"),
            ("gelu_tanh", "it applies the tanh approximation of GELU (GPT-2's); the paper's FFN uses ReLU, "
                          "max(0, x): torch.relu"),
            ("tanh", "it applies tanh between the layers; the paper's FFN uses ReLU, max(0, x): torch.relu"),
            ("sigmoid", "it applies a sigmoid between the layers; the paper's FFN uses ReLU, max(0, x): torch.relu"),
            ("silu", "it applies SiLU (swish, x sigmoid(x)) between the layers; the paper's FFN uses ReLU, "
                     "max(0, x): torch.relu"),
            ("leaky_relu", "it applies a leaky ReLU (slope 0.01 below 0); the paper's ReLU is exactly 0 for "
                           "negative inputs: torch.relu"),
        )),
        Knob("biases", (
            ("b2", "the bias b1 of the first layer is missing"),
            ("b1", "the bias b2 of the second layer is missing"),
            ("neither", "both biases are missing: x W1^T + b1, then ... W2^T + b2"),
        )),
    ),
    mistakes=(
        Mistake("relu_after", "the ReLU is applied after the second layer instead of between the two: the output "
                "must be able to be negative; apply ReLU to the hidden layer x W1^T + b1 only",
                lambda x, W1, b1, W2, b2: torch.relu((x @ W1.T + b1) @ W2.T + b2)),
        Mistake("relu_twice", "the ReLU is applied after the second layer too: apply it to the hidden layer only; "
                "the output of the second layer stays linear",
                lambda x, W1, b1, W2, b2: torch.relu(ref.feed_forward(x, W1, b1, W2, b2))),
    ),
    errors=(
        Raises("{what} raised {error}. The weights use nn.Linear's layout, (out_features, in_features): W1 is "
               "(d_ff, d_model), so the first layer is x @ W1.T + b1 (or F.linear(x, W1, b1)), not x @ W1",
               example=lambda x, W1, b1, W2, b2: torch.relu(x @ W1 + b1) @ W2 + b2,
               match="cannot be multiplied|mismatch in its core dimension|size mismatch|"
                     "Expected size for first two dimensions|must match the size"),
    ),
    judge=_raising((_NUMPY,), by_call=True),
    diagnosed=(
        Mistake("numpy", _NUMPY_SAID, lambda x, W1, b1, W2, b2: ref.feed_forward(x, W1, b1, W2, b2).numpy()),
    ),
)


# ---------------------------------------------------------------- sublayer_connection

def _connection_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # norm_first=True; not passed (the default, post-norm); False by keyword. True comes first so
    # that swapped branches are named as such before a wrong default is.
    for shape, norm_first in [((3, 4, 7), True), ((2, 5, 6), None), ((2, 3, 5), False)]:
        d = shape[-1]
        x = _rows(rng, shape)
        W = rng.normal(scale=1.2 / np.sqrt(d), size=(d, d))
        b = rng.normal(scale=0.5, size=d)
        gamma = rng.uniform(0.5, 2.0, size=d)
        beta = rng.normal(scale=0.8, size=d)
        note = "" if norm_first is None else f", norm_first={norm_first}"
        what = (f"sublayer_connection(x, sublayer, norm{note}) for x of shape {shape}, sublayer = tanh of an "
                "affine map, norm = nn.LayerNorm with trained gamma and beta")
        calls.append(Call((x, W, b, gamma, beta, 1e-5, norm_first), what=what))
    return calls


def _pre_right(post):
    """A connection right in pre-norm and ``post(x, sublayer, norm)`` in post-norm."""
    return lambda x, s, n, norm_first=False: x + s(n(x)) if norm_first else post(x, s, n)


def _post_right(pre):
    return lambda x, s, n, norm_first=False: pre(x, s, n) if norm_first else n(x + s(x))


def _normed(x, s, n):
    x = n(x)
    return x + s(x)


def _no_residual(x, s, n, norm_first=False):
    return s(n(x)) if norm_first else n(s(x))


def _no_norm(x, s, n, norm_first=False):
    return x + s(x)


def _outside(x, s, n, norm_first=False):
    return x + n(s(x))


SUBLAYER_CONNECTION = Spec(
    id="encoder-sublayer_connection",
    function="sublayer_connection",
    inputs=_connection_inputs,
    reference=ref.sublayer_connection,
    driver="encoder.drive_sublayer_connection",
    # Several mistakes are wrong in one arrangement only, so that the diagnosis names the
    # arrangement (pre- or post-norm) of the question that shows it.
    mistakes=(
        Mistake("default_pre", "called without norm_first, it normalizes first: norm_first defaults to False, the "
                "paper's post-norm, norm(x + sublayer(x))",
                lambda x, s, n, norm_first=True: ref.sublayer_connection(x, s, n, norm_first)),
        Mistake("swapped", "with norm_first=True it computes the post-norm norm(x + sublayer(x)); pre-norm is "
                "x + sublayer(norm(x)): are the two branches swapped?",
                lambda x, s, n, norm_first=False: ref.sublayer_connection(x, s, n, not norm_first)),
        Mistake("no_residual_post", "there is no residual: norm(sublayer(x)); post-norm normalizes the sum, "
                "norm(x + sublayer(x))", _pre_right(_no_residual)),
        Mistake("no_residual", "there is no residual: sublayer(norm(x)) alone; pre-norm adds the input, "
                "x + sublayer(norm(x))", _no_residual),
        Mistake("outside", "the norm is applied to the sublayer's output before the residual, x + norm(sublayer(x)); "
                "post-norm normalizes the sum: norm(x + sublayer(x))", _pre_right(_outside)),
        Mistake("normed", "the residual is added to the normalized input, norm(x) + sublayer(norm(x)); the residual "
                "path carries x itself: x + sublayer(norm(x)) (keep x before you normalize it)",
                _post_right(_normed)),
        Mistake("normed_post", "the residual is added to the normalized input, norm(x) + sublayer(norm(x)); "
                "post-norm is norm(x + sublayer(x))", _pre_right(_normed)),
        Mistake("no_norm_post", "the norm is skipped: it returns x + sublayer(x); call norm, norm(x + sublayer(x))",
                _pre_right(_no_norm)),
        Mistake("no_norm", "the norm is skipped: it returns x + sublayer(x); call norm, x + sublayer(norm(x))",
                _no_norm),
        Mistake("alone", "it returns sublayer(x) alone: no residual and no norm",
                lambda x, s, n, norm_first=False: s(x)),
        Mistake("identity", "it returns x unchanged: the sublayer is never applied",
                lambda x, s, n, norm_first=False: x),
    ),
    errors=(
        Raises("{what} raised {error}: the signature is sublayer_connection(x, sublayer, norm, norm_first=False)",
               example=lambda x, s, n, pre_norm=False: ref.sublayer_connection(x, s, n, pre_norm),
               match="unexpected keyword argument 'norm_first'"),
        Raises("{what} raised {error}: norm_first has a default, False (the paper's post-norm): "
               "def sublayer_connection(x, sublayer, norm, norm_first=False)",
               example=lambda x, s, n, norm_first: ref.sublayer_connection(x, s, n, norm_first),
               match="missing 1 required positional argument: 'norm_first'"),
    ),
    judge=_raising(by_call=True),
)


# ---------------------------------------------------------------- EncoderLayer

def _layer_params(rng, d_model, d_ff) -> dict:
    s = 1.0 / np.sqrt(d_model)
    return {
        "self_attn.in_proj_weight": rng.normal(scale=1.5 * s, size=(3 * d_model, d_model)),
        "self_attn.in_proj_bias": rng.normal(scale=0.3, size=3 * d_model),
        "self_attn.out_proj.weight": rng.normal(scale=s, size=(d_model, d_model)),
        "self_attn.out_proj.bias": rng.normal(scale=0.3, size=d_model),
        "linear1.weight": rng.normal(scale=s, size=(d_ff, d_model)),
        "linear1.bias": rng.normal(scale=0.3, size=d_ff),
        "linear2.weight": rng.normal(scale=1 / np.sqrt(d_ff), size=(d_model, d_ff)),
        "linear2.bias": rng.normal(scale=0.3, size=d_model),
        "norm1.weight": rng.uniform(0.5, 1.8, size=d_model),
        "norm1.bias": rng.normal(scale=0.5, size=d_model),
        "norm2.weight": rng.uniform(0.5, 1.8, size=d_model),
        "norm2.bias": rng.normal(scale=0.5, size=d_model),
    }


def _padding(rng, batch, seq_len) -> np.ndarray:
    """(batch, seq_len) True = real token; every sentence has 2 .. seq_len - 1 real tokens, all distinct."""
    lengths = rng.choice(np.arange(2, seq_len), size=batch, replace=False)
    return np.arange(seq_len)[None, :] < lengths[:, None]


def _layer_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    d_model, heads, d_ff, batch, seq_len = 12, 3, 20, 2, 5
    for norm_first, masked in [(False, False), (False, True), (True, True), (True, False)]:
        p = _layer_params(rng, d_model, d_ff)
        x = _rows(rng, (batch, seq_len, d_model))
        keep = _padding(rng, batch, seq_len) if masked else None
        what = (f"EncoderLayer(d_model={d_model}, heads={heads}, d_ff={d_ff}, dropout=0.5, norm_first={norm_first}) "
                f"in eval mode, on x {x.shape}" + (f" with a padding mask {keep.shape}" if masked else ", no mask"))
        args = (d_model, heads, d_ff, norm_first) + tuple(p[k] for k in LAYER_KEYS) + (x, keep)
        calls.append(Call(args, what=_OUTPUT + what))
    return calls


def _two_calls(answer: object, call: Call, what: str) -> np.ndarray:
    """The first of the two eval-mode outputs; a diagnosis if they differ (dropout left on)."""
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise CheckFailed(f"{_named(what)}: the grader could not read your module's output back; forward should "
                          "return one tensor (batch, seq_len, d_model)")
    first, second = (to_array(g, what) for g in answer)
    if first.shape == second.shape and not np.allclose(first, second, rtol=0, atol=1e-6):
        raise CheckFailed(f"{_named(what)}: two calls in eval mode gave different outputs, so dropout is still on "
                          "after .eval(). Use nn.Dropout modules (they switch off in eval mode), or pass "
                          "training=self.training to F.dropout")
    return first


def _layer(**methods):
    """The reference layer with the given methods replaced: a catalogued mistake."""
    return type("EncoderLayer", (ref.EncoderLayer,), methods)


def _connected(connection):
    """A layer whose sublayer connections are ``connection(x, sublayer, norm, norm_first)``."""
    return _layer(connect=lambda self, x, s, n: connection(x, s, n, self.norm_first))


class _AlwaysDropping(ref.EncoderLayer):
    def attend(self, t, ignore):
        return F.dropout(self.self_attn(t, t, t, key_padding_mask=ignore, need_weights=False)[0], 0.5)


class _NoReturn(ref.EncoderLayer):
    def ffn(self, t):
        self.linear2(torch.relu(self.linear1(t)))


class _TupleAttention(ref.EncoderLayer):
    def attend(self, t, ignore):
        return self.self_attn(t, t, t, key_padding_mask=ignore)


class _Old(ref.EncoderLayer):
    def __init__(self, d_model, heads, d_ff, dropout=0.0):
        super().__init__(d_model, heads, d_ff, dropout)


class _Renamed(ref.EncoderLayer):
    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, heads, d_ff, dropout, norm_first)
        self.attn = self.self_attn
        del self.self_attn

    def attend(self, t, ignore):
        return self.attn(t, t, t, key_padding_mask=ignore)[0]


class _NotAModule:
    def __init__(self, *args, **kwargs):
        pass


_MODULE_TOLD = (("is not a torch.nn.Module|it should be a class", "{what}: {detail}"),)
_MODULE_ERRORS = (
    Raises("{what}: the grader could not load torch's weights into your module: {error}", example=_Renamed,
           match="has no parameter|should have shape|has parameters that|share their parameters"),
    Raises("{what} raised {error}: keep the constructor's signature from the docstring", example=_Old,
           match="unexpected keyword argument '(norm_first|dropout|pad_id)'"),
    Raises("{what} raised {error}: nn.MultiheadAttention returns a tuple (output, weights); take the output, "
           "self.self_attn(x, x, x, ...)[0]", example=_TupleAttention, match="tuple"),
    Raises("{what} raised {error}: something it uses returned None. Does your feed_forward, layer_norm or "
           "sublayer_connection miss a `return`? Fix that one first", example=_NoReturn, match="NoneType"),
    Raises("{what} raised {error}: pass PyTorch a bool key_padding_mask of shape (batch, seq_len) with True = "
           "IGNORE, i.e. ~padding_mask", example=_layer(ignored=lambda self, m: None if m is None else (~m).long()),
           match="key_padding_mask|(?i:expected both)"),
)
_MODULE_DIAGNOSED = (
    Mistake("not_a_module", "is not a torch.nn.Module: subclass nn.Module and call super().__init__() first",
            _NotAModule),
    Mistake("not_a_class", "it should be a class (an nn.Module subclass), but it is a function",
            lambda *args: None),
)

ENCODER_LAYER = Spec(
    id="encoder-EncoderLayer",
    function="EncoderLayer",
    depends=("encoder-sublayer_connection",),  # its solution calls them
    inputs=_layer_inputs,
    reference=ref.EncoderLayer,
    driver="encoder.drive_encoder_layer",
    prepare=_two_calls,
    atol=STACK_ATOL,
    # (the mask mistakes change nothing on the questions without a padding mask)
    mistakes=(
        Mistake("mask_inverted", "the padding mask is inverted: this course's padding_mask says True = real token, "
                "PyTorch's key_padding_mask says True = IGNORE; pass key_padding_mask=~padding_mask",
                _layer(ignored=lambda self, m: m)),
        Mistake("mask_ignored", "the padding mask is ignored: pass key_padding_mask=~padding_mask to self.self_attn",
                _layer(ignored=lambda self, m: None)),
        Mistake("norm_first_lost", "it computes the post-norm arrangement; with norm_first=True it is pre-norm, "
                "x + sublayer(norm(x)): check how norm_first reaches your sublayer connections",
                _connected(lambda x, s, n, norm_first: ref.sublayer_connection(x, s, n))),
        Mistake("arrangement_swapped", "it computes the pre-norm arrangement; with norm_first=False it is post-norm, "
                "norm(x + sublayer(x)): check how norm_first reaches your sublayer connections",
                _connected(lambda x, s, n, norm_first: ref.sublayer_connection(x, s, n, not norm_first))),
        Mistake("no_relu", "the ReLU of the feed-forward sublayer is missing: linear2(relu(linear1(x)))",
                _layer(ffn=lambda self, t: self.dropout(self.linear2(self.linear1(t))))),
        Mistake("norms_swapped", "norm1 and norm2 are swapped: norm1 belongs to the self-attention sublayer, norm2 "
                "to the feed-forward one", _layer(norms=lambda self: (self.norm2, self.norm1))),
        Mistake("no_residual", "there is no residual connection around the sublayers: add the sublayer's input back",
                _connected(_no_residual)),
        Mistake("no_norm", "the sublayers skip their norms (x + sublayer(x)): use norm1 and norm2",
                _connected(_no_norm)),
        Mistake("normed", "the residual is added to the normalized input, norm(x) + sublayer(norm(x)); the residual "
                "path carries x itself", _connected(lambda x, s, n, norm_first: _normed(x, s, n))),
        Mistake("outside", "the norm is applied to the sublayer's output before the residual, x + norm(sublayer(x))",
                _connected(_outside)),
        # A residual or norm written inside a sublayer as well as around it (sublayer_connection):
        Mistake("ffn_residual", "the feed-forward sublayer adds its own residual and sublayer_connection adds x "
                "again (x + (x + FFN(x))): the residual belongs to sublayer_connection only, the sublayer returns "
                "linear2(relu(linear1(x)))",
                _layer(ffn=lambda self, t: t + ref.EncoderLayer.ffn(self, t))),
        Mistake("attention_residual", "the self-attention sublayer adds its own residual and sublayer_connection "
                "adds x again (x + (x + attention(x))): the residual belongs to sublayer_connection only",
                _layer(attend=lambda self, t, ignore: t + ref.EncoderLayer.attend(self, t, ignore))),
        Mistake("ffn_norm", "the feed-forward sublayer normalizes its own output and sublayer_connection "
                "normalizes again: the norm belongs to sublayer_connection only (norm2, once)",
                _layer(ffn=lambda self, t: self.norm2(ref.EncoderLayer.ffn(self, t)))),
    ),
    errors=_MODULE_ERRORS,
    judge=_raising(_MODULE_TOLD),
    diagnosed=_MODULE_DIAGNOSED + (
        Mistake("dropout_on", "two calls in eval mode gave different outputs, so dropout is still on after .eval()",
                _AlwaysDropping),
    ),
)


# ---------------------------------------------------------------- Encoder

def _encoder_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for vocab, d_model, heads, d_ff, n_layers, max_len, pad_id, batch, seq_len in [
            (11, 8, 2, 14, 2, 9, 0, 2, 6), (13, 10, 2, 7, 3, 12, 3, 3, 5)]:
        p = {"embed.weight": rng.normal(scale=0.4, size=(vocab, d_model))}
        for i in range(n_layers):
            p.update({f"layers.{i}.{k}": v for k, v in _layer_params(rng, d_model, d_ff).items()})
        keep = _padding(rng, batch, seq_len)
        words = [w for w in range(vocab) if w != pad_id]
        src = np.where(keep, rng.choice(words, size=(batch, seq_len)), pad_id).astype(np.int64)
        what = (f"Encoder(vocab_size={vocab}, d_model={d_model}, heads={heads}, d_ff={d_ff}, layers={n_layers}, "
                f"max_len={max_len}, pad_id={pad_id}, dropout=0.5) in eval mode, on src {src.shape} with padding")
        keys = ["embed.weight"] + [f"layers.{i}.{k}" for i in range(n_layers) for k in LAYER_KEYS]
        args = (vocab, d_model, heads, d_ff, n_layers, max_len, pad_id) + tuple(p[k] for k in keys) + (src,)
        calls.append(Call(args, what=_OUTPUT + what))
    return calls


def _encoder(inputs=None, **methods):
    """The reference Encoder with the given methods replaced; ``inputs(self, embedded, pe)``
    computes the first layer's input from the embeddings and the positional table."""
    if inputs is not None:
        methods["inputs"] = lambda self, src: inputs(self, self.embed(src), self.pe[:src.shape[1] + 1],
                                                     src.shape[1])
    return type("Encoder", (ref.Encoder,), methods)


def _sqrt(self) -> float:
    return self.d_model ** 0.5


class _OldEncoder(ref.Encoder):
    def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len):
        super().__init__(vocab_size, d_model, heads, d_ff, layers, max_len)


class _SharedLayers(ref.Encoder):
    def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len, pad_id=0, dropout=0.0):
        super().__init__(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout)
        self.layers = torch.nn.ModuleList([self.layers[0]] * layers)


ENCODER = Spec(
    id="encoder-Encoder",
    function="Encoder",
    depends=("encoder-EncoderLayer",),  # its solution calls them
    inputs=_encoder_inputs,
    reference=ref.Encoder,
    driver="encoder.drive_encoder",
    prepare=_two_calls,
    atol=STACK_ATOL,
    mistakes=(
        Mistake("unscaled", "the embeddings are not scaled: multiply them by sqrt(d_model) before adding the "
                "positional encoding (Sec. 3.4)", _encoder(lambda self, e, pe, n: e + pe[:n])),
        Mistake("times_d_model", "the embeddings are multiplied by d_model; multiply them by sqrt(d_model)",
                _encoder(lambda self, e, pe, n: e * self.d_model + pe[:n])),
        Mistake("no_pe", "the positional encoding is missing: add pe[:seq_len] to the scaled embeddings",
                _encoder(lambda self, e, pe, n: e * _sqrt(self))),
        Mistake("pe_twice", "the positional encoding is added twice (once here and once in a layer?): add it once, "
                "before the first layer", _encoder(lambda self, e, pe, n: e * _sqrt(self) + 2 * pe[:n])),
        Mistake("pe_shifted", "the positional encodings start at position 1: token t gets pe[t], pe[:seq_len]",
                _encoder(lambda self, e, pe, n: e * _sqrt(self) + pe[1:n + 1])),
        Mistake("pe_scaled", "the positional encoding is scaled by sqrt(d_model) too, (embedding + pe) * "
                "sqrt(d_model); scale the embeddings only: embedding * sqrt(d_model) + pe",
                _encoder(lambda self, e, pe, n: (e + pe[:n]) * _sqrt(self))),
        Mistake("mask_ignored", "the padding mask is ignored: build padding_mask = src != pad_id and pass it to "
                "every layer", _encoder(padding=lambda self, src: None)),
        Mistake("mask_inverted", "the padding mask is inverted: padding_mask = src != pad_id is True on real tokens "
                "(the course's convention, which the layers turn into PyTorch's key_padding_mask)",
                _encoder(padding=lambda self, src: src == self.pad_id)),
        Mistake("first_layer_only", "the first layer is applied every time: loop over the layers, `for layer in "
                "self.layers: x = layer(x, padding_mask)`",
                _encoder(stack=lambda self: [self.layers[0]] * len(self.layers))),
    ),
    # the layer's rules, each shown by an Encoder: of that layer, or (the signature) its own
    errors=tuple(replace(rule, example=_OldEncoder if rule.example is _Old else _encoder(layer=rule.example))
                 for rule in _MODULE_ERRORS),
    judge=_raising(_MODULE_TOLD),
    diagnosed=_MODULE_DIAGNOSED[1:] + (
        Mistake("shared_layers", "some layers share their parameters (the same module object appears twice",
                _SharedLayers),
        Mistake("dropout_on", "two calls in eval mode gave different outputs, so dropout is still on after .eval()",
                _encoder(layer=_AlwaysDropping)),
    ),
)

SPECS = (LAYER_NORM, FEED_FORWARD, SUBLAYER_CONNECTION, ENCODER_LAYER, ENCODER)
