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
decoder positions that are not padding only. The reference is float64 numpy.
"""
from __future__ import annotations

import numpy as np

from ._core import CheckFailed, Question, Raised, exercise, judge, to_array
from ._core import value as answer_value

NUMPY_RETURNED = "returns a numpy array for a torch tensor input"


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# ---------------------------------------------------------------- additive attention

def _additive(query, keys, W_q, W_k, v, mask, *, tanh=True, axis=-1, use_mask=True, invert=False,
              fill=-np.inf, after_softmax=False, swap=False, layout="linear", score="additive"):
    """(context (batch, d_key), weights (batch, src_len)) with knobs for the known mistakes."""
    with np.errstate(all="ignore"):
        if swap:
            W_q, W_k = W_k, W_q
        if layout == "transposed":
            pq, pk = query @ W_q, keys @ W_k
        else:
            pq, pk = query @ W_q.T, keys @ W_k.T                     # (batch, d_attn), (batch, src_len, d_attn)
        if score == "dot":
            scores = np.einsum("bd,bsd->bs", query, keys)
        elif score == "no_v":
            scores = np.tanh(pq[:, None, :] + pk).sum(-1)
        else:
            hidden = pq[:, None, :] + pk
            scores = (np.tanh(hidden) if tanh else hidden) @ v
        m = None
        if mask is not None and use_mask:
            m = ~mask if invert else mask
            if not after_softmax:
                scores = np.where(m, scores, fill)
        weights = _softmax(scores, axis)
        if m is not None and after_softmax:
            weights = np.where(m, weights, 0.0)
        return np.einsum("bs,bsd->bd", weights, keys), weights


def _raised_attention(got: object, what: str) -> None:
    if not isinstance(got, Raised) or got.message.startswith("NotImplementedError"):
        return
    message = got.message.rstrip(".")
    if NUMPY_RETURNED in message:
        raise CheckFailed(f"{what} {NUMPY_RETURNED}: in this notebook the model calls it on tensors. Use "
                          "tensor operations (@, torch.tanh, torch.softmax, masked_fill) and no np. functions")
    if "cannot be multiplied" in message or "size mismatch" in message or "must match the size" in message:
        raise CheckFailed(f"{what} raised {message}. W_q is (d_attn, d_query) and W_k is (d_attn, d_key), "
                          "in nn.Linear's (out, in) layout: project the query with query @ W_q.T and the "
                          "keys with keys @ W_k.T (W_q for the query, W_k for the keys), then add them with "
                          "the query broadcast over the source positions, query_proj[:, None, :]")
    raise CheckFailed(f"{what} raised {message}")


def _judge_attention(got: object, args: tuple, what: str) -> None:
    query, keys, W_q, W_k, v, mask = args
    _raised_attention(got, what)
    got = answer_value(got, "additive_attention")
    if not isinstance(got, tuple) or len(got) != 2:
        kind = f"a tuple of {len(got)} items" if isinstance(got, tuple) else "one array"
        raise CheckFailed(f"{what} should return a tuple (context, weights), but it returns {kind}")
    context, weights = _additive(query, keys, W_q, W_k, v, mask)
    first, second = (to_array(a, what) for a in got)
    if first.shape == weights.shape and second.shape == context.shape and first.shape != second.shape:
        raise CheckFailed(f"{what} returns (weights, context); return (context, weights)")
    if first.shape[-1:] == (W_k.shape[0],) and first.shape != context.shape:
        raise CheckFailed(f"the context of {what} has d_attn = {W_k.shape[0]} features: it sums the projected "
                          "keys W_k k_j. The context is the weighted sum of the keys themselves (the encoder "
                          "states), sum_j weights_j k_j, of d_key features")

    def alt(**knobs):
        try:
            return _additive(query, keys, W_q, W_k, v, mask, **knobs)
        except ValueError:
            return None, None

    square = W_q.shape[0] == W_q.shape[1] == W_k.shape[1]
    mistakes = [
        ("the softmax runs over the batch axis: each sentence's weights over its source positions must "
         "sum to 1, softmax(scores, dim=-1) for scores (batch, src_len)", alt(axis=0)),
        ("tanh is missing: the score is v . tanh(W_q q + W_k k_j) (Bahdanau et al. 2015, Appendix "
         "A.1.2); without it the score is linear in the query and the keys", alt(tanh=False)),
        ("v is missing: the scores sum the d_attn entries of tanh(W_q q + W_k k_j); take the dot "
         "product with v instead, tanh(...) @ v", alt(score="no_v")),
    ]
    if square:
        mistakes += [
            ("W_q and W_k are swapped: W_q projects the query (the decoder state), W_k the keys "
             "(the encoder states)", alt(swap=True)),
            ("the weights are applied transposed: W_q and W_k are stored as nn.Linear stores them, "
             "(out_features, in_features), so project with query @ W_q.T and keys @ W_k.T",
             alt(layout="transposed")),
            ("these are dot-product scores q . k_j (Luong's), not additive ones: score_j = "
             "v . tanh(W_q q + W_k k_j)", alt(score="dot")),
        ]
    if mask is not None:
        mistakes += [
            ("the mask is ignored: fill the scores where the mask is False with -inf before the softmax, "
             "so padding gets weight 0", alt(use_mask=False)),
            ("the mask is inverted: in this course True means the position may be attended to; fill "
             "the scores where the mask is False", alt(invert=True)),
            ("the masked scores are set to 0; set them to -inf (e^0 = 1 keeps their weight)", alt(fill=0.0)),
            ("it masks after the softmax: fill the scores with -inf before the softmax, not the weights "
             "after it (the rows then no longer sum to 1)", alt(after_softmax=True)),
        ]
    judge(second, weights, f"the weights of {what}", [(m, w[1]) for m, w in mistakes if w[1] is not None],
          hints=[lambda w: ("each sentence's weights over the source positions should sum to 1: softmax "
                            "over the last axis" if w.shape == weights.shape
                            and not np.allclose(w.sum(-1), 1.0, atol=1e-4) else None)])
    context_mistakes = [(m, w[0]) for m, w in mistakes if w[0] is not None]
    context_mistakes.append(("the context is not the weighted sum of the keys: context = "
                             "sum_j weights_j k_j, (weights[:, :, None] * keys).sum(1)",
                             keys.mean(axis=1)))
    judge(first, context, f"the context of {what}", context_mistakes)


def _keep_one_drop_one(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    mask = rng.random((batch, length)) < 0.6
    for b in range(batch):
        keep, drop = rng.choice(length, size=2, replace=False)
        mask[b, keep], mask[b, drop] = True, False
    return mask


@exercise("seq2seq_rnn-additive_attention", "additive_attention", driver="tensors")
def additive_attention_questions(rng: np.random.Generator) -> list[Question]:
    asked = []

    def ask(batch, src_len, d_query, d_key, d_attn, mask, note):
        query = rng.normal(size=(batch, d_query))
        keys = rng.normal(size=(batch, src_len, d_key))
        W_q = rng.normal(scale=0.8, size=(d_attn, d_query))
        W_k = rng.normal(scale=0.8, size=(d_attn, d_key))
        v = rng.normal(scale=1.5, size=(d_attn,))
        args = (query, keys, W_q, W_k, v, mask)
        what = (f"additive_attention(query {query.shape}, keys {keys.shape}, W_q {W_q.shape}, W_k {W_k.shape}, "
                f"v {v.shape}{note})")
        asked.append(Question(args, lambda got: _judge_attention(got, args, what)))

    ask(2, 5, 3, 4, 6, None, ", mask=None")
    lengths = rng.permutation([3, 4])
    padding = np.arange(5)[None, :] < lengths[:, None]
    ask(2, 5, 3, 4, 6, padding, ", padding mask (2, 5)")
    ask(3, 6, 4, 4, 4, _keep_one_drop_one(rng, 3, 6), ", mask (3, 6), all sizes 4")
    ask(3, 5, 4, 4, 4, None, ", mask=None, all sizes 4")
    return asked


# ---------------------------------------------------------------- the GRU encoder-decoder

def _gru(x, h, W_ih, W_hh, b_ih, b_hh):
    """One step of torch's GRU (gates r, z, n in that order)."""
    H = h.shape[-1]
    gi, gh = x @ W_ih.T + b_ih, h @ W_hh.T + b_hh
    r = _sigmoid(gi[:, :H] + gh[:, :H])
    z = _sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
    n = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
    return (1 - z) * n + z * h


def _seq2seq(p: dict, src, tgt_in, attention: bool, pad_id: int, *, init="last", feed="teacher",
             use_mask=True, context="attention", order="emb_first"):
    """(logits (batch, tgt_len, V), weights (batch, tgt_len, src_len) or None) with mistake knobs."""
    batch, src_len = src.shape
    mask = src != pad_id
    lengths = mask.sum(1)
    X = p["src_embed.weight"][src]
    h = np.zeros((batch, p["encoder.weight_hh_l0"].shape[1]))
    states = []
    for t in range(src_len):
        h = _gru(X[:, t], h, p["encoder.weight_ih_l0"], p["encoder.weight_hh_l0"],
                 p["encoder.bias_ih_l0"], p["encoder.bias_hh_l0"])
        states.append(h)
    H = np.stack(states, 1)                                         # (batch, src_len, d_hidden)
    last = H[np.arange(batch), lengths - 1]
    s = {"last": last, "first": H[:, 0], "padded": H[:, -1], "zeros": np.zeros_like(last)}[init]
    dec = [p[f"decoder.{n}"] for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    logits, maps = [], []
    previous = tgt_in[:, 0]
    for t in range(tgt_in.shape[1]):
        token = tgt_in[:, t] if feed == "teacher" or t == 0 else previous
        e = p["tgt_embed.weight"][token]
        if attention:
            c, w = _additive(s, H, p["attn_W_q.weight"], p["attn_W_k.weight"], p["attn_v.weight"][0],
                             mask if use_mask else None)
            if context == "mean":  # the weights computed, then not used
                c = (mask[:, :, None] * H).sum(1) / mask.sum(1, keepdims=True)
            elif context == "last":
                c = last
            x = np.concatenate([e, c] if order == "emb_first" else [c, e], -1)
            s = _gru(x, s, *dec)
            y = np.concatenate([s, c], -1) @ p["out.weight"].T + p["out.bias"]
            maps.append(w)
        else:
            s = _gru(e, s, *dec)
            y = s @ p["out.weight"].T + p["out.bias"]
        logits.append(y)
        previous = y.argmax(-1)
    return np.stack(logits, 1), (np.stack(maps, 1) if attention else None)


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


def _raised_model(got: object, what: str) -> None:
    if not isinstance(got, Raised) or got.message.startswith("NotImplementedError"):
        return
    message = got.message.rstrip(".")
    if "has no parameter" in message or "docstring's sizes give" in message or "does not name" in message \
            or "attention_weights" in message or "is not a torch.nn.Module" in message \
            or "should return the logits alone" in message:
        raise CheckFailed(f"{what}: {message}")
    if "NoneType" in message:
        raise CheckFailed(f"{what} raised {message}: something it uses returned None. Does your "
                          "additive_attention miss a `return`? Fix that one first")
    if "input.size(-1) must be equal to input_size" in message or "input has inconsistent input_size" in message:
        raise CheckFailed(f"{what} raised {message}: the decoder's input has the wrong width. With attention "
                          "it is cat([embedding, context], -1), d_emb + d_hidden features; without, the "
                          "embedding alone")
    if "cannot be multiplied" in message:
        raise CheckFailed(f"{what} raised {message}: a linear layer got the wrong number of features. With "
                          "attention the output layer reads cat([s_t, c_t], -1), 2 d_hidden features; "
                          "without, s_t alone")
    if "index out of range" in message or "out of bounds" in message:
        raise CheckFailed(f"{what} raised {message}: an index runs past the end. The encoder's last real "
                          "state of sentence b is at position lengths[b] - 1, and the decoder runs over the "
                          "tgt_len positions of tgt_in, no more")
    raise CheckFailed(f"{what} raised {message}")


def _judge_model(got: object, p: dict, src, tgt_in, attention, pad_id, what: str) -> None:
    _raised_model(got, what)
    got = answer_value(got, "Seq2SeqGRU" if isinstance(got, Raised) else "Seq2SeqGRU.forward")
    if attention:
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckFailed(f"{what}: the grader could not read the logits and attention_weights back")
        logits, weights = (to_array(a, what) for a in got)
    else:
        logits, weights = to_array(got, what), None
    keep = (tgt_in != pad_id)[:, :, None]                         # compare non-padding decoder positions only
    ref_logits, ref_weights = _seq2seq(p, src, tgt_in, attention, pad_id)

    def alt(**knobs):
        return _seq2seq(p, src, tgt_in, attention, pad_id, **knobs)

    mistakes = [
        ("the decoder starts from the encoder's FIRST state: its initial state is the encoder state at the "
         "last real token of each sentence, H[b, lengths[b] - 1] (the whole sentence read)", alt(init="first")),
        ("the decoder starts from the encoder's state after the padding (h_n of nn.GRU run over the padded "
         "batch, or H[:, -1]): take the state at each sentence's last real token, H[b, lengths[b] - 1] "
         "(or run the encoder on a pack_padded_sequence)", alt(init="padded")),
        ("the decoder starts from zeros: its initial state is the encoder's state at the last real token, "
         "the summary of the source", alt(init="zeros")),
        ("the decoder feeds its own predictions back (free running); in training it reads the given "
         "tgt_in, teacher forcing: step t's input is tgt_in[:, t]", alt(feed="free")),
    ]
    if attention:
        mistakes += [
            ("the attention ignores the padding mask: pass mask = src != pad_id to additive_attention so that "
             "padding gets weight 0", alt(use_mask=False)),
            ("the attention weights are not used: the context is a plain average of the encoder states. "
             "c_t = additive_attention(s_{t-1}, H, ...)[0]", alt(context="mean")),
            ("the context is the encoder's last state at every step, as without attention: compute c_t with "
             "additive_attention(s_{t-1}, H, ...) at every step", alt(context="last")),
            ("the decoder's input is cat([context, embedding]); the docstring's order is "
             "cat([embedding, context], -1)", alt(order="ctx_first")),
        ]
    masked = lambda a: None if a is None else np.where(keep, a, 0.0)
    got_logits = np.where(keep, logits, 0.0) if logits.shape == ref_logits.shape else logits

    def first_step_attention(_):
        """The first step's weights depend only on s_0 and H: if they differ, the attention itself is wrong."""
        if weights is None or weights.shape != ref_weights.shape:
            return None
        if np.allclose(weights[:, 0], ref_weights[:, 0], rtol=1e-4, atol=1e-5):
            return None
        return ("the attention weights differ already at the first step, before the decoder has done "
                "anything: check additive_attention (its own check above) and the call, "
                "additive_attention(s, H, attn_W_q.weight, attn_W_k.weight, attn_v.weight[0], mask) with "
                "mask = src != pad_id")

    judge(got_logits, masked(ref_logits), f"the logits of {what}", [(m, masked(w[0])) for m, w in mistakes],
          hints=[first_step_attention], rtol=1e-4, atol=1e-4)
    if attention:  # the logits are right: what is left is how the weights were stored
        judge(np.where(keep, weights, 0.0) if weights.shape == ref_weights.shape else weights,
              masked(ref_weights), f"the attention_weights of {what}", hints=[
                  lambda w: ("each step's weights over the source positions should sum to 1: store the "
                             "weights additive_attention returns, stacked over the steps with "
                             "torch.stack(..., dim=1)" if w.shape == ref_weights.shape
                             and not np.allclose(w.sum(-1)[keep[..., 0]], 1.0, atol=1e-4) else None)])


def _ids(rng: np.random.Generator, lengths, width: int, vocab: int, pad_id: int, bos: int | None = None):
    """Right-padded rows of ids that are never pad_id (nor bos after position 0)."""
    ids = np.full((len(lengths), width), pad_id, dtype=np.int64)
    choices = np.array([i for i in range(vocab) if i not in (pad_id, bos)])
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.choice(choices, size=n)
        if bos is not None:
            ids[b, 0] = bos
    return ids


@exercise("seq2seq_rnn-Seq2SeqGRU", "Seq2SeqGRU", driver="seq2seq_rnn.seq2seq_model")
def seq2seq_gru_questions(rng: np.random.Generator) -> list[Question]:
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
        asked.append(Question(args, lambda got, p=p, s=src, t=tgt_in, a=attention, k=pad_id, w=what:
                              _judge_model(got, p, s, t, a, k, w)))
    return asked


# ---------------------------------------------------------------- accuracy by length

def _accuracy_by_length(pred, ref, lengths, bins, eos, *, right_closed=False, last_inclusive=False,
                        empty=np.nan, tokens=False, eos_needed=True, after_eos=False):
    """(accuracy (B,), counts (B,)) with knobs for the known mistakes."""
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


def _judge_accuracy(got: object, args: tuple, what: str) -> None:
    pred, ref, lengths, bins, eos = args
    if isinstance(got, Raised) and ("Mean of empty slice" in got.message or "division by zero" in got.message
                                    or "ZeroDivisionError" in got.message):
        raise CheckFailed(f"{what} raised {got.message}: a bin without sentences has no accuracy; give it "
                          "NaN (float('nan'), np.nan) and a count of 0 instead of dividing by 0")
    got = answer_value(got, "accuracy_by_length")
    if not isinstance(got, tuple) or len(got) != 2:
        kind = f"a tuple of {len(got)} items" if isinstance(got, tuple) else "one array"
        raise CheckFailed(f"{what} should return a tuple (accuracy, counts), but it returns {kind}")
    accuracy, counts = _accuracy_by_length(pred, ref, lengths, bins, eos)

    def alt(**knobs):
        return _accuracy_by_length(pred, ref, lengths, bins, eos, **knobs)

    bins_mistakes = [
        ("the bins are closed on the right, lo < length <= hi; the docstring's bins are half-open, "
         "bins[b] <= length < bins[b + 1] (np.digitize(lengths, bins) - 1 gives that bin index)",
         alt(right_closed=True)),
        ("a length equal to the last edge is counted in the last bin (np.histogram does that); the bins "
         "are half-open, bins[b] <= length < bins[b + 1], also the last one", alt(last_inclusive=True)),
    ]
    judge(got[1], counts, f"the counts of {what}", [(m, w[1]) for m, w in bins_mistakes])
    given = to_array(got[0], f"the accuracy of {what}")
    expected = accuracy
    if given.shape == expected.shape and np.allclose(np.nan_to_num(given, nan=-7.0),
                                                     np.nan_to_num(expected, nan=-7.0)):
        return
    mistakes = [  # the counts are right, so the bins are: what is left is the exact match or the empty bins
        ("an empty bin gets 0; it has no sentences, so its accuracy is undefined: NaN", alt(empty=0.0)),
        ("it averages over tokens: the accuracy counts whole sentences, a sentence is right only when "
         "every token up to and including EOS matches", alt(tokens=True)),
        ("a prediction counts as right when its first tokens match the reference, even with no EOS or a "
         "late one: it must end with EOS exactly where the reference does (no EOS = wrong)",
         alt(eos_needed=False)),
        ("it compares the tokens after EOS too; everything after the first EOS is ignored (greedy decoding "
         "fills it with padding, the reference may have a different width)", alt(after_eos=True)),
    ]
    for message, (wrong, _) in mistakes:
        if given.shape == wrong.shape and np.allclose(np.nan_to_num(given, nan=-7.0), np.nan_to_num(wrong, nan=-7.0)):
            raise CheckFailed(f"the accuracy of {what}: {message}")
    if given.shape != expected.shape:
        raise CheckFailed(f"the accuracy of {what} has shape {given.shape}; expected {expected.shape}, one "
                          "value per bin (len(bins) - 1)")
    if np.isnan(expected).any() and not np.isnan(given[np.isnan(expected)]).all():
        raise CheckFailed(f"the accuracy of {what}: an empty bin should be NaN")
    raise CheckFailed(f"the accuracy of {what} has the right shape {expected.shape} but wrong values: "
                      "exact match per sentence (up to and including the first EOS), averaged per bin")


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


@exercise("seq2seq_rnn-accuracy_by_length", "accuracy_by_length")
def accuracy_by_length_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for bins, lengths, eos, pad in [
        (np.array([4, 6, 9, 12, 15]), [4, 5, 6, 8, 9, 10, 11, 6, 9, 15, 3, 5, 4, 10], 2, 0),
        (np.array([3, 5, 7, 10]), [3, 4, 5, 5, 6, 7, 7, 8, 9, 10, 4, 3], 5, 1),
    ]:
        lengths = rng.permutation(np.array(lengths, dtype=np.int64))
        pred, ref = _sentences(rng, lengths, bins, eos, pad)
        # the first set has an empty bin [12, 15): its lengths skip 12-14 and 15 is the last edge
        args = (pred, ref, lengths, bins, eos)
        what = (f"accuracy_by_length(predictions {pred.shape}, targets {ref.shape}, lengths {lengths.shape}, "
                f"bins {bins.tolist()}, eos_id={eos})")
        asked.append(Question(args, lambda got, a=args, w=what: _judge_accuracy(got, a, w)))
    return asked
