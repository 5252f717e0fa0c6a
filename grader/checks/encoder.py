"""Hidden checks of notebook 07, encoder: layer norm, feed-forward, sublayer connection, layer, stack.

Everything in notebook 07 is PyTorch. ``layer_norm`` and ``feed_forward`` are called on
torch tensors (driver ``tensors``); ``sublayer_connection``, ``EncoderLayer`` and
``Encoder`` go through the drivers of ``coursekit/drivers/encoder.py``, which build the
sublayer and norm (or the learner's module) kernel-side, load the weights drawn here BY
NAME (the names of torch.nn.TransformerEncoderLayer), switch to eval mode and call twice
(dropout left on in eval mode makes the two calls differ).

The reference below is plain numpy in float64. Sizes are pairwise distinct (batch 2,
seq_len 5, heads 3, d_k 4, d_model 12, d_ff 20), every LayerNorm has a non-unit gamma and a
nonzero beta, every sublayer a bias and a nonlinearity, and every padded sentence keeps
at least one real token and one padding token (so that an inverted mask never masks a
whole row).
"""
from __future__ import annotations

import numpy as np

from ._core import CheckFailed, Question, Raised, exercise, judge, to_array
from ._core import value as answer_value

LAYER_KEYS = ("self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
              "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
              "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias")
STACK_ATOL = 1e-4  # deep stacks in float32 (exercise-standard.md)


# ---------------------------------------------------------------- reference pieces (float64)

def _layer_norm(x, gamma, beta, eps=1e-5, *, ddof=0, eps_outside=False, axis=-1, affine="right",
                power=0.5):
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=axis, keepdims=True)
    var = x.var(axis=axis, keepdims=True, ddof=ddof)
    with np.errstate(all="ignore"):
        if eps_outside:
            x_hat = (x - mean) / (np.sqrt(var) + eps)
        else:
            x_hat = (x - mean) / (var + eps) ** power
    if affine == "right":
        return x_hat * gamma + beta
    if affine == "swapped":
        return x_hat * beta + gamma
    if affine == "no_gamma":
        return x_hat + beta
    if affine == "no_beta":
        return x_hat * gamma
    if affine == "none":
        return x_hat
    raise ValueError(affine)


def _relu(x):
    return np.maximum(x, 0.0)


def _feed_forward(x, W1, b1, W2, b2, *, relu="hidden", bias1=True, bias2=True):
    h = x @ W1.T + (b1 if bias1 else 0.0)
    if relu in ("hidden", "both"):
        h = _relu(h)
    out = h @ W2.T + (b2 if bias2 else 0.0)
    if relu in ("output", "both"):
        out = _relu(out)
    return out


def _softmax(x):
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _self_attention(x, p, heads, keep=None):
    """torch.nn.MultiheadAttention(batch_first=True) in numpy; keep (batch, seq) True = real token."""
    b, s, d = x.shape
    d_k = d // heads
    w, bias = p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"]
    q, k, v = (x @ w[i * d:(i + 1) * d].T + bias[i * d:(i + 1) * d] for i in range(3))
    q, k, v = (t.reshape(b, s, heads, d_k).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d_k)
    if keep is not None:
        scores = np.where(keep[:, None, None, :], scores, -np.inf)
    out = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
    return out @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]


def _connect(x, sublayer, norm, norm_first, residual="right"):
    """A sublayer connection or one of its known mistakes."""
    if residual == "none":  # no residual at all
        return norm(sublayer(x)) if not norm_first else sublayer(norm(x))
    if residual == "no_norm":
        return x + sublayer(x)
    if residual == "outside":  # x + norm(sublayer(x))
        return x + norm(sublayer(x))
    if residual == "normed":  # norm(x) + sublayer(norm(x))
        return norm(x) + sublayer(norm(x))
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


def _encoder_layer(x, p, heads, keep, norm_first, *, mask="right", relu=True, residual="right",
                   norms=("norm1", "norm2")):
    if mask == "ignored":
        keep = None
    elif mask == "inverted" and keep is not None:
        keep = ~keep

    def norm(name):
        return lambda t: _layer_norm(t, p[f"{name}.weight"], p[f"{name}.bias"])

    def attend(t):
        return _self_attention(t, p, heads, keep)

    def ffn(t):
        return _feed_forward(t, p["linear1.weight"], p["linear1.bias"], p["linear2.weight"], p["linear2.bias"],
                             relu="hidden" if relu else "none")

    x = _connect(x, attend, norm(norms[0]), norm_first, residual)
    return _connect(x, ffn, norm(norms[1]), norm_first, residual)


def sinusoidal(max_len: int, d_model: int) -> np.ndarray:
    pos = np.arange(max_len)[:, None]
    i = np.arange(d_model) // 2
    angles = pos / 10000 ** (2 * i / d_model)
    return np.where(np.arange(d_model) % 2 == 0, np.sin(angles), np.cos(angles))


def _encoder(src, p, heads, n_layers, pad_id, *, scale="sqrt", pe="right", mask="right", layers="all"):
    d_model = p["embed.weight"].shape[1]
    seq_len = src.shape[1]
    table = sinusoidal(seq_len + 1, d_model)
    factor = {"sqrt": np.sqrt(d_model), "none": 1.0, "d_model": float(d_model)}[scale]
    x = p["embed.weight"][src] * factor
    if pe == "right":
        x = x + table[:seq_len]
    elif pe == "twice":
        x = x + 2 * table[:seq_len]
    elif pe == "shifted":
        x = x + table[1:seq_len + 1]
    elif pe == "scaled":  # (embedding + PE) * sqrt(d_model)
        x = (p["embed.weight"][src] + table[:seq_len]) * np.sqrt(d_model)
    keep = src != pad_id
    for i in range(n_layers):
        j = 0 if layers == "first" else i
        lp = {k: p[f"layers.{j}.{k}"] for k in LAYER_KEYS}
        x = _encoder_layer(x, lp, heads, keep, False, mask=mask)
    return x


# ---------------------------------------------------------------- diagnosis helpers

def _raised(got: object, what: str) -> None:
    """A diagnosis for an exception that is not NotImplementedError (that one is 'not answered')."""
    if not isinstance(got, Raised) or got.message.startswith("NotImplementedError"):
        return
    message = got.message.rstrip(".")
    if "returns a numpy array for a torch tensor input" in message:
        raise CheckFailed(f"{what} returns a numpy array for torch tensor inputs: in this notebook everything "
                          "is PyTorch. Use tensor operations (x.mean, x.var, torch.relu, @) and no np. functions")
    raise CheckFailed(f"{what} raised {message}")


# ---------------------------------------------------------------- layer_norm

def _judge_layer_norm(got, x, gamma, beta, eps, what, axes):
    if isinstance(got, Raised) and "unexpected keyword argument 'eps'" in got.message:
        raise CheckFailed(f"{what} raised {got.message}: the signature is layer_norm(x, gamma, beta, eps=1e-5)")
    _raised(got, what)
    mistakes = [
        ("it divides by the unbiased standard deviation (n - 1 in the variance); nn.LayerNorm uses the biased "
         "variance, the mean of the squared deviations (x.var(dim=-1, unbiased=False), or correction=0)",
         _layer_norm(x, gamma, beta, eps, ddof=1)),
        ("eps is added outside the square root, (x - mean) / (std + eps); nn.LayerNorm adds it inside: "
         "(x - mean) / sqrt(var + eps)", _layer_norm(x, gamma, beta, eps, eps_outside=True)),
        ("it divides by the variance, not by its square root: (x - mean) / sqrt(var + eps)",
         _layer_norm(x, gamma, beta, eps, power=1.0)),
        ("gamma and beta are swapped: the result is x_hat * gamma + beta (gamma scales, beta shifts)",
         _layer_norm(x, gamma, beta, eps, affine="swapped")),
        ("gamma is missing: scale the normalized x by gamma, then add beta", _layer_norm(x, gamma, beta, eps,
                                                                                        affine="no_gamma")),
        ("beta is missing: add beta after scaling by gamma", _layer_norm(x, gamma, beta, eps, affine="no_beta")),
        ("gamma and beta are missing: return x_hat * gamma + beta, not x_hat alone",
         _layer_norm(x, gamma, beta, eps, affine="none")),
    ]
    if eps != 1e-5:
        mistakes.append(("it ignores the eps argument (it uses 1e-5 whatever eps is given): use eps",
                         _layer_norm(x, gamma, beta, 1e-5)))
    for axis, name in axes:
        mistakes.append((f"it normalizes over the {name} axis (dim={axis}); layer norm normalizes each token's "
                         "d_model features: mean and variance over the LAST axis, dim=-1, keepdim=True",
                         _layer_norm(x, gamma, beta, eps, axis=axis)))
    judge(got, _layer_norm(x, gamma, beta, eps), what, mistakes)


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


@exercise("encoder-layer_norm", "layer_norm", driver="tensors")
def layer_norm_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # 1. (batch 2, seq_len 3, d_model 5), default eps; one token with a tiny spread, where eps matters.
    # 2. (4, 6) with eps=0.1 by keyword: eps inside or outside the square root, or ignored.
    # 3. (3, 4, 7), eps=1e-3 positionally.
    for shape, eps, how, axes in [((2, 3, 5), None, "default", [(1, "sequence"), (0, "batch")]),
                                  ((4, 6), 0.1, "keyword", [(0, "first (token)")]),
                                  ((3, 4, 7), 1e-3, "positional", [(1, "sequence"), (0, "batch")])]:
        x = _rows(rng, shape, small_row=True)
        d = shape[-1]
        gamma = rng.uniform(0.5, 2.0, size=d) * rng.choice([-1, 1], size=d)
        beta = rng.normal(scale=0.8, size=d)
        what = f"layer_norm(x, gamma, beta{'' if eps is None else f', eps={eps}'}) for x of shape {shape}"
        if how == "default":
            args, kwargs = (x, gamma, beta), {}
        elif how == "keyword":
            args, kwargs = (x, gamma, beta), {"eps": eps}
        else:
            args, kwargs = (x, gamma, beta, eps), {}
        e = 1e-5 if eps is None else eps
        asked.append(Question(args, lambda got, x=x, g=gamma, b=beta, e=e, w=what, a=axes:
                              _judge_layer_norm(got, x, g, b, e, w, a), kwargs))
    return asked


# ---------------------------------------------------------------- feed_forward

def _judge_feed_forward(got, x, W1, b1, W2, b2, what):
    if isinstance(got, Raised):
        message = got.message
        if any(s in message for s in ("cannot be multiplied", "mismatch in its core dimension", "size mismatch",
                                      "Expected size for first two dimensions", "must match the size")):
            raise CheckFailed(f"{what} raised {message.rstrip('.')}. The weights use nn.Linear's layout, "
                              "(out_features, in_features): W1 is (d_ff, d_model), so the first layer is "
                              "x @ W1.T + b1 (or F.linear(x, W1, b1)), not x @ W1")
    _raised(got, what)
    mistakes = [
        ("the ReLU is missing: FFN(x) = max(0, x W1^T + b1) W2^T + b2, the ReLU between the two layers",
         _feed_forward(x, W1, b1, W2, b2, relu="none")),
        ("the ReLU is applied after the second layer instead of between the two: the output must be able to "
         "be negative; apply ReLU to the hidden layer x W1^T + b1 only",
         _feed_forward(x, W1, b1, W2, b2, relu="output")),
        ("the ReLU is applied after the second layer too: apply it to the hidden layer only; the output of "
         "the second layer stays linear", _feed_forward(x, W1, b1, W2, b2, relu="both")),
        ("the bias b1 of the first layer is missing", _feed_forward(x, W1, b1, W2, b2, bias1=False)),
        ("the bias b2 of the second layer is missing", _feed_forward(x, W1, b1, W2, b2, bias2=False)),
        ("both biases are missing: x W1^T + b1, then ... W2^T + b2",
         _feed_forward(x, W1, b1, W2, b2, bias1=False, bias2=False)),
    ]
    judge(got, _feed_forward(x, W1, b1, W2, b2), what, mistakes)


@exercise("encoder-feed_forward", "feed_forward", driver="tensors")
def feed_forward_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for shape, d_ff in [((2, 5, 6), 10), ((3, 4), 9), ((2, 3, 4, 7), 5)]:
        d = shape[-1]
        x = rng.normal(size=shape)
        W1 = rng.normal(scale=1 / np.sqrt(d), size=(d_ff, d))
        b1 = rng.normal(scale=0.5, size=d_ff)
        W2 = rng.normal(scale=1 / np.sqrt(d_ff), size=(d, d_ff))
        b2 = rng.normal(scale=0.5, size=d)
        what = (f"feed_forward(x, W1, b1, W2, b2) for x of shape {shape}, W1 {W1.shape} and W2 {W2.shape} "
                "(nn.Linear layout)")
        asked.append(Question((x, W1, b1, W2, b2), lambda got, a=(x, W1, b1, W2, b2), w=what:
                              _judge_feed_forward(got, *a, w)))
    return asked


# ---------------------------------------------------------------- sublayer_connection

def _judge_connection(got, x, W, b, gamma, beta, eps, norm_first, what):
    if isinstance(got, Raised) and "unexpected keyword argument 'norm_first'" in got.message:
        raise CheckFailed(f"{what} raised {got.message}: the signature is sublayer_connection(x, sublayer, norm, "
                          "norm_first=False)")
    if isinstance(got, Raised) and "missing 1 required positional argument: 'norm_first'" in got.message:
        raise CheckFailed(f"{what} raised {got.message}: norm_first has a default, False (the paper's post-norm): "
                          "def sublayer_connection(x, sublayer, norm, norm_first=False)")
    _raised(got, what)
    sub = lambda t: np.tanh(t @ W.T + b)  # noqa: E731
    norm = lambda t: _layer_norm(t, gamma, beta, eps)  # noqa: E731
    pre = bool(norm_first)
    default = norm_first is None
    mistakes = []
    if default:
        mistakes.append(("called without norm_first, it normalizes first: norm_first defaults to False, the "
                         "paper's post-norm, norm(x + sublayer(x))", _connect(x, sub, norm, True)))
    if pre:
        mistakes += [
            ("with norm_first=True it computes the post-norm norm(x + sublayer(x)); pre-norm is "
             "x + sublayer(norm(x)): are the two branches swapped?", _connect(x, sub, norm, False)),
            ("the residual is added to the normalized input, norm(x) + sublayer(norm(x)); the residual path "
             "carries x itself: x + sublayer(norm(x)) (keep x before you normalize it)",
             _connect(x, sub, norm, True, "normed")),
            ("there is no residual: sublayer(norm(x)) alone; pre-norm adds the input, x + sublayer(norm(x))",
             _connect(x, sub, norm, True, "none")),
        ]
    else:
        mistakes += [
            ("it computes the pre-norm x + sublayer(norm(x)); with norm_first=False (the paper's post-norm) it is "
             "norm(x + sublayer(x)): are the two branches swapped?", _connect(x, sub, norm, True)),
            ("there is no residual: norm(sublayer(x)); post-norm normalizes the sum, norm(x + sublayer(x))",
             _connect(x, sub, norm, False, "none")),
            ("the norm is applied to the sublayer's output before the residual, x + norm(sublayer(x)); post-norm "
             "normalizes the sum: norm(x + sublayer(x))", _connect(x, sub, norm, False, "outside")),
            ("the residual is added to the normalized input, norm(x) + sublayer(norm(x)); post-norm is "
             "norm(x + sublayer(x))", _connect(x, sub, norm, False, "normed")),
        ]
    mistakes += [
        ("the norm is skipped: it returns x + sublayer(x); call norm, " +
         ("x + sublayer(norm(x))" if pre else "norm(x + sublayer(x))"), _connect(x, sub, norm, pre, "no_norm")),
        ("it returns sublayer(x) alone: no residual and no norm", sub(x)),
        ("it returns x unchanged: the sublayer is never applied", x),
    ]
    judge(got, _connect(x, sub, norm, pre), what, mistakes)


@exercise("encoder-sublayer_connection", "sublayer_connection", driver="encoder.drive_sublayer_connection")
def sublayer_connection_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # norm_first=True; not passed (the default, post-norm); False by keyword. True comes first so
    # that swapped branches are named as such before a wrong default is.
    for shape, norm_first in [((3, 4, 7), True), ((2, 5, 6), None), ((2, 3, 5), False)]:
        d = shape[-1]
        x = _rows(rng, shape)
        W = rng.normal(scale=1.2 / np.sqrt(d), size=(d, d))
        b = rng.normal(scale=0.5, size=d)
        gamma = rng.uniform(0.5, 2.0, size=d)
        beta = rng.normal(scale=0.8, size=d)
        eps = 1e-5
        note = "" if norm_first is None else f", norm_first={norm_first}"
        what = (f"sublayer_connection(x, sublayer, norm{note}) for x of shape {shape}, sublayer = tanh of an "
                "affine map, norm = nn.LayerNorm with trained gamma and beta")
        asked.append(Question((x, W, b, gamma, beta, eps, norm_first),
                              lambda got, a=(x, W, b, gamma, beta, eps, norm_first), w=what:
                              _judge_connection(got, *a, w)))
    return asked


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


_LOAD_ERRORS = ("has no parameter", "should have shape", "has parameters that", "share their parameters")


def _raised_module(got, what, name):
    if not isinstance(got, Raised) or got.message.startswith("NotImplementedError"):
        return
    message = got.message.rstrip(".")
    if any(s in message for s in _LOAD_ERRORS):
        raise CheckFailed(f"{what}: the grader could not load torch's weights into your module: {message}")
    if "is not a torch.nn.Module" in message or "it should be a class" in message:
        raise CheckFailed(f"{what}: {message.split(': ', 1)[-1]}")
    if "unexpected keyword argument" in message and ("norm_first" in message or "dropout" in message
                                                     or "pad_id" in message):
        raise CheckFailed(f"{what} raised {message}: keep the constructor's signature from the docstring")
    if "tuple" in message:
        raise CheckFailed(f"{what} raised {message}: nn.MultiheadAttention returns a tuple (output, weights); "
                          "take the output, self.self_attn(x, x, x, ...)[0]")
    if "NoneType" in message:
        raise CheckFailed(f"{what} raised {message}: something it uses returned None. Does your feed_forward, "
                          "layer_norm or sublayer_connection miss a `return`? Fix that one first")
    if "key_padding_mask" in message or "expected both" in message.lower():
        raise CheckFailed(f"{what} raised {message}: pass PyTorch a bool key_padding_mask of shape "
                          "(batch, seq_len) with True = IGNORE, i.e. ~padding_mask")
    raise CheckFailed(f"{what} raised {message}")


def _two_calls(got, what, name, atol):
    got = answer_value(got, name)
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckFailed(f"{what}: the grader could not read your module's output back; forward should return "
                          "one tensor (batch, seq_len, d_model)")
    first, second = (to_array(g, f"the output of {what}") for g in got)
    if first.shape == second.shape and not np.allclose(first, second, rtol=0, atol=1e-6):
        raise CheckFailed(f"{what}: two calls in eval mode gave different outputs, so dropout is still on after "
                          ".eval(). Use nn.Dropout modules (they switch off in eval mode), or pass "
                          "training=self.training to F.dropout")
    return first


def _judge_layer(got, p, x, keep, heads, norm_first, what):
    _raised_module(got, what, "EncoderLayer")
    out = _two_calls(got, what, "EncoderLayer", STACK_ATOL)
    alt = lambda **k: _encoder_layer(x, p, heads, keep, norm_first, **k)  # noqa: E731
    order = "post-norm, norm(x + sublayer(x))" if not norm_first else "pre-norm, x + sublayer(norm(x))"
    mistakes = [
        (f"it computes the {'pre' if not norm_first else 'post'}-norm arrangement; with norm_first={norm_first} "
         f"it is {order}: check how norm_first reaches your sublayer connections",
         _encoder_layer(x, p, heads, keep, not norm_first)),
        ("the ReLU of the feed-forward sublayer is missing: linear2(relu(linear1(x)))", alt(relu=False)),
        ("norm1 and norm2 are swapped: norm1 belongs to the self-attention sublayer, norm2 to the feed-forward one",
         alt(norms=("norm2", "norm1"))),
        ("there is no residual connection around the sublayers: add the sublayer's input back", alt(residual="none")),
        ("the sublayers skip their norms (x + sublayer(x)): use norm1 and norm2", alt(residual="no_norm")),
        ("the residual is added to the normalized input, norm(x) + sublayer(norm(x)); the residual path "
         "carries x itself", alt(residual="normed")),
        ("the norm is applied to the sublayer's output before the residual, x + norm(sublayer(x))",
         alt(residual="outside")),
    ]
    if keep is not None:
        mistakes = [
            ("the padding mask is inverted: this course's padding_mask says True = real token, PyTorch's "
             "key_padding_mask says True = IGNORE; pass key_padding_mask=~padding_mask", alt(mask="inverted")),
            ("the padding mask is ignored: pass key_padding_mask=~padding_mask to self.self_attn",
             alt(mask="ignored")),
        ] + mistakes
    judge(out, _encoder_layer(x, p, heads, keep, norm_first), f"the output of {what}", mistakes,
          atol=STACK_ATOL)


@exercise("encoder-EncoderLayer", "EncoderLayer", driver="encoder.drive_encoder_layer")
def encoder_layer_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    d_model, heads, d_ff, batch, seq_len = 12, 3, 20, 2, 5
    for norm_first, masked in [(False, False), (False, True), (True, True), (True, False)]:
        p = _layer_params(rng, d_model, d_ff)
        x = _rows(rng, (batch, seq_len, d_model))
        keep = _padding(rng, batch, seq_len) if masked else None
        what = (f"EncoderLayer(d_model={d_model}, heads={heads}, d_ff={d_ff}, dropout=0.5, norm_first={norm_first}) "
                f"in eval mode, on x {x.shape}" + (f" with a padding mask {keep.shape}" if masked else ", no mask"))
        args = (d_model, heads, d_ff, norm_first) + tuple(p[k] for k in LAYER_KEYS) + (x, keep)
        asked.append(Question(args, lambda got, a=(p, x, keep, heads, norm_first), w=what: _judge_layer(got, *a, w)))
    return asked


# ---------------------------------------------------------------- Encoder

def _judge_encoder(got, p, src, heads, n_layers, pad_id, what):
    _raised_module(got, what, "Encoder")
    out = _two_calls(got, what, "Encoder", STACK_ATOL)
    alt = lambda **k: _encoder(src, p, heads, n_layers, pad_id, **k)  # noqa: E731
    mistakes = [
        ("the embeddings are not scaled: multiply them by sqrt(d_model) before adding the positional encoding "
         "(Sec. 3.4)", alt(scale="none")),
        ("the embeddings are multiplied by d_model; multiply them by sqrt(d_model)", alt(scale="d_model")),
        ("the positional encoding is missing: add pe[:seq_len] to the scaled embeddings", alt(pe="none")),
        ("the positional encoding is added twice (once here and once in a layer?): add it once, before the "
         "first layer", alt(pe="twice")),
        ("the positional encodings start at position 1: token t gets pe[t], pe[:seq_len]", alt(pe="shifted")),
        ("the positional encoding is scaled by sqrt(d_model) too, (embedding + pe) * sqrt(d_model); scale the "
         "embeddings only: embedding * sqrt(d_model) + pe", alt(pe="scaled")),
        ("the padding mask is ignored: build padding_mask = src != pad_id and pass it to every layer",
         alt(mask="ignored")),
        ("the padding mask is inverted: padding_mask = src != pad_id is True on real tokens (the course's "
         "convention, which the layers turn into PyTorch's key_padding_mask)", alt(mask="inverted")),
        ("the first layer is applied every time: loop over the layers, `for layer in self.layers: x = layer(x, "
         "padding_mask)`", alt(layers="first")),
    ]
    judge(out, _encoder(src, p, heads, n_layers, pad_id), f"the output of {what}", mistakes, atol=STACK_ATOL)


@exercise("encoder-Encoder", "Encoder", driver="encoder.drive_encoder")
def encoder_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
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
        asked.append(Question(args, lambda got, a=(p, src, heads, n_layers, pad_id), w=what:
                              _judge_encoder(got, *a, w)))
    return asked
