"""Hidden checks of notebook 10, seq2seq_rnn: additive attention, a GRU encoder-decoder with and
without it, and exact-match accuracy by source length.

Sizes are pairwise distinct (batch 2 or 3, src_len 5 or 6, d_query 3, d_key 4, d_attn 6;
vocabularies 11 and 13, d_emb 5, d_hidden 4) so that a softmax over the wrong axis or a swapped
weight either raises or shows; one additive-attention question is square (all sizes 4) so that
swapped or transposed weights show as wrong numbers rather than a shape error. Masks follow the
course convention (True = may attend) and every row keeps one position and drops one, so an
inverted mask never empties a row. The GRU model is a class: the driver
``coursekit.drivers.seq2seq_rnn.seq2seq_model`` loads the weights drawn here into the learner's
layers by name, so no answer depends on initialisation order. Its logits are compared at the
decoder positions that are not padding only. The references (``reference/seq2seq_rnn.py``) are
learner-style torch for the attention and the model, numpy for the accuracy, run through the
same drivers as the learner's code.
"""
from __future__ import annotations

import numpy as np
import torch

from ._core import (Call, Case, CheckFailed, Hint, Mistake, Raised, Raises, Rule, Spec, _explain_raised, close,
                    judge_case, to_array, value)
from .reference import seq2seq_rnn as ref

NUMPY_RETURNED = "returns a numpy array for a torch tensor input"
_gru = ref.gru_step  # (the name tests/test_checks_seq2seq_rnn.py compares with torch.nn.GRUCell)


# ---------------------------------------------------------------- additive attention

def _keep_one_drop_one(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    mask = rng.random((batch, length)) < 0.6
    for b in range(batch):
        keep, drop = rng.choice(length, size=2, replace=False)
        mask[b, keep], mask[b, drop] = True, False
    return mask


def _attention_calls(rng: np.random.Generator) -> list[Call]:
    asked = []

    def ask(batch, src_len, d_query, d_key, d_attn, mask, note, projected=False):
        query = rng.normal(size=(batch, d_query))
        keys = rng.normal(size=(batch, src_len, d_key))
        W_q = rng.normal(scale=0.8, size=(d_attn, d_query))
        W_k = rng.normal(scale=0.8, size=(d_attn, d_key))
        v = rng.normal(scale=1.5, size=(d_attn,))
        what = (f"additive_attention(query {query.shape}, keys {keys.shape}, W_q {W_q.shape}, W_k {W_k.shape}, "
                f"v {v.shape}{note})")
        asked.append(Call((query, keys, W_q, W_k, v, mask), what=what,
                          kwargs={"projected_keys": keys @ W_k.T} if projected else {}))

    ask(2, 5, 3, 4, 6, None, ", mask=None")
    lengths = rng.permutation([3, 4])
    padding = np.arange(5)[None, :] < lengths[:, None]
    ask(2, 5, 3, 4, 6, padding, ", padding mask (2, 5)")
    ask(3, 6, 4, 4, 4, _keep_one_drop_one(rng, 3, 6), ", mask (3, 6), all sizes 4")
    ask(3, 5, 4, 4, 4, None, ", mask=None, all sizes 4")
    # the caller's keys projected once per sentence (Bahdanau et al. 2015, A.1.2); square, so
    # projecting them again shows as wrong numbers rather than a shape error
    ask(2, 6, 4, 4, 4, _keep_one_drop_one(rng, 2, 6), ", mask (2, 6), projected_keys=keys @ W_k.T, all sizes 4",
        projected=True)
    return asked


def _attention(*, dim=-1, tanh=True, use_v=True, mask_mode="right", context_from="keys", swap=False,
               transposed=False, normalise=True, given_keys="used"):
    """A learner-style additive attention with one of the known mistakes (defaults: right).
    ``given_keys``: what it does with projected_keys, "used", "ignored" (projects the keys
    itself: also right) or "projected" (multiplies them by W_k again)."""

    def additive_attention(query, keys, W_q, W_k, v, mask=None, projected_keys=None):
        if swap:
            W_q, W_k = W_k, W_q
        pq, pk = (query @ W_q, keys @ W_k) if transposed else (query @ W_q.T, keys @ W_k.T)
        if projected_keys is not None and given_keys != "ignored":
            pk = projected_keys @ W_k.T if given_keys == "projected" else projected_keys
        hidden = pq[:, None, :] + pk
        hidden = torch.tanh(hidden) if tanh else hidden
        scores = hidden @ v if use_v else hidden.sum(-1)
        if mask is not None and mask_mode in ("right", "inverted", "zero"):
            fill = 0.0 if mask_mode == "zero" else float("-inf")
            scores = scores.masked_fill(mask if mask_mode == "inverted" else ~mask, fill)
        if dim == "size_one":  # scores kept as (batch, src_len, 1): the softmax of one number is 1
            weights = torch.softmax(scores[..., None], dim=-1)[..., 0]
        else:
            weights = torch.softmax(scores, dim=dim) if normalise else torch.exp(scores)
        if mask is not None and mask_mode == "after":
            weights = weights * mask
        values = {"keys": keys, "projected": pk}.get(context_from, keys)
        context = keys.mean(1) if context_from == "mean" else (weights[:, :, None] * values).sum(1)
        return context, weights

    return additive_attention


def _judge_attention(case: Case) -> None:
    """The order of the items and the context's width first: they explain a wrong shape."""
    if isinstance(case.answer, Raised) and NUMPY_RETURNED in case.answer.message:
        raise CheckFailed(f"{case.what} {NUMPY_RETURNED}: in this notebook the model calls it on tensors. Use "
                          "tensor operations (@, torch.tanh, torch.softmax, masked_fill) and no np. functions")
    _explain_raised(case)
    got, (context, weights) = value(case.answer, "additive_attention"), case.expected
    if isinstance(got, tuple) and len(got) == 2:
        first, second = (to_array(a, case.what) for a in got)
        if first.shape == weights.shape and second.shape == context.shape and first.shape != second.shape:
            raise CheckFailed(f"{case.what} returns (weights, context); return (context, weights)")
        d_attn = case.call.args[3].shape[0]
        if first.shape[-1:] == (d_attn,) and first.shape != context.shape:
            raise CheckFailed(f"the context of {case.what} has d_attn = {d_attn} features: it sums the projected "
                              "keys W_k k_j. The context is the weighted sum of the keys themselves (the encoder "
                              "states), sum_j weights_j k_j, of d_key features")
    judge_case(case)


def _sizes(call: Call) -> tuple:
    """(batch, src_len, d_query, d_key, d_attn) of a call."""
    query, keys, W_q = call.args[:3]
    return query.shape[0], keys.shape[1], query.shape[1], keys.shape[2], W_q.shape[0]


_ATTENTION_RULES = (
    Rule("mask=None", lambda call: call.args[5] is None),
    Rule("a mask hiding positions, every row keeping one", lambda call: call.args[5] is not None
         and not np.all(call.args[5]) and bool(np.all(np.any(call.args[5], axis=-1)))),
    Rule("projected_keys given", lambda call: call.kwargs.get("projected_keys") is not None),
    Rule("d_query != d_key != d_attn", lambda call: len(set(_sizes(call)[2:])) == 3),
    Rule("batch != src_len", lambda call: _sizes(call)[0] != _sizes(call)[1]),
)

ADDITIVE_ATTENTION = Spec(
    id="seq2seq_rnn-additive_attention",
    function="additive_attention",
    driver="tensors",
    inputs=_attention_calls,
    rules=_ATTENTION_RULES,
    equivalent=(
        ("L9 -1 -> 1",
         "scores are (batch, src_len): dim=1 is the last axis, dim=-1"),
    ),
    reference=ref.additive_attention,
    parts=("context", "weights"),
    order=(1, 0),  # the context follows from the weights: judge the weights first
    judge=_judge_attention,
    mistakes=(
        Mistake("batch_axis", "the softmax runs over the batch axis: each sentence's weights over its source "
                "positions must sum to 1, softmax(scores, dim=-1) for scores (batch, src_len). (F.softmax without a "
                "dim picks dim=0 for a 3-D tensor such as scores of shape (batch, src_len, 1): always give dim)",
                _attention(dim=0)),
        Mistake("size_one_axis", "every weight is 1: the softmax runs over an axis of size 1 (scores of shape "
                "(batch, src_len, 1), from @ v[:, None] or nn.Linear(d_attn, 1)). Squeeze that axis first, then take "
                "the softmax over the source positions: scores (batch, src_len), softmax(scores, dim=-1)",
                _attention(dim="size_one")),
        Mistake("no_tanh", "tanh is missing: the score is v . tanh(W_q q + W_k k_j) (Bahdanau et al. 2015, "
                "Appendix A.1.2); without it the score is linear in the query and the keys", _attention(tanh=False)),
        Mistake("no_v", "v is missing: the scores sum the d_attn entries of tanh(W_q q + W_k k_j); take the dot "
                "product with v instead, tanh(...) @ v", _attention(use_v=False)),
        Mistake("mask_ignored", "the mask is ignored: fill the scores where the mask is False with -inf before the "
                "softmax, so padding gets weight 0", _attention(mask_mode="ignored")),
        Mistake("mask_inverted", "the mask is inverted: in this course True means the position may be attended "
                "to; fill the scores where the mask is False", _attention(mask_mode="inverted")),
        Mistake("mask_zero", "the masked scores are set to 0; set them to -inf (e^0 = 1 keeps their weight)",
                _attention(mask_mode="zero")),
        Mistake("mask_after", "it masks after the softmax: fill the scores with -inf before the softmax, not the "
                "weights after it (the rows then no longer sum to 1)", _attention(mask_mode="after")),
        Mistake("context_mean", "the context is not the weighted sum of the keys: context = sum_j weights_j k_j, "
                "(weights[:, :, None] * keys).sum(1)", _attention(context_from="mean")),
        Mistake("keys_projected_twice", "the projected_keys it was given are multiplied by W_k again: they are "
                "already W_k k_j (keys @ W_k.T), so add them to the projected query as they are",
                _attention(given_keys="projected")),
    ),
    hints=(
        Hint("each sentence's weights over the source positions should sum to 1: softmax over the last axis",
             lambda w, call: not np.allclose(w.sum(-1), 1.0, atol=1e-4), example=_attention(normalise=False),
             part=1),
    ),
    errors=(
        # W_q and W_k swapped, or used transposed, raise on the questions whose sizes differ
        Raises("{what} raised {error}. W_q is (d_attn, d_query) and W_k is (d_attn, d_key), in nn.Linear's "
               "(out, in) layout: project the query with query @ W_q.T and the keys with keys @ W_k.T (W_q for "
               "the query, W_k for the keys), then add them with the query broadcast over the source positions, "
               "query_proj[:, None, :]", match="cannot be multiplied|size mismatch|must match the size",
               example=_attention(swap=True)),
        Raises("{what} raised {error}: additive_attention takes an optional last argument, projected_keys=None: "
               "the keys already projected, keys @ W_k.T (batch, src_len, d_attn), which the model computes once "
               "per sentence; keep it in the signature and use it in place of keys @ W_k.T when it is not None",
               match="unexpected keyword argument 'projected_keys'",
               example=lambda query, keys, W_q, W_k, v, mask=None: ref.additive_attention(query, keys, W_q, W_k, v,
                                                                                          mask)),
        Raises("{what} raised {error}", example=lambda query, keys, W_q, W_k, v, mask=None, projected_keys=None:
               ref.additive_attention(query, keys, W_q, W_k, v, mask.bool() if mask is not None else mask[0],
                                      projected_keys)),
    ),
    diagnosed=(
        Mistake("numpy_returned", NUMPY_RETURNED + ": in this notebook the model calls it on tensors",
                lambda *args: tuple(np.asarray(a) for a in ref.additive_attention(*args))),
        Mistake("transposed", "query @ W_q.T", _attention(transposed=True)),
        Mistake("weights_first", "returns (weights, context)",
                lambda *args: tuple(reversed(ref.additive_attention(*args)))),
        Mistake("projected_context", "it sums the projected keys", _attention(context_from="projected")),
    ),
)


# ---------------------------------------------------------------- the GRU encoder-decoder

def _model_params(rng: np.random.Generator, V_src, V_tgt, d_emb, d_hidden, attention) -> dict:
    from coursekit.drivers.seq2seq_rnn import parameter_names

    shapes = {"src_embed.weight": (V_src, d_emb), "tgt_embed.weight": (V_tgt, d_emb),
              "encoder.weight_ih_l0": (3 * d_hidden, d_emb), "encoder.weight_hh_l0": (3 * d_hidden, d_hidden),
              "encoder.bias_ih_l0": (3 * d_hidden,), "encoder.bias_hh_l0": (3 * d_hidden,),
              "decoder.weight_ih": (3 * d_hidden, d_emb + (d_hidden if attention else 0)),
              "decoder.weight_hh": (3 * d_hidden, d_hidden),
              "decoder.bias_ih": (3 * d_hidden,), "decoder.bias_hh": (3 * d_hidden,),
              "out.weight": (V_tgt, 2 * d_hidden if attention else d_hidden), "out.bias": (V_tgt,),
              "attn_W_q.weight": (d_hidden, d_hidden), "attn_W_k.weight": (d_hidden, d_hidden),
              "attn_v.weight": (1, d_hidden)}
    scale = {"src_embed.weight": 1.0, "tgt_embed.weight": 1.0, "attn_v.weight": 1.5}
    return {name: rng.normal(scale=scale.get(name, 0.7), size=shapes[name])
            for name in parameter_names(attention)}


def _ids(rng: np.random.Generator, lengths, width: int, vocab: int, pad_id: int, bos: int | None = None):
    """Right-padded rows of ids that are never pad_id (nor bos after position 0)."""
    ids = np.full((len(lengths), width), pad_id, dtype=np.int64)
    choices = np.array([i for i in range(vocab) if i not in (pad_id, bos)])
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.choice(choices, size=n)
        if bos is not None:
            ids[b, 0] = bos
    return ids


def _model_calls(rng: np.random.Generator) -> list[Call]:
    from coursekit.drivers.seq2seq_rnn import parameter_names

    asked = []
    for attention, pad_id, src_lengths, tgt_lengths in [(False, 0, [6, 4, 3], [5, 5, 3]),
                                                        (True, 0, [4, 6, 3], [5, 3, 5]),
                                                        (True, 2, [5, 3], [4, 5])]:
        V_src, V_tgt, d_emb, d_hidden = 11, 13, 5, 4
        p = _model_params(rng, V_src, V_tgt, d_emb, d_hidden, attention)
        src = _ids(rng, rng.permutation(src_lengths), max(src_lengths), V_src, pad_id)
        tgt_in = _ids(rng, rng.permutation(tgt_lengths), max(tgt_lengths), V_tgt, pad_id, bos=1 if pad_id != 1 else 3)
        what = (f"Seq2SeqGRU({V_src}, {V_tgt}, d_emb={d_emb}, d_hidden={d_hidden}, attention={attention}, "
                f"pad_id={pad_id}) on src {src.shape} and tgt_in {tgt_in.shape} with padding")
        args = (V_src, V_tgt, d_emb, d_hidden, attention, pad_id) + tuple(
            p[n] for n in parameter_names(attention)) + (src, tgt_in)
        asked.append(Call(args, what=what))
    return asked


def _gru_model(*, init="last", feed="teacher", use_mask=True, context="attention", order="emb_first",
               attention_fn=ref.additive_attention, store="right", updated=True, batch_first=True):
    """The reference Seq2SeqGRU with one of the known mistakes (defaults: right); ``updated``:
    the decoder's new state is kept; ``batch_first``: how the encoder's nn.GRU is built."""

    class Seq2SeqGRU(ref.Seq2SeqGRU):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not batch_first:
                self.encoder = torch.nn.GRU(self.encoder.input_size, self.encoder.hidden_size)

        def forward(self, src, tgt_in):
            mask = src != self.pad_id
            H, h_n = self.encoder(self.src_embed(src))
            last = H[torch.arange(len(src)), mask.sum(1) - 1]
            s = {"last": lambda: last, "first": lambda: H[:, 0], "padded": lambda: h_n[0],
                 "zeros": lambda: torch.zeros_like(last),
                 "past_end": lambda: H[torch.arange(len(src)), mask.sum(1)]}[init]()
            logits, maps, token = [], [], tgt_in[:, 0]
            for t in range(tgt_in.shape[1]):
                e = self.tgt_embed(tgt_in[:, t] if feed == "teacher" or t == 0 else token)
                if self.attention:
                    c, w = attention_fn(s, H, self.attn_W_q.weight, self.attn_W_k.weight, self.attn_v.weight[0],
                                        mask if use_mask else None)
                    if context == "mean":  # the weights computed, then not used
                        c = (mask[:, :, None] * H).sum(1) / mask.sum(1, keepdim=True)
                    elif context == "last":
                        c = last
                    x = {"emb_first": lambda: torch.cat([e, c], -1), "ctx_first": lambda: torch.cat([c, e], -1),
                         "no_context": lambda: e, "no_dim": lambda: torch.cat([e, c])}[order]()
                    new = self.decoder(x, s)
                    s = new if updated else s
                    y = self.out(torch.cat([new, c], -1))
                    maps.append(w)
                else:
                    new = self.decoder(e, s)
                    s = new if updated else s
                    y = self.out(new)
                logits.append(y)
                token = y.argmax(-1)
            if self.attention and store:
                self.attention_weights = torch.stack(maps, 1 if store == "right" else 2)
            return torch.stack(logits, 1)

    return Seq2SeqGRU


def _logits_and_weights(answer: object, call: Call, what: str) -> tuple:
    """(logits, attention weights or None), each as an array, zero at the padding of tgt_in."""
    attention, tgt_in = bool(call.args[4]), call.args[-1]
    if attention:
        if not isinstance(answer, tuple) or len(answer) != 2:
            raise CheckFailed(f"{what}: the grader could not read the logits and attention_weights back")
        logits, weights = (to_array(a, what) for a in answer)
    else:
        logits, weights = to_array(answer, what), None
    keep = (tgt_in != call.args[5])[:, :, None]  # compare non-padding decoder positions only
    masked = lambda a, width: np.where(keep, a, 0.0) if a.shape[:2] == keep.shape[:2] and a.ndim == 3 \
        and a.shape[2] == width else a
    return masked(logits, logits.shape[-1]), None if weights is None else masked(weights, call.args[-2].shape[1])


def _judge_gru(case: Case) -> None:
    """The logits against the catalogue (the logits alone: how the weights were stored is judged
    after), then the stored attention weights."""
    what = case.what
    if isinstance(case.answer, Raised):
        _explain_raised(case)
    value(case.answer, "Seq2SeqGRU.forward")
    logits, weights = _logits_and_weights(case.answer, case.call, what)
    ref_logits, ref_weights = _logits_and_weights(case.expected, case.call, what)
    label = f"the logits of {what}"
    if not close(logits, ref_logits, rtol=1e-4, atol=1e-4):
        for mistake, wrong in case.mistaken():
            try:
                wrong_logits = _logits_and_weights(wrong, case.call, what)[0]
            except CheckFailed:
                continue
            if close(logits, wrong_logits, rtol=1e-4, atol=1e-4):
                raise CheckFailed(f"{label}: {mistake.diagnosis}")
        if logits.shape != ref_logits.shape:
            raise CheckFailed(f"{label} has shape {logits.shape}; expected {ref_logits.shape}")
        if not np.all(np.isfinite(logits)):
            raise CheckFailed(f"{label} contains NaN or infinity where every value should be finite")
        # The first step's weights depend only on s_0 and H: if they differ, the attention itself is wrong.
        if weights is not None and weights.shape == ref_weights.shape and not np.allclose(
                weights[:, 0], ref_weights[:, 0], rtol=1e-4, atol=1e-5):
            raise CheckFailed(f"{label}: the attention weights differ already at the first step, before the "
                              "decoder has done anything: check additive_attention (its own check above) and the "
                              "call, additive_attention(s, H, attn_W_q.weight, attn_W_k.weight, attn_v.weight[0], "
                              "mask) with mask = src != pad_id")
        where = case.findings().where()  # (the first submodule whose output differs: grader.checks._localise)
        if where:
            raise CheckFailed(f"{label}: {where}")
        raise CheckFailed(f"{label} has the right shape {ref_logits.shape} but wrong values")
    if weights is None or close(weights, ref_weights):
        return
    label = f"the attention_weights of {what}"
    if weights.shape != ref_weights.shape:
        raise CheckFailed(f"{label} has shape {weights.shape}; expected {ref_weights.shape}")
    keep = case.call.args[-1] != case.call.args[5]
    if not np.allclose(weights.sum(-1)[keep], 1.0, atol=1e-4):
        raise CheckFailed(f"{label}: each step's weights over the source positions should sum to 1: store the "
                          "weights additive_attention returns, stacked over the steps with torch.stack(..., dim=1)")
    raise CheckFailed(f"{label} has the right shape {ref_weights.shape} but wrong values")


class _NamedOtherwise(ref.Seq2SeqGRU):
    def __init__(self, src_vocab, tgt_vocab, d_emb, d_hidden, attention=True, pad_id=0):
        super().__init__(src_vocab, tgt_vocab, d_emb, d_hidden, attention, pad_id)
        self.embedding = self.src_embed
        del self.src_embed


class _NoReturn(ref.Seq2SeqGRU):
    def forward(self, src, tgt_in):
        super().forward(src, tgt_in)


def _source_lengths(call: Call) -> set:
    return set(np.sum(call.args[-2] != call.args[5], axis=-1).tolist())


_MODEL_RULES = (
    Rule("attention=True", lambda call: call.args[4] is True),
    Rule("attention=False", lambda call: call.args[4] is False),
    Rule("sources of different lengths (padding)", lambda call: len(_source_lengths(call)) > 1),
    Rule("padding in tgt_in", lambda call: bool(np.any(call.args[-1] == call.args[5]))),
    Rule("pad_id != 0", lambda call: call.args[5] != 0),
)

# (the drawn weights are loaded into every parameter, the padding row too)
_PADDING_IDX = "padding_idx only zeroes the padding row at initialisation and in the gradient; the forward is the same"

SEQ2SEQ_GRU = Spec(
    id="seq2seq_rnn-Seq2SeqGRU",
    submodules=("src_embed", "tgt_embed", "encoder", "out"),
    function="Seq2SeqGRU",
    depends=("seq2seq_rnn-additive_attention",),  # its solution calls them
    driver="seq2seq_rnn.seq2seq_model",
    inputs=_model_calls,
    rules=_MODEL_RULES,
    equivalent=(
        ("L8 nn.Embedding(src_vocab, d_emb, padding_idx=pad_id) -> nn.Embedding(src_vocab, d_emb)", _PADDING_IDX),
        ("L9 nn.Embedding(tgt_vocab, d_emb, padding_idx=pad_id) -> nn.Embedding(tgt_vocab, d_emb)", _PADDING_IDX),
        ("L19 0 -> -1", "attn_v.weight is (1, d_hidden): its row 0 is its row -1"),
        ("L34 -1 -> 1", "the embedding and the context are (batch, features): dim=1 is the last axis, dim=-1"),
        ("L35 -1 -> 1", "the state and the context are (batch, features): dim=1 is the last axis, dim=-1"),
    ),
    reference=ref.Seq2SeqGRU,
    judge=_judge_gru,
    mistakes=(
        Mistake("first_state", "the decoder starts from the encoder's FIRST state: its initial state is the encoder "
                "state at the last real token of each sentence, H[b, lengths[b] - 1] (the whole sentence read)",
                _gru_model(init="first")),
        Mistake("padded_state", "the decoder starts from the encoder's state after the padding (h_n of nn.GRU run "
                "over the padded batch, or H[:, -1]): take the state at each sentence's last real token, "
                "H[b, lengths[b] - 1] (or run the encoder on a pack_padded_sequence)", _gru_model(init="padded")),
        Mistake("zero_state", "the decoder starts from zeros: its initial state is the encoder's state at the last "
                "real token, the summary of the source", _gru_model(init="zeros")),
        Mistake("free_running", "the decoder feeds its own predictions back (free running); in training it reads "
                "the given tgt_in, teacher forcing: step t's input is tgt_in[:, t]", _gru_model(feed="free")),
        Mistake("mask_ignored", "the attention ignores the padding mask: pass mask = src != pad_id to "
                "additive_attention so that padding gets weight 0", _gru_model(use_mask=False)),
        Mistake("weights_unused", "the attention weights are not used: the context is a plain average of the "
                "encoder states. c_t = additive_attention(s_{t-1}, H, ...)[0]", _gru_model(context="mean")),
        Mistake("last_state_context", "the context is the encoder's last state at every step, as without "
                "attention: compute c_t with additive_attention(s_{t-1}, H, ...) at every step",
                _gru_model(context="last")),
        Mistake("context_first", "the decoder's input is cat([context, embedding]); the docstring's order is "
                "cat([embedding, context], -1)", _gru_model(order="ctx_first")),
        Mistake("state_not_updated", "the decoder's state is never carried forward: every step starts again from the "
                "encoder's state. Keep the new state, s = cell(input, s), for the next step",
                _gru_model(updated=False)),
        Mistake("encoder_not_batch_first", "the encoder's nn.GRU reads its input as (seq_len, batch, d_emb): build it "
                "with batch_first=True for the (batch, src_len) ids, nn.GRU(d_emb, d_hidden, batch_first=True)",
                _gru_model(batch_first=False)),
    ),
    errors=(
        Raises("{what}: {error}", match="has no parameter|docstring's sizes give|does not name|attention_weights|"
               "is not a torch.nn.Module|should return the logits alone", example=_NamedOtherwise),
        Raises("{what} raised {error}: something it uses returned None. Does your additive_attention miss a "
               "`return`? Fix that one first", match="NoneType",
               example=_gru_model(attention_fn=lambda *args: None)),
        Raises("{what} raised {error}: the decoder's input has the wrong width. With attention it is "
               "cat([embedding, context], -1), d_emb + d_hidden features; without, the embedding alone",
               match="input.size\\(-1\\) must be equal to input_size|input has inconsistent input_size",
               example=_gru_model(order="no_context")),
        Raises("{what} raised {error}: an index runs past the end. The encoder's last real state of sentence b is "
               "at position lengths[b] - 1, and the decoder runs over the tgt_len positions of tgt_in, no more",
               match="index out of range|out of bounds", example=_gru_model(init="past_end")),
        Raises("{what} raised {error}", example=_gru_model(order="no_dim")),
    ),
    diagnosed=(
        Mistake("forgot_return", "Seq2SeqGRU.forward returns nothing (None)", _NoReturn),
        Mistake("weights_transposed", "the attention_weights of", _gru_model(store="transposed")),
        Mistake("attention_without_tanh", "differ already at the first step",
                _gru_model(attention_fn=_attention(tanh=False))),
    ),
)


# ---------------------------------------------------------------- accuracy by length

def _sentences(rng: np.random.Generator, lengths, bins, eos: int, pad: int, vocab: int = 9):
    """Predictions and references covering every case: right, wrong token, EOS missing, early,
    late, garbage after EOS, and widths that differ."""
    n = len(lengths)
    ref_width, pred_width = 7, 8
    ref = np.full((n, ref_width), pad, dtype=np.int64)
    pred = np.full((n, pred_width), pad, dtype=np.int64)
    words = np.array([t for t in range(vocab) if t not in (eos, pad)])
    kinds = ["right", "right_garbage", "wrong_token", "no_eos", "late_eos", "early_eos", "right"]
    inside = np.flatnonzero((lengths >= bins[0]) & (lengths < bins[-1]))
    order = list(inside) + [i for i in range(n) if i not in inside]   # every kind inside some bin
    for position, i in enumerate(order):
        k = rng.integers(2, 6)
        sentence = list(rng.choice(words, size=k))
        ref[i, :k + 1] = sentence + [eos]
        kind = kinds[position] if position < len(kinds) else rng.choice(kinds)
        p = list(sentence) + [eos]
        if kind == "right_garbage":
            p = p + list(rng.choice(words, size=pred_width - len(p)))
        elif kind == "wrong_token":
            j = rng.integers(k)
            p[j] = words[(list(words).index(p[j]) + 1) % len(words)]
        elif kind == "no_eos":
            p = sentence + list(rng.choice(words, size=pred_width - k))
        elif kind == "late_eos":
            p = sentence + [words[0], eos]
        elif kind == "early_eos":
            p = sentence[:-1] + [eos]
        pred[i, :len(p)] = p[:pred_width]
    return pred, ref


def _accuracy_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for bins, lengths, eos, pad in [
        (np.array([4, 6, 9, 12, 15]), [4, 5, 6, 8, 9, 10, 11, 6, 9, 15, 3, 5, 4, 10], 2, 0),
        (np.array([3, 5, 7, 10]), [3, 4, 5, 5, 6, 7, 7, 8, 9, 10, 4, 3], 5, 1),
    ]:
        lengths = rng.permutation(np.array(lengths, dtype=np.int64))
        pred, ref = _sentences(rng, lengths, bins, eos, pad)
        # the first set has an empty bin [12, 15): its lengths skip 12-14 and 15 is the last edge
        what = (f"accuracy_by_length(predictions {pred.shape}, targets {ref.shape}, lengths {lengths.shape}, "
                f"bins {bins.tolist()}, eos_id={eos})")
        asked.append(Call((pred, ref, lengths, bins, eos), what=what))
    asked.append(_cut_at_max_len(rng))
    return asked


def _cut_at_max_len(rng: np.random.Generator, width: int = 4, eos: int = 3, pad: int = 0) -> Call:
    """Greedy outputs cut at max_len = ``width`` before their EOS: a prediction holding exactly the
    reference's tokens and no EOS is wrong (so is one cut inside the sentence); beside them,
    right ones whose EOS fits, one with a token after its EOS."""
    words = np.array([t for t in range(9) if t not in (eos, pad)])
    rows = [(4, "cut"), (3, "right"), (5, "cut"), (2, "after"), (4, "wrong"), (3, "right")]
    ref = np.full((len(rows), 7), pad, dtype=np.int64)
    pred = np.full((len(rows), width), pad, dtype=np.int64)
    for i, (k, kind) in enumerate(rows):
        sentence = list(rng.choice(words, size=k))
        ref[i, :k + 1] = sentence + [eos]
        p = {"cut": sentence, "right": sentence + [eos], "after": sentence + [eos, words[0]],
             "wrong": sentence[:-1] + [words[(list(words).index(sentence[-1]) + 1) % len(words)]]}[kind]
        pred[i, :min(width, len(p))] = p[:width]
    order = rng.permutation(len(rows))
    lengths = rng.integers(2, 8, size=len(rows)).astype(np.int64)
    bins = np.array([2, 5, 8])
    what = (f"accuracy_by_length(predictions {pred.shape} cut at max_len, targets {ref.shape}, lengths "
            f"{lengths.shape}, bins {bins.tolist()}, eos_id={eos})")
    return Call((pred[order], ref[order], lengths, bins, eos), what=what)


def _counted(*, right_closed=False, last_inclusive=False, empty=np.nan, tokens=False, eos_needed=True, after_eos=False):
    """A learner-style accuracy_by_length with one of the known mistakes."""

    def accuracy_by_length(pred, ref, lengths, bins, eos):
        n = len(ref)
        correct = np.zeros(n)
        for i in range(n):
            r = list(ref[i])
            r = r[:r.index(eos)] if eos in r else r
            p = list(pred[i])
            if tokens:
                width = len(r) + 1
                padded = p[:width] + [-1] * (width - len(p[:width]))
                correct[i] = np.mean([a == b for a, b in zip(padded, r + [eos])])
            elif after_eos:  # whole rows compared, cut to the narrower width
                width = min(len(p), len(ref[i]))
                correct[i] = float(p[:width] == list(ref[i])[:width])
            elif not eos_needed:  # only the reference's tokens compared: EOS missing or late goes unseen
                correct[i] = float(p[:len(r)] == r)
            elif eos in p:
                correct[i] = float(p[:p.index(eos)] == r)
        B = len(bins) - 1
        acc, counts = np.zeros(B), np.zeros(B, dtype=np.int64)
        for b in range(B):
            lo, hi = bins[b], bins[b + 1]
            if right_closed:
                inside = (lengths > lo) & (lengths <= hi)
            else:
                closes = last_inclusive and b == B - 1
                inside = (lengths >= lo) & ((lengths < hi) | (closes & (lengths == hi)))
            counts[b] = inside.sum()
            acc[b] = correct[inside].mean() if counts[b] else empty
        return acc, counts

    return accuracy_by_length


def _nan_as_number(answer: object, call: Call, what: str) -> object:
    """NaN (an empty bin's accuracy) made comparable: the core never matches NaN with NaN."""
    if isinstance(answer, tuple) and len(answer) == 2:
        return (np.nan_to_num(to_array(answer[0], f"the accuracy of {what}"), nan=-7.0), answer[1])
    return answer


def _empty_bin_not_nan(accuracy: np.ndarray, call: Call) -> bool:
    _, _, lengths, bins, _ = call.args
    empty = np.array([not np.any((lengths >= lo) & (lengths < hi)) for lo, hi in zip(bins[:-1], bins[1:])])
    return accuracy.shape == empty.shape and bool(np.any(accuracy[empty] != -7.0))


def _divide_by_count(pred, ref, lengths, bins, eos):
    right = [float(p[:list(p).index(eos)].tolist() == r[:list(r).index(eos)].tolist()) if eos in p else 0.0
             for p, r in zip(pred, ref)]
    inside = [[i for i, n in enumerate(lengths) if lo <= n < hi] for lo, hi in zip(bins[:-1], bins[1:])]
    return (np.array([sum(right[i] for i in b) / len(b) for b in inside]), np.array([len(b) for b in inside]))


def _bins_of(call: Call) -> tuple:
    """(lengths, bins) of a call."""
    return np.asarray(call.args[2]), np.asarray(call.args[3])


def _exact_kinds(call: Call) -> set:
    """What the sentences inside the bins show: "no EOS", "tokens after EOS differ", "late EOS"."""
    pred, ref_, _, _, eos = call.args
    lengths, bins = _bins_of(call)
    kinds = set()
    for p, r, n in zip(pred.tolist(), ref_.tolist(), lengths):
        if not bins[0] <= n < bins[-1]:
            continue
        r = r[:r.index(eos)] if eos in r else r
        if eos not in p:
            kinds.add("no EOS")
        elif p[:p.index(eos)] == r and any(t != eos for t in p[p.index(eos) + 1:]):
            kinds.add("tokens after EOS differ")
        elif p[:len(r)] == r and p.index(eos) > len(r):
            kinds.add("late EOS")
    return kinds


def _empty_bin(call: Call) -> bool:
    lengths, bins = _bins_of(call)
    return any(not np.any((lengths >= lo) & (lengths < hi)) for lo, hi in zip(bins[:-1], bins[1:]))


_ACCURACY_RULES = (
    Rule("an empty bin (NaN, count 0)", _empty_bin),
    Rule("a length equal to the last edge (outside)", lambda call: bool(np.any(_bins_of(call)[0] == call.args[3][-1]))),
    Rule("a length equal to an inner edge", lambda call: bool(np.any(np.isin(call.args[2], call.args[3][1:-1])))),
    Rule("a prediction without EOS", lambda call: "no EOS" in _exact_kinds(call)),
    Rule("a right prediction with other tokens after its EOS",
         lambda call: "tokens after EOS differ" in _exact_kinds(call)),
    Rule("a prediction whose EOS comes late", lambda call: "late EOS" in _exact_kinds(call)),
    Rule("a prediction cut before its EOS, holding exactly the reference's tokens", lambda call: any(
        eos not in p and p == r[:r.index(eos)] for p, r, eos in
        ((p, r, call.args[4]) for p, r in zip(call.args[0].tolist(), call.args[1].tolist())))),
)

ACCURACY_BY_LENGTH = Spec(
    id="seq2seq_rnn-accuracy_by_length",
    function="accuracy_by_length",
    inputs=_accuracy_calls,
    rules=_ACCURACY_RULES,
    equivalent=(
        ("L5 lengths = np.asarray(lengths) -> (left out)",
         "lengths is an array (numpy, or a torch tensor as the docstring allows): compared with the edges it "
         "gives the same masks, and numpy indexes by a torch bool tensor alike"),
        ("L11 np.array(counts, dtype=np.int64) -> np.array(counts)",
         "counts holds Python ints, which np.array makes int64 on Linux (where the course runs); counts are "
         "compared by value"),
        ("L4 ...edictions, targets)], dtype=np.float64) -> ...edictions, targets)])",
         "the exact matches are then booleans, and the mean of booleans is the same fraction as of 0.0 and 1.0"),
    ),
    reference=ref.accuracy_by_length,
    parts=("accuracy", "counts"),
    order=(1, 0),  # the counts are right, so the bins are: what is left is the exact match or the empty bins
    prepare=_nan_as_number,
    mistakes=(
        Mistake("right_closed", "the bins are closed on the right, lo < length <= hi; the docstring's bins are "
                "half-open, bins[b] <= length < bins[b + 1] (np.digitize(lengths, bins) - 1 gives that bin index)",
                _counted(right_closed=True)),
        Mistake("histogram", "a length equal to the last edge is counted in the last bin (np.histogram does that); "
                "the bins are half-open, bins[b] <= length < bins[b + 1], also the last one",
                _counted(last_inclusive=True)),
        Mistake("empty_zero", "an empty bin gets 0; it has no sentences, so its accuracy is undefined: NaN",
                _counted(empty=0.0)),
        Mistake("tokens", "it averages over tokens: the accuracy counts whole sentences, a sentence is right only "
                "when every token up to and including EOS matches", _counted(tokens=True)),
        Mistake("eos_not_needed", "a prediction counts as right when its first tokens match the reference, even "
                "with no EOS or a late one: it must end with EOS exactly where the reference does (no EOS = wrong)",
                _counted(eos_needed=False)),
        Mistake("after_eos", "it compares the tokens after EOS too; everything after the first EOS is ignored "
                "(greedy decoding fills it with padding, the reference may have a different width)",
                _counted(after_eos=True)),
    ),
    hints=(
        Hint("an empty bin should be NaN", _empty_bin_not_nan, part=0,
             example=_counted(empty=-1.0)),
        Hint("exact match per sentence (up to and including the first EOS), averaged per bin",
             lambda accuracy, call: True, part=0,
             example=lambda *args: (ref.accuracy_by_length(*args)[0] / 2, ref.accuracy_by_length(*args)[1])),
    ),
    errors=(
        Raises("{what} raised {error}: a bin without sentences has no accuracy; give it NaN (float('nan'), "
               "np.nan) and a count of 0 instead of dividing by 0",
               match="Mean of empty slice|division by zero|ZeroDivisionError", example=_divide_by_count),
    ),
)

SPECS = (ADDITIVE_ATTENTION, SEQ2SEQ_GRU, ACCURACY_BY_LENGTH)
