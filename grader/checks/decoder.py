"""Hidden checks of notebook 08, decoder: shift right, the decoder's self-attention mask,
the decoder layer, the decoder stack, and the causality experiment.

Masks follow the course convention (True = may attend, or: a real token). Sizes are
pairwise distinct (batch 2, heads 3, d_k 4, d_model 12, tgt_len 5, src_len 6, d_ff 20) so
that a swapped axis raises or shows. The layer and the stack are classes: the drivers of
``coursekit/drivers/decoder.py`` build them, load the weights drawn here by the names of
torch.nn.TransformerDecoderLayer, switch to eval mode and call them on several inputs: the
base input, the decoder input with a later token changed (earlier outputs must not move),
the memory changed at real positions (the output must move) and at padded positions (it
must not), then the base input again (built with dropout 0.5: eval mode must switch it
off). The reference below is numpy float64, with knobs for the known mistakes; tests check
it against torch.nn.TransformerDecoderLayer.
"""
from __future__ import annotations

import numpy as np

from coursekit.drivers.decoder import LAYER_PARAMS

from ._core import CheckFailed, Question, Raised, exercise, judge, to_array
from ._core import value as answer_value

EPS = 1e-5  # nn.LayerNorm's default


# ---------------------------------------------------------------- shift_right

def _int_hint(got: object, what: str) -> None:
    """Token ids must stay integers: nn.Embedding refuses float ids."""
    if isinstance(got, np.ndarray) and got.dtype.kind == "f":
        raise CheckFailed(f"{what} returns float ids ({got.dtype}); token ids are integers (int64), which "
                          "nn.Embedding needs: build the BOS column with the target's dtype, e.g. "
                          "torch.full((batch, 1), bos_id, dtype=target.dtype) or np.full(..., dtype=target.dtype)")


def _judge_shift(got: object, target: np.ndarray, bos: int, what: str) -> None:
    got = answer_value(got, "shift_right")
    batch, length = target.shape
    bos_col = np.full((batch, 1), bos)
    expected = np.concatenate([bos_col, target[:, :-1]], axis=1)
    if isinstance(got, np.ndarray) and got.shape == (batch, length + 1):
        if np.array_equal(got, np.concatenate([bos_col, target], axis=1)):
            raise CheckFailed(f"{what} prepends BOS but keeps the last column: the decoder input has the "
                              "target's length, so drop the target's last token (target[:, :-1])")
    mistakes = [
        ("it returns the target unchanged: the decoder input is the target shifted one step right, "
         "BOS first (teacher forcing: position t sees y_1 ... y_(t-1) and predicts y_t)", target),
        ("it shifts left, BOS at the end: the decoder input starts with BOS, then target[:, :-1]",
         np.concatenate([target[:, 1:], bos_col], axis=1)),
        ("it drops the target's first token instead of its last: [BOS, target[:, 1:]] skips y_1; "
         "use [BOS, target[:, :-1]]", np.concatenate([bos_col, target[:, 1:]], axis=1)),
        ("the first column holds the target's last token, not BOS: after a roll by one, set column 0 "
         "to bos_id", np.roll(target, 1, axis=1)),
        ("it rolls the flattened array (np.roll / torch.roll without an axis): shift along the "
         "sequence axis, axis 1 (dim=1), and put BOS in column 0",
         np.roll(target.reshape(-1), 1).reshape(target.shape)),
        ("it shifts along the batch axis: shift each sentence along axis 1 (the sequence axis), not "
         "axis 0", np.concatenate([np.full((1, length), bos), target[:-1]], axis=0)),
    ]
    _int_hint(got, what)
    judge(got, expected, what, mistakes, hints=[
        lambda g: ("column 0 should be bos_id in every sentence" if g.shape == expected.shape
                   and not np.all(g[:, 0] == bos) else None)])


@exercise("decoder-shift_right", "shift_right", driver="tensors")
def shift_right_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # (batch 3, length 6) and (2, 4), with EOS = 2 and PAD = 0 after each sentence; bos_id not always 1
    for batch, length, bos in [(3, 6, 1), (2, 4, 5), (1, 1, 3)]:
        target = np.zeros((batch, length), dtype=np.int64)
        lengths = rng.permutation(np.arange(1, length + 1))[:batch] if length >= batch else np.full(batch, length)
        lengths[0] = length  # one sentence fills the row: its EOS is the last column
        for b, n in enumerate(lengths):
            target[b, :n - 1] = rng.integers(6, 20, size=n - 1)
            target[b, n - 1] = 2
        what = f"shift_right(target, bos_id={bos}) for target of shape {target.shape}"
        asked.append(Question((target, bos), lambda got, t=target, b=bos, w=what: _judge_shift(got, t, b, w)))
    return asked


# ---------------------------------------------------------------- decoder_self_mask

def _self_mask(tgt: np.ndarray, pad: int, how: str = "right") -> np.ndarray:
    length = tgt.shape[1]
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    causal = {"right": j <= i, "strict": j < i, "one_ahead": j <= i + 1, "upper": j >= i}.get(how, j <= i)
    keys = (tgt != pad)[:, None, :]
    if how == "causal_only":
        return np.broadcast_to(causal, (tgt.shape[0], length, length))
    if how == "padding_only":
        return np.broadcast_to(keys, (tgt.shape[0], length, length))
    if how == "query_axis":
        return causal[None] & (tgt != pad)[:, :, None]
    if how == "inverted":
        return ~(causal[None] & keys)
    if how == "or":
        return causal[None] | keys
    return causal[None] & keys


def _judge_self_mask(got: object, tgt: np.ndarray, pad: int, what: str) -> None:
    got = answer_value(got, "decoder_self_mask")
    expected = _self_mask(tgt, pad)
    batch, length = tgt.shape
    if isinstance(got, np.ndarray) and got.shape == (batch, 1, length, length):
        raise CheckFailed(f"{what} has shape {got.shape}: return (batch, tgt_len, tgt_len) without a heads axis "
                          "(torch_attn_mask repeats it per head)")
    mistakes = [
        ("the diagonal is masked: each position may attend to itself (key j <= query i, torch.tril with "
         "diagonal=0)", _self_mask(tgt, pad, "strict")),
        ("one future position is visible (off by one): query i may attend to keys j <= i only; "
         "torch.tril(..., diagonal=0), not diagonal=1", _self_mask(tgt, pad, "one_ahead")),
        ("it is inverted: in this course True means may attend (torch's attn_mask means the opposite)",
         _self_mask(tgt, pad, "inverted")),
        ("it is the causal mask only: also hide the padding keys (tgt_in[b, j] == pad_id)",
         _self_mask(tgt, pad, "causal_only")),
        ("it is the padding mask only: also hide the future keys (j > i), the causal mask",
         _self_mask(tgt, pad, "padding_only")),
        ("it hides padding queries (rows) instead of padding keys (columns): the padding mask of key j "
         "goes along the last axis, (tgt_in != pad_id)[:, None, :]", _self_mask(tgt, pad, "query_axis")),
        ("it lets a query see the future (upper triangle): key j <= query i is the lower triangle, "
         "torch.tril", _self_mask(tgt, pad, "upper")),
        ("it combines the masks with OR: a key must be both in the past and not padding, AND (&)",
         _self_mask(tgt, pad, "or")),
    ]
    if pad != 0:
        mistakes.append(("it hides token 0 instead of pad_id: use the pad_id argument",
                         _self_mask(tgt, 0)))
    judge(got, expected.astype(np.float64), what, mistakes)


@exercise("decoder-decoder_self_mask", "decoder_self_mask", driver="tensors")
def decoder_self_mask_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for batch, length, pad in [(2, 5, 0), (3, 6, 4)]:
        lengths = rng.permutation(np.arange(2, length + 1))[:batch]
        lengths[rng.integers(batch)] = length
        tgt = np.full((batch, length), pad, dtype=np.int64)
        for b, n in enumerate(lengths):
            tgt[b, :n] = rng.choice([t for t in range(0, 15) if t != pad], size=n)
        if pad != 0:  # token 0 is a real word here: a mask that hides 0 instead of pad_id shows
            tgt[:, 1] = 0
        what = f"decoder_self_mask(tgt_in, pad_id={pad}) for tgt_in of shape {tgt.shape}"
        asked.append(Question((tgt, pad), lambda got, t=tgt, p=pad, w=what: _judge_self_mask(got, t, p, w)))
    return asked


# ---------------------------------------------------------------- the layer: a float64 reference

def _softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def _norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


def _attend(p: dict, prefix: str, q, kv, heads: int, mask=None, key_keep=None):
    """nn.MultiheadAttention(batch_first=True) in float64; mask (T, S) or (B, T, S), key_keep (B, S): True = attend."""
    d = q.shape[-1]
    w, b = p[f"{prefix}.in_proj_weight"], p[f"{prefix}.in_proj_bias"]
    Q, K, V = q @ w[:d].T + b[:d], kv @ w[d:2 * d].T + b[d:2 * d], kv @ w[2 * d:].T + b[2 * d:]

    def split(t):
        return t.reshape(t.shape[0], t.shape[1], heads, d // heads).transpose(0, 2, 1, 3)

    Q, K, V = split(Q), split(K), split(V)
    with np.errstate(all="ignore"):
        scores = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
        keep = np.ones(scores.shape, dtype=bool)
        if mask is not None:
            keep &= mask[:, None] if mask.ndim == 3 else mask
        if key_keep is not None:
            keep &= key_keep[:, None, None, :]
        out = _softmax(np.where(keep, scores, -np.inf)) @ V
    out = out.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], d)
    return out @ p[f"{prefix}.out_proj.weight"].T + p[f"{prefix}.out_proj.bias"]


def _layer(p: dict, y, memory, heads: int, norm_first: bool, tgt_mask=None, memory_keep=None, *,
           cross="memory", self_mask="given", memory_mask="given", residual="right", relu=True,
           norms=("norm1", "norm2", "norm3")):
    """torch.nn.TransformerDecoderLayer's forward (eval mode) in float64, with knobs for the known mistakes."""
    with np.errstate(all="ignore"):
        t_mask = {"given": tgt_mask, "none": None,
                  "inverted": None if tgt_mask is None else ~tgt_mask}[self_mask]
        m_keep = {"given": memory_keep, "none": None,
                  "inverted": None if memory_keep is None else ~memory_keep}[memory_mask]

        def sa(x):
            return _attend(p, "self_attn", x, x, heads, t_mask)

        def ca(x):
            source = memory if cross == "memory" else x
            return _attend(p, "multihead_attn", x, source, heads, None, m_keep if cross == "memory" else None)

        def ff(x):
            h = x @ p["linear1.weight"].T + p["linear1.bias"]
            h = np.maximum(h, 0.0) if relu else h
            return h @ p["linear2.weight"].T + p["linear2.bias"]

        x = y
        for sub, name in zip((sa, ca, ff), norms):
            def norm(t, name=name):
                return _norm(t, p[f"{name}.weight"], p[f"{name}.bias"])
            if norm_first:
                x = {"right": lambda: x + sub(norm(x)), "none": lambda: sub(norm(x)),
                     "outside": lambda: norm(x + sub(x))}[residual]()
            else:
                x = {"right": lambda: norm(x + sub(x)), "none": lambda: norm(sub(x)),
                     "outside": lambda: x + norm(sub(x))}[residual]()
        return x


def _layer_params(rng: np.random.Generator, d_model: int, d_ff: int) -> dict:
    """Weights as a trained layer might have them: no zeros, non-unit norms with a bias."""
    s = 1.0 / np.sqrt(d_model)
    p = {}
    for prefix in ("self_attn", "multihead_attn"):
        p[f"{prefix}.in_proj_weight"] = rng.normal(scale=1.5 * s, size=(3 * d_model, d_model))
        p[f"{prefix}.in_proj_bias"] = rng.normal(scale=0.3, size=(3 * d_model,))
        p[f"{prefix}.out_proj.weight"] = rng.normal(scale=s, size=(d_model, d_model))
        p[f"{prefix}.out_proj.bias"] = rng.normal(scale=0.3, size=(d_model,))
    p["linear1.weight"] = rng.normal(scale=s, size=(d_ff, d_model))
    p["linear1.bias"] = rng.normal(scale=0.3, size=(d_ff,))
    p["linear2.weight"] = rng.normal(scale=1.0 / np.sqrt(d_ff), size=(d_model, d_ff))
    p["linear2.bias"] = rng.normal(scale=0.3, size=(d_model,))
    for name in ("norm1", "norm2", "norm3"):
        p[f"{name}.weight"] = rng.uniform(0.6, 1.6, size=(d_model,))
        p[f"{name}.bias"] = rng.normal(scale=0.3, size=(d_model,))
    return p


def _raised_layer(got: object, what: str, name: str) -> None:
    if not isinstance(got, Raised) or got.message.startswith("NotImplementedError"):
        return
    message = got.message.rstrip(".")
    if "has no attribute" in message or "has no " in message and "it should be" in message or "has shape" in message:
        raise CheckFailed(f"{what}: the grader could not load torch's weights into your module: {message}")
    if "attn_mask is" in message and "but should be" in message and "3D" in message:
        raise CheckFailed(f"{what} raised {message}. torch wants a 3-D attn_mask of shape (batch * heads, "
                          "tgt_len, tgt_len), True = ignore: pass torch_attn_mask(tgt_mask, heads), the helper "
                          "that converts a course mask of any shape")
    if "attn_mask is" in message and "but should be" in message or "key_padded_mask" in message or (
            "is invalid for input of size" in message):
        raise CheckFailed(f"{what} raised {message}. Are the attention layers built with batch_first=True? "
                          "Without it nn.MultiheadAttention reads (seq_len, batch, d_model)")
    if "returns a tuple" in message or "returns a list" in message:
        raise CheckFailed(f"{what}: {message}. nn.MultiheadAttention returns (output, weights): keep [0]")
    if "unexpected keyword argument" in message:
        raise CheckFailed(f"{what} raised {message}: the grader calls forward(y, memory, tgt_mask=..., "
                          "memory_padding_mask=...) with these names" if name == "DecoderLayer" else
                          f"{what} raised {message}: the grader calls {name}(vocab_size, d_model, heads, d_ff, "
                          "layers, max_len, pad_id, dropout=...) and forward(tgt_in, memory, "
                          "memory_padding_mask=...) with these names")
    raise CheckFailed(f"{what} raised {message}")


def _outputs(got: object, k: int, what: str, name: str) -> tuple:
    _raised_layer(got, what, name)
    got = answer_value(got, name)
    if not isinstance(got, tuple) or len(got) != k + 1:
        raise CheckFailed(f"{what}: the grader could not read the outputs back")
    return tuple(to_array(g, what) for g in got)


def _dropout_check(outs: tuple, what: str, where: str = "") -> None:
    first, again = outs[0], outs[-1]
    if first.shape == again.shape and not np.allclose(first, again, rtol=1e-5, atol=1e-6, equal_nan=True):
        raise CheckFailed(f"{what}: two calls on the same input in eval mode give different outputs, so dropout "
                          f"is still on (built with dropout=0.5){where}. Use nn.Dropout modules (self.dropout), "
                          "which .eval() switches off, or F.dropout(x, p, training=self.training): F.dropout's "
                          "default is training=True")


NAN_HINT = ("it contains NaN: a row of a mask hides every key. Is a mask inverted? This course's masks mean "
            "True = may attend; torch's attn_mask and key_padding_mask mean True = ignore (pass "
            "torch_attn_mask(tgt_mask, heads) and ~memory_padding_mask)")


def _judge_layer(got: object, case: dict, what: str) -> None:
    ys, mems = case["ys"], case["memories"]
    outs = _outputs(got, len(ys), what, "DecoderLayer")
    _dropout_check(outs, what)
    p, heads, norm_first = case["params"], case["heads"], case["norm_first"]
    t_mask, m_keep, position = case["tgt_mask"], case["memory_keep"], case["position"]

    def ref(i, **knobs):
        return _layer(p, ys[i], mems[i], heads, norm_first, t_mask, m_keep, **knobs)

    def mistakes(i):
        found = [
            ("cross-attention takes its keys and values from the decoder: in multihead_attn the queries "
             "come from the decoder (x) and the keys and values from the encoder's output, memory",
             ref(i, cross="decoder")),
            ("it puts the layer norm " + ("after the residual sum (post-norm); norm_first=True asks for "
             "pre-norm, x + sublayer(norm(x))" if norm_first else "before the sublayer (pre-norm); "
             "norm_first=False is the paper's post-norm, norm(x + sublayer(x))"),
             _layer(p, ys[i], mems[i], heads, not norm_first, t_mask, m_keep)),
            ("there is no residual connection: add the sublayer's input back, "
             + ("x + sublayer(norm(x))" if norm_first else "norm(x + sublayer(x))"), ref(i, residual="none")),
            ("the residual is added to the wrong tensor: "
             + ("pre-norm is x + sublayer(norm(x))" if norm_first else
                "post-norm is norm(x + sublayer(x)), the sum inside the norm"), ref(i, residual="outside")),
            ("the feed-forward network has no ReLU: linear2(relu(linear1(x)))", ref(i, relu=False)),
            ("the layer norms are used in the wrong order: norm1 after self-attention, norm2 after "
             "cross-attention, norm3 after the feed-forward network", ref(i, norms=("norm3", "norm2", "norm1"))),
        ]
        if t_mask is not None:
            found.append(("it ignores tgt_mask in the self-attention, so every position sees the future: pass "
                          "attn_mask=torch_attn_mask(tgt_mask, heads) to self_attn", ref(i, self_mask="none")))
        if m_keep is not None:
            found += [("it ignores memory_padding_mask, so the decoder attends to padded source positions: pass "
                       "key_padding_mask=~memory_padding_mask to multihead_attn", ref(i, memory_mask="none")),
                      ("memory_padding_mask is used the wrong way round: it is True at real tokens, torch's "
                       "key_padding_mask is True at padding, so pass ~memory_padding_mask",
                       ref(i, memory_mask="inverted"))]
        return found

    expected = ref(0)
    base = outs[0]

    def leak(g):
        if t_mask is None or position is None or g.shape != expected.shape:
            return None
        if not np.allclose(outs[1][:, :position], g[:, :position], rtol=1e-4, atol=1e-5):
            return (f"changing the decoder input at position {position} changed the outputs at earlier "
                    "positions: the self-attention must use tgt_mask (a causal mask), attn_mask=torch_attn_mask("
                    "tgt_mask, heads)")
        return None

    def memory_ignored(g):
        if g.shape != expected.shape or not case["memory_real_changed"]:
            return None
        if np.allclose(outs[2], g, rtol=1e-4, atol=1e-5):
            return ("the output does not change when the encoder memory changes: cross-attention "
                    "(multihead_attn) must take its keys and values from memory")
        return None

    def memory_padding(g):
        if m_keep is None or g.shape != expected.shape:
            return None
        if not np.allclose(outs[3], g, rtol=1e-4, atol=1e-5):
            return ("changing the memory at padded source positions changed the output: mask them with "
                    "key_padding_mask=~memory_padding_mask")
        return None

    def nan(g):
        return NAN_HINT if not np.all(np.isfinite(g)) else None

    if base.shape == expected.shape and not np.all(np.isfinite(base)):
        raise CheckFailed(f"the output of {what}: {NAN_HINT}")
    judge(base, expected, f"the output of {what}", mistakes(0), hints=[leak, memory_ignored, memory_padding, nan])
    for i in range(1, len(ys)):
        judge(outs[i], ref(i), f"the output of {what} on another input ({case['notes'][i]})", mistakes(i),
              hints=[nan])


def _padding_keep(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    """Every sentence padded (at least one pad, at least two real tokens): an inverted mask never hides a whole row."""
    lengths = rng.permutation(np.arange(2, length))[:batch]
    return np.arange(length)[None, :] < lengths[:, None]


def _perturbed_inputs(rng, y, memory, keep, position):
    """[base, y changed at `position` and later, memory changed at real positions, memory changed at pads]."""
    y_future = y.copy()
    if position is not None:
        y_future[:, position:] += rng.normal(scale=1.0, size=y_future[:, position:].shape)
    real = np.ones(memory.shape[:2], dtype=bool) if keep is None else keep
    mem_real = memory + real[..., None] * rng.normal(scale=1.0, size=memory.shape)
    mem_pad = memory + (~real)[..., None] * rng.normal(scale=3.0, size=memory.shape)
    return [y, y_future, y, y], [memory, memory, mem_real, mem_pad]


@exercise("decoder-DecoderLayer", "DecoderLayer", driver="decoder.decoder_layer")
def decoder_layer_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    d_model, heads, d_ff, batch, tgt_len, src_len = 12, 3, 20, 2, 5, 6
    causal = np.tril(np.ones((tgt_len, tgt_len), dtype=bool))
    for norm_first, mask_kind, padded in [(False, "causal", True), (True, "causal", True), (False, None, False),
                                          (False, "combined", True)]:
        p = _layer_params(rng, d_model, d_ff)
        y = rng.normal(size=(batch, tgt_len, d_model))
        memory = rng.normal(size=(batch, src_len, d_model))
        keep = _padding_keep(rng, batch, src_len) if padded else None
        if mask_kind == "combined":  # causal AND target padding, (batch, tgt_len, tgt_len)
            tgt_lengths = np.array([tgt_len, 3])
            tgt_mask = causal[None] & (np.arange(tgt_len)[None, None, :] < tgt_lengths[:, None, None])
        else:
            tgt_mask = causal if mask_kind == "causal" else None
        position = int(rng.integers(2, tgt_len - 1)) if tgt_mask is not None else None
        ys, mems = _perturbed_inputs(rng, y, memory, keep, position)
        case = {"params": p, "heads": heads, "norm_first": norm_first, "tgt_mask": tgt_mask, "memory_keep": keep,
                "position": position, "ys": ys, "memories": mems, "memory_real_changed": True,
                "notes": ["", "a later decoder token changed", "the memory changed", "padded memory changed"]}
        masks = {"causal": "a causal tgt_mask (5, 5)", "combined": "a causal + padding tgt_mask (2, 5, 5)",
                 None: "no masks"}[mask_kind]
        what = (f"DecoderLayer(d_model={d_model}, heads={heads}, d_ff={d_ff}, norm_first={norm_first}) on y "
                f"{y.shape}, memory {memory.shape}, {masks}" + (", a memory padding mask (2, 6)" if padded else ""))
        args = (d_model, heads, d_ff, 0.5, norm_first) + tuple(p[n] for n in LAYER_PARAMS) + (
            np.stack(ys), np.stack(mems), tgt_mask, keep)
        asked.append(Question(args, lambda got, c=case, w=what: _judge_layer(got, c, w)))
    return asked


# ---------------------------------------------------------------- the stack

def _pe(max_len: int, d_model: int) -> np.ndarray:
    pos = np.arange(max_len)[:, None]
    angle = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((max_len, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


def _stack(case: dict, tgt: np.ndarray, memory: np.ndarray, *, scale="sqrt", pe="right", mask="right",
           shared=False, memory_mask=True):
    d, n = case["d_model"], case["layers"]
    emb = case["embed"][tgt]
    table = _pe(case["max_len"] + 1, d)
    length = tgt.shape[1]
    pos = {"right": table[:length], "none": 0.0, "twice": 2 * table[:length], "shifted": table[1:length + 1]}[pe]
    if scale == "after":
        x = (emb + pos) * np.sqrt(d)
    else:
        x = emb * {"sqrt": np.sqrt(d), "none": 1.0, "d": float(d)}[scale] + pos
    t_mask = {"right": _self_mask(tgt, case["pad"]), "none": None, "pad0": _self_mask(tgt, 0)}[mask]
    for i in range(n):
        p = case["layer_params"][n - 1 if shared else i]
        x = _layer(p, x, memory, case["heads"], False, t_mask, case["memory_keep"] if memory_mask else None)
    return x


def _judge_stack(got: object, case: dict, what: str) -> None:
    tgts, mems = case["tgt_ins"], case["memories"]
    outs = _outputs(got, len(tgts), what, "Decoder")
    _dropout_check(outs, what, ", in the Decoder or in its DecoderLayers")
    real = [t != case["pad"] for t in tgts]  # outputs at padding positions are not compared: nothing reads them

    def at_real(i, a):
        a = np.asarray(a)
        return a[real[i]] if a.shape[:2] == tgts[i].shape else a

    def mistakes(i):
        t, m = tgts[i], mems[i]
        return [
            ("the embeddings are not multiplied by sqrt(d_model) (Sec. 3.4): embed(tgt_in) * sqrt(d_model) + PE",
             _stack(case, t, m, scale="none")),
            ("the embeddings are multiplied by d_model; multiply by sqrt(d_model)", _stack(case, t, m, scale="d")),
            ("sqrt(d_model) scales the positional encoding too: scale the embeddings only, "
             "embed(tgt_in) * sqrt(d_model) + PE", _stack(case, t, m, scale="after")),
            ("the positional encoding is missing: add sinusoidal_encoding(max_len, d_model)[:tgt_len]",
             _stack(case, t, m, pe="none")),
            ("the positional encoding is added twice", _stack(case, t, m, pe="twice")),
            ("the positional encoding starts at position 1: the first token gets row 0, PE[:tgt_len]",
             _stack(case, t, m, pe="shifted")),
            ("the layers share one set of weights: nn.ModuleList([layer] * n) repeats the same module; build "
             "a new DecoderLayer for each layer", _stack(case, t, m, shared=True)),
            ("no self-attention mask reaches the layers, so every position sees the future: pass "
             "tgt_mask=decoder_self_mask(tgt_in, pad_id) to each layer", _stack(case, t, m, mask="none")),
            ("memory_padding_mask does not reach the layers: pass it to each layer",
             _stack(case, t, m, memory_mask=False)),
        ] + ([("its self-attention mask hides token 0 instead of pad_id: use the pad_id given to __init__ "
               "(decoder_self_mask(tgt_in, self.pad_id))", _stack(case, t, m, mask="pad0"))] if case["pad"] else [])

    expected = _stack(case, tgts[0], mems[0])
    position = case["position"]

    def leak(g):
        if g.shape != at_real(0, expected).shape or outs[1].shape != expected.shape:
            return None
        if not np.allclose(outs[1][:, :position], outs[0][:, :position], rtol=1e-4, atol=1e-4):
            return (f"changing the decoder input token at position {position} changed the outputs at earlier "
                    "positions: does every layer get tgt_mask=decoder_self_mask(tgt_in, pad_id)? If it does, the "
                    "leak is inside your DecoderLayer: make it pass its own checks first")
        return None

    if outs[0].shape != expected.shape:
        raise CheckFailed(f"the output of {what} has shape {outs[0].shape}; expected {expected.shape}, "
                          "(batch, tgt_len, d_model): the decoder's last layer output, no vocabulary projection")
    try:
        for i in range(len(tgts)):
            judge(at_real(i, outs[i]), at_real(i, _stack(case, tgts[i], mems[i])),
                  f"the output of {what}" + (f" on another input ({case['notes'][i]})" if i else ""),
                  [(msg, at_real(i, wrong)) for msg, wrong in mistakes(i)],
                  hints=[leak, lambda g: NAN_HINT if not np.all(np.isfinite(g)) else None],
                  atol=1e-4)
    except CheckFailed as failure:
        if str(failure).endswith("but wrong values"):
            raise CheckFailed(f"the output of {what} has the right shape but wrong values at the real (not "
                              "padding) positions. The Decoder uses your DecoderLayer: make that pass its own checks "
                              "first; then look at the embedding (embed, * sqrt(d_model)), the positional "
                              "encoding (PE[:tgt_len]) and the masks passed to each layer") from None
        raise


@exercise("decoder-Decoder", "Decoder", driver="decoder.decoder_stack")
def decoder_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for vocab, d_model, heads, d_ff, layers, max_len, pad, batch, tgt_len, src_len in [
            (11, 12, 3, 20, 2, 9, 0, 2, 5, 6), (13, 8, 2, 12, 2, 7, 1, 3, 5, 6)]:
        case = {"d_model": d_model, "heads": heads, "layers": layers, "max_len": max_len, "pad": pad,
                "embed": rng.normal(size=(vocab, d_model)) * 0.5,
                "layer_params": [_layer_params(rng, d_model, d_ff) for _ in range(layers)],
                "memory_keep": _padding_keep(rng, batch, src_len)}
        tokens = [t for t in range(vocab) if t != pad]
        tgt = rng.choice(tokens, size=(batch, tgt_len))
        tgt[1, 3:] = pad  # sentence 1 is padded after 3 tokens
        tgt[:, 0] = rng.choice([t for t in tokens if t != 0])  # like BOS: a real token, never 0
        if pad != 0:
            tgt[:, 1] = 0  # token 0 is a real word here
        position = 2
        future = tgt.copy()
        future[:, position] = [rng.choice([t for t in tokens if t != v]) for v in tgt[:, position]]
        memory = rng.normal(size=(batch, src_len, d_model))
        mem_real = memory + case["memory_keep"][..., None] * rng.normal(size=memory.shape)
        case.update(tgt_ins=[tgt, future, tgt], memories=[memory, memory, mem_real], position=position,
                    notes=["", "a later token changed", "the memory changed"])
        what = (f"Decoder(vocab_size={vocab}, d_model={d_model}, heads={heads}, d_ff={d_ff}, layers={layers}, "
                f"max_len={max_len}, pad_id={pad}) on tgt_in {tgt.shape}, memory {memory.shape}")
        args = ((vocab, d_model, heads, d_ff, layers, max_len, pad, 0.5, case["embed"])
                + tuple(p[n] for p in case["layer_params"] for n in LAYER_PARAMS)
                + (np.stack(case["tgt_ins"]), np.stack(case["memories"]), case["memory_keep"]))
        asked.append(Question(args, lambda got, c=case, w=what: _judge_stack(got, c, w)))
    return asked


# ---------------------------------------------------------------- future_influence

def _stand_in(E, L, W, U, ids, memory):
    return np.tanh((L @ E[ids]) @ W + (memory.mean(axis=1) @ U)[:, None, :])


def _influence(case: dict, how: str = "right", offset: int = 0) -> np.ndarray:
    E, L, W, U, tgt, memory = (case[k] for k in ("E", "L", "W", "U", "tgt", "memory"))
    changed = tgt.copy()
    changed[:, case["position"] + offset] = case["new_token"]
    diff = _stand_in(E, L, W, U, changed, memory) - _stand_in(E, L, W, U, tgt, memory)
    return {"right": np.abs(diff).max(-1), "signed": diff.max(-1), "signed_min": (-diff).max(-1),
            "mean": np.abs(diff).mean(-1), "norm": np.sqrt((diff ** 2).sum(-1)),
            "sum": np.abs(diff).sum(-1)}[how]


def _judge_influence(got: object, case: dict, what: str) -> None:
    got = answer_value(got, "future_influence")
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckFailed(f"{what}: the grader could not read the answer back")
    answer, unchanged = got
    answer = answer_value(answer, "future_influence")
    expected = _influence(case)
    batch, length = case["tgt"].shape
    shape = np.shape(answer) if isinstance(answer, np.ndarray) else None
    if shape == (batch, length, case["E"].shape[1]):
        raise CheckFailed(f"{what} returns the change of every feature, {shape}: reduce over the last axis "
                          "(d_model) with the largest absolute change, .abs().amax(dim=-1)")
    if shape is not None and shape != expected.shape and len(shape) == 2 or shape == (batch,) or shape == (length,):
        raise CheckFailed(f"{what} has shape {shape}; expected (batch, tgt_len) = {expected.shape}: one number "
                          "per sentence and position, the max over the features (last axis) only")
    mistakes = [
        ("it is all zeros: both calls saw the same tokens. Was tgt_in changed in place before the baseline "
         "was computed? Change a copy (tgt_in.clone())", np.zeros_like(expected)),
        ("it takes the largest signed change; take the largest absolute change, |after - before|",
         _influence(case, "signed")),
        ("it takes the largest signed change (before - after); take the largest absolute change",
         _influence(case, "signed_min")),
        ("it averages the absolute change over the features; take the maximum (.amax(dim=-1))",
         _influence(case, "mean")),
        ("it takes the Euclidean norm of the change; take the maximum absolute change over the features",
         _influence(case, "norm")),
        ("it sums the absolute change over the features; take the maximum", _influence(case, "sum")),
        ("it changes the token after `position`: set column `position` itself (tgt[:, position] = new_token)",
         _influence(case, offset=1)),
        ("it changes the token before `position`: set column `position` itself (tgt[:, position] = new_token)",
         _influence(case, offset=-1)),
    ]
    if case["leaky"]:
        causal = np.where(np.arange(length)[None, :] < case["position"], 0.0, expected)
        mistakes.append(("it reports no change before `position` without measuring it: this decoder is not "
                         "causal, compute the change at every position", causal))
    judge(answer, expected, what, mistakes)
    if not bool(np.asarray(unchanged)):
        raise CheckFailed(f"{what}: the values are right, but it changed tgt_in in place; change a copy "
                          "(tgt_in.clone()), the caller's tensor must stay as it was")


@exercise("decoder-future_influence", "future_influence", driver="decoder.influence_probe")
def future_influence_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    vocab, d, d_mem, batch, length, src_len = 9, 7, 5, 3, 6, 4
    for leaky in (False, True):
        L = np.tril(rng.uniform(0.3, 1.0, size=(length, length)))
        if leaky:  # position 1 peeks at a later token: the decoder the learner measures is not causal
            L[1, 4] = 0.8
        position = 4 if leaky else int(rng.integers(2, length - 1))
        tgt = rng.integers(0, vocab, size=(batch, length))
        new_token = int(rng.integers(0, vocab))
        tgt[:, position] = [rng.choice([t for t in range(vocab) if t != new_token]) for _ in range(batch)]
        case = {"E": rng.normal(size=(vocab, d)), "L": L, "W": rng.normal(scale=0.6, size=(d, d)),
                "U": rng.normal(scale=0.6, size=(d_mem, d)), "tgt": tgt,
                "memory": rng.normal(size=(batch, src_len, d_mem)), "position": position,
                "new_token": new_token, "leaky": leaky}
        what = (f"future_influence(decoder, tgt_in {tgt.shape}, memory {case['memory'].shape}, position={position}, "
                f"new_token={new_token})" + (" for a decoder that is not causal" if leaky else ""))
        args = tuple(case[k] for k in ("E", "L", "W", "U", "tgt", "memory", "position", "new_token"))
        asked.append(Question(args, lambda got, c=case, w=what: _judge_influence(got, c, w)))
    return asked
