"""Hidden checks of notebook 09, transformer: the full model, the label-smoothed loss, the
warmup schedule, greedy decoding and one training step.

Grader-side references in numpy float64 (the model, the loss, the schedule, greedy decoding
of the scripted stand-in) and in torch float64 (the tiny model's training steps). The
learner's classes and functions of modules are called through the drivers of
``coursekit/drivers/transformer.py``, which load the weights drawn here by name.

Sizes are pairwise distinct: src_vocab 11, tgt_vocab 13, d_model 12, 3 heads (d_k 4),
d_ff 20, batch 2, source length 5, target length 6, so that swapped embeddings or axes
either raise or show. Sentence 1 of every batch is padded (source and target). Mask
convention of the course: True = may attend / real token; torch's masks are the reverse.
Logits at padding positions of tgt_in are not checked (no loss is computed there).
"""
from __future__ import annotations

import json

import numpy as np

from ._core import CheckFailed, Question, Raised, Unsupported, close, exercise, judge, to_array
from ._core import value as answer_value

DEEP_ATOL = 1e-4  # two-layer stacks in float32


# ---------------------------------------------------------------- numpy reference of the model

def _softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _mha(p: dict, prefix: str, query, key, heads: int, allowed):
    """torch.nn.MultiheadAttention (in_proj rows q, k, v) with allowed (batch, q, k) True = may attend."""
    d = query.shape[-1]
    w, b = p[f"{prefix}.in_proj_weight"], p[f"{prefix}.in_proj_bias"]
    q = query @ w[:d].T + b[:d]
    k = key @ w[d:2 * d].T + b[d:2 * d]
    v = key @ w[2 * d:].T + b[2 * d:]
    bsz, lq, lk, dk = query.shape[0], query.shape[1], key.shape[1], d // heads
    q = q.reshape(bsz, lq, heads, dk).transpose(0, 2, 1, 3)
    k = k.reshape(bsz, lk, heads, dk).transpose(0, 2, 1, 3)
    v = v.reshape(bsz, lk, heads, dk).transpose(0, 2, 1, 3)
    with np.errstate(all="ignore"):
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dk)
        scores = np.where(allowed[:, None], scores, -np.inf)
        weights = np.nan_to_num(_softmax(scores))  # a query with no key left gets no weight (torch's fast path)
        out = (weights @ v).transpose(0, 2, 1, 3).reshape(bsz, lq, d)
    return out @ p[f"{prefix}.out_proj.weight"].T + p[f"{prefix}.out_proj.bias"]


def _ffn(p, prefix, x):
    h = np.maximum(x @ p[f"{prefix}.linear1.weight"].T + p[f"{prefix}.linear1.bias"], 0)
    return h @ p[f"{prefix}.linear2.weight"].T + p[f"{prefix}.linear2.bias"]


def _pe(length: int, d: int) -> np.ndarray:
    pos = np.arange(length)[:, None]
    angle = pos / 10000 ** (np.arange(0, d, 2) / d)
    pe = np.zeros((length, d))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)[:, : d // 2]
    return pe


def _transformer(p: dict, cfg: dict, src, tgt_in, *, scale="sqrt", pe="both", causal="right",
                 memory_mask="right", encoder_mask="right", swap_embed=False, output="logits"):
    """The reference logits (batch, tgt_len, tgt_vocab), or a known mistake's (knobs)."""
    d, heads, pad = cfg["d_model"], cfg["heads"], cfg["pad_id"]
    factor = {"sqrt": np.sqrt(d), "none": 1.0, "d_model": float(d)}[scale]
    src_table, tgt_table = p["src_embed.weight"], p["tgt_embed.weight"]
    if swap_embed:
        src_table, tgt_table = tgt_table, src_table
    x = src_table[src] * factor + (_pe(src.shape[1], d) if pe in ("both", "src") else 0)
    y = tgt_table[tgt_in] * factor + (_pe(tgt_in.shape[1], d) if pe in ("both", "tgt") else 0)
    real = src != pad
    lq, lk = tgt_in.shape[1], src.shape[1]
    enc_allowed = {"right": np.repeat(real[:, None], lk, 1), "none": np.ones((len(src), lk, lk), bool)}[encoder_mask]
    for i in range(cfg["layers"]):
        pre = f"encoder_layers.{i}"
        x = _layer_norm(x + _mha(p, f"{pre}.self_attn", x, x, heads, enc_allowed), p[f"{pre}.norm1.weight"],
                        p[f"{pre}.norm1.bias"])
        x = _layer_norm(x + _ffn(p, pre, x), p[f"{pre}.norm2.weight"], p[f"{pre}.norm2.bias"])
    tri = {"right": np.tril(np.ones((lq, lq), bool)), "none": np.ones((lq, lq), bool),
           "diagonal": np.tril(np.ones((lq, lq), bool), -1), "one_ahead": np.tril(np.ones((lq, lq), bool), 1)}[causal]
    self_allowed = np.repeat(tri[None], len(src), 0)
    cross_allowed = {"right": np.repeat(real[:, None], lq, 1), "none": np.ones((len(src), lq, lk), bool),
                     "inverted": np.repeat(~real[:, None], lq, 1)}[memory_mask]
    for i in range(cfg["layers"]):
        pre = f"decoder_layers.{i}"
        y = _layer_norm(y + _mha(p, f"{pre}.self_attn", y, y, heads, self_allowed), p[f"{pre}.norm1.weight"],
                        p[f"{pre}.norm1.bias"])
        y = _layer_norm(y + _mha(p, f"{pre}.multihead_attn", y, x, heads, cross_allowed), p[f"{pre}.norm2.weight"],
                        p[f"{pre}.norm2.bias"])
        y = _layer_norm(y + _ffn(p, pre, y), p[f"{pre}.norm3.weight"], p[f"{pre}.norm3.bias"])
    logits = y @ p["generator.weight"].T + p["generator.bias"]
    if output == "probs":
        return _softmax(logits)
    if output == "log_probs":
        return np.log(_softmax(logits))
    return logits


def _param_shapes(cfg: dict) -> list:
    d, f, sv, tv = cfg["d_model"], cfg["d_ff"], cfg["src_vocab"], cfg["tgt_vocab"]
    attn = lambda n: [(f"{n}.in_proj_weight", (3 * d, d)), (f"{n}.in_proj_bias", (3 * d,)),
                      (f"{n}.out_proj.weight", (d, d)), (f"{n}.out_proj.bias", (d,))]
    ffn = lambda n: [(f"{n}.linear1.weight", (f, d)), (f"{n}.linear1.bias", (f,)),
                     (f"{n}.linear2.weight", (d, f)), (f"{n}.linear2.bias", (d,))]
    norm = lambda n, k: [(f"{n}.norm{k}.weight", (d,)), (f"{n}.norm{k}.bias", (d,))]
    shapes = [("src_embed.weight", (sv, d)), ("tgt_embed.weight", (tv, d))]
    for i in range(cfg["layers"]):
        n = f"encoder_layers.{i}"
        shapes += attn(f"{n}.self_attn") + ffn(n) + norm(n, 1) + norm(n, 2)
    for i in range(cfg["layers"]):
        n = f"decoder_layers.{i}"
        shapes += attn(f"{n}.self_attn") + attn(f"{n}.multihead_attn") + ffn(n) + norm(n, 1) + norm(n, 2) + norm(n, 3)
    return shapes + [("generator.weight", (tv, d)), ("generator.bias", (tv,))]


def _draw_params(rng, cfg):
    p = {}
    for name, shape in _param_shapes(cfg):
        if ".norm" in name:
            p[name] = (1.0 if name.endswith(".weight") else 0.0) + rng.normal(scale=0.2, size=shape)
        elif "embed" in name:
            p[name] = rng.normal(scale=0.5, size=shape)
        elif len(shape) == 1:
            p[name] = rng.normal(scale=0.2, size=shape)
        else:
            p[name] = rng.normal(scale=1.0 / np.sqrt(shape[-1]), size=shape)
    return p


def _spec(cfg, p) -> tuple[str, np.ndarray]:
    shapes = _param_shapes(cfg)
    spec = json.dumps({**cfg, "params": [[n, list(s)] for n, s in shapes]})
    return spec, np.concatenate([p[n].ravel() for n, _ in shapes])


def _raised_model(got: object, what: str) -> None:
    if not isinstance(got, Raised) or got.message.startswith("NotImplementedError"):
        return
    message = got.message
    if "index out of range" in message:
        raise CheckFailed(f"{what} raised {message}: token ids beyond an embedding's size. Are src_embed and "
                          "tgt_embed swapped (src_embed = nn.Embedding(src_vocab, d_model) embeds src, tgt_embed "
                          "embeds tgt_in)?")
    if "has no parameter" in message or "should have shape" in message or "one tensor" in message \
            or "does not name" in message or "has no method" in message:
        raise CheckFailed(f"{what}: the grader could not load its weights into your model: {message}")
    if "must match the size" in message and "dimension 1" in message:
        raise CheckFailed(f"{what} raised {message}. The positional encoding must be cut to the sequence "
                          "length: pe[:seq_len], not the whole max_len table")
    raise CheckFailed(f"{what} raised {message}")


def _judge_model(got, p, cfg, src, tgt_in, what):
    _raised_model(got, what)
    got = answer_value(got, "Transformer")
    if not isinstance(got, tuple) or len(got) != 3:
        raise CheckFailed(f"{what}: expected the logits, one tensor (batch, tgt_len, tgt_vocab)")
    first, second, third = (to_array(a, what) for a in got)
    real = tgt_in != cfg["pad_id"]  # positions whose logits are checked

    def sel(a):
        a = np.asarray(a, dtype=np.float64)
        return a[real] if a.shape == real.shape + (cfg["tgt_vocab"],) else a

    expected = _transformer(p, cfg, src, tgt_in)

    def alt(**knobs):
        """A known mistake's logits, or None where it cannot run (e.g. ids beyond a swapped table)."""
        try:
            return _transformer(p, cfg, src, tgt_in, **knobs)
        except IndexError:
            return None

    if first.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {first.shape}; expected (batch, tgt_len, tgt_vocab) = {expected.shape}: "
                          "the generator projects every target position to tgt_vocab logits")
    if not close(sel(first), sel(second), atol=DEEP_ATOL):
        raise CheckFailed(f"{what}: two calls in eval mode gave different outputs, so dropout is still on in "
                          "eval mode. Use nn.Dropout modules (model.eval() switches them off), or "
                          "F.dropout(x, p, training=self.training)")
    mistakes = [
        ("the embeddings are not multiplied by sqrt(d_model) (Sec. 3.4): embed(ids) * math.sqrt(d_model), "
         "then add the positional encoding", alt(scale="none")),
        ("the embeddings are multiplied by d_model; the paper multiplies them by sqrt(d_model)",
         alt(scale="d_model")),
        ("there is no positional encoding: add pe[:seq_len] to the scaled embeddings of both src and tgt_in",
         alt(pe="none")),
        ("the positional encoding is added to the source embeddings only: the decoder's input needs it too",
         alt(pe="src")),
        ("the positional encoding is added to the target embeddings only: the encoder's input needs it too",
         alt(pe="tgt")),
        ("the decoder's self-attention has no causal mask, so position t sees the target tokens after it. "
         "Pass tgt_mask=causal_mask(tgt_len) to every decoder layer",
         alt(causal="none")),
        ("the causal mask hides the diagonal: a position must attend to itself too (position 0 then sees "
         "nothing at all). Use torch.tril(ones, diagonal=0): position t sees positions 0 ... t",
         alt(causal="diagonal")),
        ("the causal mask lets each position see one token ahead (torch.triu/tril off by one): position t may "
         "attend to positions 0 ... t only, torch.tril(ones, diagonal=0)",
         alt(causal="one_ahead")),
        ("the cross-attention ignores the source padding: pass memory_padding_mask=src_mask (True = real "
         "token) to every decoder layer", alt(memory_mask="none")),
        ("the encoder's self-attention ignores the source padding: pass src_mask (True = real token) to every "
         "encoder layer", alt(encoder_mask="none")),
        ("src_embed and tgt_embed are swapped: src_embed embeds the source ids (encoder), tgt_embed the target "
         "ids (decoder)", alt(swap_embed=True)),
        ("it returns probabilities (a softmax of the logits): return the generator's raw logits; the loss "
         "applies log_softmax itself", alt(output="probs")),
        ("it returns log-probabilities: return the generator's raw logits; the loss applies log_softmax itself",
         alt(output="log_probs")),
    ]
    mistakes = [(m, sel(a)) for m, a in mistakes if a is not None]

    def nan_hint(a):
        if np.isnan(a).any():
            return ("NaN in the logits: some query has no key left. Is the causal mask hiding the diagonal (a "
                    "position must see itself: torch.tril(..., diagonal=0)), or is a mask inverted (torch's "
                    "key_padding_mask and attn_mask use True = ignore)?")
        return None

    judge(sel(first), sel(expected), what, mistakes, hints=[nan_hint], atol=DEEP_ATOL)
    if third.shape != expected.shape or not close(sel(third), sel(expected), atol=DEEP_ATOL):
        raise CheckFailed(f"{what}: forward(src, tgt_in) is right, but decode(encode(src, src_mask), src_mask, tgt_in) "
                          "with src_mask = src != pad_id differs from it. forward should be exactly that; "
                          "greedy_decode relies on encode and decode")


def _tokens(rng, batch, length, vocab, pad, lengths):
    ids = rng.integers(0, vocab, size=(batch, length))
    ids = np.where(ids == pad, (pad + 1) % vocab, ids)
    for b, n in enumerate(lengths):
        ids[b, n:] = pad
    return ids.astype(np.int64)


@exercise("transformer-Transformer", "Transformer", driver="transformer.model")
def transformer_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for cfg, src_lengths, tgt_lengths in [
        (dict(src_vocab=11, tgt_vocab=13, d_model=12, heads=3, d_ff=20, layers=2, max_len=16, pad_id=0), (5, 3), (6, 4)),
        (dict(src_vocab=9, tgt_vocab=7, d_model=10, heads=2, d_ff=6, layers=1, max_len=11, pad_id=2), (4, 7), (3, 5)),
    ]:
        p = _draw_params(rng, cfg)
        src = _tokens(rng, 2, max(src_lengths), cfg["src_vocab"], cfg["pad_id"], src_lengths)
        tgt_in = _tokens(rng, 2, max(tgt_lengths), cfg["tgt_vocab"], cfg["pad_id"], tgt_lengths)
        spec, flat = _spec(cfg, p)
        what = (f"Transformer(src_vocab={cfg['src_vocab']}, tgt_vocab={cfg['tgt_vocab']}, d_model={cfg['d_model']}, "
                f"heads={cfg['heads']}, d_ff={cfg['d_ff']}, layers={cfg['layers']}, ...)(src, tgt_in) for src "
                f"{src.shape} and tgt_in {tgt_in.shape} with padding")
        asked.append(Question((spec, flat, src, tgt_in),
                              lambda got, p=p, c=cfg, s=src, t=tgt_in, w=what: _judge_model(got, p, c, s, t, w)))
    return asked


# ---------------------------------------------------------------- label-smoothed loss

def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _ls_loss(logits, target, pad, eps, *, spread="nonpad", keep="nonpad", reduce="mean", log="log_softmax"):
    """The reference (defaults) and the known mistakes, in float64."""
    V = logits.shape[-1]
    z = logits.reshape(-1, V)
    t = target.reshape(-1)
    with np.errstate(all="ignore"):
        logp = {"log_softmax": _log_softmax(z), "none": z, "softmax": np.exp(_log_softmax(z)),
                "log_softmax_axis0": _log_softmax(z.T).T}[log]
    q = np.zeros_like(z)
    if spread == "nonpad":          # eps over the V-1 classes other than padding, the true one included
        q[:] = eps / (V - 1)
        q[:, pad] = 0
        q[np.arange(len(t)), t] = 1 - eps + eps / (V - 1)   # (rows whose target is pad are dropped)
    elif spread == "nonpad_add":    # the same for non-pad targets; a pad target's row gets 1 - eps on pad
        q[:] = eps / (V - 1)
        q[:, pad] = 0
        q[np.arange(len(t)), t] += 1 - eps
    elif spread == "all":           # torch's label_smoothing: eps / V on every class, padding included
        q[:] = eps / V
        q[np.arange(len(t)), t] += 1 - eps
    elif spread == "over_V":        # eps / V on non-pad classes: the distribution sums to 1 - eps / V
        q[:] = eps / V
        q[:, pad] = 0
        q[np.arange(len(t)), t] += 1 - eps
    elif spread == "others":        # true class 1 - eps, eps over the V - 2 others (neither true nor pad)
        q[:] = eps / (V - 2)
        q[:, pad] = 0
        q[np.arange(len(t)), t] = 1 - eps
    elif spread == "true_only_eps":  # forgot the 1 - eps: true class gets 1 + eps/(V-1)
        q[:] = eps / (V - 1)
        q[:, pad] = 0
        q[np.arange(len(t)), t] += 1
    with np.errstate(all="ignore"):
        per_token = -(q * logp).sum(-1)
    mask = t != pad if keep == "nonpad" else np.ones_like(t, dtype=bool)
    if reduce == "sum":
        return np.float64(per_token[mask].sum())
    if reduce == "sentence_mean":
        tok = per_token.reshape(target.shape)
        m = mask.reshape(target.shape)
        return np.float64(np.mean([tok[b][m[b]].mean() for b in range(tok.shape[0]) if m[b].any()]))
    return np.float64(per_token[mask].mean())


def _judge_loss(got, logits, target, pad, eps, what):
    if isinstance(got, Raised) and not got.message.startswith("NotImplementedError"):
        message = got.message
        hint = ""
        if "scatter" in message or "gather" in message or "Index tensor must have" in message:
            hint = (": scatter_/gather need an index with the same number of axes as the tensor, "
                    "target.unsqueeze(-1)")
        elif "expected scalar type Long" in message or "must be of type Long" in message:
            hint = ": token ids index: keep target int64 (torch.long)"
        raise CheckFailed(f"{what} raised {message}{hint}")
    got = answer_value(got, "label_smoothed_loss")
    arr = to_array(got, what)
    if arr.size == len(target.reshape(-1)) or arr.shape == target.shape:
        raise CheckFailed(f"{what} returns one loss per token, shape {arr.shape}: average over the non-padding "
                          "tokens and return a scalar")
    if arr.shape not in ((), (1,)):
        raise CheckFailed(f"{what} should be a scalar (a 0-d tensor), but it has shape {arr.shape}")
    arr = arr.reshape(())
    A = lambda **k: _ls_loss(logits, target, pad, eps, **k)
    mistakes = [
        ("it puts smoothing mass on the padding class (torch's label_smoothing spreads eps / V over all V "
         "classes, padding included). Give padding probability 0 and spread eps over the other V - 1 "
         "classes: eps / (V - 1) each, plus 1 - eps on the true class", A(spread="all")),
        ("padding positions are not ignored: average only over the tokens whose target is not pad_id",
         A(keep="all")),
        ("padding positions are not ignored: average only over the tokens whose target is not pad_id",
         A(keep="all", spread="nonpad_add")),
        ("padding positions are not ignored, and smoothing mass sits on the padding class",
         A(keep="all", spread="all")),
        ("it sums over the tokens; take the mean over the non-padding tokens", A(reduce="sum")),
        ("it averages per sentence, then over sentences; average over all non-padding tokens of the batch "
         "at once (as F.cross_entropy's 'mean' with ignore_index does)", A(reduce="sentence_mean")),
        ("it spreads eps / V over the non-padding classes, so the target distribution sums to 1 - eps / V, "
         "not 1: with padding excluded there are V - 1 classes, eps / (V - 1) each", A(spread="over_V")),
        ("the true class gets 1 - eps and eps is spread over the V - 2 other non-padding classes; the stated "
         "convention spreads eps over all V - 1 non-padding classes, the true one included, so the true class "
         "gets 1 - eps + eps / (V - 1)", A(spread="others")),
        ("the true class gets 1 + eps / (V - 1): subtract eps from it (1 - eps + eps / (V - 1)), so the "
         "distribution sums to 1", A(spread="true_only_eps")),
        ("it uses the logits as log-probabilities: take F.log_softmax(logits, dim=-1) first",
         A(log="none")),
        ("it uses probabilities (softmax) where log-probabilities belong: F.log_softmax(logits, dim=-1)",
         A(log="softmax")),
    ]
    expected = A()
    judge(arr, expected, what, [(m, np.asarray(a)) for m, a in mistakes if np.isfinite(a)])


@exercise("transformer-label_smoothed_loss", "label_smoothed_loss", driver="tensors")
def label_smoothed_loss_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for shape, vocab, pad, eps, lengths in [((3, 5), 7, 0, 0.1, (5, 2, 4)), ((2, 4), 9, 3, 0.25, (4, 1)),
                                            ((2, 6), 6, 1, 0.0, (6, 3))]:
        logits = rng.normal(scale=2.0, size=shape + (vocab,))
        target = _tokens(rng, shape[0], shape[1], vocab, pad, lengths)
        what = (f"label_smoothed_loss(logits {logits.shape}, target {target.shape}, pad_id={pad}, smoothing={eps})")
        asked.append(Question((logits, target, pad, eps),
                              lambda got, l=logits, t=target, p=pad, e=eps, w=what: _judge_loss(got, l, t, p, e, w)))
    # 2-D logits (tokens, V) and float32 logits
    logits = rng.normal(scale=1.5, size=(7, 8)).astype(np.float32)
    target = rng.integers(1, 8, size=7).astype(np.int64)
    target[[2, 5]] = 0
    what = "label_smoothed_loss(logits (7, 8) float32, target (7,), pad_id=0, smoothing=0.2)"
    asked.append(Question((logits, target, 0, 0.2),
                          lambda got: _judge_loss(got, logits.astype(np.float64), target, 0, 0.2, what)))
    return asked


# ---------------------------------------------------------------- learning-rate schedule

def _noam(step, d_model, warmup, factor=1.0, *, how="right"):
    s = step + 1 if how == "from_zero" else step
    if how == "warmup_half":
        return factor * d_model ** -0.5 * min(s ** -0.5, s * warmup ** -0.5)
    if how == "d_model_pos":
        return factor * d_model ** 0.5 * min(s ** -0.5, s * warmup ** -1.5)
    if how == "max":
        return factor * d_model ** -0.5 * max(s ** -0.5, s * warmup ** -1.5)
    if how == "no_factor":
        return d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)
    if how == "no_d_model":
        return factor * min(s ** -0.5, s * warmup ** -1.5)
    return factor * d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)


def _judge_noam(got, args, what):
    step, d_model, warmup, factor = args
    if isinstance(got, Raised) and not got.message.startswith("NotImplementedError"):
        raise CheckFailed(f"{what} raised {got.message}")
    arr = to_array(got, what)
    if arr.shape not in ((), (1,)):
        raise CheckFailed(f"{what} should be one number, but it has shape {arr.shape}")
    arr = arr.reshape(())
    n = lambda how: np.float64(_noam(step, d_model, warmup, factor, how=how))
    mistakes = [
        ("the warmup term uses warmup ** -0.5; the paper has step * warmup ** -1.5 (Sec. 5.3)", n("warmup_half")),
        ("it multiplies by d_model ** 0.5; the paper has d_model ** -0.5", n("d_model_pos")),
        ("it takes the max of the two terms; the paper takes the min (a linear rise, then step ** -0.5)",
         n("max")),
        ("it counts steps from 0 (uses step + 1): the step number passed in is already 1-based", n("from_zero")),
        ("factor is ignored: multiply the schedule by factor", n("no_factor")),
        ("d_model ** -0.5 is missing", n("no_d_model")),
    ]
    judge(arr, np.float64(n("right")), what, [(m, a) for m, a in mistakes], rtol=1e-6, atol=1e-12)


def _judge_noam_zero(got, what):
    if isinstance(got, Raised):
        if got.message.startswith("ValueError"):
            return
        if got.message.startswith("NotImplementedError"):
            answer_value(got, "noam_lr")
        if got.message.startswith("ZeroDivisionError"):
            raise CheckFailed(f"{what} raised {got.message}; check step < 1 first and raise ValueError, as the "
                              "docstring says")
        raise CheckFailed(f"{what} raised {got.message}; it should raise ValueError, as the docstring says")
    raise CheckFailed(f"{what} returned a value; steps start at 1, so it should raise ValueError, as the "
                      "docstring says")


@exercise("transformer-noam_lr", "noam_lr")
def noam_lr_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    d_model = int(rng.choice([48, 64, 96]))
    warmup = int(rng.choice([40, 50, 70]))
    for step, factor in [(1, 1.0), (int(rng.integers(5, 20)), 2.0), (warmup, 0.5),
                         (int(rng.integers(3 * warmup, 5 * warmup)), 1.5), (int(rng.integers(2, warmup - 5)), 1.0)]:
        args = (step, d_model, warmup, factor)
        what = f"noam_lr(step={step}, d_model={d_model}, warmup={warmup}, factor={factor})"
        asked.append(Question(args, lambda got, a=args, w=what: _judge_noam(got, a, w)))
    # the default factor (by position only)
    args = (7, 32, 25, 1.0)
    asked.append(Question((7, 32, 25), lambda got: _judge_noam(got, args, "noam_lr(7, 32, 25)")))
    asked.append(Question((0, 64, 50), lambda got: _judge_noam_zero(got, "noam_lr(step=0, d_model=64, warmup=50)")))
    return asked


# ---------------------------------------------------------------- greedy decoding

def _scripted_logits_top(plan, bos, junk, prefix, b, t):
    want = [bos] + list(plan[b][:t])
    return plan[b][t] if t < len(plan[b]) and list(prefix[:t + 1]) == want else junk


def _greedy(plan, src, bos, eos, pad, max_len, junk, *, how="right"):
    """Greedy decoding of the scripted stand-in, in plain Python: (tokens, decode calls)."""
    plan = [list(r) for r in plan]
    batch = len(plan)
    ys = [[bos] for _ in range(batch)]
    done = [False] * batch
    calls = 0
    for step in range(max_len):
        calls += 1
        nxt = []
        for b in range(batch):
            if how == "last_only":
                prefix = [ys[b][-1]]
                t = 0
            else:
                prefix = ys[b]
                t = 0 if how == "first_position" else len(prefix) - 1
            nxt.append(_scripted_logits_top(plan, bos, junk, prefix, b, t))
        for b in range(batch):
            if done[b] and how not in ("no_stop", "no_pad"):
                nxt[b] = pad
            ys[b].append(nxt[b])
            if nxt[b] == eos:
                done[b] = True
        if how == "any_stop" and any(done):
            break
        if all(done) and how not in ("no_early_exit", "no_stop"):
            break
    out = np.array([row[1:] for row in ys], dtype=np.int64)
    if how == "keep_bos":
        out = np.array(ys, dtype=np.int64)
    if how == "drop_eos":
        out = np.where(out == eos, pad, out)
    return out, calls


def _judge_greedy(got, plan, src, bos, eos, pad, max_len, junk, what):
    if isinstance(got, Raised) and not got.message.startswith("NotImplementedError"):
        message = got.message
        if "more than" in message and "times" in message:
            raise CheckFailed(f"{what}: the loop does not stop after max_len steps. Loop for at most max_len "
                              "steps (for _ in range(max_len)) and break early when every sentence has its EOS")
        if "not model(...)" in message:
            raise CheckFailed(f"{what} raised {message}")
        raise CheckFailed(f"{what} raised {message}")
    got = answer_value(got, "greedy_decode")
    if not isinstance(got, tuple) or len(got) != 3:
        raise CheckFailed(f"{what}: expected one int64 tensor of token ids")
    raw, calls, mask_ok = got
    if isinstance(raw, (Raised, Unsupported)) or isinstance(raw, tuple):
        to_array(raw, what)
    if not isinstance(raw, np.ndarray) or raw.dtype.kind not in "iub":
        kind = getattr(raw, "dtype", type(raw))
        raise CheckFailed(f"{what} returns {kind} values; return token ids as an int64 tensor (argmax gives int64)")
    tokens = raw.astype(np.int64)
    expected, expected_calls = _greedy(plan, src, bos, eos, pad, max_len, junk)
    variant = lambda how: _greedy(plan, src, bos, eos, pad, max_len, junk, how=how)[0]
    mistakes = [
        ("it keeps BOS as the first column: return the generated tokens only, ys[:, 1:]", variant("keep_bos")),
        ("it does not stop a sentence at its EOS: every token after a sentence's EOS must be pad_id "
         "(keep a `finished` flag per sentence and write pad_id once it is set)", variant("no_stop")),
        ("it does not stop a sentence at its EOS: every token after a sentence's EOS must be pad_id "
         "(keep a `finished` flag per sentence and write pad_id once it is set)", variant("no_pad")),
        ("tokens after EOS are padded, but the loop runs on to max_len after every sentence has finished: "
         "break as soon as all sentences have produced EOS (the output is then shorter than max_len)",
         variant("no_early_exit")),
        ("it stops as soon as ANY sentence produces EOS; stop when ALL of them have", variant("any_stop")),
        ("it takes the prediction at the first position, logits[:, 0]; the next token is predicted at the "
         "LAST position, logits[:, -1]", variant("first_position")),
        ("it feeds the decoder only the last token; feed the whole prefix [BOS, y1, ..., yt] every step "
         "(the decoder attends over all of it)", variant("last_only")),
        ("EOS itself is missing from the output: keep the EOS token, then pad_id after it", variant("drop_eos")),
    ]
    mistakes = [(m, a) for m, a in mistakes]
    for message, wrong in mistakes:
        if wrong.shape == tokens.shape and np.array_equal(wrong, tokens) and not np.array_equal(expected, tokens):
            raise CheckFailed(f"{what}: {message}")
    if tokens.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {tokens.shape}; expected {expected.shape} (batch, steps run), "
                          "without BOS, stopping when every sentence has produced EOS or after max_len steps")
    if not np.array_equal(tokens, expected):
        raise CheckFailed(f"{what} returns other tokens than greedy decoding gives: at each step feed the "
                          "prefix so far to model.decode, take the argmax over the vocabulary (the last axis) "
                          "at the last position, append it")
    calls = np.asarray(calls).reshape(-1)
    if int(calls[0]) != 1:
        raise CheckFailed(f"{what} called model.encode {int(calls[0])} times: encode the source once, before the "
                          "loop, and reuse the memory")
    if not bool(np.asarray(mask_ok).reshape(-1)[0]):
        raise CheckFailed(f"{what} did not pass src_mask = (src != pad_id) (a bool tensor, True = real token) to "
                          "model.encode and model.decode")


@exercise("transformer-greedy_decode", "greedy_decode", driver="transformer.greedy")
def greedy_decode_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # (vocab, bos, eos, pad, junk, eos step per sentence (None = never), max_len)
    for vocab, bos, eos, pad, junk, eos_at, max_len in [
        (9, 1, 2, 0, 8, (1, 3, None), 5),
        (11, 3, 5, 1, 10, (2, 0, 4, 1), 7),
    ]:
        batch = len(eos_at)
        steps = max_len + 3
        words = [v for v in range(vocab) if v not in (bos, eos, pad, junk)]
        plan = rng.choice(words, size=(batch, steps)).astype(np.int64)
        for b, at in enumerate(eos_at):
            if at is not None:
                plan[b, at] = eos
        src = rng.choice(words, size=(batch, 4)).astype(np.int64)
        src[1, 3:] = pad
        what = (f"greedy_decode(model, src {src.shape}, bos_id={bos}, eos_id={eos}, pad_id={pad}, max_len={max_len}) "
                "on a stand-in model whose outputs the grader scripted")
        asked.append(Question((plan, src, bos, eos, pad, max_len, vocab, junk),
                              lambda got, a=(plan, src, bos, eos, pad, max_len, junk), w=what: _judge_greedy(got, *a, w)))
    return asked


# ---------------------------------------------------------------- one training step

def _tiny_reference(arrays, pad, srcs, tgts, lrs, optimizer, *, shift="right", zero_grad=True,
                    scheduler="after", train_mode=True):
    """Parameters after each step and the losses, in torch float64, as train_step should do."""
    import torch

    params = [torch.tensor(arrays[k], dtype=torch.float64, requires_grad=True)
              for k in ("src_embed", "tgt_embed", "out_weight", "out_bias")]
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=1.0)
    else:
        opt = torch.optim.SGD(params, lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lrs[min(k, len(lrs) - 1)])
    if scheduler == "before":
        sched.step()
    losses, snaps = [], []
    for src, tgt in zip(srcs, tgts):
        src, tgt = torch.tensor(src), torch.tensor(tgt)
        if shift == "right":
            tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
        elif shift == "none":
            tgt_in, tgt_out = tgt, tgt
        else:  # reversed
            tgt_in, tgt_out = tgt[:, 1:], tgt[:, :-1]
        s_emb, t_emb, w, b = params
        real = (src != pad).to(torch.float64)
        context = (s_emb[src] * real[..., None]).sum(1) / real.sum(1, keepdim=True)
        logits = torch.tanh(t_emb[tgt_in] + context[:, None]) @ w.T + b
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1),
                                                 ignore_index=pad)
        if zero_grad:
            opt.zero_grad()
        loss.backward()
        opt.step()
        if scheduler in ("after", "before"):
            sched.step()
        losses.append(loss.item())
        snaps.append(torch.cat([p.detach().flatten() for p in params]).numpy())
    return np.array(losses), np.stack(snaps)


def _judge_train_step(got, arrays, pad, srcs, tgts, lrs, optimizer, what):
    if isinstance(got, Raised) and not got.message.startswith("NotImplementedError"):
        message = got.message
        if "does not require grad" in message:
            raise CheckFailed(f"{what} raised {message}: the loss must come from the model's logits with autograd "
                              "on (no torch.no_grad(), no .item() before backward)")
        if "backward through the graph a second time" in message:
            raise CheckFailed(f"{what} raised {message}: compute the logits and the loss anew in every step")
        raise CheckFailed(f"{what} raised {message}")
    got = answer_value(got, "train_step")
    losses, snaps, first_in, first_target, modes, counts = (to_array(a, what) if not isinstance(a, np.ndarray) else a
                                                            for a in got)
    counts = np.asarray(counts).reshape(-1)
    if counts[0] == 0 or counts[1] == 0:
        raise CheckFailed(f"{what} did not call " + ("the model" if counts[0] == 0 else "loss_fn") +
                          ": compute logits = model(src, tgt_in), then loss = loss_fn(logits, tgt_out)")
    if counts[0] != len(srcs):
        raise CheckFailed(f"{what} called the model {int(counts[0] / len(srcs))} times per step: once is enough")
    tgt = np.asarray(tgts[0])
    first_in = np.asarray(first_in)
    first_target = np.asarray(first_target)
    if first_in.shape == tgt.shape and np.array_equal(first_in, tgt):
        raise CheckFailed(f"{what}: the targets are not shifted: the model got the whole tgt as its input. "
                          "Teacher forcing feeds tgt_in = tgt[:, :-1] ([BOS, y1, ...]) and scores the "
                          "prediction against tgt_out = tgt[:, 1:] ([y1, ..., EOS])")
    if first_in.shape == tgt[:, 1:].shape and np.array_equal(first_in, tgt[:, 1:]):
        raise CheckFailed(f"{what}: the shift is reversed: the model got tgt[:, 1:] as input. Feed tgt_in = "
                          "tgt[:, :-1] (starts with BOS) and score against tgt_out = tgt[:, 1:]")
    if not (first_in.shape == tgt[:, :-1].shape and np.array_equal(first_in, tgt[:, :-1])):
        raise CheckFailed(f"{what}: the model should get tgt_in = tgt[:, :-1], the target without its last token")
    if not (first_target.shape == tgt[:, 1:].shape and np.array_equal(first_target, tgt[:, 1:])):
        raise CheckFailed(f"{what}: loss_fn should get (logits, tgt_out) with tgt_out = tgt[:, 1:], the target "
                          "without its BOS")
    modes = np.asarray(modes).reshape(-1)
    if not modes.all():
        raise CheckFailed(f"{what}: the model was in eval mode during the step: call model.train() first (the "
                          "notebook evaluates in between, which switches dropout off)")
    exp_losses, exp_snaps = _tiny_reference(arrays, pad, srcs, tgts, lrs, optimizer)
    losses = np.asarray(losses, dtype=np.float64).reshape(-1)
    snaps = np.asarray(snaps, dtype=np.float64)
    if close(snaps, exp_snaps, rtol=1e-6, atol=1e-9):
        if not close(losses, exp_losses, rtol=1e-6, atol=1e-8):
            raise CheckFailed(f"{what} returns other losses than loss_fn gave: return loss.item() of this step's "
                              "loss (computed before the update)")
        return
    alternatives = [
        ("the gradients are not reset: call optimizer.zero_grad() before loss.backward(), or they add up over "
         "steps", dict(zero_grad=False)),
        ("the scheduler is never stepped: call scheduler.step() after optimizer.step(), once per step",
         dict(scheduler="never")),
        ("scheduler.step() comes before optimizer.step(), so every step uses the next step's learning rate: "
         "optimizer.step() first, then scheduler.step()", dict(scheduler="before")),
    ]
    for message, knobs in alternatives:
        _, alt = _tiny_reference(arrays, pad, srcs, tgts, lrs, optimizer, **knobs)
        if close(snaps, alt, rtol=1e-6, atol=1e-9):
            raise CheckFailed(f"{what}: {message}")
    initial = np.concatenate([np.ravel(arrays[k]) for k in ("src_embed", "tgt_embed", "out_weight", "out_bias")])
    if close(snaps[-1], initial):
        raise CheckFailed(f"{what}: the parameters did not change: call loss.backward(), then optimizer.step()")
    raise CheckFailed(f"{what}: after the steps the parameters differ from one optimizer.step() per call on the "
                      "gradient of this step's loss: zero_grad, backward, optimizer.step(), scheduler.step()")


def _judge_falls(got, what):
    if isinstance(got, Raised) and not got.message.startswith("NotImplementedError"):
        raise CheckFailed(f"{what} raised {got.message}")
    got = answer_value(got, "train_step")
    losses = np.asarray(to_array(got[0], what), dtype=np.float64).reshape(-1)
    if len(losses) < 2 or not np.all(np.isfinite(losses)):
        raise CheckFailed(f"{what}: the losses are not finite numbers")
    if not losses[-5:].mean() < 0.5 * losses[0]:
        raise CheckFailed(f"{what}: the loss did not fall to half its first value in {len(losses)} steps "
                          f"(first {losses[0]:.3f}, last {losses[-1]:.3f})")


def _tiny_arrays(rng, src_vocab, tgt_vocab, d):
    return {"src_embed": rng.normal(scale=0.5, size=(src_vocab, d)),
            "tgt_embed": rng.normal(scale=0.5, size=(tgt_vocab, d)),
            "out_weight": rng.normal(scale=0.5, size=(tgt_vocab, d)),
            "out_bias": rng.normal(scale=0.1, size=(tgt_vocab,))}


def _tiny_spec(arrays, pad):
    names = ("src_embed", "tgt_embed", "out_weight", "out_bias")
    spec = json.dumps({"pad_id": pad, "params": [[n, list(arrays[n].shape)] for n in names]})
    return spec, np.concatenate([arrays[n].ravel() for n in names])


@exercise("transformer-train_step", "train_step", driver="transformer.training")
def train_step_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # exact: three SGD steps on two batches with a changing learning rate (pad 1, bos 2, eos 3)
    pad, bos, eos = 1, 2, 3
    arrays = _tiny_arrays(rng, 8, 9, 5)
    srcs, tgts = [], []
    for b in range(3):
        src = _tokens(rng, 3, 4, 8, pad, (4, 2, 3))
        body = rng.integers(4, 9, size=(3, 5))
        tgt = np.concatenate([np.full((3, 1), bos), body, np.full((3, 1), pad)], 1)
        for row, n in enumerate((5, 3, 4)):
            tgt[row, 1 + n] = eos
            tgt[row, 2 + n:] = pad
        srcs.append(src)
        tgts.append(tgt.astype(np.int64))
    lrs = np.array([0.5, 0.3, 0.8, 0.2])
    spec, flat = _tiny_spec(arrays, pad)
    what = "train_step(model, src, tgt, optimizer, scheduler, loss_fn) on a stand-in model, three steps with SGD"
    asked.append(Question((spec, flat, np.stack(srcs), np.stack(tgts), lrs, "sgd"),
                          lambda got: _judge_train_step(got, arrays, pad, srcs, tgts, list(lrs), "sgd", what)))
    # the loss must fall: 40 Adam steps on a tiny task where the next token is (previous + 1) mod 6 (+ offset)
    pad2 = 0
    arrays2 = _tiny_arrays(rng, 7, 10, 8)
    srcs2, tgts2 = [], []
    for _ in range(40):
        start = rng.integers(3, 10, size=(4, 1))
        body = 3 + (start - 3 + np.arange(6)[None]) % 7
        tgt = np.concatenate([np.full((4, 1), 1), body, np.full((4, 1), 2)], 1).astype(np.int64)
        srcs2.append(_tokens(rng, 4, 3, 7, pad2, (3, 3, 2, 3)))
        tgts2.append(tgt)
    spec2, flat2 = _tiny_spec(arrays2, pad2)
    what2 = "40 calls of train_step on a stand-in model with Adam (lr 0.05)"
    asked.append(Question((spec2, flat2, np.stack(srcs2), np.stack(tgts2), np.array([0.05]), "adam"),
                          lambda got: _judge_falls(got, what2)))
    return asked
