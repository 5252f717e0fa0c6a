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

from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from coursekit.drivers.encoder import LAYER_KEYS

from ._core import Call, CheckFailed, Knob, Mistake, Probe, Raises, Rule, Spec, to_array
from ._probes import activation_shape
from .reference import encoder as ref

STACK_ATOL = 1e-4  # deep stacks in float32 (exercise-standard.md)
_OUTPUT = "the output of {}"  # a module's answer is its output; an error is raised by the call


def _numpy_rule(example) -> Raises:
    """The driver's error for a numpy answer to tensor inputs, in this notebook's words."""
    return Raises("{what} returns a numpy array for torch tensor inputs: in this notebook everything is PyTorch. "
                  "Use tensor operations (x.mean, x.var, torch.relu, @) and no np. functions",
                  example=example, match="returns a numpy array for a torch tensor input")


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


def _eps(call: Call) -> float:
    return call.kwargs.get("eps", call.args[3] if len(call.args) > 3 else 1e-5)


# The docstring's rules: eps (its default, by keyword, by position) inside the root, where a row's
# variance is near eps; the last axis of an input with more axes than two.
_LAYER_NORM_RULES = (
    Rule("the default eps", lambda call: len(call.args) == 3 and not call.kwargs),
    Rule("eps by keyword", lambda call: "eps" in call.kwargs),
    Rule("eps by position", lambda call: len(call.args) == 4),
    Rule("a token whose variance is near eps",
         lambda call: bool(np.any(np.var(call.args[0], axis=-1) < 100 * _eps(call)))),
    Rule("more than two axes, normalized over the last",
         lambda call: np.ndim(call.args[0]) >= 3 and len(set(np.shape(call.args[0]))) == 3),
)

LAYER_NORM = Spec(
    id="encoder-layer_norm",
    function="layer_norm",
    inputs=_layer_norm_inputs,
    rules=_LAYER_NORM_RULES,
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
        Mistake("whole_tensor", "it takes the mean and the variance of the whole tensor (no dim); layer norm "
                "normalizes each token on its own: mean and variance over the last axis, dim=-1, keepdim=True",
                lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, dim=tuple(range(x.dim())))),
        Mistake("not_centred", "the mean is not subtracted: x is divided by its standard deviation as it is; "
                "normalize x - mean, (x - mean) / sqrt(var + eps)",
                lambda x, g, b, eps=1e-5: x / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps) * g + b),
        # (the first question's tiny-variance token makes eps matter at its default too)
        Mistake("no_eps", "eps is missing: it divides by sqrt(var), which a token of (nearly) constant features "
                "makes (nearly) zero; add eps inside the root, sqrt(var + eps)",
                lambda x, g, b, eps=1e-5: _ln(x, g, b, 0.0)),
    ),
    errors=(
        _numpy_rule(lambda x, g, b, eps=1e-5: ref.layer_norm(x, g, b, eps).numpy()),
        Raises("{what} raised {error}: the signature is layer_norm(x, gamma, beta, eps=1e-5)",
               example=lambda x, g, b: ref.layer_norm(x, g, b), match="unexpected keyword argument 'eps'"),
        Raises("{what} raised {error}: the mean and the variance lose their last axis, so they do not broadcast "
               "against x. Keep it: x.mean(dim=-1, keepdim=True), x.var(dim=-1, keepdim=True, correction=0)",
               example=lambda x, g, b, eps=1e-5: (x - x.mean(-1)) / torch.sqrt(x.var(-1, correction=0) + eps) * g + b,
               match="must match the size of tensor"),
    ),
    by_call=True,
)


# ---------------------------------------------------------------- feed_forward

def _feed_forward_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # the last question's hidden layer reaches far beyond 6 (a spread of about 20), where ReLU6 and ReLU part
    for shape, d_ff, spread in [((2, 5, 6), 10, 1.0), ((3, 4), 9, 1.0), ((2, 3, 4, 7), 5, 1.0), ((3, 5), 8, 20.0)]:
        d = shape[-1]
        x = rng.normal(size=shape)
        W1 = rng.normal(scale=spread / np.sqrt(d), size=(d_ff, d))
        b1 = rng.normal(scale=0.5, size=d_ff)
        W2 = rng.normal(scale=1 / np.sqrt(d_ff), size=(d, d_ff))
        b2 = rng.normal(scale=0.5, size=d)
        calls.append(Call((x, W1, b1, W2, b2), what=f"feed_forward(x, W1, b1, W2, b2) for x of shape {shape}, W1 "
                          f"{W1.shape} and W2 {W2.shape} (nn.Linear layout)"))
    return calls


_RELU = "the paper's FFN uses ReLU, max(0, x): torch.relu"

# The activations a learner may put between the two layers, and what each is. The knob tries
# the first ones on the graded calls (alone, and with a bias missing); the probe, whose answer
# is the activation itself, tells all of them apart, and describes any other one.
_ACTIVATIONS = {
    "relu": (torch.relu, ""),
    "none": (lambda h: h, "the ReLU is missing: FFN(x) = max(0, x W1^T + b1) W2^T + b2, the ReLU between the two "
                          "layers"),
    "gelu": (F.gelu, f"it applies GELU (x Phi(x), the activation of BERT and GPT) between the layers; {_RELU}"),
    "gelu_tanh": (lambda h: F.gelu(h, approximate="tanh"),
                  f"it applies the tanh approximation of GELU (GPT-2's); {_RELU}"),
    "tanh": (torch.tanh, f"it applies tanh between the layers; {_RELU}"),
    "sigmoid": (torch.sigmoid, f"it applies a sigmoid between the layers; {_RELU}"),
    "silu": (F.silu, f"it applies SiLU (swish, x sigmoid(x)) between the layers; {_RELU}"),
    "leaky_relu": (F.leaky_relu, "it applies a leaky ReLU (slope 0.01 below 0); the paper's ReLU is exactly 0 for "
                                 "negative inputs: torch.relu"),
    # (tried by the probe only)
    "quick_gelu": (lambda h: h * torch.sigmoid(1.702 * h),
                   f"it applies the sigmoid approximation of GELU, x sigmoid(1.702 x); {_RELU}"),
    "elu": (F.elu, f"it applies ELU (x above 0, exp(x) - 1 below) between the layers; {_RELU}"),
    "selu": (F.selu, f"it applies SELU (a scaled ELU) between the layers; {_RELU}"),
    "softplus": (F.softplus, f"it applies softplus, log(1 + exp(x)), a smooth ReLU that is never 0; {_RELU}"),
    "mish": (F.mish, f"it applies Mish, x tanh(softplus(x)), between the layers; {_RELU}"),
    "relu6": (F.relu6, f"it applies ReLU6, min(max(0, x), 6), which clips large values at 6; {_RELU}"),
    "hardtanh": (F.hardtanh, f"it applies hardtanh, which clips to [-1, 1]; {_RELU}"),
    "hardswish": (F.hardswish, f"it applies hard swish, x relu6(x + 3) / 6; {_RELU}"),
    "hardsigmoid": (F.hardsigmoid, f"it applies a hard sigmoid, relu6(x + 3) / 6; {_RELU}"),
    "softsign": (F.softsign, f"it applies softsign, x / (1 + |x|); {_RELU}"),
    "logsigmoid": (F.logsigmoid, f"it applies log(sigmoid(x)); {_RELU}"),
    "squared_relu": (lambda h: torch.relu(h) ** 2, f"it applies the square of ReLU, max(0, x)^2; {_RELU}"),
    "abs": (torch.abs, f"it applies |x|, which keeps negative inputs (as positive values); {_RELU}"),
    "prelu": (lambda h: F.leaky_relu(h, 0.25), "it applies a leaky ReLU with slope 0.25 below 0 (PReLU's initial "
                                               "slope); the paper's ReLU is exactly 0 for negative inputs: torch.relu"),
}
# (the names a description uses: "the closest is ELU")
_LABELS = {
    "relu": "ReLU",
    "none": "no activation",
    "gelu": "GELU",
    "gelu_tanh": "the tanh approximation of GELU",
    "tanh": "tanh",
    "sigmoid": "a sigmoid",
    "silu": "SiLU",
    "leaky_relu": "a leaky ReLU",
    "quick_gelu": "the sigmoid approximation of GELU",
    "elu": "ELU",
    "selu": "SELU",
    "softplus": "softplus",
    "mish": "Mish",
    "relu6": "ReLU6",
    "hardtanh": "hardtanh",
    "hardswish": "hard swish",
    "hardsigmoid": "a hard sigmoid",
    "softsign": "softsign",
    "logsigmoid": "log sigmoid",
    "squared_relu": "squared ReLU",
    "abs": "|x|",
    "prelu": "a leaky ReLU of slope 0.25",
}
_KNOB_ACTIVATIONS = ("none", "gelu", "gelu_tanh", "tanh", "sigmoid", "silu", "leaky_relu")


def _feed_forward_variant(activation="relu", biases="both"):
    """feed_forward with another activation between the layers, or without ``biases`` (the
    ones kept: "both", "b1", "b2", "neither")."""
    act = _ACTIVATIONS[activation][0]

    def feed_forward(x, W1, b1, W2, b2):
        b1 = b1 if biases in ("both", "b1") else 0 * b1
        b2 = b2 if biases in ("both", "b2") else 0 * b2
        return act(x @ W1.T + b1) @ W2.T + b2

    return feed_forward


def _activation_region(rng: np.random.Generator) -> list[Call]:
    """One call whose answer is the activation itself: identity weights (d_ff = d_model = 11),
    zero biases, x spread over [-8, 8] (where ReLU6 clips, sigmoid and tanh saturate, ELU
    and softplus part from ReLU), 0 among them."""
    grid = np.concatenate([np.linspace(-8, -3.2, 20), np.linspace(-3, 3, 25), np.linspace(3.2, 8, 21)])
    x = (grid + rng.uniform(-0.02, 0.02, size=grid.size) * (grid != 0)).reshape(6, 11)
    eye, zero = np.eye(11), np.zeros(11)
    return [Call((x, eye, zero, eye, zero), what="feed_forward(x, I, 0, I, 0) on a known activation region")]


def _hidden(call: Call) -> np.ndarray:
    x, W1, b1 = call.args[:3]
    return x @ W1.T + b1


# ReLU where the hidden layer has both signs (and beyond 6, where ReLU6 clips); layers on the last axis
# of any input; d_ff != d_model (nn.Linear's layout shows)
_FEED_FORWARD_RULES = (
    Rule("hidden values of both signs", lambda call: bool((_hidden(call) < 0).any() and (_hidden(call) > 0).any())),
    Rule("hidden values beyond 6", lambda call: bool((_hidden(call) > 6).any())),
    Rule("more than two axes", lambda call: np.ndim(call.args[0]) >= 3),
    Rule("d_ff != d_model", lambda call: call.args[1].shape[0] != call.args[1].shape[1]),
)

FEED_FORWARD = Spec(
    id="encoder-feed_forward",
    function="feed_forward",
    inputs=_feed_forward_inputs,
    rules=_FEED_FORWARD_RULES,
    reference=ref.feed_forward,
    driver="tensors",
    # The activation and the biases are knobs: each wrong setting is a catalogued mistake, and
    # two wrong at once (GELU and no b1) are named together.
    variant=_feed_forward_variant,
    knobs=(
        Knob("activation", tuple((name, _ACTIVATIONS[name][1]) for name in _KNOB_ACTIVATIONS)),
        Knob("biases", (
            ("b2", "the bias b1 of the first layer is missing"),
            ("b1", "the bias b2 of the second layer is missing"),
            ("neither", "both biases are missing: x W1^T + b1, then ... W2^T + b2"),
        )),
    ),
    # Which activation, whatever else is wrong: on a known region, with identity weights and
    # zero biases, the answer is the activation itself.
    probes=(
        Probe("activation", _activation_region, reads=("activation",),
              extra=(Knob("activation", tuple((name, diagnosis) for name, (_, diagnosis) in _ACTIVATIONS.items()
                                              if name not in _KNOB_ACTIVATIONS + ("relu",))),),
              describe=activation_shape(lambda call: call.args[0],
                                        {_LABELS[name]: lambda x, f=f: f(torch.from_numpy(x)).numpy()
                                         for name, (f, _) in _ACTIVATIONS.items()},
                                        asked="ReLU", fix="Use ReLU, max(0, x): torch.relu"),
              right="the activation between the layers is ReLU, as asked: look at the weights' layout, the biases "
                    "and where the ReLU is applied",
              examples=(
                  Mistake("hand_written_gelu", "the activation between the layers is not ReLU: it is negative for "
                          "large negative inputs", lambda x, W1, b1, W2, b2: (lambda h: 0.5 * h * (
                              1 + torch.tanh(0.8 * (h + 0.1 * h ** 2))))(x @ W1.T + b1) @ W2.T + b2),
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
        _numpy_rule(lambda x, W1, b1, W2, b2: ref.feed_forward(x, W1, b1, W2, b2).numpy()),
        Raises("{what} raised {error}. The weights use nn.Linear's layout, (out_features, in_features): W1 is "
               "(d_ff, d_model), so the first layer is x @ W1.T + b1 (or F.linear(x, W1, b1)), not x @ W1",
               example=lambda x, W1, b1, W2, b2: torch.relu(x @ W1 + b1) @ W2 + b2,
               match="cannot be multiplied|mismatch in its core dimension|size mismatch|"
                     "Expected size for first two dimensions|must match the size"),
        Raises("{what} raised {error}: the layers act on the last axis whatever the axes before it are (a token, a "
               "sentence, a batch): x @ W1.T + b1 works for any of them, and so does einsum with '...d,fd->...f'",
               example=lambda x, W1, b1, W2, b2: torch.einsum("bsf,df->bsd", torch.relu(
                   torch.einsum("bsd,fd->bsf", x, W1) + b1), W2) + b2,
               match="number of subscripts in the equation"),
    ),
    by_call=True,
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


# one wrong arrangement of both norm_first settings: a norm before the sublayer and one after the sum
SANDWICH = ("each sublayer is normalized twice, before the sublayer and after the residual sum, "
            "norm(x + sublayer(norm(x))): one norm per sublayer, pre-norm x + sublayer(norm(x)) or post-norm "
            "norm(x + sublayer(x)) as norm_first says")


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


# norm_first: True, False, and its default (post-norm)
_CONNECTION_RULES = (
    Rule("norm_first=True", lambda call: call.args[-1] is True),
    Rule("norm_first=False", lambda call: call.args[-1] is False),
    Rule("norm_first by its default", lambda call: call.args[-1] is None),
)

SUBLAYER_CONNECTION = Spec(
    id="encoder-sublayer_connection",
    function="sublayer_connection",
    inputs=_connection_inputs,
    rules=_CONNECTION_RULES,
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
        Mistake("sandwich", SANDWICH, lambda x, s, n, norm_first=False: n(x + s(n(x)))),
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
    by_call=True,
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


def _layer_call(rng, norm_first, params, masked=False, d_model=12, heads=3, d_ff=20, batch=2, seq_len=5) -> Call:
    x = _rows(rng, (batch, seq_len, d_model))
    keep = _padding(rng, batch, seq_len) if masked else None
    what = (f"EncoderLayer(d_model={d_model}, heads={heads}, d_ff={d_ff}, dropout=0.5, norm_first={norm_first}) "
            f"in eval mode, on x {x.shape}" + (f" with a padding mask {keep.shape}" if masked else ", no mask"))
    return Call((d_model, heads, d_ff, norm_first) + tuple(params) + (x, keep), what=what)


def _layer_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for norm_first, masked in [(False, False), (False, True), (True, True), (True, False)]:
        p = _layer_params(rng, 12, 20)
        calls.append(_layer_call(rng, norm_first, [p[k] for k in LAYER_KEYS], masked))
    return calls


def _two_calls(answer: object, call: Call, what: str) -> np.ndarray:
    """The first of the two eval-mode outputs; a diagnosis if they differ (dropout left on)."""
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise CheckFailed(f"{call.what}: the grader could not read your module's output back; forward should "
                          "return one tensor (batch, seq_len, d_model)")
    first, second = (to_array(g, what) for g in answer)
    if first.shape == second.shape and not np.allclose(first, second, rtol=0, atol=1e-6):
        raise CheckFailed(f"{call.what}: two calls in eval mode gave different outputs, so dropout is still on "
                          "after .eval(). Use nn.Dropout modules (they switch off in eval mode), or pass "
                          "training=self.training to F.dropout")
    return first


def _layer(**methods):
    """The reference layer with the given methods replaced: a catalogued mistake."""
    return type("EncoderLayer", (ref.EncoderLayer,), methods)


def _connected(connection):
    """A layer whose sublayer connections are ``connection(x, sublayer, norm, norm_first)``."""
    return _layer(connect=lambda self, x, s, n: connection(x, s, n, self.norm_first))


def _wired(**crossed):
    """A layer whose sublayers are chained with crossed wires (:func:`_chain`'s keywords)."""
    def forward(self, x, padding_mask=None):
        ignore = self.ignored(padding_mask)
        return _chain(x, (lambda t: self.attend(t, ignore), self.ffn), self.norms(), self.norm_first, **crossed)
    return _layer(forward=forward)


_ENCODER_ROLES = {"norm1": "the self-attention sublayer", "norm2": "the feed-forward sublayer"}


def _connection(x, sublayer, norm, norm_first, residual="once", normed="once"):
    """sublayer_connection with its residual or its norm "missing", or written inside the
    sublayer as well as around it ("twice": the sublayer adds its own input back, or
    normalizes its own output)."""
    inner = sublayer
    if residual == "twice":
        inner = lambda t, s=inner: t + s(t)  # noqa: E731
    if normed == "twice":
        inner = lambda t, s=inner: norm(s(t))  # noqa: E731
    around = (lambda t: t) if normed == "missing" else norm
    if norm_first:
        h = inner(around(x))
        return h if residual == "missing" else x + h
    h = inner(x)
    return around(h if residual == "missing" else x + h)


def _chain(x, sublayers, norms, norm_first, *, reads=(), residual_from=(), sandwich=False):
    """The sublayer connections of a layer, one after the other, with the wires a learner
    crosses: the sublayers numbered in ``reads`` are given the layer's input instead of the
    previous sublayer's output, those in ``residual_from`` add back the layer's input instead
    of their own input; ``sandwich`` normalizes both before the sublayer and after the sum."""
    y = x
    for i, (sublayer, norm) in enumerate(zip(sublayers, norms)):
        given, back = (y if i in reads else x), (y if i in residual_from else x)
        if sandwich:
            x = norm(back + sublayer(norm(given)))
        else:
            x = back + sublayer(norm(given)) if norm_first else norm(back + sublayer(given))
    return x


def _listed(words: list[str]) -> str:
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]


def _reused_norm(pattern: tuple[str, ...], roles: dict[str, str]) -> tuple[str, str, object]:
    """(mistake name, diagnosis, ``norms`` method) of a layer that uses one of its norms for two
    sublayers (``pattern``: the norm each sublayer uses; ``roles``: each norm's sublayer)."""
    reused = next(n for n in pattern if pattern.count(n) > 1)
    unused = [n for n in roles if n not in pattern]
    users = _listed([roles[m] for m, n in zip(roles, pattern) if n == reused])
    own = ", ".join(f"{n} for {r}" for n, r in roles.items())
    diagnosis = (f"{reused} is used for {users} ({_listed(unused)} never): one norm object keeps one gamma and "
                 f"beta, and each sublayer has its own norm: {own}")
    return "norm_reused_" + "".join(n[-1] for n in pattern), diagnosis, lambda self: tuple(getattr(self, n)
                                                                                          for n in pattern)


_MASKS = {"right": ref.EncoderLayer.ignored, "inverted": lambda self, m: m, "ignored": lambda self, m: None}
_ARRANGED = {"right": lambda norm_first: norm_first, "post": lambda norm_first: False,
             "swapped": lambda norm_first: not norm_first}


def _layer_variant(mask="right", arrangement="right", attention_residual="once", attention_norm="once",
                   ffn_residual="once", ffn_norm="once"):
    """EncoderLayer with the spec's knobs: the padding mask, the arrangement (norm_first), and
    each sublayer's residual and norm (missing, or inside the sublayer as well as around it)."""

    def forward(self, x, padding_mask=None):
        ignore, first_norm = _MASKS[mask](self, padding_mask), _ARRANGED[arrangement](self.norm_first)
        first, second = self.norms()
        x = _connection(x, lambda t: self.attend(t, ignore), first, first_norm, attention_residual, attention_norm)
        return _connection(x, self.ffn, second, first_norm, ffn_residual, ffn_norm)

    return _layer(forward=forward)


def _sublayer_knobs(sublayers: dict[str, tuple[str, str, str]]) -> tuple[Knob, ...]:
    """A residual knob and a norm knob per sublayer (``name: (its words, its norm, its symbol)``)."""
    knobs = []
    for name, (words, norm, symbol) in sublayers.items():
        knobs.append(Knob(f"{name}_residual", (
            ("missing", f"there is no residual connection around the {words} sublayer: add its input back "
                        f"(sublayer_connection does it for every sublayer)"),
            ("twice", f"the {words} sublayer adds its own residual and sublayer_connection adds x again "
                      f"(x + (x + {symbol}(x))): the residual belongs to sublayer_connection only"),
        )))
        knobs.append(Knob(f"{name}_norm", (
            ("missing", f"the {words} sublayer's norm ({norm}) is missing: sublayer_connection applies it, once"),
            ("twice", f"the {words} sublayer normalizes its own output and sublayer_connection normalizes again: "
                      f"the norm belongs to sublayer_connection only ({norm}, once)"),
        )))
    return tuple(knobs)


def _constant_sublayers(layer_params, keys, biases, build):
    """Probe calls where every sublayer outputs a constant vector whatever its code does
    (zero weights, a bias on its output only, ``biases``): the output then shows only how
    the residual connections and norms are arranged. Post-norm and pre-norm, no masks."""
    def calls(rng: np.random.Generator) -> list[Call]:
        asked = []
        for norm_first in (False, True):
            p = layer_params(rng)
            for name, value in p.items():
                if not name.startswith("norm"):
                    p[name] = value if name in biases else np.zeros_like(value)
            asked.append(replace(build(rng, norm_first, [p[k] for k in keys]),
                                 what="a layer whose sublayers output constants"))
        return asked
    return calls


class _SequenceFirst(ref.EncoderLayer):
    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, heads, d_ff, dropout, norm_first)
        self.self_attn = torch.nn.MultiheadAttention(d_model, heads, dropout=dropout)


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


_MODULE_ERRORS = (
    Raises("{what}: {detail}", example=_NotAModule, match="is not a torch.nn.Module|it should be a class"),
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

def _layer_sizes(call: Call) -> tuple:
    """(batch, heads, seq_len, d_model) of a layer call."""
    x = call.args[-2]
    return x.shape[0], call.args[1], x.shape[1], call.args[0]


def _padded(keep) -> bool:
    """A padding mask that hides some keys, in sentences of different lengths."""
    return keep is not None and not np.all(keep) and len(set(np.sum(keep, axis=-1).tolist())) > 1


_LAYER_RULES = (
    Rule("a padding mask (sentences of different lengths)", lambda call: _padded(call.args[-1])),
    Rule("no padding mask", lambda call: call.args[-1] is None),
    Rule("norm_first=True", lambda call: call.args[3] is True),
    Rule("norm_first=False", lambda call: call.args[3] is False),
    Rule("batch, heads, seq_len and d_model all different", lambda call: len(set(_layer_sizes(call))) == 4),
)

# Mutants of a module's reference that compute the same outputs where the checks can look
IN_EVAL = "the module is judged in eval mode (random dropout masks cannot be compared), where dropout is the identity"
NEED_WEIGHTS = "need_weights only decides whether the weights come back too: the output, [0], is the same"
# (a gap, not a proof: training with another rate differs; the gpt driver counts such nn.Dropout modules)
RATE_IN_EVAL = ("layers built with their default dropout rate instead of the one given: judged in eval mode, where "
                "every rate gives the identity; the training-mode rate is not checked")

ENCODER_LAYER = Spec(
    id="encoder-EncoderLayer",
    submodules=("self_attn", "norm1", "linear1", "linear2", "norm2"),
    function="EncoderLayer",
    depends=("encoder-sublayer_connection",),  # its solution calls them
    inputs=_layer_inputs,
    rules=_LAYER_RULES,
    equivalent=(
        ("L7 nn.MultiheadAttention(d_model, heads, dropout=dropout, ba... -> "
         "nn.MultiheadAttention(d_model, heads, batch_first=True)", IN_EVAL),
        ("L20 self.self_attn(t, t, t, key_padding_mask=ignore, need_wei... -> "
         "self.self_attn(t, t, t, key_padding_mask=ignore)", NEED_WEIGHTS),
        ("L20 False -> True", NEED_WEIGHTS),
    ),
    reference=ref.EncoderLayer,
    driver="encoder.drive_encoder_layer",
    prepare=_two_calls,
    atol=STACK_ATOL,
    variant=_layer_variant,
    knobs=(
        Knob("mask", (
            ("inverted", "the padding mask is inverted: this course's padding_mask says True = real token, "
                         "PyTorch's key_padding_mask says True = IGNORE; pass key_padding_mask=~padding_mask"),
            ("ignored", "the padding mask is ignored: pass key_padding_mask=~padding_mask to self.self_attn"),
        )),
        Knob("arrangement", (
            ("post", "it computes the post-norm arrangement; with norm_first=True it is pre-norm, x + sublayer(norm(x)): "
                     "check how norm_first reaches your sublayer connections"),
            ("swapped", "it computes the pre-norm arrangement; with norm_first=False it is post-norm, norm(x + "
                        "sublayer(x)): check how norm_first reaches your sublayer connections"),
        )),
        *_sublayer_knobs({"attention": ("self-attention", "norm1", "attention"),
                          "ffn": ("feed-forward", "norm2", "FFN")}),
    ),
    # (the mask knob changes nothing on the questions without a padding mask)
    mistakes=(
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
        *(Mistake(name, diagnosis, _layer(norms=norms)) for name, diagnosis, norms in
          (_reused_norm(pattern, _ENCODER_ROLES) for pattern in (("norm1", "norm1"), ("norm2", "norm2")))),
        Mistake("ffn_residual_from_input", "the feed-forward sublayer's residual adds back the layer's input x, not "
                "its own input (the self-attention sublayer's output): each residual adds back the tensor its "
                "sublayer was given", _wired(residual_from=(1,))),
        Mistake("ffn_given_input", "the feed-forward sublayer is given the layer's input x, not the self-attention "
                "sublayer's output: the sublayers run one after the other, each on the previous one's output",
                _wired(reads=(1,))),
        Mistake("sandwich", SANDWICH, _wired(sandwich=True)),
        Mistake("not_batch_first", "the self-attention reads x as (seq_len, batch, d_model), so it attends across "
                "the sentences of the batch: build nn.MultiheadAttention with batch_first=True", _SequenceFirst),
    ),
    # How the residual connections and norms are arranged, whatever a sublayer computes.
    probes=(
        Probe("connections", _constant_sublayers(lambda rng: _layer_params(rng, 12, 20), LAYER_KEYS,
                                                 ("self_attn.out_proj.bias", "linear2.bias"), _layer_call),
              reads=("arrangement", "attention_residual", "attention_norm", "ffn_residual", "ffn_norm"), most=3,
              right="the residual connections and norms are right (asked with sublayers that output constants): "
                    "the mistake is inside a sublayer, the self-attention or the feed-forward network"),
    ),
    errors=_MODULE_ERRORS,
    by_call=True,
    output=_OUTPUT,
    diagnosed=_MODULE_DIAGNOSED + (
        Mistake("dropout_on", "two calls in eval mode gave different outputs, so dropout is still on after .eval()",
                _AlwaysDropping),
    ),
)


# ---------------------------------------------------------------- Encoder

def _encoder_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for vocab, d_model, heads, d_ff, n_layers, max_len, pad_id, batch, seq_len in [
            (11, 8, 2, 14, 2, 9, 0, 2, 6), (13, 10, 2, 7, 3, 5, 3, 3, 5)]:  # (the second fills max_len)
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
        calls.append(Call(args, what=what))
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


_ENCODER_RULES = (
    Rule("padding in the source (sentences of different lengths)",
         lambda call: _padded(call.args[-1] != call.args[6])),
    Rule("pad_id != 0", lambda call: call.args[6] != 0),
    Rule("two layers or more", lambda call: call.args[4] >= 2),
    Rule("seq_len < max_len (the table cut)", lambda call: call.args[-1].shape[1] < call.args[5]),
    Rule("seq_len == max_len (the whole table)", lambda call: call.args[-1].shape[1] == call.args[5]),
)

_TABLE = ("the table needs seq_len <= max_len rows (asked with seq_len == max_len); its extra row serves a "
          "catalogued mistake")

ENCODER = Spec(
    id="encoder-Encoder",
    submodules=("embed", "layers.*", "layers.*.self_attn", "layers.*.norm1", "layers.*.linear1", "layers.*.linear2",
                "layers.*.norm2"),
    function="Encoder",
    depends=("encoder-EncoderLayer",),  # its solution calls them
    inputs=_encoder_inputs,
    rules=_ENCODER_RULES,
    equivalent=(
        ("L12 max_len + 1 -> max_len", _TABLE),
        ("L12 1 -> 2", _TABLE),
        ("L12 1 -> 0", _TABLE),
        ("L12 False -> True", "a persistent buffer differs only in the state_dict; the weights are loaded by name"),
        ("L12 ...ax_len + 1, d_model), persistent=False) -> ...ax_len + 1, d_model))",
         "a persistent buffer differs only in the state_dict; the weights are loaded by name"),
        ("L14 self.layer(d_model, heads, d_ff, dropout) -> self.layer(d_model, heads, d_ff)", RATE_IN_EVAL),
    ),
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
        Mistake("layers_unused", "the output is the embeddings with their positions: the layers' outputs are not "
                "kept. Assign each one, x = layer(x, padding_mask)", _encoder(stack=lambda self: [])),
    ),
    # the layer's rules, each shown by an Encoder: of that layer, or (the signature) its own
    errors=tuple(replace(rule, example={_Old: _OldEncoder, _NotAModule: _NotAModule}.get(
        rule.example, _encoder(layer=rule.example))) for rule in _MODULE_ERRORS),
    by_call=True,
    output=_OUTPUT,
    diagnosed=_MODULE_DIAGNOSED[1:] + (
        Mistake("shared_layers", "some layers share their parameters (the same module object appears twice",
                _SharedLayers),
        Mistake("dropout_on", "two calls in eval mode gave different outputs, so dropout is still on after .eval()",
                _encoder(layer=_AlwaysDropping)),
    ),
)

SPECS = (LAYER_NORM, FEED_FORWARD, SUBLAYER_CONNECTION, ENCODER_LAYER, ENCODER)
