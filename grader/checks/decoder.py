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

from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from coursekit.drivers.decoder import LAYER_PARAMS

from ._core import (Call, Case, CheckFailed, Hint, Mistake, Probe, Raises, Rule, Spec, _equal, catalogued, judge_case,
                    to_array, value)
from .encoder import (IN_EVAL, NEED_WEIGHTS, SANDWICH, _chain, _connection, _constant_sublayers, _no_residual,
                      _outside, _reused_norm, _sqrt, _sublayer_knobs)
from .reference import decoder as ref
from .reference import encoder as ref_encoder



# ---------------------------------------------------------------- shift_right

def _int_ids(answer: object, call: Call, what: str) -> object:
    """Token ids must stay integers: nn.Embedding refuses float ids."""
    if isinstance(answer, np.ndarray) and answer.dtype.kind == "f":
        raise CheckFailed(f"{what} returns float ids ({answer.dtype}); token ids are integers (int64), which "
                          "nn.Embedding needs: build the BOS column with the target's dtype, e.g. "
                          "torch.full((batch, 1), bos_id, dtype=target.dtype) or np.full(..., dtype=target.dtype)")
    return answer


def _shift_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (batch 3, length 6) and (2, 4), with EOS = 2 and PAD = 0 after each sentence; bos_id not always 1
    for batch, length, bos in [(3, 6, 1), (2, 4, 5), (1, 1, 3)]:
        target = np.zeros((batch, length), dtype=np.int64)
        lengths = rng.permutation(np.arange(1, length + 1))[:batch] if length >= batch else np.full(batch, length)
        lengths[0] = length  # one sentence fills the row: its EOS is the last column
        for b, n in enumerate(lengths):
            target[b, :n - 1] = rng.integers(6, 20, size=n - 1)
            target[b, n - 1] = 2
        calls.append(Call((target, bos), what=f"shift_right(target, bos_id={bos}) for target of shape {target.shape}"))
    return calls


def _bos(t, bos_id):
    return torch.full((t.shape[0], 1), bos_id, dtype=t.dtype)


_SHIFT_RULES = (
    Rule("bos_id != 1", lambda call: call.args[1] != 1),
    Rule("a target of length 1 (BOS alone)", lambda call: call.args[0].shape[1] == 1),
    Rule("several sentences, batch != length", lambda call: 1 < call.args[0].shape[0] != call.args[0].shape[1]),
)

SHIFT_RIGHT = Spec(
    id="decoder-shift_right",
    function="shift_right",
    inputs=_shift_inputs,
    rules=_SHIFT_RULES,
    equivalent=(
        ("L3 torch.full((target.shape[0], 1), bos_id, dtype=target.dtype) -> torch.full((target.shape[0], 1), bos_id)",
         "the docstring's target is int64, and torch.full with an int fill value (bos_id) makes int64 already"),
    ),
    reference=ref.shift_right,
    driver="tensors",
    prepare=_int_ids,
    mistakes=(
        Mistake("keeps_last", "it prepends BOS but keeps the last column: the decoder input has the target's "
                "length, so drop the target's last token (target[:, :-1])",
                lambda t, b: torch.cat([_bos(t, b), t], dim=1)),
        Mistake("unchanged", "it returns the target unchanged: the decoder input is the target shifted one step "
                "right, BOS first (teacher forcing: position t sees y_1 ... y_(t-1) and predicts y_t)",
                lambda t, b: t),
        Mistake("shift_left", "it shifts left, BOS at the end: the decoder input starts with BOS, then "
                "target[:, :-1]", lambda t, b: torch.cat([t[:, 1:], _bos(t, b)], dim=1)),
        Mistake("drops_first", "it drops the target's first token instead of its last: [BOS, target[:, 1:]] skips "
                "y_1; use [BOS, target[:, :-1]]", lambda t, b: torch.cat([_bos(t, b), t[:, 1:]], dim=1)),
        Mistake("roll", "the first column holds the target's last token, not BOS: after a roll by one, set column "
                "0 to bos_id", lambda t, b: torch.roll(t, 1, dims=1)),
        Mistake("flat_roll", "it rolls the flattened array (np.roll / torch.roll without an axis): shift along the "
                "sequence axis, axis 1 (dim=1), and put BOS in column 0", lambda t, b: torch.roll(t, 1)),
        Mistake("batch_axis", "it shifts along the batch axis: shift each sentence along axis 1 (the sequence "
                "axis), not axis 0", lambda t, b: torch.cat([torch.full((1, t.shape[1]), b), t[:-1]], dim=0)),
    ),
    hints=(
        Hint("column 0 should be bos_id in every sentence",
             lambda got, call: not np.all(got[:, 0] == call.args[1]), example=lambda t, b: ref.shift_right(t, 1)),
    ),
    diagnosed=(
        Mistake("float_ids", "returns float ids", lambda t, b: torch.cat([torch.ones(t.shape[0], 1) * b, t[:, :-1]],
                                                                         dim=1)),
    ),
)


# ---------------------------------------------------------------- decoder_self_mask

def _mask_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for batch, length, pad in [(2, 5, 0), (3, 6, 4)]:
        lengths = rng.permutation(np.arange(2, length + 1))[:batch]
        lengths[rng.integers(batch)] = length
        tgt = np.full((batch, length), pad, dtype=np.int64)
        for b, n in enumerate(lengths):
            tgt[b, :n] = rng.choice([t for t in range(0, 15) if t != pad], size=n)
        if pad != 0:  # token 0 is a real word here: a mask that hides 0 instead of pad_id shows
            tgt[:, 1] = 0
        calls.append(Call((tgt, pad), what=f"decoder_self_mask(tgt_in, pad_id={pad}) for tgt_in of shape {tgt.shape}"))
    return calls


def _no_heads_axis(answer: object, call: Call, what: str) -> object:
    batch, length = call.args[0].shape
    if isinstance(answer, np.ndarray) and answer.shape == (batch, 1, length, length):
        raise CheckFailed(f"{what} has shape {answer.shape}: return (batch, tgt_len, tgt_len) without a heads axis "
                          "(torch_attn_mask repeats it per head)")
    return answer


def _ambiguous(case: Case) -> None:
    """judge_case, except that an answer two catalogued mistakes give alike gets both
    diagnoses: on a batch without padding, "padding mask only" and "OR" are the same mask."""
    if isinstance(case.answer, np.ndarray):
        answer = _no_heads_axis(case.answer, case.call, case.what).astype(np.float64)
        same = [m.diagnosis for m, wrong in case.mistaken() if isinstance(wrong, np.ndarray)
                and wrong.shape == answer.shape and np.array_equal(wrong.astype(np.float64), answer)]
        if len(same) > 1 and not np.array_equal(answer, case.expected.astype(np.float64)):
            case.fail("; or ".join(same))
    judge_case(case)


def _masked(causal=lambda n: torch.tril(torch.ones(n, n, dtype=torch.bool)), keys=lambda t, p: (t != p)[:, None, :],
            combine=lambda c, k: c & k):
    """decoder_self_mask with one piece changed (a catalogued mistake)."""
    return lambda t, p: combine(causal(t.shape[1])[None], keys(t, p))


def _every(t, p):
    return torch.ones(t.shape[0], 1, t.shape[1], dtype=torch.bool)


def _lengths(ids: np.ndarray, pad: int) -> set:
    return set(np.sum(ids != pad, axis=-1).tolist())


_MASK_RULES = (
    Rule("padding keys in sentences of different lengths", lambda call: len(_lengths(*call.args)) > 1),
    Rule("pad_id != 0, with real tokens 0", lambda call: call.args[1] != 0 and bool(np.any(call.args[0] == 0))),
    Rule("batch != tgt_len", lambda call: call.args[0].shape[0] != call.args[0].shape[1]),
)

DECODER_SELF_MASK = Spec(
    id="decoder-decoder_self_mask",
    function="decoder_self_mask",
    inputs=_mask_inputs,
    rules=_MASK_RULES,
    reference=ref.decoder_self_mask,
    driver="tensors",
    prepare=_no_heads_axis,
    judge=_ambiguous,
    mistakes=(
        Mistake("diagonal_masked", "the diagonal is masked: each position may attend to itself (key j <= query i, "
                "torch.tril with diagonal=0)",
                _masked(causal=lambda n: torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1))),
        Mistake("one_ahead", "one future position is visible (off by one): query i may attend to keys j <= i only; "
                "torch.tril(..., diagonal=0), not diagonal=1",
                _masked(causal=lambda n: torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=1))),
        Mistake("inverted", "it is inverted: in this course True means may attend (torch's attn_mask means the "
                "opposite)", lambda t, p: ~ref.decoder_self_mask(t, p)),
        Mistake("causal_only", "it is the causal mask only: also hide the padding keys (tgt_in[b, j] == pad_id)",
                _masked(keys=_every)),
        Mistake("padding_only", "it is the padding mask only: also hide the future keys (j > i), the causal mask",
                _masked(causal=lambda n: torch.ones(n, n, dtype=torch.bool))),
        Mistake("query_axis", "it hides padding queries (rows) instead of padding keys (columns): the padding mask "
                "of key j goes along the last axis, (tgt_in != pad_id)[:, None, :]",
                _masked(keys=lambda t, p: (t != p)[:, :, None])),
        Mistake("upper", "it lets a query see the future (upper triangle): key j <= query i is the lower triangle, "
                "torch.tril", _masked(causal=lambda n: torch.triu(torch.ones(n, n, dtype=torch.bool)))),
        Mistake("or", "it combines the masks with OR: a key must be both in the past and not padding, AND (&)",
                _masked(combine=lambda c, k: c | k)),
        # (the second question pads with 4 and holds real 0 tokens)
        Mistake("pad_zero", "it hides token 0 instead of pad_id: use the pad_id argument",
                lambda t, p: ref.decoder_self_mask(t, 0)),
    ),
    errors=(
        Raises("decoder_self_mask raised {error}: the padding mask (batch, tgt_len) does not broadcast against the "
               "causal mask (tgt_len, tgt_len). Give it an axis for the queries, (tgt_in != pad_id)[:, None, :] of "
               "shape (batch, 1, tgt_len): each key column is hidden for every query",
               example=lambda t, p: torch.tril(torch.ones(t.shape[1], t.shape[1], dtype=torch.bool)) & (t != p),
               match="must match the size of tensor"),
    ),
    diagnosed=(
        Mistake("heads_axis", "without a heads axis", lambda t, p: ref.decoder_self_mask(t, p)[:, None]),
    ),
)


# ---------------------------------------------------------------- DecoderLayer

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


def _layer_call(params, norm_first, ys, mems, tgt_mask, keep, masks, d_model=12, heads=3, d_ff=20) -> Call:
    """A call of the layer driver: the layer built with dropout 0.5, loaded with ``params``
    (LAYER_PARAMS order), run on each (y, memory) pair."""
    what = (f"DecoderLayer(d_model={d_model}, heads={heads}, d_ff={d_ff}, norm_first={norm_first}) on y "
            f"{ys[0].shape}, memory {mems[0].shape}, {masks}" + (", a memory padding mask (2, 6)" if keep is not None else ""))
    return Call((d_model, heads, d_ff, 0.5, norm_first) + tuple(params) + (np.stack(ys), np.stack(mems), tgt_mask, keep),
                what=what)


def _layer_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
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
        masks = {"causal": "a causal tgt_mask (5, 5)", "combined": "a causal + padding tgt_mask (2, 5, 5)",
                 None: "no masks"}[mask_kind]
        calls.append(_layer_call([p[n] for n in LAYER_PARAMS], norm_first, ys, mems, tgt_mask, keep, masks))
    return calls


def _constant_call(rng: np.random.Generator, norm_first: bool, params: list) -> Call:
    return _layer_call(params, norm_first, [rng.normal(size=(2, 5, 12))], [rng.normal(size=(2, 6, 12))], None, None,
                       "no masks")


NAN_HINT = ("it contains NaN: a row of a mask hides every key. Is a mask inverted? This course's masks mean "
            "True = may attend; torch's attn_mask and key_padding_mask mean True = ignore (pass "
            "torch_attn_mask(tgt_mask, heads) and ~memory_padding_mask)")


def _outputs(answer: object, what: str, name: str) -> tuple:
    """The k + 1 outputs of a decoder driver, as arrays."""
    answer = value(answer, name)
    if not isinstance(answer, tuple):
        raise CheckFailed(f"{what}: the grader could not read the outputs back")
    return tuple(to_array(g, what) for g in answer)


def _dropout_check(outs: tuple, what: str, where: str = "") -> None:
    first, again = outs[0], outs[-1]
    if first.shape == again.shape and not np.allclose(first, again, rtol=1e-5, atol=1e-6, equal_nan=True):
        raise CheckFailed(f"{what}: two calls on the same input in eval mode give different outputs, so dropout "
                          f"is still on (built with dropout=0.5){where}. Use nn.Dropout modules (self.dropout), "
                          "which .eval() switches off, or F.dropout(x, p, training=self.training): F.dropout's "
                          "default is training=True")


def _by_output(case: Case, outs: tuple, notes: tuple[str, ...], hints, pick=lambda i, a: a, atol=None) -> None:
    """Judge each output of a several-input call on its own (judge_case), as the output of
    ``case.what`` on input i; ``hints(i)`` for output i, ``pick`` the entries compared."""
    expected = _outputs(case.expected, case.what, case.spec.function)
    spec = replace(case.spec, judge=None, prepare=None, atol=atol or case.spec.atol)
    if all(_equal(pick(i, outs[i]), pick(i, expected[i]), spec.rtol, spec.atol) for i in range(len(notes))):
        return  # (right: no mistake need run)
    wrong = []
    for mistake, answer in case.mistaken():
        try:
            wrong.append((mistake, _outputs(answer, case.what, case.spec.function)))
        except CheckFailed:
            continue
    for i, note in enumerate(notes):
        what = f"the output of {case.what}" + (f" on another input ({note})" if note else "")
        one = replace(spec, hints=hints(i))
        judge_case(Case(one, replace(case.call, what=what), pick(i, outs[i]), pick(i, expected[i]),
                        [(m, pick(i, w[i])) for m, w in wrong if len(w) > i],
                        _found=case.findings() if i == 0 else None))


def _layer_judge(case: Case) -> None:
    """Eval mode first (the repeat of input 0), NaN before anything else, then each input's
    output; the base output also by what the perturbed inputs show (causality, memory)."""
    args = case.call.args
    ys, mems, t_mask, m_keep = args[-4:]
    outs = _outputs(case.answer, case.what, "DecoderLayer")
    _dropout_check(outs, case.what)
    moved = np.any(ys[1] != ys[0], axis=(0, 2))
    position = int(np.argmax(moved)) if moved.any() else None
    base = outs[0]
    if base.shape == case.expected[0].shape and not np.all(np.isfinite(base)):
        raise CheckFailed(f"the output of {case.what}: {NAN_HINT}")
    if not _equal(case.answer, case.expected, case.spec.rtol, case.spec.atol):
        found = catalogued(case, case.answer)  # the whole answer: one mistake, two knobs, what the probes find
        if found:
            raise CheckFailed(f"the output of {case.what}: {found}")

    def leak(g, call):
        return (t_mask is not None and position is not None
                and not np.allclose(outs[1][:, :position], g[:, :position], rtol=1e-4, atol=1e-5))

    # (the base output is finite here; the other outputs get the general NaN message)
    base_hints = (
        Hint(f"changing the decoder input at position {position} changed the outputs at earlier positions: the "
             "self-attention must use tgt_mask (a causal mask), attn_mask=torch_attn_mask(tgt_mask, heads)", leak,
             example=None),
        Hint("the output does not change when the encoder memory changes: cross-attention (multihead_attn) must "
             "take its keys and values from memory",
             lambda g, call: np.allclose(outs[2], g, rtol=1e-4, atol=1e-5), example=None),
        Hint("changing the memory at padded source positions changed the output: mask them with "
             "key_padding_mask=~memory_padding_mask",
             lambda g, call: m_keep is not None and not np.allclose(outs[3], g, rtol=1e-4, atol=1e-5), example=None))
    _by_output(case, outs[:len(ys)], ("", "a later decoder token changed", "the memory changed",
                                      "padded memory changed"), lambda i: base_hints if i == 0 else ())


def _decoder_layer(**methods):
    """The reference layer with the given methods replaced: a catalogued mistake."""
    return type("DecoderLayer", (ref.DecoderLayer,), methods)


def _arranged(connection):
    return _decoder_layer(connect=lambda self, x, s, n: connection(x, s, n, self.norm_first))


_SUBLAYERS = ("self", "cross", "ffn")


def _layer_variant(**connections):
    """DecoderLayer with each sublayer's residual and norm as the spec's knobs
    (``<sublayer>_residual``, ``<sublayer>_norm``: "once", "missing" or "twice")."""

    def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
        mask, ignored = self.self_mask(tgt_mask), self.memory_ignored(memory_padding_mask)
        sublayers = (lambda x: self.attend(x, mask), lambda x: self.cross(x, memory, ignored), self.ffn)
        x = y
        for name, sublayer, norm in zip(_SUBLAYERS, sublayers, self.norms()):
            x = _connection(x, sublayer, norm, self.norm_first, connections.get(f"{name}_residual", "once"),
                            connections.get(f"{name}_norm", "once"))
        return x

    return _decoder_layer(forward=forward)


def _decoder_wired(normed_memory=False, **crossed):
    """A layer whose sublayers are chained with crossed wires (encoder._chain's keywords), or
    (``normed_memory``) whose pre-norm cross-attention normalizes the memory too."""

    def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
        mask, ignored = self.self_mask(tgt_mask), self.memory_ignored(memory_padding_mask)
        keys = self.norm2(memory) if normed_memory and self.norm_first else memory
        sublayers = (lambda x: self.attend(x, mask), lambda x: self.cross(x, keys, ignored), self.ffn)
        return _chain(y, sublayers, self.norms(), self.norm_first, **crossed)

    return _decoder_layer(forward=forward)


_DECODER_ROLES = {"norm1": "the masked self-attention sublayer", "norm2": "the cross-attention sublayer",
                  "norm3": "the feed-forward sublayer"}
# Wires a learner crosses in the decoder layer (issue 33): norms reused, residuals and inputs taken
# from the layer's input y, the memory normalized with the queries.
_DECODER_WIRING = (
    *(Mistake(name, diagnosis, _decoder_layer(norms=norms)) for name, diagnosis, norms in
      (_reused_norm(pattern, _DECODER_ROLES) for pattern in (("norm1", "norm1", "norm1"), ("norm1", "norm2", "norm2"),
                                                            ("norm1", "norm1", "norm3")))),
    Mistake("residual_from_input", "the cross-attention and feed-forward sublayers add back the layer's input y, not "
            "their own input: each residual adds back the tensor its sublayer was given (the previous sublayer's "
            "output)", _decoder_wired(residual_from=(1, 2))),
    Mistake("ffn_residual_from_input", "the feed-forward sublayer's residual adds back the layer's input y, not its "
            "own input (the cross-attention sublayer's output): each residual adds back the tensor its sublayer was "
            "given", _decoder_wired(residual_from=(2,))),
    Mistake("cross_given_input", "the cross-attention's queries come from the layer's input y, not from the masked "
            "self-attention sublayer's output: the sublayers run one after the other, each on the previous one's "
            "output", _decoder_wired(reads=(1,))),
    Mistake("memory_normed", "with norm_first=True it normalizes the memory too (norm2(memory)): pre-norm normalizes "
            "the sublayer's input x only, the queries; the keys and values are the encoder's memory as it is",
            _decoder_wired(normed_memory=True)),
    Mistake("sandwich", SANDWICH, _decoder_wired(sandwich=True)),
)


def _layer_raised(signature: str) -> tuple[Raises, ...]:
    """The raised-error rules of a decoder module; ``signature`` is how the grader calls it."""
    return (
        Raises("{what}: the grader could not load torch's weights into your module: {error}",
               example=_decoder_layer(__init__=_renamed_init), match="has no attribute|has no .*it should be|has shape"),
        # (each attention given the other's mask: the shapes say which, a square mask where the
        # cross-attention wants (tgt_len, src_len), a source-length padding mask on the targets)
        Raises("{what} raised {error}. The cross-attention (multihead_attn) got a square (tgt_len, tgt_len) mask, the "
               "self-attention's: tgt_mask belongs to self_attn only; the cross-attention's mask is the memory's "
               "padding, key_padding_mask=~memory_padding_mask", example=_CrossGetsTargetMask,
               match=r"attn_mask is torch\.Size\(\[(?:\d+, )?(\d+), \1\]\), but should be \((?:\d+, )?\1, (?!\1\))"),
        Raises("{what} raised {error}. The self-attention got the memory's padding mask, one entry per SOURCE "
               "position: key_padding_mask=~memory_padding_mask belongs to the cross-attention (multihead_attn); "
               "the self-attention's mask is attn_mask=torch_attn_mask(tgt_mask, heads)",
               example=_SelfGetsMemoryMask, match=r"key_padded_mask\.shape\[1\] to be (\d+), but got (?!\1\b)"),
        Raises("{what} raised {error}. torch wants a 3-D attn_mask of shape (batch * heads, tgt_len, tgt_len), True = "
               "ignore: pass torch_attn_mask(tgt_mask, heads), the helper that converts a course mask of any shape",
               example=_decoder_layer(self_mask=lambda self, m: None if m is None else ~m),
               match="(?=.*attn_mask is)(?=.*but should be)(?=.*3D)"),
        Raises("{what} raised {error}. Are the attention layers built with batch_first=True? Without it "
               "nn.MultiheadAttention reads (seq_len, batch, d_model)", example=_SequenceFirst,
               match="(?=.*attn_mask is)(?=.*but should be)|key_padded_mask|is invalid for input of size"),
        Raises("{what}: {error}. nn.MultiheadAttention returns (output, weights): keep [0]",
               example=_decoder_layer(forward=lambda self, *a, **k: (ref.DecoderLayer.forward(self, *a, **k), None)),
               match="returns a tuple|returns a list"),
        Raises("{what} raised {error}: " + signature, example=_OldNames, match="unexpected keyword argument"),
    )


class _CrossGetsTargetMask(ref.DecoderLayer):
    def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
        self.wrong = self.self_mask(tgt_mask)
        return super().forward(y, memory, tgt_mask, memory_padding_mask)

    def cross(self, x, memory, ignored):
        return self.dropout(self.multihead_attn(x, memory, memory, attn_mask=self.wrong, key_padding_mask=ignored,
                                                need_weights=False)[0])


class _SelfGetsMemoryMask(ref.DecoderLayer):
    def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
        self.wrong = self.memory_ignored(memory_padding_mask)
        return super().forward(y, memory, tgt_mask, memory_padding_mask)

    def attend(self, x, mask):
        return self.dropout(self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=self.wrong,
                                           need_weights=False)[0])


def _renamed_init(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
    ref.DecoderLayer.__init__(self, d_model, heads, d_ff, dropout, norm_first)
    self.cross_attn = self.multihead_attn
    del self.multihead_attn


class _SequenceFirst(ref.DecoderLayer):
    """(only the cross-attention: a self-attention reading (seq_len, batch) fails on its
    mask first, which the 3-D mask rule names)"""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, heads, d_ff, dropout, norm_first)
        self.multihead_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout)


class _OldNames(ref.DecoderLayer):
    def forward(self, y, memory, mask=None, memory_padding_mask=None):
        return super().forward(y, memory, mask, memory_padding_mask)


def _first_key_ignored(self, memory_padding_mask):
    if memory_padding_mask is None:
        return None
    ignored = torch.zeros_like(memory_padding_mask)
    ignored[:, 0] = True
    return ignored


class _FunctionalDropout(ref.DecoderLayer):
    def ffn(self, x):
        return F.dropout(self.linear2(torch.relu(self.linear1(x))), 0.5)


def _masks(call: Call) -> tuple:
    """(tgt_mask, memory padding mask) of a layer call."""
    return call.args[-2], call.args[-1]


_LAYER_RULES = (
    Rule("tgt_len != src_len (the cross-attention's queries and keys)",
         lambda call: call.args[-4].shape[2] != call.args[-3].shape[2]),
    Rule("batch, heads, tgt_len and d_model all different",
         lambda call: len({call.args[-4].shape[1], call.args[1], call.args[-4].shape[2], call.args[0]}) == 4),
    Rule("a memory padding mask", lambda call: _masks(call)[1] is not None and not np.all(_masks(call)[1])),
    Rule("a (tgt_len, tgt_len) tgt_mask", lambda call: np.ndim(_masks(call)[0]) == 2),
    Rule("a (batch, tgt_len, tgt_len) tgt_mask", lambda call: np.ndim(_masks(call)[0]) == 3),
    Rule("no masks", lambda call: all(m is None for m in _masks(call))),
    Rule("norm_first=True", lambda call: call.args[4] is True),
    Rule("norm_first=False", lambda call: call.args[4] is False),
)

DECODER_LAYER = Spec(
    id="decoder-DecoderLayer",
    submodules=("self_attn", "multihead_attn", "norm1", "norm2", "norm3", "linear1", "linear2"),
    function="DecoderLayer",
    inputs=_layer_inputs,
    rules=_LAYER_RULES,
    equivalent=(
        ("L8 nn.MultiheadAttention(d_model, heads, dropout=dropout, ba... -> "
         "nn.MultiheadAttention(d_model, heads, batch_first=True)", IN_EVAL),
        ("L9 nn.MultiheadAttention(d_model, heads, dropout=dropout, ba... -> "
         "nn.MultiheadAttention(d_model, heads, batch_first=True)", IN_EVAL),
        ("L22 self.self_attn(x, x, x, attn_mask=mask, need_weights=False) -> self.self_attn(x, x, x, attn_mask=mask)",
         NEED_WEIGHTS),
        ("L22 False -> True", NEED_WEIGHTS),
        ("L25 False -> True", NEED_WEIGHTS),
        ("L25 ...padding_mask=ignored, need_weights=False) -> ...padding_mask=ignored)", NEED_WEIGHTS),
    ),
    reference=ref.DecoderLayer,
    driver="decoder.decoder_layer",
    judge=_layer_judge,
    by_call=True,
    mistakes=(
        Mistake("cross_from_decoder", "cross-attention takes its keys and values from the decoder: in multihead_attn "
                "the queries come from the decoder (x) and the keys and values from the encoder's output, memory",
                _decoder_layer(cross=lambda self, x, memory, ignored: ref.DecoderLayer.cross(self, x, x, None))),
        Mistake("norm_first_lost", "it puts the layer norm after the residual sum (post-norm); norm_first=True asks "
                "for pre-norm, x + sublayer(norm(x))",
                _arranged(lambda x, s, n, norm_first: ref_encoder.sublayer_connection(x, s, n))),
        Mistake("arrangement_swapped", "it puts the layer norm before the sublayer (pre-norm); norm_first=False is the "
                "paper's post-norm, norm(x + sublayer(x))",
                _arranged(lambda x, s, n, norm_first: ref_encoder.sublayer_connection(x, s, n, not norm_first))),
        Mistake("no_residual", "there is no residual connection: add the sublayer's input back, norm(x + sublayer(x))",
                _arranged(_no_residual)),
        Mistake("outside", "the residual is added to the wrong tensor: post-norm is norm(x + sublayer(x)), the sum "
                "inside the norm", _arranged(_outside)),
        Mistake("no_relu", "the feed-forward network has no ReLU: linear2(relu(linear1(x)))",
                _decoder_layer(ffn=lambda self, x: self.dropout(self.linear2(self.linear1(x))))),
        Mistake("norms_reversed", "the layer norms are used in the wrong order: norm1 after self-attention, norm2 "
                "after cross-attention, norm3 after the feed-forward network",
                _decoder_layer(norms=lambda self: (self.norm3, self.norm2, self.norm1))),
        # (the mask mistakes change nothing on the questions without that mask)
        Mistake("tgt_mask_ignored", "it ignores tgt_mask in the self-attention, so every position sees the future: "
                "pass attn_mask=torch_attn_mask(tgt_mask, heads) to self_attn",
                _decoder_layer(self_mask=lambda self, m: None)),
        Mistake("memory_mask_ignored", "it ignores memory_padding_mask, so the decoder attends to padded source "
                "positions: pass key_padding_mask=~memory_padding_mask to multihead_attn",
                _decoder_layer(memory_ignored=lambda self, m: None)),
        Mistake("memory_mask_inverted", "memory_padding_mask is used the wrong way round: it is True at real tokens, "
                "torch's key_padding_mask is True at padding, so pass ~memory_padding_mask",
                _decoder_layer(memory_ignored=lambda self, m: m)),
        *_DECODER_WIRING,
    ),
    variant=_layer_variant,
    knobs=_sublayer_knobs({"self": ("masked self-attention", "norm1", "attention"),
                           "cross": ("cross-attention", "norm2", "cross"), "ffn": ("feed-forward", "norm3", "FFN")}),
    # How the residual connections and norms are arranged, whatever a sublayer computes.
    probes=(
        Probe("connections", _constant_sublayers(lambda rng: _layer_params(rng, 12, 20), LAYER_PARAMS,
                                                 ("self_attn.out_proj.bias", "multihead_attn.out_proj.bias",
                                                  "linear2.bias"), _constant_call),
              reads=tuple(f"{s}_{part}" for s in _SUBLAYERS for part in ("residual", "norm")),
              right="the residual connections and norms are right (asked with sublayers that output constants): "
                    "the mistake is inside a sublayer, one of the attentions or the feed-forward network"),
    ),
    errors=_layer_raised("the grader calls forward(y, memory, tgt_mask=..., memory_padding_mask=...) with these "
                         "names"),
    diagnosed=(
        Mistake("dropout_on", "dropout is still on (built with dropout=0.5)", _FunctionalDropout),
        # (torch's fused path, need_weights=False, gives a fully masked row zeros, not NaN)
        Mistake("nan", NAN_HINT, _decoder_layer(self_mask=lambda self, m: m, attend=lambda self, x, m: self.dropout(
            self.self_attn(x, x, x, attn_mask=m)[0]))),
        Mistake("leak", "changed the outputs at earlier positions: the self-attention must use tgt_mask",
                _decoder_layer(self_mask=lambda self, m: None if m is None else
                               ref.torch_attn_mask(m | torch.ones_like(m).tril(1).triu(1), self.heads))),
        Mistake("memory_unused", "the output does not change when the encoder memory changes",
                _decoder_layer(cross=lambda self, x, memory, ignored:
                               ref.DecoderLayer.cross(self, x, torch.zeros_like(memory), ignored))),
        Mistake("padded_memory_read", "changing the memory at padded source positions changed the output",
                _decoder_layer(memory_ignored=_first_key_ignored)),
        Mistake("not_a_class", "it should be a class", lambda *args, **kwargs: None),
        Mistake("not_a_module", "is not a torch.nn.Module", type("NotAModule", (), {"__init__": lambda s, *a, **k: None})),
    ),
)


# ---------------------------------------------------------------- the stack

def _stack_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for vocab, d_model, heads, d_ff, layers, max_len, pad, batch, tgt_len, src_len in [
            (11, 12, 3, 20, 2, 9, 0, 2, 5, 6), (13, 8, 2, 12, 2, 7, 1, 3, 5, 6)]:
        embed = rng.normal(size=(vocab, d_model)) * 0.5
        layer_params = [_layer_params(rng, d_model, d_ff) for _ in range(layers)]
        memory_keep = _padding_keep(rng, batch, src_len)
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
        mem_real = memory + memory_keep[..., None] * rng.normal(size=memory.shape)
        what = (f"Decoder(vocab_size={vocab}, d_model={d_model}, heads={heads}, d_ff={d_ff}, layers={layers}, "
                f"max_len={max_len}, pad_id={pad}) on tgt_in {tgt.shape}, memory {memory.shape}")
        args = ((vocab, d_model, heads, d_ff, layers, max_len, pad, 0.5, embed)
                + tuple(p[n] for p in layer_params for n in LAYER_PARAMS)
                + (np.stack([tgt, future, tgt]), np.stack([memory, memory, mem_real]), memory_keep))
        calls.append(Call(args, what=what))
    return calls


_STACK_VALUES = ("has the right shape but wrong values at the real (not padding) positions. The Decoder uses your "
                 "DecoderLayer: make that pass its own checks first; then look at the embedding (embed, * "
                 "sqrt(d_model)), the positional encoding (PE[:tgt_len]) and the masks passed to each layer")


def _stack_judge(case: Case) -> None:
    """Eval mode first; the shape of the output; then each input's output at the real
    (not padding) positions only: nothing reads the outputs at padding positions."""
    tgts, pad = case.call.args[-3], case.call.args[6]
    outs = _outputs(case.answer, case.what, "Decoder")
    _dropout_check(outs, case.what, ", in the Decoder or in its DecoderLayers")
    expected = case.expected[0]
    if outs[0].shape != expected.shape:
        raise CheckFailed(f"the output of {case.what} has shape {outs[0].shape}; expected {expected.shape}, "
                          "(batch, tgt_len, d_model): the decoder's last layer output, no vocabulary projection")
    real = [t != pad for t in tgts]
    position = 2

    def at_real(i, a):
        a = np.asarray(a)
        return a[real[i]] if a.shape[:2] == tgts[i].shape else a

    leak = Hint(f"changing the decoder input token at position {position} changed the outputs at earlier positions: "
                "does every layer get tgt_mask=decoder_self_mask(tgt_in, pad_id)? If it does, the leak is inside your "
                "DecoderLayer: make it pass its own checks first",
                # (NaN is named first, by the general message)
                lambda g, call: np.all(np.isfinite(g)) and outs[1].shape == expected.shape and not np.allclose(
                    outs[1][:, :position], outs[0][:, :position], rtol=1e-4, atol=1e-4), example=None)
    try:
        _by_output(case, outs[:len(tgts)], ("", "a later token changed", "the memory changed"),
                   lambda i: (leak,), pick=at_real)
    except CheckFailed as failure:
        if str(failure).endswith("but wrong values"):
            raise CheckFailed(f"the output of {case.what} {_STACK_VALUES}") from None
        raise


def _decoder(inputs=None, **methods):
    """The reference Decoder with the given methods replaced; ``inputs(self, embedded, pe, n)``
    computes the first layer's input from the embeddings and the positional table."""
    if inputs is not None:
        methods["inputs"] = lambda self, t: inputs(self, self.embed(t), self.pe, t.shape[1])
    return type("Decoder", (ref.Decoder,), methods)


class _SharedDecoderLayers(ref.Decoder):
    def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout=0.0):
        super().__init__(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout)
        self.layers = nn.ModuleList([self.layers[0]] * layers)


class _TupleDecoder(ref.Decoder):
    def forward(self, tgt_in, memory, memory_padding_mask=None):
        return super().forward(tgt_in, memory, memory_padding_mask), None


class _MemoryMaskDropped(ref.Decoder):
    def forward(self, tgt_in, memory, memory_padding_mask=None):
        return super().forward(tgt_in, memory)


_STACK_RULES = (
    Rule("padding in the target", lambda call: len(_lengths(call.args[-3][0], call.args[6])) > 1),
    Rule("padding in the memory", lambda call: not np.all(call.args[-1])),
    Rule("pad_id != 0, with real tokens 0", lambda call: call.args[6] != 0 and bool(np.any(call.args[-3][0] == 0))),
    Rule("tgt_len != src_len", lambda call: call.args[-3].shape[2] != call.args[-2].shape[2]),
    Rule("two layers or more", lambda call: call.args[4] >= 2),
)

DECODER = Spec(
    id="decoder-Decoder",
    submodules=("embed", "layers.*", "layers.*.self_attn", "layers.*.multihead_attn", "layers.*.norm1",
                "layers.*.norm2", "layers.*.norm3", "layers.*.linear1", "layers.*.linear2"),
    function="Decoder",
    depends=("decoder-DecoderLayer", "decoder-decoder_self_mask"),  # its solution calls them
    inputs=_stack_inputs,
    rules=_STACK_RULES,
    reference=ref.Decoder,
    driver="decoder.decoder_stack",
    judge=_stack_judge,
    by_call=True,
    atol=1e-4,
    mistakes=(
        Mistake("unscaled", "the embeddings are not multiplied by sqrt(d_model) (Sec. 3.4): embed(tgt_in) * "
                "sqrt(d_model) + PE", _decoder(lambda self, e, pe, n: e + pe[:n])),
        Mistake("times_d_model", "the embeddings are multiplied by d_model; multiply by sqrt(d_model)",
                _decoder(lambda self, e, pe, n: e * self.d_model + pe[:n])),
        Mistake("pe_scaled", "sqrt(d_model) scales the positional encoding too: scale the embeddings only, "
                "embed(tgt_in) * sqrt(d_model) + PE", _decoder(lambda self, e, pe, n: (e + pe[:n]) * _sqrt(self))),
        Mistake("no_pe", "the positional encoding is missing: add sinusoidal_encoding(max_len, d_model)[:tgt_len]",
                _decoder(lambda self, e, pe, n: e * _sqrt(self))),
        Mistake("pe_twice", "the positional encoding is added twice",
                _decoder(lambda self, e, pe, n: e * _sqrt(self) + 2 * pe[:n])),
        Mistake("pe_shifted", "the positional encoding starts at position 1: the first token gets row 0, PE[:tgt_len]",
                _decoder(lambda self, e, pe, n: e * _sqrt(self) + pe[1:n + 1])),
        Mistake("layers_unused", "the output is the embeddings with their positions: the layers' outputs are not "
                "kept. Assign each one, x = layer(x, memory, tgt_mask=..., memory_padding_mask=...)",
                _decoder(forward=lambda self, tgt_in, memory, memory_padding_mask=None: self.dropout(
                    self.inputs(tgt_in)))),
        Mistake("shared_layers", "the layers share one set of weights: nn.ModuleList([layer] * n) repeats the same "
                "module; build a new DecoderLayer for each layer", _SharedDecoderLayers),
        Mistake("no_self_mask", "no self-attention mask reaches the layers, so every position sees the future: pass "
                "tgt_mask=decoder_self_mask(tgt_in, pad_id) to each layer", _decoder(mask=lambda self, t: None)),
        Mistake("memory_mask_dropped", "memory_padding_mask does not reach the layers: pass it to each layer",
                _MemoryMaskDropped),
        # (the second question pads with 1 and holds real 0 tokens)
        Mistake("pad_zero", "its self-attention mask hides token 0 instead of pad_id: use the pad_id given to __init__ "
                "(decoder_self_mask(tgt_in, self.pad_id))",
                _decoder(mask=lambda self, t: ref.decoder_self_mask(t, 0))),
    ),
    errors=tuple(replace(rule, example=_TupleDecoder if "returns a tuple" in rule.match else _decoder(layer=rule.example))
                 for rule in _layer_raised(
        "the grader calls Decoder(vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout=...) and "
        "forward(tgt_in, memory, memory_padding_mask=...) with these names")),
    diagnosed=(
        Mistake("dropout_on", "dropout is still on (built with dropout=0.5), in the Decoder or in its DecoderLayers",
                _decoder(layer=_FunctionalDropout)),
        Mistake("leak_in_layer", "the leak is inside your DecoderLayer",
                _decoder(layer=DECODER_LAYER.mistakes[0].implementation)),
        Mistake("wrong_layer", "The Decoder uses your DecoderLayer: make that pass its own checks first",
                _decoder(layer=DECODER_LAYER.mistakes[5].implementation)),
        Mistake("not_a_class", "it should be a class", lambda *args, **kwargs: None),
    ),
)


# ---------------------------------------------------------------- future_influence

def _influence_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    vocab, d, d_mem, batch, length, src_len = 9, 7, 5, 3, 6, 4
    for leaky in (False, True):
        L = np.tril(rng.uniform(0.3, 1.0, size=(length, length)))
        if leaky:  # position 1 peeks at a later token: the decoder the learner measures is not causal
            L[1, 4] = 0.8
        position = 4 if leaky else int(rng.integers(2, length - 1))
        tgt = rng.integers(0, vocab, size=(batch, length))
        new_token = int(rng.integers(0, vocab))
        tgt[:, position] = [rng.choice([t for t in range(vocab) if t != new_token]) for _ in range(batch)]
        E, W, U = rng.normal(size=(vocab, d)), rng.normal(scale=0.6, size=(d, d)), rng.normal(scale=0.6, size=(d_mem, d))
        memory = rng.normal(size=(batch, src_len, d_mem))
        what = (f"future_influence(decoder, tgt_in {tgt.shape}, memory {memory.shape}, position={position}, "
                f"new_token={new_token})" + (" for a decoder that is not causal" if leaky else ""))
        calls.append(Call((E, L, W, U, tgt, memory, position, new_token), what=what))
    return calls


def _influence_answer(answer: object, call: Call, what: str) -> object:
    """The influence the learner returns (the driver adds whether tgt_in stayed unchanged)."""
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise CheckFailed(f"{what}: the grader could not read the answer back")
    got = value(answer[0], "future_influence")
    batch, length = call.args[4].shape
    shape = np.shape(got) if isinstance(got, np.ndarray) else None
    if shape == (batch, length, call.args[0].shape[1]):
        raise CheckFailed(f"{what} returns the change of every feature, {shape}: reduce over the last axis "
                          "(d_model) with the largest absolute change, .abs().amax(dim=-1)")
    if shape is not None and shape != (batch, length) and len(shape) == 2 or shape == (batch,) or shape == (length,):
        raise CheckFailed(f"{what} has shape {shape}; expected (batch, tgt_len) = {(batch, length)}: one number "
                          "per sentence and position, the max over the features (last axis) only")
    return got


def _judge_influence(case: Case) -> None:
    """The values first; then that tgt_in was left as it was."""
    judge_case(case)
    if not bool(np.asarray(case.answer[1])):
        case.fail("the values are right, but it changed tgt_in in place; change a copy (tgt_in.clone()), the "
                  "caller's tensor must stay as it was")


def _influence(reduce=lambda diff: diff.abs().amax(-1), offset=0, in_place=False, causal=False):
    """future_influence with one piece changed (a catalogued mistake)."""
    def influence(decoder, tgt_in, memory, position, new_token):
        before = decoder(tgt_in, memory)
        changed = tgt_in if in_place else tgt_in.clone()
        changed[:, position + offset] = new_token
        out = reduce(decoder(changed, memory) - before)
        if causal:
            out[:, :position] = 0.0
        return out
    return influence


def _changed_first(decoder, tgt_in, memory, position, new_token):
    tgt_in[:, position] = new_token
    return (decoder(tgt_in, memory) - decoder(tgt_in, memory)).abs().amax(-1)


_INFLUENCE_RULES = (
    Rule("a decoder that is not causal (the change is measured everywhere)",
         lambda call: bool(np.any(np.triu(call.args[1], 1)))),
    Rule("a causal decoder", lambda call: not np.any(np.triu(call.args[1], 1))),
)

FUTURE_INFLUENCE = Spec(
    id="decoder-future_influence",
    function="future_influence",
    inputs=_influence_inputs,
    rules=_INFLUENCE_RULES,
    reference=ref.future_influence,
    driver="decoder.influence_probe",
    prepare=_influence_answer,
    judge=_judge_influence,
    mistakes=(
        Mistake("all_zeros", "it is all zeros: both calls saw the same tokens. Was tgt_in changed in place before "
                "the baseline was computed? Change a copy (tgt_in.clone())", _changed_first),
        Mistake("signed", "it takes the largest signed change; take the largest absolute change, |after - before|",
                _influence(lambda diff: diff.amax(-1))),
        Mistake("signed_min", "it takes the largest signed change (before - after); take the largest absolute change",
                _influence(lambda diff: (-diff).amax(-1))),
        Mistake("mean", "it averages the absolute change over the features; take the maximum (.amax(dim=-1))",
                _influence(lambda diff: diff.abs().mean(-1))),
        Mistake("norm", "it takes the Euclidean norm of the change; take the maximum absolute change over the "
                "features", _influence(lambda diff: diff.norm(dim=-1))),
        Mistake("sum", "it sums the absolute change over the features; take the maximum",
                _influence(lambda diff: diff.abs().sum(-1))),
        Mistake("token_after", "it changes the token after `position`: set column `position` itself "
                "(tgt[:, position] = new_token)", _influence(offset=1)),
        Mistake("token_before", "it changes the token before `position`: set column `position` itself "
                "(tgt[:, position] = new_token)", _influence(offset=-1)),
        # (right for the causal decoder; the second question's decoder is not causal)
        Mistake("assumed_causal", "it reports no change before `position` without measuring it: this decoder is "
                "not causal, compute the change at every position", _influence(causal=True)),
    ),
    diagnosed=(
        Mistake("in_place", "it changed tgt_in in place", _influence(in_place=True)),
        Mistake("every_feature", "returns the change of every feature", _influence(lambda diff: diff.abs())),
        Mistake("wrong_axis", "has shape", _influence(lambda diff: diff.abs().amax(1))),
    ),
)

SPECS = (SHIFT_RIGHT, DECODER_SELF_MASK, DECODER_LAYER, DECODER, FUTURE_INFLUENCE)
