"""Mistake and variant cases of notebook 10's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6). The GRU model goes through the driver
coursekit.drivers.seq2seq_rnn.seq2seq_model, as it does while grading.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.check_cases import shared_tests
from tests.conftest import solution_namespace

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny GRUs and softmaxes: with two OpenMP threads on a loaded machine each call can wait
    tens of milliseconds for the other thread. One thread here; the previous count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def seq2seq_rnn_notebook() -> dict:
    """The reference solutions of notebook 10 (additive_attention, Seq2SeqGRU, accuracy_by_length)."""
    return solution_namespace("10_seq2seq_rnn")


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- additive_attention

def make_attention(*, dim=-1, tanh=True, use_v=True, mask_mode="right", swap=False, transposed=False,
                   returns="right", context_from="keys", numpy=False, given="used"):
    """A learner-style additive attention with knobs for the mistakes learners make. ``given``:
    what it does with projected_keys: "used", "ignored" (projects the keys itself; right too),
    "projected" again by W_k, or "unknown" (a signature without it)."""

    def additive_attention(query, keys, W_q, W_k, v, mask=None, projected_keys=None):
        if swap:
            W_q, W_k = W_k, W_q
        pq = query @ W_q if transposed else query @ W_q.T
        pk = keys @ W_k if transposed else keys @ W_k.T
        if projected_keys is not None and given in ("used", "projected"):
            pk = projected_keys @ W_k.T if given == "projected" else projected_keys
        hidden = pq[:, None, :] + pk
        hidden = torch.tanh(hidden) if tanh else hidden
        scores = hidden @ v if use_v else hidden.sum(-1)
        if mask is not None and mask_mode == "right":
            scores = scores.masked_fill(~mask, float("-inf"))
        elif mask is not None and mask_mode == "inverted":
            scores = scores.masked_fill(mask, float("-inf"))
        elif mask is not None and mask_mode == "zero":
            scores = scores.masked_fill(~mask, 0.0)
        weights = torch.softmax(scores, dim=dim)
        if mask is not None and mask_mode == "after":
            weights = weights * mask
        values = pk if context_from == "projected" else keys
        context = (weights[:, :, None] * values).sum(1)
        if numpy:
            return np.asarray(context), np.asarray(weights)
        return (weights, context) if returns == "swapped" else (context, weights)

    if given == "unknown":
        return lambda query, keys, W_q, W_k, v, mask=None: additive_attention(query, keys, W_q, W_k, v, mask)
    return additive_attention


def _attention_einsum_float64(query, keys, W_q, W_k, v, mask=None, projected_keys=None):
    q, k = query.double(), keys.double()
    pk = torch.einsum("ad,bsd->bsa", W_k.double(), k) if projected_keys is None else projected_keys.double()
    hidden = torch.tanh(torch.einsum("ad,bd->ba", W_q.double(), q)[:, None] + pk)
    scores = torch.einsum("bsa,a->bs", hidden, v.double())
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, -1e9))
    weights = scores.softmax(-1)
    return torch.einsum("bs,bsd->bd", weights, k).float(), weights.float()


def _attention_column_scores(query, keys, W_q, W_k, v, mask=None, projected_keys=None, dim=-1):
    """A learner's scores as a column, (batch, src_len, 1) from @ v[:, None], then a softmax over
    ``dim`` (None: F.softmax's implicit dim, 0 for a 3-D tensor) and a squeeze."""
    pk = keys @ W_k.T if projected_keys is None else projected_keys
    scores = torch.tanh((query @ W_q.T).unsqueeze(1) + pk) @ v[:, None]
    if mask is not None:
        scores = scores.masked_fill(~mask[..., None], float("-inf"))
    with warnings.catch_warnings():  # (torch warns that the implicit dim is deprecated: the learner's mistake)
        warnings.simplefilter("ignore")
        weights = (F.softmax(scores) if dim is None else F.softmax(scores, dim=dim)).squeeze(-1)
    return (weights.unsqueeze(-1) * keys).sum(1), weights


def _attention_functional(query, keys, W_q, W_k, v, mask=None, projected_keys=None):  # ignores projected_keys
    scores = F.linear(torch.tanh(F.linear(query, W_q).unsqueeze(1) + F.linear(keys, W_k)), v[None]).squeeze(-1)
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), -math.inf)
    weights = F.softmax(scores, dim=1)
    return torch.bmm(weights.unsqueeze(1), keys).squeeze(1), weights


def _attention_loop(query, keys, W_q, W_k, v, mask=None, projected_keys=None):
    scores = []
    for j in range(keys.shape[1]):
        pk = keys[:, j] @ W_k.T if projected_keys is None else projected_keys[:, j]
        scores.append(torch.tanh(query @ W_q.T + pk) @ v)
    scores = torch.stack(scores, dim=1)
    if mask is not None:
        scores[~mask] = -float("inf")
    weights = torch.exp(scores - scores.max(-1, keepdim=True).values)
    weights = weights / weights.sum(-1, keepdim=True)
    context = sum(weights[:, j, None] * keys[:, j] for j in range(keys.shape[1]))
    return context, weights


# ---------------------------------------------------------------- Seq2SeqGRU

def make_gru(*, init="last", feed="teacher", use_mask=True, context="attention", order="emb_first",
             store=True, names=True, out_reads_state_only=False, bidirectional=False, attention_fn=None,
             forgot_return=False, keeps_state=True, batch_first=True):
    """A learner-style Seq2SeqGRU with knobs for the mistakes learners make."""
    attend = attention_fn or make_attention()

    class Seq2SeqGRU(nn.Module):
        def __init__(self, src_vocab, tgt_vocab, d_emb, d_hidden, attention=True, pad_id=0):
            super().__init__()
            self.attention, self.pad_id = attention, pad_id
            if names:
                self.src_embed = nn.Embedding(src_vocab, d_emb, padding_idx=pad_id)
            else:
                self.embedding = nn.Embedding(src_vocab, d_emb, padding_idx=pad_id)
            self.tgt_embed = nn.Embedding(tgt_vocab, d_emb, padding_idx=pad_id)
            self.encoder = nn.GRU(d_emb, d_hidden, batch_first=batch_first, bidirectional=bidirectional)
            width = 2 * d_hidden if attention and not out_reads_state_only else d_hidden
            self.decoder = nn.GRUCell(d_emb + (d_hidden if attention else 0), d_hidden)
            if attention:
                self.attn_W_q = nn.Linear(d_hidden, d_hidden, bias=False)
                self.attn_W_k = nn.Linear(d_hidden, d_hidden, bias=False)
                self.attn_v = nn.Linear(d_hidden, 1, bias=False)
            self.out = nn.Linear(width, tgt_vocab)

        def forward(self, src, tgt_in):
            mask = src != self.pad_id
            lengths = mask.sum(1)
            embed = self.src_embed if names else self.embedding
            H, h_n = self.encoder(embed(src))
            last = H[torch.arange(len(src)), lengths - 1]
            s = {"last": last, "first": H[:, 0], "padded": h_n[0], "zeros": torch.zeros_like(last)}[init]
            logits, maps = [], []
            token = tgt_in[:, 0]
            for t in range(tgt_in.shape[1]):
                if feed == "teacher" or t == 0:
                    token = tgt_in[:, t]
                e = self.tgt_embed(token)
                if self.attention:
                    c, a = attend(s, H, self.attn_W_q.weight, self.attn_W_k.weight, self.attn_v.weight[0],
                                  mask if use_mask else None)
                    if context == "mean":
                        c = (H * mask[:, :, None]).sum(1) / lengths[:, None]
                    elif context == "last":
                        c = last
                    h = self.decoder(torch.cat([e, c] if order == "emb_first" else [c, e], -1), s)
                    s = h if keeps_state else s  # (a learner who never carries the new state forward)
                    y = self.out(h if out_reads_state_only else torch.cat([h, c], -1))
                    maps.append(a)
                else:
                    s = self.decoder(e, s)
                    y = self.out(s)
                logits.append(y)
                token = y.argmax(-1)
            if self.attention and store:
                self.attention_weights = torch.stack(maps, 1 if store is True else 2)
            if not forgot_return:
                return torch.stack(logits, 1)

    return Seq2SeqGRU


class PackedGRU(nn.Module):
    """Valid: the encoder runs on a pack_padded_sequence (h_n is the last real state), the
    decoder is an nn.GRU stepped one token at a time (its weights are named ..._l0), the
    attention is computed inline with einsum in float64."""

    def __init__(self, src_vocab, tgt_vocab, d_emb, d_hidden, attention=True, pad_id=0):
        super().__init__()
        self.attention, self.pad_id = attention, pad_id
        self.src_embed = nn.Embedding(src_vocab, d_emb, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_emb, padding_idx=pad_id)
        self.encoder = nn.GRU(d_emb, d_hidden, batch_first=True)
        self.decoder = nn.GRU(d_emb + (d_hidden if attention else 0), d_hidden, batch_first=True)
        if attention:
            self.attn_W_q = nn.Linear(d_hidden, d_hidden, bias=False)
            self.attn_W_k = nn.Linear(d_hidden, d_hidden, bias=False)
            self.attn_v = nn.Linear(d_hidden, 1, bias=False)
        self.out = nn.Linear(d_hidden * (2 if attention else 1), tgt_vocab)

    def forward(self, src, tgt_in):
        mask = src != self.pad_id
        packed = nn.utils.rnn.pack_padded_sequence(self.src_embed(src), mask.sum(1), batch_first=True,
                                                   enforce_sorted=False)
        out, h = self.encoder(packed)
        H, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        if not self.attention:
            states, _ = self.decoder(self.tgt_embed(tgt_in), h)       # the whole sequence at once
            return self.out(states)
        keys = self.attn_W_k(H).double()
        logits, maps = [], []
        for t in range(tgt_in.shape[1]):
            scores = torch.einsum("bsa,a->bs", torch.tanh(self.attn_W_q(h[0]).double()[:, None] + keys),
                                  self.attn_v.weight[0].double())
            a = scores.masked_fill(~mask, -1e9).softmax(-1)
            c = torch.einsum("bs,bsd->bd", a, H.double()).float()
            x = torch.cat([self.tgt_embed(tgt_in[:, t]), c], -1)[:, None]
            step, h = self.decoder(x, h)
            logits.append(self.out(torch.cat([step[:, 0], c], -1)))
            maps.append(a.float())
        self.attention_weights = torch.stack(maps, 1)
        return torch.stack(logits, 1)


class GatherGRU(nn.Module):
    """Valid: the last real state picked with gather, the steps written with the learner's own
    loop-based attention, float64 logits."""

    def __init__(self, src_vocab, tgt_vocab, d_emb, d_hidden, attention=True, pad_id=0):
        super().__init__()
        self.use_attention = attention
        self.pad = pad_id
        self.src_embed = nn.Embedding(src_vocab, d_emb, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_emb, padding_idx=pad_id)
        self.encoder = nn.GRU(d_emb, d_hidden, batch_first=True)
        self.decoder = nn.GRUCell(d_emb + d_hidden * attention, d_hidden)
        if attention:
            self.attn_W_q = nn.Linear(d_hidden, d_hidden, bias=False)
            self.attn_W_k = nn.Linear(d_hidden, d_hidden, bias=False)
            self.attn_v = nn.Linear(d_hidden, 1, bias=False)
        self.out = nn.Linear(d_hidden + d_hidden * attention, tgt_vocab)

    def forward(self, src, tgt_in):
        mask = src.ne(self.pad)
        H = self.encoder(self.src_embed(src))[0]
        index = (mask.sum(1) - 1).view(-1, 1, 1).expand(-1, 1, H.shape[-1])
        s = H.gather(1, index).squeeze(1)
        outputs, maps = [], []
        for t, e in enumerate(self.tgt_embed(tgt_in).unbind(1)):
            if self.use_attention:
                c, a = _attention_loop(s, H, self.attn_W_q.weight, self.attn_W_k.weight,
                                       self.attn_v.weight.squeeze(0), mask)
                s = self.decoder(torch.cat((e, c), 1), s)
                outputs.append(self.out(torch.cat((s, c), 1)).double())
                maps.append(a)
            else:
                s = self.decoder(e, s)
                outputs.append(self.out(s).double())
        if self.use_attention:
            self.attention_weights = torch.stack(maps, 1)
        return torch.stack(outputs, 1)


class NotAModule:
    def __init__(self, *args, **kwargs):
        pass


# ---------------------------------------------------------------- accuracy_by_length

def _right(predictions, targets, eos_id):
    out = []
    for p, r in zip(np.asarray(predictions).tolist(), np.asarray(targets).tolist()):
        out.append(eos_id in p and p[:p.index(eos_id)] == r[:r.index(eos_id)])
    return np.array(out)


def make_accuracy(*, bins_mode="right", empty="nan", tokens=False, eos_needed=True, after_eos=False):
    def accuracy_by_length(predictions, targets, lengths, bins, eos_id):
        predictions, targets = np.asarray(predictions), np.asarray(targets)
        lengths, bins = np.asarray(lengths), np.asarray(bins)
        if tokens:
            right = []
            for p, r in zip(predictions.tolist(), targets.tolist()):
                r = r[:r.index(eos_id) + 1]
                p = (p + [-1] * len(r))[:len(r)]
                right.append(np.mean([a == b for a, b in zip(p, r)]))
            right = np.array(right)
        elif after_eos:
            width = min(predictions.shape[1], targets.shape[1])
            right = (predictions[:, :width] == targets[:, :width]).all(1)
        elif not eos_needed:
            right = []
            for p, r in zip(predictions.tolist(), targets.tolist()):
                r = r[:r.index(eos_id)]
                right.append(p[:len(r)] == r)
            right = np.array(right)
        else:
            right = _right(predictions, targets, eos_id)
        if bins_mode == "histogram":
            counts = np.histogram(lengths, bins)[0]
            which = np.digitize(lengths, bins) - 1
            which[lengths == bins[-1]] = len(bins) - 2
        elif bins_mode == "right_closed":
            which = np.digitize(lengths, bins, right=True) - 1
            counts = np.array([(which == b).sum() for b in range(len(bins) - 1)])
        else:
            which = np.digitize(lengths, bins) - 1
            counts = np.array([(which == b).sum() for b in range(len(bins) - 1)])
        accuracy = []
        for b in range(len(bins) - 1):
            if counts[b]:
                accuracy.append(right[which == b].mean())
            else:
                accuracy.append(0.0 if empty == "zero" else float("nan"))
        return np.array(accuracy), counts

    return accuracy_by_length


def _accuracy_torch(predictions, targets, lengths, bins, eos_id):
    """Valid: coursekit.training.exact_match, then torch.bucketize."""
    from coursekit.training import exact_match

    right = exact_match(torch.as_tensor(predictions), torch.as_tensor(targets), eos_id).double()
    lengths, bins = torch.as_tensor(lengths), torch.as_tensor(bins)
    which = torch.bucketize(lengths, bins, right=True) - 1
    counts = torch.stack([(which == b).sum() for b in range(len(bins) - 1)])
    sums = torch.stack([right[which == b].sum() for b in range(len(bins) - 1)])
    return sums / counts, counts


def _accuracy_vectorized(predictions, targets, lengths, bins, eos_id):
    """Valid: everything vectorized, masks after the first EOS."""
    p, r = np.asarray(predictions), np.asarray(targets)
    width = max(p.shape[1], r.shape[1])
    p = np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=-1)
    r = np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=-1)
    has_eos = (p == eos_id).any(1)
    p_end, r_end = np.argmax(p == eos_id, 1), np.argmax(r == eos_id, 1)
    positions = np.arange(width)
    same = np.where(positions <= r_end[:, None], p == r, True).all(1)
    right = has_eos & (p_end == r_end) & same
    lengths = np.asarray(lengths)
    acc, counts = [], []
    for lo, hi in zip(bins[:-1], bins[1:]):
        inside = (lengths >= lo) & (lengths < hi)
        counts.append(inside.sum())
        with np.errstate(invalid="ignore"):
            acc.append(right[inside].sum() / inside.sum() if inside.any() else np.nan)
    return np.array(acc, dtype=np.float32), np.array(counts)


MISTAKES = {
    "seq2seq_rnn-additive_attention": [
        (lambda *a, **k: _attention_column_scores(*a, **k, dim=None), "F.softmax without a dim picks dim=0"),
        (lambda *a, **k: _attention_column_scores(*a, **k, dim=-1), "the softmax runs over an axis of size 1"),
        (make_attention(dim=0), "the softmax runs over the batch axis"),
        (make_attention(tanh=False), "tanh is missing"),
        (make_attention(use_v=False), "v is missing"),
        (make_attention(mask_mode="ignored"), "the mask is ignored"),
        (make_attention(mask_mode="inverted"), "the mask is inverted"),
        (make_attention(mask_mode="zero"), "the masked scores are set to 0"),
        (make_attention(mask_mode="after"), "it masks after the softmax"),
        (make_attention(swap=True), "W_q for the query, W_k for the keys"),
        (make_attention(transposed=True), "query @ W_q.T"),
        (make_attention(returns="swapped"), "returns (weights, context)"),
        (make_attention(context_from="projected"), "it sums the projected keys"),
        (make_attention(numpy=True), "returns a numpy array for a torch tensor input"),
        (make_attention(given="projected"), "the projected_keys it was given are multiplied by W_k again"),
        (make_attention(given="unknown"), "takes an optional last argument, projected_keys=None"),
        (stub, "not answered yet"),
    ],
    "seq2seq_rnn-Seq2SeqGRU": [
        (make_gru(keeps_state=False), "the decoder's state is never carried forward"),
        (make_gru(batch_first=False), "the encoder's nn.GRU reads its input as (seq_len, batch, d_emb)"),
        (make_gru(init="first"), "the decoder starts from the encoder's FIRST state"),
        (make_gru(init="padded"), "the encoder's state after the padding"),
        (make_gru(init="zeros"), "the decoder starts from zeros"),
        (make_gru(feed="free"), "feeds its own predictions back"),
        (make_gru(use_mask=False), "the attention ignores the padding mask"),
        (make_gru(context="mean"), "the attention weights are not used"),
        (make_gru(context="last"), "the context is the encoder's last state at every step"),
        (make_gru(order="ctx_first"), "the docstring's order is cat([embedding, context], -1)"),
        (make_gru(store=False), "store the weights of every step as self.attention_weights"),
        (make_gru(store="transposed"), "the attention_weights of"),
        (make_gru(forgot_return=True), "Seq2SeqGRU.forward returns nothing (None)"),
        (make_gru(names=False), "has no parameter src_embed.weight"),
        (make_gru(out_reads_state_only=True), "out.weight has shape"),
        (make_gru(bidirectional=True), "has parameters the docstring does not name"),
        (make_gru(attention_fn=make_attention(tanh=False)), "differ already at the first step"),
        (NotAModule, "is not a torch.nn.Module"),
        (stub, "it should be a class"),
        (type("Stub", (nn.Module,), {"__init__": lambda self, *a, **k: stub()}), "not answered yet"),
    ],
    "seq2seq_rnn-accuracy_by_length": [
        (make_accuracy(bins_mode="right_closed"), "the bins are closed on the right"),
        (make_accuracy(bins_mode="histogram"), "np.histogram does that"),
        (make_accuracy(empty="zero"), "an empty bin gets 0"),
        (make_accuracy(tokens=True), "it averages over tokens"),
        (make_accuracy(eos_needed=False), "even with no EOS or a late one"),
        (make_accuracy(after_eos=True), "it compares the tokens after EOS too"),
        (stub, "not answered yet"),
    ],
}

VARIANTS = {
    "seq2seq_rnn-additive_attention": [make_attention(), lambda *a, **k: _attention_column_scores(*a, **k, dim=1), make_attention(given="ignored"), _attention_einsum_float64,
                                       _attention_functional, _attention_loop],
    "seq2seq_rnn-Seq2SeqGRU": [make_gru(), PackedGRU, GatherGRU],
    "seq2seq_rnn-accuracy_by_length": [make_accuracy(), _accuracy_torch, _accuracy_vectorized],
}


globals().update(shared_tests("seq2seq_rnn", MISTAKES, VARIANTS, solutions="seq2seq_rnn_notebook", seeds=8))


def test_reference_matches_torch_gru():
    """The grader's numpy GRU step equals torch.nn.GRUCell (gate order r, z, n)."""
    from grader.checks.seq2seq_rnn import _gru

    torch.manual_seed(0)
    cell = nn.GRUCell(5, 4)
    x, h = torch.randn(3, 5), torch.randn(3, 4)
    with torch.no_grad():
        want = cell(x, h).numpy()
    got = _gru(x.numpy().astype(np.float64), h.numpy().astype(np.float64),
               *(p.detach().numpy().astype(np.float64) for p in (cell.weight_ih, cell.weight_hh, cell.bias_ih,
                                                                 cell.bias_hh)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_padding_does_not_change_the_reference_model(seq2seq_rnn_notebook):
    """The notebook's claim: extra padding columns on the source leave the logits unchanged."""
    torch.manual_seed(1)
    model = seq2seq_rnn_notebook["Seq2SeqGRU"](9, 7, 4, 6, attention=True).eval()
    src = torch.tensor([[3, 4, 5, 0], [6, 2, 0, 0]])
    tgt_in = torch.tensor([[1, 3, 4], [1, 5, 6]])
    with torch.no_grad():
        a = model(src, tgt_in)
        b = model(torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], 1), tgt_in)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
