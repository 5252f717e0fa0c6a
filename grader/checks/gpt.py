"""Hidden checks of notebook 12, gpt: the pre-norm block, the decoder-only model with tied
weights, the next-token loss, perplexity, the sampling distribution (temperature, top-k,
top-p), the KV cache and beam search with a length penalty.

The references are learner-style torch code (``reference/gpt.py``), run through the same
drivers as the learner's (``coursekit/drivers/gpt.py``): the block and the model are loaded
with the weights drawn here by name; perplexity and beam search get a bigram stand-in model
whose logits are a drawn table; the KV cache gets the parts of a GPT with drawn weights.

Sizes are pairwise distinct (batch 2, heads 3, d_k 4, sequence length 5 or 6, vocabulary 11)
so that a swapped axis raises or shows. Inputs are drawn without ties: top-k and top-p cut
nowhere near a tie, and beam search never compares two equal scores.
"""
from __future__ import annotations

import json
import math

import numpy as np
import torch
import torch.nn.functional as F

from coursekit.probe import collect
from coursekit.protocol import Unsupported

from ..wire import decode_payload
from ._core import (ATOL, RTOL, _one_thread, Call, Case, CheckFailed, Hint, Knob, Mistake, Raised, Raises, Rule, Spec, _equal,
                    _explain_raised, catalogued, judge_case, to_array, value)
from .reference import gpt as ref
from .reference.multi_head import merge_heads, scaled_dot_product_attention, split_heads
from .transformer import _tokens, draw_weights

DEEP_ATOL = 1e-4  # stacks of blocks in float32


# ---------------------------------------------------------------- weights by name

def _block_shapes(d: int, f: int, prefix: str = "") -> list:
    attn = [(f"{prefix}attn.{w}.{p}", (d, d) if p == "weight" else (d,))
            for w in ("W_q", "W_k", "W_v", "W_o") for p in ("weight", "bias")]
    return attn + [(f"{prefix}norm1.weight", (d,)), (f"{prefix}norm1.bias", (d,)),
                   (f"{prefix}norm2.weight", (d,)), (f"{prefix}norm2.bias", (d,)),
                   (f"{prefix}linear1.weight", (f, d)), (f"{prefix}linear1.bias", (f,)),
                   (f"{prefix}linear2.weight", (d, f)), (f"{prefix}linear2.bias", (d,))]


def _model_shapes(cfg: dict) -> list:
    d, v = cfg["d_model"], cfg["vocab_size"]
    shapes = [("tok_embed.weight", (v, d)), ("pos_embed.weight", (cfg["max_len"], d))]
    for i in range(cfg["layers"]):
        shapes += _block_shapes(d, cfg["d_ff"], f"blocks.{i}.")
    shapes += [("norm.weight", (d,)), ("norm.bias", (d,))]
    return shapes + ([] if cfg["tie_weights"] else [("lm_head.weight", (v, d))])


def _packed(cfg: dict, shapes: list, p: dict) -> tuple[str, np.ndarray]:
    spec = json.dumps({**cfg, "params": [[n, list(s)] for n, s in shapes]})
    return spec, np.concatenate([p[n].ravel() for n, _ in shapes])


def _differs(exercise: str, other: object, driver: str | None, reference: object, part: int | None = None):
    """A rule's test (:class:`Rule`): on the call, ``other`` answers otherwise than ``reference``
    (in its item ``part``, if given), both run and compared as grading runs and compares answers;
    never for a call where either does not answer with data (a raised error)."""

    def exercised(call: Call) -> bool:
        answers = [decode_payload(collect(exercise, fn, [call.call()], driver), exercise)[0]
                   for fn in (reference, other)]
        if any(isinstance(a, (Raised, Unsupported)) for a in answers):
            return False
        if part is not None:
            answers = [a[part] for a in answers]
        return not _equal(answers[0], answers[1], RTOL, ATOL, nan=True)

    return exercised


def _first(answer: object, call: Call, what: str) -> np.ndarray:
    """The first of the two outputs the drivers hand back (module called twice in eval mode)."""
    if not isinstance(answer, tuple) or len(answer) < 2:
        raise CheckFailed(f"{what}: expected one tensor")
    return to_array(answer[0], what)


def _same_twice(case: Case) -> None:
    """Two calls in eval mode must agree, or dropout is still on."""
    a, b = (to_array(x, case.what) for x in case.answer[:2])
    if a.shape != b.shape or not np.allclose(a, b, rtol=case.spec.rtol, atol=case.spec.atol, equal_nan=True):
        case.fail("two calls in eval mode gave different outputs, so dropout is still on in eval mode. Use "
                  "nn.Dropout modules (model.eval() switches them off), or F.dropout(x, p, training=self.training)")


NAN_MASK = ("NaN in the output: some query has no key left. Does the causal mask hide the diagonal (a position "
            "must see itself: torch.tril(ones, diagonal=0)), or is it inverted (the course's masks: True = may "
            "attend)?")


# ---------------------------------------------------------------- the block

def _block_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for d, h, f, shape in [(12, 3, 20, (2, 5)), (10, 2, 6, (3, 4))]:
        shapes = _block_shapes(d, f)
        spec, flat = _packed(dict(d_model=d, heads=h, d_ff=f), shapes, draw_weights(rng, shapes))
        x = rng.normal(size=shape + (d,))
        what = f"Block(d_model={d}, heads={h}, d_ff={f})(x) for x {x.shape}"
        asked.append(Call((spec, flat, x), what=what))
    return asked


_MASKS = {"causal": 0, "one_ahead": 1, "hides_diagonal": -1}


def _block_variant(norm="pre", mask="causal", activation="gelu", residual=True):
    """A Block with some of its choices wrong (the spec's knobs)."""
    act = {"gelu": F.gelu, "relu": torch.relu, "tanh_gelu": lambda t: F.gelu(t, approximate="tanh"),
           "none": lambda t: t}[activation]
    post = {"pre": (), "post": (0, 1), "post_attention": (0,), "post_mlp": (1,)}[norm]   # the post-norm sublayers

    class Block(ref.Block):
        def mask(self, length):
            if mask == "none":
                return None
            return torch.tril(torch.ones(length, length, dtype=torch.bool), diagonal=_MASKS[mask])

        def mlp(self, h):
            return self.dropout(self.linear2(self.dropout(act(self.linear1(h)))))

        def forward(self, x):
            for i, (sublayer, layer_norm) in enumerate(((self.attend, self.norm1), (self.mlp, self.norm2))):
                if i in post:
                    x = layer_norm(x + sublayer(x))
                else:
                    x = (x if residual else 0) + sublayer(layer_norm(x))
            return x

    return Block


def _judge_block(case: Case) -> None:
    _explain_raised(case)
    value(case.answer, case.what)
    if isinstance(case.answer, tuple) and len(case.answer) == 2:
        _same_twice(case)
    judge_case(case)


class _FunctionalDropoutBlock(ref.Block):
    def attend(self, h):
        return F.dropout(self.attn(h, h, h, self.mask(h.shape[1]))[0], 0.3)


class _TorchAttentionBlock(ref.Block):
    def __init__(self, d_model, heads, d_ff, dropout=0.0):
        super().__init__(d_model, heads, d_ff, dropout)
        self.attn = torch.nn.MultiheadAttention(d_model, heads, batch_first=True)


BLOCK = Spec(
    id="gpt-Block",
    submodules=("attn", "attn.W_q", "attn.W_k", "attn.W_v", "attn.W_o", "norm1", "norm2", "linear1", "linear2"),
    rules=(
        Rule("position t attends to positions 0 ... t only", _differs("gpt-Block", _block_variant(mask="none"),
                                                                      "gpt.block", ref.Block)),
        Rule("and to itself", _differs("gpt-Block", _block_variant(mask="hides_diagonal"), "gpt.block", ref.Block)),
        Rule("pre-norm: x + sublayer(norm(x))", _differs("gpt-Block", _block_variant(norm="post"), "gpt.block",
                                                         ref.Block)),
        Rule("the exact GELU", _differs("gpt-Block", _block_variant(activation="tanh_gelu"), "gpt.block", ref.Block)),
    ),
    function="Block",
    driver="gpt.block",
    inputs=_block_calls,
    reference=ref.Block,
    prepare=_first,
    judge=_judge_block,
    atol=DEEP_ATOL,
    variant=_block_variant,
    knobs=(
        Knob("norm", (("post", "it normalizes after the residual sum, norm(x + sublayer(x)): the 2017 paper's "
                               "post-norm. This block is pre-norm, as in GPT-2: x + sublayer(norm(x))"),
                      ("post_attention", "the attention sublayer normalizes after the residual sum, norm1(x + "
                                         "attn(x)): both sublayers are pre-norm, x + sublayer(norm(x)) "
                                         "(sublayer_connection(..., norm_first=True))"),
                      ("post_mlp", "the MLP sublayer normalizes after the residual sum, norm2(x + mlp(x)): both "
                                   "sublayers are pre-norm, x + sublayer(norm(x)) (sublayer_connection(..., "
                                   "norm_first=True))"))),
        Knob("mask", (("none", "the self-attention has no causal mask, so position t reads the tokens after it. "
                               "Pass causal_mask(seq_len) to self.attn"),
                      ("one_ahead", "the causal mask lets each position see one token ahead (torch.tril(..., "
                                    "diagonal=1)): position t may attend to positions 0 ... t only"))),
        Knob("activation", (("relu", "the feed-forward network uses ReLU; GPT uses GELU: F.gelu(x), as "
                                     "torch's TransformerEncoderLayer(activation='gelu')"),
                            ("none", "the feed-forward network has no activation, so linear2(linear1(h)) is one "
                                     "linear map: apply F.gelu between the two layers"),
                            ("tanh_gelu", "the feed-forward network uses the tanh approximation of GELU "
                                          "(GPT-2's code); this block uses the exact GELU, F.gelu(x), as "
                                          "torch's TransformerEncoderLayer(activation='gelu')"))),
        Knob("residual", ((False, "there is no residual connection: x + sublayer(norm(x)), not sublayer(norm(x))"),)),
    ),
    hints=(
        Hint(NAN_MASK, lambda got, call: bool(np.isnan(got).any()), example=_block_variant(mask="hides_diagonal")),
    ),
    errors=(
        Raises("{what}: the grader could not load its weights into your Block: {error}",
               match="has no parameter|should have shape|one tensor|does not name",
               example=_TorchAttentionBlock),
    ),
    diagnosed=(
        Mistake("functional_dropout", "dropout is still on in eval mode", _FunctionalDropoutBlock),
    ),
)


# ---------------------------------------------------------------- the model

def _model_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for cfg, ids_shape in [
        (dict(vocab_size=11, d_model=12, heads=3, d_ff=20, layers=2, max_len=9, tie_weights=True), (2, 6)),
        (dict(vocab_size=13, d_model=10, heads=2, d_ff=6, layers=1, max_len=7, tie_weights=False), (3, 7)),
    ]:
        shapes = _model_shapes(cfg)
        spec, flat = _packed(cfg, shapes, draw_weights(rng, shapes))
        ids = rng.integers(0, cfg["vocab_size"], size=ids_shape).astype(np.int64)
        what = (f"GPT(vocab_size={cfg['vocab_size']}, d_model={cfg['d_model']}, heads={cfg['heads']}, "
                f"d_ff={cfg['d_ff']}, layers={cfg['layers']}, max_len={cfg['max_len']}, "
                f"tie_weights={cfg['tie_weights']})(ids) for ids {ids.shape}")
        asked.append(Call((spec, flat, ids), what=what))
    spec, flat, _ = asked[0].args
    long = rng.integers(0, 11, size=(1, 10)).astype(np.int64)
    asked.append(Call((spec, flat, long), raises="ValueError",
                      what="GPT(..., max_len=9)(ids) for ids of 10 tokens, longer than max_len"))
    return asked


def _model_variant(positions="learned", scale=False, final_norm=True):
    """A GPT with some of its choices wrong (the spec's knobs)."""

    class GPT(ref.GPT):
        def positions(self, length):
            return torch.arange(1, length + 1) if positions == "from_one" else torch.arange(length)

        def embed(self, ids):
            tokens = self.tok_embed(ids) * (math.sqrt(self.tok_embed.embedding_dim) if scale else 1.0)
            return tokens + (0 if positions == "none" else self.pos_embed(self.positions(ids.shape[1])))

        def head(self, x):
            return self.lm_head(self.norm(x) if final_norm else x)

    return GPT


def _after_head(fn):
    class GPT(ref.GPT):
        def head(self, x):
            return fn(ref.GPT.head(self, x))

    return GPT


def _logits(answer: object, call: Call, what: str) -> np.ndarray:
    if not isinstance(answer, tuple) or len(answer) != 3:
        raise CheckFailed(f"{what}: expected the logits, one tensor (batch, seq_len, vocab_size)")
    logits = to_array(answer[0], what)
    batch, length = np.shape(call.args[2])
    if length > 1 and logits.ndim == 2 and logits.shape[0] == batch:
        raise CheckFailed(f"{what} has shape {logits.shape}: the logits of the last position only. Return those of "
                          f"every position, (batch, seq_len, vocab_size) = ({batch}, {length}, vocab_size): lm_head on "
                          "the whole sequence (the loss scores every position, generation takes [:, -1] itself)")
    return logits


def _judge_model(case: Case) -> None:
    """Dropout in eval mode and tying first, then the logits (the catalogue)."""
    if case.call.raises:
        message = getattr(case.answer, "message", "")
        if isinstance(case.answer, Raised) and not message.startswith(("ValueError", "NotImplementedError")):
            case.fail(f"raised {message}: check the length first, and raise ValueError for a sequence longer than "
                      "max_len (pos_embed has no row for position max_len)")
        return judge_case(case)
    _explain_raised(case)
    value(case.answer, case.what)
    _logits(case.answer, case.call, case.what)
    _same_twice(case)
    tied, count, other_p = (int(v) for v in np.asarray(case.answer[2]).reshape(-1)[:3])
    want_tied, want_count, _ = (int(v) for v in np.asarray(case.expected[2]).reshape(-1)[:3])
    if tied != want_tied:
        case.fail("lm_head.weight should " + ("" if want_tied else "not ") + "be tok_embed.weight" +
                  (": with tie_weights=True, self.lm_head.weight = self.tok_embed.weight" if want_tied else
                   ": tie only when tie_weights is True"))
    if count != want_count:
        case.fail(f"the model has {count} parameters; expected {want_count}")
    judge_case(case)
    if other_p:
        case.fail(f"the logits are right, but {other_p} of the model's nn.Dropout modules have another p than the "
                  "dropout given, so training would drop another share: pass dropout on, to nn.Dropout(dropout) "
                  "and to every Block(d_model, heads, d_ff, dropout)")


class _SharedBlocks(ref.GPT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.blocks = torch.nn.ModuleList([self.blocks[0]] * len(self.blocks))


class _CopiedHead(ref.GPT):
    def __init__(self, *args, tie_weights=True, **kwargs):
        super().__init__(*args, tie_weights=False, **kwargs)
        if tie_weights:
            with torch.no_grad():
                self.lm_head.weight.copy_(self.tok_embed.weight)  # a copy at the start, two tensors after


class _FunctionalDropoutModel(ref.GPT):
    def embed(self, ids):
        return F.dropout(super().embed(ids), 0.3)


class _SinusoidalModel(ref.GPT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        del self.pos_embed


class _BlocksWithoutDropout(ref.GPT):
    def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len, tie_weights=True, dropout=0.0):
        super().__init__(vocab_size, d_model, heads, d_ff, layers, max_len, tie_weights, dropout)
        self.blocks = torch.nn.ModuleList([self.block(d_model, heads, d_ff) for _ in range(layers)])


class _NoLengthCheck(ref.GPT):
    def forward(self, ids):
        x = self.dropout(self.embed(ids))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


GPT = Spec(
    id="gpt-GPT",
    submodules=("tok_embed", "pos_embed", "blocks.*", "blocks.*.attn", "blocks.*.norm1", "blocks.*.norm2",
                "blocks.*.linear1", "blocks.*.linear2", "norm", "lm_head"),
    rules=(
        Rule("ValueError if T > max_len", lambda call: call.raises == "ValueError"),
        Rule("T = max_len is allowed", lambda call: not call.raises
             and np.shape(call.args[2])[1] == json.loads(call.args[0])["max_len"]),
        Rule("with tie_weights, lm_head.weight IS tok_embed.weight",
             lambda call: not call.raises and json.loads(call.args[0])["tie_weights"]),
        Rule("without tie_weights, lm_head is a parameter of its own",
             lambda call: not call.raises and not json.loads(call.args[0])["tie_weights"]),
        Rule("learned positions 0 ... T - 1", _differs("gpt-GPT", _model_variant(positions="from_one"), "gpt.model",
                                                       ref.GPT, part=0)),
    ),
    function="GPT",
    driver="gpt.model",
    inputs=_model_calls,
    reference=ref.GPT,
    prepare=_logits,
    judge=_judge_model,
    atol=DEEP_ATOL,
    depends=("gpt-Block",),
    variant=_model_variant,
    knobs=(
        Knob("positions", (("none", "there are no positions: add pos_embed(torch.arange(seq_len)) to the token "
                                    "embeddings, or the model cannot tell word order"),
                           ("from_one", "the positions start at 1: the first token is position 0, "
                                        "pos_embed(torch.arange(seq_len))"))),
        Knob("scale", ((True, "the token embeddings are multiplied by sqrt(d_model) (notebook 09's encoder-decoder "
                              "did, as the 2017 paper); GPT adds tok_embed(ids) + pos_embed(positions) as they are"),)),
        Knob("final_norm", ((False, "there is no final layer norm: with pre-norm blocks the residual stream is never "
                                    "normalized, so apply self.norm to it before lm_head"),)),
    ),
    mistakes=(
        Mistake("probabilities", "it returns probabilities (a softmax of the logits): return lm_head's raw logits; "
                "the loss applies log_softmax itself", _after_head(lambda z: z.softmax(-1))),
        Mistake("log_probabilities", "it returns log-probabilities: return lm_head's raw logits; the loss applies "
                "log_softmax itself", _after_head(lambda z: z.log_softmax(-1))),
        Mistake("blocks_without_mask", "position t sees the tokens after it: the blocks' self-attention has no causal "
                "mask (see Block)", type("GPT", (ref.GPT,), {"block": _block_variant(mask="none")})),
        Mistake("blocks_post_norm", "the blocks normalize after the residual sum (post-norm); GPT's blocks are "
                "pre-norm, x + sublayer(norm(x)) (see Block)", type("GPT", (ref.GPT,), {"block": _block_variant(norm="post")})),
    ),
    errors=(
        Raises("{what}: the grader could not load its weights into your model: {error}",
               match="has no parameter|should have shape|one tensor|does not name|lm_head.weight is tok_embed",
               example=_SharedBlocks),
    ),
    diagnosed=(
        Mistake("copied_head", "self.lm_head.weight = self.tok_embed.weight (one nn.Parameter, not a copy)",
                _CopiedHead),
        Mistake("sinusoidal_positions", "has no parameter pos_embed.weight", _SinusoidalModel),
        Mistake("functional_dropout", "dropout is still on in eval mode", _FunctionalDropoutModel),
        Mistake("no_length_check", "raise ValueError for a sequence longer than max_len", _NoLengthCheck),
        Mistake("blocks_without_dropout", "to every Block(d_model, heads, d_ff, dropout)", _BlocksWithoutDropout),
    ),
    equivalent=(
        ("L31 1 -> 0", "only the text of the ValueError changes (it names the batch size, not the length)"),
    ),
)


# ---------------------------------------------------------------- the next-token loss

def _loss_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for batch, length, vocab, pad, lengths in [(3, 6, 7, 0, (6, 3, 5)), (2, 5, 9, 4, (5, 2))]:
        logits = rng.normal(scale=2.0, size=(batch, length, vocab))
        ids = _tokens(rng, batch, length, vocab, pad, lengths)
        if pad:
            ids[0, 1] = 0  # a target 0 that is not padding: ignore_index=pad_id, not 0
        what = f"next_token_loss(logits {logits.shape}, ids {ids.shape}, pad_id={pad})"
        asked.append(Call((logits, ids, pad), what=what))
    return asked


# What F.log_softmax(z) or F.softmax(z) without dim normalises over: torch's legacy choice, dim 0 for a
# 0-, 1- or 3-d tensor (the batch axis of (batch, seq_len, vocab) logits), else dim 1.
IMPLICIT_DIM = ("the softmax runs over the batch axis: F.log_softmax(z) or F.softmax(z) without dim picks dim 0 "
                "for a 3-d tensor (batch, seq_len, vocab_size), with a warning. Pass dim=-1, over the vocabulary")


def _log_probabilities_over(z: torch.Tensor, dim: str) -> torch.Tensor:
    """(batch, seq_len, vocab) logits -> log-probabilities over the vocabulary, or over ``dim="batch"``."""
    return F.log_softmax(z, dim=0 if dim == "batch" else -1)


def _loss_variant(shift="right", pad="ignored", reduction="tokens", dim="vocab"):
    """next_token_loss with some of its choices wrong (the spec's knobs)."""

    def next_token_loss(logits, ids, pad_id):
        z, target = {"right": (logits[:, :-1], ids[:, 1:]), "none": (logits, ids),
                     "reversed": (logits[:, 1:], ids[:, :-1])}[shift]
        ignore = {"ignored": pad_id, "counted": -100, "zero": 0}[pad]
        per_token = F.nll_loss(_log_probabilities_over(z, dim).transpose(1, 2), target, ignore_index=ignore,
                               reduction="none")
        kept = target != ignore
        if reduction == "sum":
            return per_token.sum()
        if reduction == "sentences":
            return torch.stack([row[k].mean() for row, k in zip(per_token, kept) if k.any()]).mean()
        return per_token[kept].mean()

    return next_token_loss


def _scalar(answer: object, call: Call, what: str) -> np.ndarray:
    arr = to_array(answer, what)
    if arr.shape not in ((), (1,)):
        raise CheckFailed(f"{what} should be a scalar (a 0-d tensor), but it has shape {arr.shape}: average "
                          "over the predicted tokens")
    return arr.reshape(())


def _targets(ids: np.ndarray, pad: int) -> np.ndarray:
    """Which of ids[:, 1:] are predicted (not pad)."""
    return np.asarray(ids)[:, 1:] != pad


NEXT_TOKEN_LOSS = Spec(
    id="gpt-next_token_loss",
    rules=(
        Rule("the targets equal to pad_id are ignored", lambda call: not _targets(*call.args[1:]).all()),
        Rule("pad_id, not a fixed id: a target 0 that is not padding",
             lambda call: call.args[2] != 0 and bool((np.asarray(call.args[1])[:, 1:] == 0).any())),
        Rule("averaged over the targets: sentences with different numbers of them",
             lambda call: len(set(_targets(*call.args[1:]).sum(1).tolist())) > 1),
    ),
    function="next_token_loss",
    driver="tensors",
    inputs=_loss_calls,
    reference=ref.next_token_loss,
    prepare=_scalar,
    variant=_loss_variant,
    knobs=(
        Knob("shift", (("none", "the targets are not shifted: position t is scored on token t, the token it "
                                "already reads, so the model learns to copy. Position t predicts token t + 1: "
                                "compare logits[:, :-1] with ids[:, 1:]"),
                       ("reversed", "the shift is reversed: logits[:, 1:] against ids[:, :-1] scores each "
                                    "position on the token before it. Compare logits[:, :-1] with ids[:, 1:]"))),
        Knob("pad", (("counted", "the padding targets count: ignore the targets equal to pad_id "
                                 "(F.cross_entropy(..., ignore_index=pad_id))"),
                     ("zero", "it ignores token 0, not pad_id: pass ignore_index=pad_id"))),
        Knob("reduction", (("sum", "it sums over the tokens; take the mean over the predicted (non-padding) tokens"),
                           ("sentences", "it averages per sentence, then over sentences; average over all "
                                         "predicted tokens of the batch at once"))),
        Knob("dim", (("batch", IMPLICIT_DIM),)),
    ),
    hints=(
        Hint("a cross-entropy is never negative: take the log-probabilities, F.log_softmax(logits, -1), or pass the raw "
             "logits to F.cross_entropy", lambda got, call: bool(np.all(got < 0)),
             example=lambda logits, ids, pad_id: F.nll_loss(logits[:, :-1].softmax(-1).transpose(1, 2), ids[:, 1:],
                                                             ignore_index=pad_id)),
    ),
    errors=(
        Raises("{what} raised {error}: the logits and the targets must lose one position each, logits[:, :-1] "
               "(no prediction after the last token) and ids[:, 1:] (no prediction of the first)",
               match="batch_size|size of tensor|shape",
               example=lambda logits, ids, pad_id: F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                                   ids.reshape(-1), ignore_index=pad_id)),
    ),
)


# ---------------------------------------------------------------- perplexity

def _perplexity_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for vocab, pad, shapes, lengths in [
        (7, 0, [(2, 6), (3, 4), (1, 7)], [(6, 2), (4, 4, 3), (7,)]),
        (6, 3, [(3, 5), (2, 3)], [(5, 2, 4), (3, 3)]),
    ]:
        table = rng.normal(scale=1.5, size=(vocab, vocab))
        packed = np.full((len(shapes), 3, 7), pad, dtype=np.int64)
        for i, ((rows, cols), lens) in enumerate(zip(shapes, lengths)):
            packed[i, :rows, :cols] = _tokens(rng, rows, cols, vocab, pad, lens)
        sizes = np.array(shapes, dtype=np.int64)
        what = (f"perplexity(model, batches, pad_id={pad}) for {len(shapes)} batches of shapes "
                f"{', '.join(str(s) for s in shapes)}, on a stand-in model")
        asked.append(Call((table, packed, sizes, pad), what=what))
    return asked


def _perplexity_variant(weighting="tokens", pad="ignored", shift="right", base="e", evaluate=True, dim="vocab"):
    """perplexity with some of its choices wrong (the spec's knobs)."""

    @torch.no_grad()
    def perplexity(model, batches, pad_id):
        if evaluate:
            model.eval()
        losses, counts, sentences = [], [], []
        for ids in batches:
            logits = model(ids)
            z, target = (logits[:, :-1], ids[:, 1:]) if shift == "right" else (logits, ids)
            ignore = pad_id if pad == "ignored" else -100
            per_token = F.nll_loss(_log_probabilities_over(z, dim).transpose(1, 2), target, ignore_index=ignore,
                                   reduction="none")
            kept = (target != ignore).sum(1)
            losses.append(per_token.sum().item())
            counts.append(int(kept.sum()))
            sentences += (per_token.sum(1)[kept > 0] / kept[kept > 0]).tolist()
        exp = math.exp if base == "e" else lambda x: 2.0 ** x
        if weighting == "sentences":
            return exp(sum(sentences) / len(sentences))
        if weighting == "batches":
            return exp(sum(loss / n for loss, n in zip(losses, counts)) / len(losses))
        if weighting == "perplexities":
            return sum(exp(loss / n) for loss, n in zip(losses, counts)) / len(losses)
        return exp(sum(losses) / sum(counts))

    return perplexity


def _ppl(answer: object, call: Call, what: str) -> np.ndarray:
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise CheckFailed(f"{what}: expected one number")
    return to_array(answer[0], what).reshape(())


def _judge_perplexity(case: Case) -> None:
    _explain_raised(case)
    value(case.answer, case.what)
    training, calls = (int(v) for v in np.asarray(case.answer[1]).reshape(-1)[:2])
    batches = len(case.call.args[2])
    if training:
        case.fail("the model was in training mode, so dropout was on: call model.eval() first (the notebook "
                  "measures perplexity right after training)")
    if calls != batches:
        case.fail(f"it called the model {calls} times for {batches} batches: once per batch")
    judge_case(case)


def _batch_targets(call: Call) -> list[np.ndarray]:
    """The number of predicted tokens of each sentence, per batch of a perplexity call."""
    _, packed, shapes, pad = call.args
    return [_targets(packed[i, :r, :c], pad).sum(1) for i, (r, c) in enumerate(np.asarray(shapes).tolist())]


PERPLEXITY = Spec(
    id="gpt-perplexity",
    rules=(
        Rule("over every batch: batches with different numbers of predicted tokens",
             lambda call: len({int(n.sum()) for n in _batch_targets(call)}) > 1),
        Rule("over every predicted token: sentences with different numbers of them",
             lambda call: len(set(np.concatenate(_batch_targets(call)).tolist())) > 1),
        Rule("the targets that are pad_id are not predicted tokens",
             lambda call: any(not _targets(call.args[1][i, :r, :c], call.args[3]).all()
                              for i, (r, c) in enumerate(np.asarray(call.args[2]).tolist()))),
    ),
    function="perplexity",
    driver="gpt.evaluation",
    inputs=_perplexity_calls,
    reference=ref.perplexity,
    prepare=_ppl,
    judge=_judge_perplexity,
    rtol=1e-5,
    variant=_perplexity_variant,
    knobs=(
        Knob("weighting", (("batches", "it averages the batches' mean losses, so a batch of few tokens weighs as "
                                       "much as a large one: sum the negative log-likelihoods of all tokens, divide "
                                       "by the number of predicted tokens, then exp"),
                           ("perplexities", "it averages the batches' perplexities: perplexity is the exp of the "
                                            "mean loss over ALL predicted tokens, exp(total NLL / tokens)"),
                           ("sentences", "it averages the sentences' mean losses, so a short sentence weighs as much "
                                         "as a long one: sum the negative log-likelihoods of all tokens, divide by "
                                         "the number of predicted tokens, then exp"))),
        Knob("dim", (("batch", IMPLICIT_DIM),)),
        Knob("pad", (("counted", "the padding targets count as predicted tokens: leave out the targets equal to "
                                 "pad_id, from the losses and from the count"),)),
        Knob("shift", (("none", "it scores position t on token t, not t + 1: the predicted tokens are ids[:, 1:], "
                                "against logits[:, :-1]"),)),
        Knob("base", (("two", "it raises 2 to a loss in nats: exp(loss) with natural logarithms (or 2 ** loss "
                              "with the loss in bits, the same number)"),)),
    ),
    mistakes=(
        Mistake("mean_loss", "it returns the mean loss; perplexity is its exponential, exp(total NLL / tokens)",
                lambda model, batches, pad_id: math.log(ref.perplexity(model, batches, pad_id))),
    ),
    diagnosed=(
        Mistake("no_eval", "call model.eval() first", _perplexity_variant(evaluate=False)),
        Mistake("twice", "once per batch", lambda model, batches, pad_id: (
            model.eval(), [model(ids) for ids in batches], ref.perplexity(model, batches, pad_id))[2]),
    ),
)


# ---------------------------------------------------------------- GPT-2's initialisation

INIT_STD = 0.02   # GPT-2's (nanoGPT's _init_weights)
_SIGMAS = 6.0     # bands of 6 standard errors: a right answer falls outside with probability < 1e-8


def _init_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for cfg in (dict(vocab_size=40, d_model=32, heads=4, d_ff=48, layers=2, max_len=24, tie_weights=True),
                dict(vocab_size=30, d_model=24, heads=3, d_ff=40, layers=3, max_len=20, tie_weights=False)):
        what = f"gpt2_init(GPT(d_model={cfg['d_model']}, layers={cfg['layers']}, tie_weights={cfg['tie_weights']}))"
        asked.append(Call((json.dumps(cfg), int(rng.integers(2**31))), what=what))
    return asked


def _init_kind(name: str) -> str:
    """residual (W_o, linear2 weights), matrix (other linear weights), embedding, bias, norm_weight, norm_bias."""
    parts = name.split(".")
    if parts[0] in ("tok_embed", "pos_embed"):
        return "embedding"
    if len(parts) > 1 and parts[-2].startswith("norm"):
        return f"norm_{parts[-1]}"
    if parts[-1] == "bias":
        return "bias"
    return "residual" if parts[-2] in ("W_o", "linear2") else "matrix"


def _init_judge(case: Case) -> None:
    _explain_raised(case)
    if not isinstance(case.answer, tuple) or len(case.answer) != 2:
        case.fail(f"{case.what}: expected the statistics of the model's parameters")
    stats, returned = to_array(case.answer[0], case.what), to_array(case.answer[1], case.what)
    cfg = json.loads(case.call.args[0])
    from coursekit.drivers.gpt import layout
    named = list(layout(cfg).named_parameters(remove_duplicate=False))
    if stats.shape != (len(named), 3):
        case.fail(f"{case.what}: expected one row per parameter, {(len(named), 3)}, got {stats.shape}")
    residual = INIT_STD / math.sqrt(2 * cfg["layers"])

    def near(row, std, n):
        rms, mean = row[0], row[1]
        return abs(rms - std) <= _SIGMAS * std / math.sqrt(2 * n) and abs(mean) <= _SIGMAS * std / math.sqrt(n)

    groups: dict[str, list] = {}
    for (name, p), row in zip(named, stats):
        groups.setdefault(_init_kind(name), []).append((name, row, p.numel()))
    for kind, exact in (("norm_weight", 1.0), ("norm_bias", 0.0)):
        for name, row, _ in groups.get(kind, []):
            if abs(row[1] - exact) > 1e-6 or row[2] > 1e-6:
                case.fail(f"the layer norms are touched ({name}): they start at weight 1 and bias 0, PyTorch's "
                          "initial values; initialise the weights of nn.Linear and nn.Embedding only")
    for name, row, _ in groups.get("bias", []):
        if row[0] > 1e-7:
            case.fail(f"the biases are left at PyTorch's initial values ({name} is not 0): nn.init.zeros_ on "
                      "every nn.Linear's bias")
    for name, row, n in groups.get("embedding", []):
        if near(row, residual, n):
            case.fail(f"{name} has 0.02/sqrt(2N), as a residual projection: only each block's attn.W_o and linear2 "
                      "are scaled (with tied weights lm_head.weight IS tok_embed.weight: leave lm_head at 0.02)")
        if not near(row, INIT_STD, n):
            case.fail(f"the embeddings do not have std 0.02 ({name} has {row[0]:.3g}; nn.Embedding starts at "
                      "normal(0, 1)): nn.init.normal_(embedding.weight, mean=0.0, std=0.02)")
    res = groups.get("residual", [])
    mat = groups.get("matrix", [])
    res_ok = all(near(r, residual, n) for _, r, n in res)
    mat_ok = all(near(r, INIT_STD, n) for _, r, n in mat)
    mat_scaled = any(near(r, residual, n) for _, r, n in mat)
    res_plain = all(near(r, INIT_STD, n) for _, r, n in res)
    if res_ok and mat_scaled and all(near(r, residual, n) for nm, r, n in mat if nm.startswith("blocks.")):
        case.fail("every linear layer is scaled by 1/sqrt(2N): only the residual projections, the layers that "
                  "write into the residual stream (each block's attn.W_o and linear2), get 0.02/sqrt(2N); the "
                  "others keep 0.02")
    if mat_scaled:
        case.fail("the wrong layers are scaled: " + next(nm for nm, r, n in mat if near(r, residual, n)) +
                  " has 0.02/sqrt(2N); the residual projections are the layers that write into the residual "
                  "stream, each block's attn.W_o and linear2 (nanoGPT's c_proj)")
    if all(near(r, INIT_STD / math.sqrt(cfg["layers"]), n) for _, r, n in res) and not res_ok:
        case.fail("the residual projections are divided by sqrt(N), not sqrt(2N): each of the N blocks adds two "
                  "residual layers (attention and MLP), 2N in all")
    if res_plain and mat_ok:
        case.fail("the residual projections are not scaled: each block's attn.W_o and linear2 start at "
                  "0.02/sqrt(2N), N the number of blocks (GPT-2, Sec. 2.3)")
    for name, row, n in res + mat:
        std = residual if _init_kind(name) == "residual" else INIT_STD
        if not near(row, std, n):
            case.fail(f"{name} has root mean square {row[0]:.3g} and mean {row[1]:.2g}; expected normal(0, "
                      f"{std:.3g}) ({'0.02/sqrt(2N)' if std == residual else '0.02'})")
    if int(returned.reshape(-1)[0]) != 1:
        case.fail("it initialises the model in place but does not return it: end with `return model`, so that "
                  "gpt2_init(GPT(...)) is the model")


def _init_by(residual="2N", scaled=("W_o", "linear2"), biases=True, norms=False, embeddings=True):
    """A learner's gpt2_init with one choice wrong."""

    def gpt2_init(model):
        n = len(model.blocks)
        std_r = {"2N": 0.02 / math.sqrt(2 * n), "N": 0.02 / math.sqrt(n), "none": 0.02}[residual]
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                std = std_r if name.split(".")[-1] in scaled else 0.02
                torch.nn.init.normal_(module.weight, 0.0, std)
                if biases and module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
            elif isinstance(module, torch.nn.Embedding) and embeddings:
                torch.nn.init.normal_(module.weight, 0.0, 0.02)
            elif isinstance(module, torch.nn.LayerNorm) and norms:
                torch.nn.init.normal_(module.weight, 0.0, 0.02)
        return model

    return gpt2_init


GPT2_INIT = Spec(
    id="gpt-gpt2_init",
    rules=(
        Rule("the residual scale depends on the number of blocks: N = 2 and N = 3",
             lambda call: json.loads(call.args[0])["layers"] in (2, 3)),
    ),
    function="gpt2_init",
    driver="gpt.initialised",
    inputs=_init_calls,
    reference=ref.gpt2_init,
    judge=_init_judge,
    mistakes=(
        Mistake("sqrt_n", "divided by sqrt(N), not sqrt(2N)", _init_by(residual="N")),
        Mistake("unscaled", "the residual projections are not scaled", _init_by(residual="none")),
        Mistake("wrong_layers", "the wrong layers are scaled", _init_by(scaled=("W_q", "linear1"))),
        Mistake("all_layers", "every linear layer is scaled",
                _init_by(scaled=("W_q", "W_k", "W_v", "W_o", "linear1", "linear2"))),
        Mistake("biases", "the biases are left at PyTorch's initial values", _init_by(biases=False)),
        Mistake("norms", "the layer norms are touched", _init_by(norms=True)),
        Mistake("embeddings", "the embeddings do not have std 0.02", _init_by(embeddings=False)),
        Mistake("no_return", "does not return it", lambda model: ref.gpt2_init(model) and None),
    ),
)


# ---------------------------------------------------------------- weight decay's parameter groups

def _groups_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for cfg in (dict(vocab_size=11, d_model=12, heads=3, d_ff=20, layers=2, max_len=9, tie_weights=True),
                dict(vocab_size=13, d_model=10, heads=2, d_ff=6, layers=3, max_len=7, tie_weights=False)):
        decay = float(np.round(rng.uniform(0.02, 0.3), 3))   # never AdamW's default 0.01, never 0
        what = (f"param_groups(GPT(layers={cfg['layers']}, tie_weights={cfg['tie_weights']}), "
                f"weight_decay={decay})")
        asked.append(Call((json.dumps(cfg), decay), what=what))
    return asked


def _kind(name: str, tied: bool) -> str:
    """What a parameter of the notebook's GPT is, by its name: the tied weight, an embedding, a norm's
    weight or bias, a linear layer's bias or matrix."""
    if tied and name in ("tok_embed.weight", "lm_head.weight"):
        return "tied"
    if name.startswith(("tok_embed.", "pos_embed.")):
        return "embedding"
    if name.split(".")[-2].startswith("norm"):
        return "norm"
    return "bias" if name.endswith(".bias") else "matrix"


_KIND_WRONG = {
    "embedding": "the position embedding (pos_embed.weight) decays: p.dim() >= 2 picks nn.Embedding's weight too. "
                 "Decay the weights of nn.Linear layers only; embeddings are looked up, not multiplied "
                 "(minGPT's configure_optimizers: Linear weights decay, LayerNorm and Embedding weights do not)",
    "tied": "the tied weight decays: lm_head.weight IS tok_embed.weight, the token embedding, and an embedding "
            "does not decay (nanoGPT removes lm_head.weight from its decay set for this reason): decide by the "
            "nn.Embedding that owns it, not by the nn.Linear that shares it",
    "norm": "the layer norms' weights (or biases) decay: decay pulls a norm's gain towards 0, not towards a "
            "simpler function; put every parameter of nn.LayerNorm in the group without decay",
    "bias": "the biases of the linear layers decay: only the matrices (nn.Linear's weight) decay; a bias shifts, "
            "it does not scale, and stays without decay",
}


def _judge_groups(case: Case) -> None:
    _explain_raised(case)
    got, want = (to_array(a, case.what) for a in (case.answer, case.expected))
    if _equal(got, want, case.spec.rtol, case.spec.atol):
        return
    if got.shape != want.shape:
        case.fail(f"{case.what}: expected one row per parameter name, {want.shape}, got {got.shape}")
    cfg, decay = json.loads(case.call.args[0]), float(case.call.args[1])
    tied = bool(cfg["tie_weights"])
    from coursekit.drivers.gpt import layout
    names = [n for n, _ in layout(cfg).named_parameters(remove_duplicate=False)]
    count, given = got[:, 0], got[:, 1]
    for name, n in zip(names, count):
        if n == 0:
            case.fail(f"{name} is in no group, so AdamW would never update it: every parameter goes into "
                      "exactly one group (walk model.modules(), or check against model.parameters())")
    for name, n in zip(names, count):
        if n > 1:
            if _kind(name, tied) == "tied":
                case.fail("the tied weight is listed twice (as lm_head.weight and as tok_embed.weight: one "
                          "nn.Parameter under two names), and AdamW raises 'some parameters appear in more than "
                          "one parameter group'. Place each tensor once: keep a set of the ids placed")
            case.fail(f"{name} is listed {int(n)} times: every parameter goes into exactly one group")
    kinds = [_kind(n, tied) for n in names]
    matrices = [g for g, k in zip(given, kinds) if k == "matrix"]
    if all(abs(g) <= case.spec.atol for g in matrices):
        case.fail("the linear layers' matrices get no weight decay: they are the group with "
                  "weight_decay=weight_decay; biases, norms and embeddings are the group with 0.0")
    if any(abs(g - decay) > 1e-9 * max(1.0, decay) for g in matrices):
        wrong = next(g for g in matrices if abs(g - decay) > 1e-9 * max(1.0, decay))
        case.fail(f"the matrices' group has weight_decay {wrong:g}, not the weight_decay given: use the argument")
    others = {float(g) for g, k in zip(given, kinds) if k != "matrix"}
    if others and all(abs(g - decay) <= 1e-9 * max(1.0, decay) for g in others):
        case.fail("every parameter decays (AdamW(model.parameters(), weight_decay=...) does that): biases, norms "
                  "and embeddings go into a second group, with weight_decay 0.0")
    if len(others) == 1 and abs(others.pop()) > case.spec.atol:
        case.fail("the group without decay has a weight_decay other than 0.0: biases, norms and embeddings get "
                  "weight_decay 0.0")
    for kind in ("embedding", "tied", "norm", "bias"):
        if any(abs(g) > case.spec.atol for g, k in zip(given, kinds) if k == kind):
            case.fail(_KIND_WRONG[kind])
    judge_case(case)


def _groups_by(decide, once=True):
    """A learner's param_groups that walks every module's own parameters and decides with decide(module,
    name, parameter); once=False places a shared tensor again under its second owner."""

    def param_groups(model, weight_decay):
        decay, no_decay, seen = [], [], set()
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if once and id(parameter) in seen:
                    continue
                seen.add(id(parameter))
                (decay if decide(module, name, parameter) else no_decay).append(parameter)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    return param_groups


PARAM_GROUPS = Spec(
    id="gpt-param_groups",
    rules=(
        Rule("with tied weights the output layer's matrix is the token embedding: no decay, and listed once",
             lambda call: json.loads(call.args[0])["tie_weights"]),
        Rule("without tied weights lm_head is a linear layer's matrix of its own, which decays",
             lambda call: not json.loads(call.args[0])["tie_weights"]),
        Rule("the weight_decay given, not AdamW's default", lambda call: call.args[1] != 0.01),
    ),
    function="param_groups",
    driver="gpt.groups",
    inputs=_groups_calls,
    reference=ref.param_groups,
    judge=_judge_groups,
    mistakes=(
        Mistake("by_ndim", "the position embedding (pos_embed.weight) decays", lambda model, weight_decay: [
            {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]),
        Mistake("tied_twice", "the tied weight is listed twice",
                _groups_by(lambda m, n, p: isinstance(m, torch.nn.Linear) and n == "weight", once=False)),
        Mistake("tied_decayed", "the tied weight decays", lambda model, weight_decay: ref.param_groups(
            model, weight_decay) if model.lm_head.weight is not model.tok_embed.weight else [
            {"params": [p for n, p in model.named_parameters() if n.endswith("weight") and "norm" not in n
                        and "pos_embed" not in n], "weight_decay": weight_decay},
            {"params": [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n
                        or "pos_embed" in n], "weight_decay": 0.0}]),
        Mistake("norms", "the layer norms' weights (or biases) decay",
                _groups_by(lambda m, n, p: isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)) and n == "weight")),
        Mistake("biases", "the biases of the linear layers decay",
                _groups_by(lambda m, n, p: isinstance(m, torch.nn.Linear))),
        Mistake("missing", "is in no group", lambda model, weight_decay: ref.param_groups(model.blocks, weight_decay)),
        Mistake("fixed", "not the weight_decay given", lambda model, weight_decay: ref.param_groups(model, 0.01)),
        Mistake("swapped", "the linear layers' matrices get no weight decay", lambda model, weight_decay: [
            {**group, "weight_decay": wd} for group, wd in zip(ref.param_groups(model, weight_decay),
                                                                (0.0, weight_decay))]),
    ),
)


# ---------------------------------------------------------------- the sampling distribution

def _cut_far_from(probs: np.ndarray, top_p: float) -> bool:
    """Every row's sorted cumulative sums stay 0.03 away from top_p, and its first token is below it."""
    sums = np.cumsum(-np.sort(-probs, axis=-1), axis=-1)
    return bool(np.all(np.abs(sums - top_p) > 0.03) and np.all(sums[:, 0] < top_p - 0.03))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _sums_to_one_over(probs: np.ndarray, axis: int) -> bool:
    """The sums along ``axis`` are 1, leaving out those with NaN (a column 0 / 0 where every row cut it)."""
    sums = probs.sum(axis)
    finite = np.isfinite(sums)
    return bool(finite.any() and np.allclose(sums[finite], 1, atol=1e-4))


def _probs_calls(rng: np.random.Generator) -> list[Call]:
    def logits(shape, temperature, top_k, top_p, scale):
        while True:  # no ties, and no cumulative sum near top_p: the cut is not a rounding question
            z = rng.normal(scale=scale, size=shape)
            kept = z / temperature
            if top_k is not None:
                kept = np.where(kept >= np.sort(kept, -1)[:, -top_k][:, None], kept, -np.inf)
            if top_p is None or _cut_far_from(_softmax(kept), top_p):
                return z

    asked = []
    for shape, t, k, p, scale in [((2, 7), 0.6, None, None, 1.5), ((3, 8), 1.5, 3, None, 1.5),
                                  ((2, 9), 1.0, None, 0.75, 1.5), ((3, 6), 0.8, 4, 0.6, 1.5), ((2, 5), 1.2, 5, None, 1.5),
                                  ((4, 10), 2.0, 6, 0.85, 1.5),
                                  # flat: top-p before top-k would keep all three of top-k, after it only two
                                  ((2, 12), 0.5, 3, 0.5, 0.2)]:
        z = logits(shape, t, k, p, scale)
        what = f"next_token_probs(logits {shape}, temperature={t}, top_k={k}, top_p={p})"
        asked.append(Call((z,), dict(temperature=t, top_k=k, top_p=p), what=what))
    asked.append(Call((rng.normal(size=(2, 5)),), dict(temperature=0.0, top_k=None, top_p=None), raises="ValueError",
                      what="next_token_probs(logits, temperature=0)"))
    return asked


def _probs_variant(temperature="divide", top_k="k", renormalise="sum", top_p="keep_crossing", order="k_first",
                   axis="vocab"):
    """next_token_probs with some of its choices wrong (the spec's knobs)."""
    rule = dict(temperature=temperature, top_k=top_k, renormalise=renormalise, top_p=top_p, order=order)
    dim = 0 if axis == "batch" else -1   # the softmax's (the rest works on rows, as the learner's would)

    def cut_top_k(z, k):
        if k is None or k >= z.shape[-1]:
            return z
        kept = k + 1 if rule["top_k"] == "k_plus_one" else k
        kth = torch.topk(z, min(kept, z.shape[-1]), dim=-1).values[..., -1:]
        return z.masked_fill(z < kth, float("-inf"))

    def kept_by_top_p(probs, p):
        if p is None:
            return torch.ones_like(probs, dtype=torch.bool)
        if rule["top_p"] == "vocab_order":
            return torch.cumsum(probs, dim=-1) - probs < p
        sorted_probs, order_ = torch.sort(probs, dim=-1, descending=True)
        sums = torch.cumsum(sorted_probs, dim=-1)
        keep = sums - sorted_probs < p if rule["top_p"] == "keep_crossing" else sums < p
        return torch.zeros_like(keep).scatter(-1, order_, keep)

    def next_token_probs(logits, temperature=1.0, top_k=None, top_p=None):
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        z = {"divide": logits / temperature, "multiply": logits * temperature,
             "after_softmax": logits}[rule["temperature"]]
        if rule["order"] == "p_first" and top_p is not None:
            z = z.masked_fill(~kept_by_top_p(torch.softmax(z, -1), top_p), float("-inf"))
            top_p = None
        cut = cut_top_k(z, top_k)
        if rule["renormalise"] == "none":          # the cut tokens zeroed in the uncut softmax
            probs = torch.softmax(z, dim) * (cut > float("-inf"))
        else:
            probs = torch.softmax(cut, dim)
        if rule["temperature"] == "after_softmax":
            probs = probs / temperature
        probs = probs * kept_by_top_p(probs, top_p)
        if rule["renormalise"] == "none":
            return probs
        if rule["renormalise"] == "softmax_again":
            return torch.softmax(probs, -1)
        if top_p is None and rule["temperature"] != "after_softmax":   # (as the reference: after a top-p cut, or
            return probs                                                # after a temperature on probabilities)
        return probs / probs.sum(-1, keepdim=True)

    return next_token_probs


# The logits are (batch, V), as the docstring says: the last axis is axis 1.
_LAST_AXIS = "the logits are 2-d, (batch, V), as the docstring says: dim=1 is dim=-1"

NEXT_TOKEN_PROBS = Spec(
    id="gpt-next_token_probs",
    equivalent=(
        *((f"L{line} -1 -> 1", _LAST_AXIS) for line in (12, 13, 15, 17, 18, 20, 22)),
        ("L13 torch.topk(z, top_k, dim=-1) -> torch.topk(z, top_k)", "torch.topk's default dim is -1"),
        ("L17 torch.sort(probs, dim=-1, descending=True) -> torch.sort(probs, descending=True)",
         "torch.sort's default dim is -1"),
        ("L12 top_k < z.shape[-1] -> top_k <= z.shape[-1]", "a top_k of V keeps every token either way: the V-th "
                                                            "largest is the smallest, and nothing is below it"),
        ("L19 before < top_p -> before <= top_p", "they differ only where the mass before a token equals top_p "
                                                  "exactly, which the drawn inputs keep 0.03 away from: no rule, a "
                                                  "rounding question (exercise-standard.md)"),
    ),
    rules=(
        Rule("ValueError: temperature <= 0", lambda call: call.raises == "ValueError"),
        Rule("divide by the temperature", lambda call: not call.raises and call.kwargs["temperature"] != 1),
        Rule("keep the top_k largest", lambda call: (call.kwargs["top_k"] or np.inf) < np.shape(call.args[0])[-1]),
        Rule("a top_k of the vocabulary's size keeps every token",
             lambda call: call.kwargs["top_k"] == np.shape(call.args[0])[-1]),
        Rule("top-p: the one that crosses it included", _differs(
            "gpt-next_token_probs", _probs_variant(top_p="exclude_crossing"), None, ref.next_token_probs)),
        Rule("top-k, softmax, then top-p", _differs(
            "gpt-next_token_probs", _probs_variant(order="p_first"), None, ref.next_token_probs)),
    ),
    function="next_token_probs",
    driver="tensors",
    inputs=_probs_calls,
    reference=ref.next_token_probs,
    variant=_probs_variant,
    knobs=(
        Knob("temperature", (("after_softmax", "the temperature is applied after the softmax, where renormalising "
                                               "undoes it: divide the logits by the temperature, then softmax"),
                             ("multiply", "it multiplies the logits by the temperature: divide them, logits / "
                                          "temperature (a low temperature sharpens the distribution)"))),
        Knob("top_k", (("k_plus_one", "top-k keeps k + 1 tokens: keep the k largest logits, "
                                      "torch.topk(z, k).values[..., -1:] is the k-th"),)),
        Knob("renormalise", (("none", "the kept probabilities are not renormalised: after a cut they sum to less "
                                      "than 1; divide by their sum (or softmax the kept logits)"),
                             ("softmax_again", "it applies softmax to probabilities: renormalise the kept "
                                               "probabilities by dividing by their sum"))),
        Knob("top_p", (("exclude_crossing", "top-p drops the token whose cumulative probability crosses top_p: "
                                            "keep every token whose more probable tokens sum to less than top_p, "
                                            "the crossing one included"),
                       ("vocab_order", "top-p sums the probabilities in vocabulary order: sort them, most "
                                       "probable first, before the cumulative sum"))),
        Knob("axis", (("batch", "the softmax runs over the batch axis (dim 0), so each token's probabilities sum "
                                "to 1 across the sequences: softmax over the vocabulary, the last axis, "
                                "torch.softmax(z, dim=-1)"),)),
        Knob("order", (("p_first", "top-p is applied before top-k: cut top-k first, renormalise, then apply top-p "
                                   "to that distribution"),)),
    ),
    hints=(
        Hint("the probabilities sum to 1 down each column, over the batch axis (dim 0), not along each row: the "
             "softmax, and any renormalising, runs over the vocabulary, the last axis (dim=-1)",
             lambda got, call: _sums_to_one_over(got, 0) and not _sums_to_one_over(got, -1),
             example=lambda logits, temperature=1.0, top_k=None, top_p=None: (lambda p: p / p.sum(0, keepdim=True))(
                 ref.next_token_probs(logits, temperature, top_k, top_p))),
        Hint("NaN in the probabilities: a row kept no token (0 / 0). Top-p must keep the token whose cumulative "
             "probability crosses top_p, so at least the most probable token stays",
             lambda got, call: bool(np.isnan(got).all(-1).any()),
             example=lambda logits, temperature=1.0, top_k=None, top_p=None: ref.next_token_probs(
                 logits, temperature, top_k, top_p) * (float("nan") if top_p else 1.0)),
        Hint("the rows do not sum to 1: renormalise the kept probabilities",
             lambda got, call: bool(np.any(np.abs(got.sum(-1) - 1) > 1e-4)),
             example=lambda logits, temperature=1.0, top_k=None, top_p=None: 0.9 * ref.next_token_probs(
                 logits, temperature, top_k, top_p)),
    ),
    errors=(
        Raises("{what} raised {error}: the probabilities are of the last axis, one row per sequence; "
               "softmax(z, dim=-1)", match="dimension|out of range",
               example=lambda logits, temperature=1.0, top_k=None, top_p=None: torch.softmax(logits, dim=2)),
    ),
)


# ---------------------------------------------------------------- the KV cache

def _cache_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for cfg, batch, chunks in [
        (dict(vocab_size=11, d_model=12, heads=3, d_ff=20, layers=2, max_len=16, tie_weights=True), 2, (3, 1, 2, 1)),
        (dict(vocab_size=9, d_model=8, heads=2, d_ff=10, layers=1, max_len=16, tie_weights=True), 3, (1, 2, 1, 1)),
    ]:
        shapes = _model_shapes(cfg)
        spec, flat = _packed(cfg, shapes, draw_weights(rng, shapes))
        ids = rng.integers(0, cfg["vocab_size"], size=(batch, sum(chunks))).astype(np.int64)
        what = (f"forward_cached(model, ids, cache) on a GPT(d_model={cfg['d_model']}, heads={cfg['heads']}, "
                f"layers={cfg['layers']}) fed {' + '.join(map(str, chunks))} tokens")
        asked.append(Call((spec, flat, ids, np.array(chunks, dtype=np.int64)), what=what))
    return asked


def _cache_variant(positions="offset", append="once", mask="offset", pair="keys_values"):
    """forward_cached with some of its choices wrong (the spec's knobs)."""

    def forward_cached(model, ids, cache=None):
        past = 0 if not cache else cache[0][0].shape[2]
        length = ids.shape[1]
        first = past if positions == "offset" else 0
        x = model.tok_embed(ids) + (0 if positions == "none" else model.pos_embed(torch.arange(first, first + length)))
        if cache and pair == "swapped":   # the cached values read as keys, and the keys as values
            cache = [(v, k) for k, v in cache]
        new_cache = []
        for i, block in enumerate(model.blocks):
            attn = block.attn
            h = block.norm1(x)
            q, k_new, v_new = (split_heads(layer(h), attn.heads) for layer in (attn.W_q, attn.W_k, attn.W_v))
            k, v = k_new, v_new
            if cache:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
            total = k.shape[2]
            if mask == "none":
                allowed = None
            else:
                allowed = torch.ones(length, total, dtype=torch.bool).tril(
                    diagonal=total - length if mask == "offset" else 0)
            out, _ = scaled_dot_product_attention(q, k, v, allowed)
            x = x + attn.W_o(merge_heads(out))
            x = x + block.linear2(F.gelu(block.linear1(block.norm2(x))))
            if append == "twice":
                new_cache.append((torch.cat([k, k_new], dim=2), torch.cat([v, v_new], dim=2)))
            elif append == "new_only":
                new_cache.append((k_new, v_new))
            elif append == "nothing":
                pass
            else:
                new_cache.append((k, v))
        return model.lm_head(model.norm(x)), new_cache

    return forward_cached


def _cached_logits(answer: object, call: Call, what: str) -> np.ndarray:
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise CheckFailed(f"{what}: expected the logits and the cache")
    return to_array(answer[0], what)


def _judge_cache(case: Case) -> None:
    """The logits of every position first (the catalogue), then the cache's shapes."""
    _explain_raised(case)
    value(case.answer, case.what)
    judge_case(case)
    shapes, expected = np.asarray(case.answer[1]), np.asarray(case.expected[1])
    if shapes.shape != expected.shape or not np.array_equal(shapes, expected):
        chunks = np.asarray(case.call.args[3])
        case.fail(f"the logits are right, but the cache has other shapes than (keys, values) of (batch, heads, "
                  f"positions so far, d_k) per block: after {chunks[0]} token(s) expected {tuple(expected[0, 0, 0])}, "
                  f"got {tuple(shapes[0, 0, 0]) if shapes.ndim == 4 and len(shapes) else shapes.shape}")


FORWARD_CACHED = Spec(
    id="gpt-forward_cached",
    rules=(
        Rule("new tokens at positions past ...: several of them after a cache",
             lambda call: any(c > 1 for c in np.asarray(call.args[3])[1:])),
        Rule("one token after a cache", lambda call: any(c == 1 for c in np.asarray(call.args[3])[1:])),
        Rule("one (keys, values) pair per block: several blocks", lambda call: json.loads(call.args[0])["layers"] > 1),
    ),
    function="forward_cached",
    driver="gpt.cached",
    inputs=_cache_calls,
    reference=ref.forward_cached,
    prepare=_cached_logits,
    judge=_judge_cache,
    atol=DEEP_ATOL,
    variant=_cache_variant,
    knobs=(
        Knob("positions", (("restart", "the new tokens get positions 0, 1, ... again: after `past` cached tokens "
                                       "they are at past, past + 1, ...: pos_embed(torch.arange(past, past + t))"),
                           ("none", "the new tokens get no position embedding: add model.pos_embed(torch.arange("
                                    "past, past + t)) to model.tok_embed(ids)"))),
        Knob("pair", (("swapped", "the cached keys and values are read the other way round: each block's cache "
                                  "is (keys, values), cache[i][0] the keys"),)),
        Knob("append", (("twice", "the new keys and values are appended twice: the cache for the next call is "
                                  "the concatenation itself, torch.cat([past_keys, new_keys], dim=2), not that with "
                                  "the new keys added again"),
                        ("new_only", "the cache returned holds only the new keys and values, so the next call "
                                     "forgets the earlier positions: return the concatenation of the past and the "
                                     "new ones"),
                        ("nothing", "the cache returned is empty, so the next call sees no earlier position: "
                                    "append each block's (keys, values) to it"))),
        Knob("mask", (("none", "several new tokens in one call see each other's future: mask with new token i "
                               "attending to keys 0 ... past + i, torch.ones(t, past + t).tril(diagonal=past)"),
                      ("not_offset", "the causal mask is not shifted by the cached length: new token i may attend "
                                     "to keys 0 ... past + i, torch.ones(t, past + t).tril(diagonal=past)"))),
    ),
    errors=(
        Raises("{what} raised {error}: concatenate the cached and the new keys (and values) along the positions "
               "axis, dim=2 of (batch, heads, positions, d_k)", match="Sizes of tensors must match|size of tensor",
               example=lambda model, ids, cache=None: _cache_variant()(model, ids, None if not cache else [
                   (k.transpose(1, 2), v) for k, v in cache])),
        Raises("{what} raised {error}", match="not model\\(\\.\\.\\.\\)",
               example=lambda model, ids, cache=None: (model(ids), cache)),
    ),
    diagnosed=(
        Mistake("last_only", "the logits of every new position",
                lambda model, ids, cache=None: (lambda out: (out[0][:, -1:], out[1]))(ref.forward_cached(
                    model, ids, cache)) if ids.shape[1] > 1 else ref.forward_cached(model, ids, cache)),
    ),
    equivalent=tuple((name, "every block's keys and values hold the same number of positions, so past is read "
                            "alike from the last block's or from the values") for name in
                     ("L5 0 -> -1 #2", "L5 0 -> 1 #3", "L5 0 -> -1 #3")),
)


# ---------------------------------------------------------------- beam search

def _beam_calls(rng: np.random.Generator) -> list[Call]:
    """A bigram stand-in model per call. The first is built so that greedy decoding is worse:
    after the prompt, token 3 is the most probable, but every continuation of 3 is unlikely,
    while 4 is followed by 5 with high probability. The others are drawn, with EOS likely
    enough that hypotheses finish at different lengths."""
    asked = []
    vocab, eos = 7, 2
    table = rng.normal(scale=0.3, size=(vocab, vocab))
    table[1, 3], table[1, 4], table[1, eos] = 2.0, 1.7, -3.0          # after the prompt: 3 beats 4
    table[3, :] = rng.normal(scale=0.1, size=vocab)                    # after 3: nothing stands out
    table[4, 5], table[5, eos], table[4, eos] = 4.0, 3.5, -2.0         # after 4: 5, then EOS
    asked.append(Call((table, np.array([1], dtype=np.int64), 3, 5, eos, 0.6),
                      what="beam_search(model, prompt, beam_size=3, max_new_tokens=5, eos_id=2, alpha=0.6) on a "
                           "stand-in model where greedy decoding is worse"))
    # the best continuation branches at the second step: 3 then 6 (not 3's most probable, 5), then EOS
    vocab = 8
    table = rng.normal(scale=0.3, size=(vocab, vocab))
    table[1, 3], table[1, 4] = 2.5, 1.5
    table[3, :], table[3, 5], table[3, 6] = -2.0, 1.6, 1.3
    table[5, :] = rng.normal(scale=0.1, size=vocab)                    # after 5: nothing stands out
    table[6, eos] = 4.0
    asked.append(Call((table, np.array([1], dtype=np.int64), 3, 6, eos, 0.6),
                      what="beam_search(model, prompt, beam_size=3, max_new_tokens=6, eos_id=2, alpha=0.6) on a "
                           "stand-in model whose best sentence leaves the most probable token at the second step"))
    for vocab, eos, prompt, beam, steps, alpha in [(8, 3, (1, 5), 4, 6, 0.6), (6, 0, (2,), 2, 5, 1.0),
                                                   (9, 4, (1, 6, 7), 3, 7, 0.8)]:
        table = rng.normal(scale=1.5, size=(vocab, vocab))
        table[:, eos] += rng.uniform(0.5, 1.5, size=vocab)            # finishing is often among the best
        what = (f"beam_search(model, prompt of {len(prompt)} token(s), beam_size={beam}, max_new_tokens={steps}, "
                f"eos_id={eos}, alpha={alpha}) on a stand-in model")
        asked.append(Call((table, np.array(prompt, dtype=np.int64), beam, steps, eos, alpha), what=what))
    asked += [_finishing_trap(rng, 2), _finishing_trap(rng, 3)]
    # every hypothesis finishes at the second step: the search stops with none alive
    table = _log_probabilities(6, {2: {3: 0.5, 4: 0.4}, **{r: {1: 0.9} for r in (0, 1, 3, 4, 5)}})
    asked.append(Call((table + rng.normal(scale=0.01, size=table.shape), np.array([2], dtype=np.int64), 2, 6, 1, 0.6),
                      what="beam_search(model, prompt, beam_size=2, max_new_tokens=6, eos_id=1, alpha=0.6) on a "
                           "stand-in model where every hypothesis finishes early"))
    # EOS is never among the best: the best hypothesis is one still alive after max_new_tokens
    table = rng.normal(scale=1.0, size=(7, 7))
    table[:, 3] -= 8.0
    asked.append(Call((table, np.array([5, 1], dtype=np.int64), 3, 4, 3, 0.6),
                      what="beam_search(model, prompt of 2 tokens, beam_size=3, max_new_tokens=4, eos_id=3, "
                           "alpha=0.6) on a stand-in model where no hypothesis finishes"))
    return asked


def _log_probabilities(vocab: int, rows: dict) -> np.ndarray:
    """A (vocab, vocab) table of log-probabilities (log_softmax leaves them as they are): row r
    gives the tokens in rows[r] their probabilities and shares the rest evenly."""
    table = np.full((vocab, vocab), 1.0 / vocab)
    for r, chosen in rows.items():
        table[r] = (1 - sum(chosen.values())) / (vocab - len(chosen))
        table[r, list(chosen)] = list(chosen.values())
    return np.log(table)


def _finishing_trap(rng: np.random.Generator, beam_size: int) -> Call:
    """A stand-in model where finishing at once has the best summed log-probability but not the
    best penalised score, and where after EOS a cheap loop (EOS 3 EOS 3 ...) would score best if
    a finished hypothesis kept growing. With beam_size 2 the winner also needs the beam's second
    place after the prompt's continuation, which a finished hypothesis kept in the beam takes;
    with 3 it does not, so the ranking alone is tested. Margins >= 0.1, noise 0.01."""
    vocab, eos = 8, 2
    table = _log_probabilities(vocab, {
        1: {eos: 0.36, 4: 0.62},       # after the prompt: 4, or EOS (finished, the best raw score)
        4: {6: 0.55, 7: 0.44},         # 6 is likelier, but leads nowhere: the winner goes through 7
        7: {5: 0.97}, 5: {eos: 0.97},  # 4 7 5 EOS: the best score / ((5 + 4) / 6)
        eos: {3: 0.97}, 3: {eos: 0.97},  # after EOS, a likely loop for a hypothesis that keeps growing
    }) + rng.normal(scale=0.01, size=(vocab, vocab))
    return Call((table, np.array([1], dtype=np.int64), beam_size, 5, eos, 1.0),
                what=f"beam_search(model, prompt, beam_size={beam_size}, max_new_tokens=5, eos_id=2, alpha=1.0) on "
                     "a stand-in model where the hypothesis with the best summed log-probability finishes first")


def _beam_variant(finish="at_eos", final="normalized", length="generated"):
    """beam_search with some of its choices wrong (the spec's knobs)."""

    @torch.no_grad()
    def beam_search(model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6):
        def ended(seq):
            return len(seq) > len(prompt) and seq[-1] == eos_id

        alive, finished = [(prompt.tolist(), 0.0)], []
        for _ in range(max_new_tokens):
            frozen = [h for h in alive if finish == "stay" and ended(h[0])]   # finished, still in the beam
            growing = [h for h in alive if h not in frozen]
            if not growing:
                break
            logp = torch.log_softmax(model(torch.tensor([s for s, _ in growing]))[:, -1].double(), -1)
            totals = torch.tensor([score for _, score in growing], dtype=torch.float64)[:, None] + logp
            grown = [(growing[b][0] + [t], totals[b, t].item()) for b in range(len(growing))
                     for t in range(logp.shape[-1])]
            best = sorted(frozen + grown, key=lambda h: -h[1])[:beam_size]
            alive = []
            for hypothesis in best:
                done = ended(hypothesis[0]) and hypothesis not in frozen
                if done and finish in ("at_eos", "also_alive"):
                    finished.append(hypothesis)
                if not done or finish != "at_eos":
                    alive.append(hypothesis)
            if not alive:
                break
        start = 0 if length == "with_prompt" else len(prompt)
        hypotheses = finished + alive
        longest = max(len(seq) for seq, _ in hypotheses)

        def penalised(seq, score):
            return score / ref.length_penalty((longest if final == "one_penalty" else len(seq)) - start, alpha)

        rank = (lambda h: h[1]) if final in ("raw", "rank_raw") else (lambda h: penalised(*h))
        seq, score = max(hypotheses, key=rank)
        return torch.tensor(seq[len(prompt):], dtype=torch.int64), score if final == "raw" else penalised(seq, score)

    return beam_search


def _beam_answer(call: Call) -> tuple:
    """The reference's (tokens, score) for a beam_search call, as the driver hands them back."""
    from coursekit.drivers.gpt import beam

    tokens, score = beam(ref.beam_search)(*call.args)
    return tokens.numpy(), score


def _steps_run(call: Call) -> int:
    """How many steps the reference's search ran (its stand-in model counts its calls)."""
    from coursekit.drivers.gpt import _bigram

    table, prompt, beam_size, max_new_tokens, eos_id, alpha = call.args
    model = _bigram(table, 0.0).eval()
    ref.beam_search(model, torch.tensor(prompt), beam_size, max_new_tokens, eos_id, alpha)
    return len(model.modes)


def _beam_differs(other: object, part: int | None = None):
    return _differs("gpt-beam_search", other, "gpt.beam", ref.beam_search, part)


def _judge_beam(case: Case) -> None:
    """Tokens by exact equality (ids are integers), then the score."""
    _explain_raised(case)
    got = value(case.answer, case.what)
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckFailed(f"{case.what}: expected (tokens, score)")
    tokens, score = got
    if not isinstance(tokens, np.ndarray) or tokens.dtype.kind not in "iu" or tokens.ndim != 1:
        raise CheckFailed(f"{case.what}: the tokens should be a 1-d int64 tensor of the new token ids")
    expected_tokens, expected_score = case.expected
    same_tokens = tokens.shape == expected_tokens.shape and np.array_equal(tokens, expected_tokens)
    same_score = np.allclose(to_array(score, case.what), expected_score, rtol=1e-5, atol=1e-7)
    if same_tokens and same_score:
        return
    found = catalogued(case, case.answer)
    if found:
        case.fail(found)
    if same_tokens:
        case.fail("the tokens are right, but the score is not their summed log-probability divided by the length "
                  "penalty ((5 + n) / 6) ** alpha, n = the number of new tokens (EOS included)")
    case.fail("it returns another hypothesis than beam search finds: keep the beam_size best continuations of all "
              "beams by summed log-probability, set aside those ending in EOS, and pick the best by score / "
              "((5 + n) / 6) ** alpha")


BEAM_SEARCH = Spec(
    id="gpt-beam_search",
    function="beam_search",
    driver="gpt.beam",
    inputs=_beam_calls,
    reference=ref.beam_search,
    judge=_judge_beam,
    variant=_beam_variant,
    knobs=(
        Knob("finish", (("never", "a hypothesis that produces EOS is never finished: it stays among the beams and "
                                  "keeps growing. Set it aside as finished when its last token is eos_id"),
                        ("also_alive", "a hypothesis that ends in EOS is recorded as finished but also stays among "
                                       "the beams, where it keeps growing and takes a place: set it aside, out of "
                                       "the beams, when its last token is eos_id"),
                        ("stay", "a finished hypothesis (its last token eos_id) stays in the beam and takes one of "
                                 "its beam_size places: set it aside, so that the beam keeps the best continuations "
                                 "of the unfinished hypotheses only"))),
        Knob("final", (("raw", "it compares the summed log-probabilities without the length penalty, which favours "
                               "short hypotheses: divide each by ((5 + n) / 6) ** alpha, n its number of new tokens"),
                       ("rank_raw", "it picks the hypothesis with the best summed log-probability and divides only "
                                    "the winner's by the length penalty: rank every hypothesis by score / ((5 + n) "
                                    "/ 6) ** alpha, which favours short ones less"),
                       ("one_penalty", "every hypothesis is divided by one length penalty, that of the longest, which "
                                       "leaves the ranking of the summed log-probabilities: each needs its own, "
                                       "((5 + n) / 6) ** alpha with n its own number of new tokens"))),
        Knob("length", (("with_prompt", "the length penalty counts the prompt: n is the number of new tokens "
                                        "(EOS included), not the whole sequence"),)),
    ),
    errors=(
        Raises("{what} raised {error}", example=lambda model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6:
               model(prompt)[beam_size]),
    ),
    rules=(
        Rule("the beam_size best continuations of all beams: greedy decoding finds another hypothesis",
             _beam_differs(lambda model, prompt, beam_size, *rest: ref.beam_search(model, prompt, 1, *rest), 0)),
        Rule("a finished hypothesis is set aside: kept in the beam, it takes a place another needs",
             _beam_differs(_beam_variant(finish="stay"))),
        Rule("a length penalty that changes the ranking", _beam_differs(_beam_variant(final="rank_raw"), 0)),
        Rule("each hypothesis is divided by the penalty of its own length",
             _beam_differs(_beam_variant(final="one_penalty"), 0)),
        Rule("stop when none is alive", lambda call: _steps_run(call) < call.args[3]),
        Rule("or return a still alive hypothesis", lambda call: _steps_run(call) == call.args[3]
             and _beam_answer(call)[0][-1:].tolist() != [call.args[4]]),
    ),
    equivalent=(
        ("L11 -1 -> 1 #2", "the log-probabilities are 2-d, (alive, V): dim=1 is dim=-1"),
        ("L14 -1 -> 1", "logp is 2-d, (alive, V): shape[1] is shape[-1]"),
        ("L12 torch.tensor([score for _, score in alive], dtype=torch.f... -> torch.tensor([score for _, score in "
         "alive])", "the running scores rounded to float32 (relative 6e-8) are added to float64 log-probabilities: "
                    "far below the score's tolerance (1e-5) and the gaps between the drawn hypotheses' scores"),
        ("L25 max(ranked, key=lambda r: r[0]) -> max(ranked)", "ranked holds (score, tokens): max compares the "
                                                               "scores first, and the inputs never tie them"),
        ("L26 torch.tensor(tokens, dtype=torch.int64) -> torch.tensor(tokens)", "a list of Python ints is int64"),
    ),
)

# ---------------------------------------------------------------- batched generation

def _batch_variant(padding="left", positions="own", mask="keys", steps="every", eos="per_row"):
    """generate_batch with some of its choices wrong (the spec's knobs)."""

    @torch.no_grad()
    def generate_batch(model, prompts, max_new_tokens, eos_id, pad_id):
        lengths = torch.tensor([len(prompt) for prompt in prompts])
        batch, longest = len(prompts), int(lengths.max())
        ids = torch.full((batch, longest), pad_id, dtype=torch.int64)
        for row, prompt in enumerate(prompts):
            start = 0 if padding == "right" else longest - len(prompt)
            ids[row, start:start + len(prompt)] = prompt
        columns = torch.arange(longest)[None, :]
        real = columns < lengths[:, None] if padding == "right" else columns >= (longest - lengths)[:, None]
        by_column = positions == "columns" or padding == "right"     # right-padded, the columns are the positions
        place = columns.expand(batch, -1) if by_column else (real.cumsum(dim=1) - 1).clamp(min=0)
        tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.int64)
        done = torch.zeros(batch, dtype=torch.bool)
        cache = []
        for step in range(max_new_tokens):
            past, t = real.shape[1] - ids.shape[1], ids.shape[1]
            keys, queries = torch.arange(past + t)[None, :], torch.arange(past, past + t)[:, None]
            seen = {"keys": real, "none": torch.ones_like(real), "inverted": ~real}[mask]
            if steps == "first" and step:
                seen = torch.ones_like(real)
            itself = (keys == queries) & (padding != "right")      # right-padded, a pad query has real keys before it
            allowed = ((keys <= queries) & (seen[:, None, :] | itself))[:, None]
            x = model.tok_embed(ids) + model.pos_embed(place)
            for i, block in enumerate(model.blocks):
                attn = block.attn
                h = block.norm1(x)
                q, k, v = (split_heads(layer(h), attn.heads) for layer in (attn.W_q, attn.W_k, attn.W_v))
                if step:
                    k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
                    cache[i] = (k, v)
                else:
                    cache.append((k, v))
                out, _ = scaled_dot_product_attention(q, k, v, allowed)
                x = x + attn.W_o(merge_heads(out))
                x = x + block.linear2(F.gelu(block.linear1(block.norm2(x))))
            token = model.lm_head(model.norm(x[:, -1])).argmax(dim=-1)
            if eos != "continue":
                token = token.masked_fill(done, pad_id)
            tokens[:, step] = token
            done = done | (token == eos_id)
            if done.all() or (eos == "stop_all" and done.any()):
                break
            ids, place = token[:, None], place[:, -1:] + 1
            real = torch.cat([real, torch.ones(batch, 1, dtype=torch.bool)], dim=1)
        return tokens

    return generate_batch


def _gpt_of(cfg: dict, weights: dict):
    """The reference GPT (eval mode) with the drawn weights: each prompt alone, uncached."""
    from coursekit.drivers.gpt import load_by_name

    model = ref.GPT(cfg["vocab_size"], cfg["d_model"], cfg["heads"], cfg["d_ff"], cfg["layers"], cfg["max_len"],
                    tie_weights=True)
    load_by_name(model, weights, "the reference")
    return model.eval()


@torch.no_grad()
def alone(model, prompt, max_new_tokens, eos_id):
    """Greedy decoding of one prompt (1-d) with the uncached model: its new tokens (up to eos_id)
    and the smallest gap between the best and the second logit over the steps."""
    ids, new, gap = prompt[None], [], math.inf
    for _ in range(max_new_tokens):
        last = model(ids)[0, -1].double()
        top = torch.topk(last, 2).values
        gap = min(gap, float(top[0] - top[1]))
        new.append(int(last.argmax()))
        if new[-1] == eos_id:
            break
        ids = torch.cat([ids, torch.tensor([[new[-1]]])], dim=1)
    return new, gap


_KNOBS_APART = [dict(padding="right"), dict(positions="columns"), dict(mask="none"), dict(mask="inverted"),
                dict(steps="first"), dict(eos="stop_all"), dict(eos="continue")]


def _batch_calls(rng: np.random.Generator) -> list[Call]:
    """Drawn GPTs and prompts of pairwise different lengths; eos_id is a token that one row writes
    after its first step while another row never writes it, so rows finish at different steps; every
    catalogued mistake answers a call of several rows otherwise than the reference and each other. Every
    greedy step (each prompt alone) has a gap of at least 0.005 between its best and second logit, and
    no row writes pad_id."""
    with _one_thread():
        return _batch_calls_drawn(rng)


def _batch_calls_drawn(rng: np.random.Generator) -> list[Call]:
    asked = []
    for cfg, lengths, steps, pad in [
        (dict(vocab_size=13, d_model=12, heads=3, d_ff=20, layers=2, max_len=16, tie_weights=True), (4, 1, 3), 6, 0),
        (dict(vocab_size=11, d_model=8, heads=2, d_ff=10, layers=2, max_len=14, tie_weights=True), (2, 5), 5, 10),
        (dict(vocab_size=13, d_model=12, heads=3, d_ff=20, layers=2, max_len=16, tie_weights=True), (3,), 5, 0),
        (dict(vocab_size=9, d_model=10, heads=2, d_ff=6, layers=1, max_len=14, tie_weights=True), (1, 2, 4, 3), 7, 0),
    ]:
        while True:
            shapes = _model_shapes(cfg)
            weights = draw_weights(rng, shapes)
            model = _gpt_of(cfg, weights)
            choices = [i for i in range(cfg["vocab_size"]) if i != pad]
            prompts = [rng.choice(choices, size=n).astype(np.int64) for n in lengths]
            runs = [alone(model, torch.tensor(p), steps, -1) for p in prompts]
            if min(gap for _, gap in runs) < 0.005 or any(pad in new for new, _ in runs):
                continue
            firsts = {}
            for row, (new, _) in enumerate(runs):
                for step, token in enumerate(new):
                    firsts.setdefault((row, token), step)
            candidates = [token for token in range(cfg["vocab_size"]) if token != pad and all(
                firsts.get((row, token), steps) >= 1 for row in range(len(prompts))) and any(
                2 <= firsts.get((row, token), steps) < steps - 1 for row in range(len(prompts))) and (
                len(prompts) == 1 or any((row, token) not in firsts for row in range(len(prompts))))]
            if not candidates:
                continue
            eos = int(rng.choice(candidates))
            if len(prompts) == 1 or _apart(cfg, weights, shapes, prompts, steps, eos, pad):
                break
        spec, flat, packed, steps, eos, pad = _batch_args(cfg, weights, shapes, prompts, steps, eos, pad)
        what = (f"generate_batch(model, prompts of {', '.join(map(str, lengths))} token(s), max_new_tokens={steps}, "
                f"eos_id={eos}, pad_id={pad}) on a GPT(layers={cfg['layers']})")
        asked.append(Call((spec, flat, packed, steps, eos, pad), what=what))
    return asked


def _batch_args(cfg, weights, shapes, prompts, steps, eos, pad) -> tuple:
    spec, flat = _packed(cfg, shapes, weights)
    packed = np.full((len(prompts), max(len(p) for p in prompts)), -1, dtype=np.int64)
    for row, prompt in enumerate(prompts):
        packed[row, :len(prompt)] = prompt
    return spec, flat, packed, steps, eos, pad


def _apart(cfg, weights, shapes, prompts, steps, eos, pad) -> bool:
    """Every catalogued mistake gives other tokens than the reference, and than every other mistake,
    on this call."""
    from coursekit.drivers.gpt import batched

    args = _batch_args(cfg, weights, shapes, prompts, steps, eos, pad)
    answers = [batched(ref.generate_batch)(*args)] + [batched(_batch_variant(**knob))(*args) for knob in _KNOBS_APART]
    return all(not torch.equal(answers[i], answers[j]) for i in range(len(answers)) for j in range(i))


def _judge_batch(case: Case) -> None:
    """Tokens by exact equality (ids are integers), row by row."""
    _explain_raised(case)
    got = value(case.answer, case.what)
    expected = case.expected
    if isinstance(got, np.ndarray) and got.shape == expected.shape and np.array_equal(got, expected):
        return
    found = catalogued(case, case.answer)
    if found:
        case.fail(found)
    pad = case.call.args[5]
    if isinstance(got, np.ndarray) and got.shape == expected.shape:
        same = [np.array_equal(a, b) for a, b in zip(got, expected)]
        stops = [(b[:len(b) - np.argmax(b[::-1] != pad)] if (b != pad).any() else b) for b in expected]
        if all(np.array_equal(a[:len(s)], s) for a, s in zip(got, stops)):
            case.fail("the tokens of every row are right up to its eos_id, but not after it: once a row has "
                      "written eos_id, its later places are pad_id (each row stops on its own)")
        case.fail(f"{sum(same)} of {len(same)} rows get the tokens their prompt gets alone: left-pad the prompts, "
                  "count each token's position from its prompt's first real token, and let no query attend to a "
                  "pad key, at every step")
    case.fail("it returns other tokens than each prompt generated alone")


_NO_PAD_KEY = ("mask the keys where the batch holds padding, (batch, 1, t, past + t) = causal & real[:, None, :], "
               "at every step")

GENERATE_BATCH = Spec(
    id="gpt-generate_batch",
    function="generate_batch",
    driver="gpt.batched",
    inputs=_batch_calls,
    reference=ref.generate_batch,
    judge=_judge_batch,
    variant=_batch_variant,
    knobs=(
        Knob("padding", (("right", "the prompts are padded on the right, so a shorter prompt's next token is read at "
                                   "a pad and its new tokens come after the pads: pad on the LEFT, so that every "
                                   "row's last real token is in the last column"),)),
        Knob("positions", (("columns", "the positions are counted from the batch's first column, so a shorter "
                                       "prompt starts at the position of its first pad: count from each prompt's first "
                                       "real token, positions = real.cumsum(1) - 1 (0 at the pads, clamped)"),)),
        Knob("mask", (("none", "there is no padding mask, so real tokens attend to the pads: " + _NO_PAD_KEY),
                      ("inverted", "the padding mask is inverted: the queries attend to the pads and not to the "
                                   "real tokens (the course's masks: True = may attend)"))),
        Knob("steps", (("first", "the padding mask is applied to the prompt only: at the later steps the new token "
                                 "attends to the pad keys in the cache. Keep the mask of the real columns and extend "
                                 "it by one True per step"),)),
        Knob("eos", (("stop_all", "generation stops for every row when the first row writes eos_id: each row stops "
                                  "on its own (pad_id after its eos_id), and the loop only when every row has"),
                     ("continue", "a row goes on writing after its eos_id: once a row has written eos_id, its later "
                                  "places are pad_id"))),
    ),
    rules=(
        Rule("prompts of different lengths in one batch, left-padded", lambda call: len(
            {int((row >= 0).sum()) for row in call.args[2]}) > 1),
        Rule("a batch of one", lambda call: len(call.args[2]) == 1),
        Rule("a prompt of one token", lambda call: any(int((row >= 0).sum()) == 1 for row in call.args[2])),
        Rule("rows finish at different steps, pad_id after eos_id", lambda call: len(call.args[2]) > 1),
        Rule("positions counted from each prompt's first real token", _differs(
            "gpt-generate_batch", _batch_variant(positions="columns"), "gpt.batched", ref.generate_batch)),
        Rule("no query attends to a pad key", _differs(
            "gpt-generate_batch", _batch_variant(mask="none"), "gpt.batched", ref.generate_batch)),
    ),
    equivalent=(
        ("L10 torch.full((batch, longest), pad_id, dtype=torch.int64) -> torch.full((batch, longest), pad_id)",
         "pad_id is a Python int, and torch.full with an int fill makes int64"),
        ("L15 torch.full((batch, max_new_tokens), pad_id, dtype=torch.i... -> torch.full((batch, max_new_tokens), "
         "pad_id)", "pad_id is a Python int, and torch.full with an int fill makes int64"),
        ("L20 past + t -> t", "after the prompt (past = 0, where past + t is t) each step feeds one token: keys "
                              "arange(1) against the query past makes the causal part all True and the self part "
                              "all False, which broadcast over the past + 1 columns of real, whose last is True"),
        ("L35 -1 -> 1 #2", "the logits of the last position are 2-d, (batch, V): dim=1 is dim=-1"),
        ("L38 if done.all(): break -> (left out)", "once every row is done, each later step writes pad_id in every "
                                                    "row (masked_fill(done, pad_id)), as the tokens were filled"),
    ),
)

# ---------------------------------------------------------------- beam search with the KV cache

def _beam_cached_variant(reorder="parents", again=False):
    """beam_search_cached with its cache reordered otherwise (the spec's knob), or, ``again``, the
    prompt's last token fed once more after the prompt's cache (every new token one position late)."""

    def own_rows(count, rows):                       # row i keeps row i's past (the last, if fewer)
        return torch.arange(count).clamp(max=rows - 1)

    def take(cache, keys_index, values_index):
        return [(k.index_select(0, keys_index), v.index_select(0, values_index)) for k, v in cache]

    @torch.no_grad()
    def beam_search_cached(model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6):
        logits, cache = ref.forward_cached(model, prompt[None])
        if again:
            logits, cache = ref.forward_cached(model, prompt[None, -1:], cache)
        alive, finished = [(prompt.tolist(), 0.0)], []
        for step in range(max_new_tokens):
            logp = torch.log_softmax(logits[:, -1].double(), dim=-1)
            scores = torch.tensor([score for _, score in alive], dtype=torch.float64)[:, None] + logp
            best = torch.topk(scores.flatten(), min(beam_size, scores.numel())).indices.tolist()
            alive_next, parents = [], []
            for flat in best:
                beam, token = divmod(flat, logp.shape[-1])
                hypothesis = (alive[beam][0] + [token], scores[beam, token].item())
                (finished if token == eos_id else alive_next).append(hypothesis)
                if token != eos_id:
                    parents.append(beam)
            alive = alive_next
            if not alive or step == max_new_tokens - 1:
                break
            parents = torch.tensor(parents)
            own = own_rows(len(parents), cache[0][0].shape[0])
            index = {"parents": (parents, parents), "none": (own, own), "keys": (parents, own),
                     "values": (own, parents), "after": (own, own)}[reorder]
            cache = take(cache, *index)
            logits, cache = ref.forward_cached(model, torch.tensor([[seq[-1]] for seq, _ in alive]), cache)
            if reorder == "after":                   # the new keys appended first, then reordered
                moved = parents.clamp(max=len(parents) - 1)
                cache = take(cache, moved, moved)
        start = len(prompt)
        ranked = [(score / ref.length_penalty(len(seq) - start, alpha), seq[start:]) for seq, score in finished + alive]
        score, tokens = max(ranked, key=lambda r: r[0])
        return torch.tensor(tokens, dtype=torch.int64), score

    return beam_search_cached


@torch.no_grad()
def _trace(model, prompt, beam_size, max_new_tokens, eos_id, alpha):
    """beam_search on the uncached model in float64: (tokens, score, the steps at which hypotheses
    finished, the smallest gap between a kept and a dropped candidate or two ranked hypotheses,
    whether it stopped with no beam alive before max_new_tokens)."""
    alive, finished, ends, gap, stopped = [(prompt.tolist(), 0.0)], [], set(), math.inf, False
    for step in range(max_new_tokens):
        logp = torch.log_softmax(model(torch.tensor([seq for seq, _ in alive]))[:, -1].double(), dim=-1)
        scores = (torch.tensor([score for _, score in alive], dtype=torch.float64)[:, None] + logp).flatten()
        order = torch.sort(scores, descending=True)
        keep = min(beam_size, scores.numel())
        if keep < scores.numel():
            gap = min(gap, float(order.values[keep - 1] - order.values[keep]))
        nxt = []
        for flat in order.indices[:keep].tolist():
            beam, token = divmod(flat, logp.shape[-1])
            hypothesis = (alive[beam][0] + [token], float(scores[flat]))
            if token == eos_id:
                finished.append(hypothesis)
                ends.add(step)
            else:
                nxt.append(hypothesis)
        alive = nxt
        if not alive:
            stopped = step < max_new_tokens - 1
            break
    start = len(prompt)
    ranked = sorted(((score / ref.length_penalty(len(seq) - start, alpha), seq[start:])
                     for seq, score in finished + alive), reverse=True)
    if len(ranked) > 1:
        gap = min(gap, ranked[0][0] - ranked[1][0])
    return ranked[0][1], ranked[0][0], ends, gap, stopped


# (config, prompt length, beam_size, max_new_tokens, alpha, what the call is for, what its reference run must
# show: tokens, the steps at which hypotheses finished, whether it stopped with none alive, eos_id)
_BEAM_CACHED = [
    (dict(vocab_size=11, d_model=12, heads=3, d_ff=20, layers=2, max_len=16, tie_weights=True), 3, 3, 6, 0.6,
     "beams that finish at different steps",
     lambda tokens, ends, stopped, eos: len(ends) > 1 and len(tokens) > 3),
    (dict(vocab_size=5, d_model=8, heads=2, d_ff=10, layers=1, max_len=12, tie_weights=True), 1, 6, 4, 0.6,
     "a beam larger than the first step's candidates", lambda tokens, ends, stopped, eos: len(tokens) > 2),
    (dict(vocab_size=11, d_model=12, heads=3, d_ff=20, layers=2, max_len=16, tie_weights=True), 2, 1, 5, 0.6,
     "beam_size 1, greedy decoding, which stops at eos_id", lambda tokens, ends, stopped, eos: stopped),
    (dict(vocab_size=9, d_model=10, heads=2, d_ff=6, layers=2, max_len=14, tie_weights=True), 1, 2, 5, 1.0,
     "a prompt of one token, the best hypothesis still alive at the last step",
     lambda tokens, ends, stopped, eos: len(tokens) == 5 and tokens[-1] != eos and ends),
]
_REORDERS = ("parents", "none", "keys", "values", "after")


def _beam_cached_calls(rng: np.random.Generator) -> list[Call]:
    """Drawn GPTs and prompts. Each call is decided by a margin (1e-3 at least between a kept and a
    dropped candidate, and between the two best hypotheses, in float64), so float32's rounding in
    batches of other sizes changes no choice; on the first, hypotheses finish at two steps at least
    and every catalogued mistake answers otherwise than the reference and than each other; greedy
    decoding (beam 1) writes eos_id before max_new_tokens, so the search stops with no beam alive."""
    with _one_thread():
        return [_beam_cached_call(rng, *row, apart=i == 0) for i, row in enumerate(_BEAM_CACHED)]


def _beam_cached_call(rng, cfg, length, beam, steps, alpha, purpose, need, apart) -> Call:
    from coursekit.drivers.gpt import beam_cached

    shapes = _model_shapes(cfg)
    while True:
        weights = draw_weights(rng, shapes)
        model = _gpt_of(cfg, weights).double()
        prompt = rng.integers(0, cfg["vocab_size"], size=length).astype(np.int64)
        eos = int(rng.integers(0, cfg["vocab_size"]))
        tokens, _, ends, gap, stopped = _trace(model, torch.tensor(prompt), beam, steps, eos, alpha)
        if gap < 1e-3 or not need(tokens, ends, stopped, eos):
            continue
        spec, flat = _packed(cfg, shapes, weights)
        args = (spec, flat, prompt, beam, steps, eos, alpha)
        if apart:
            answers = [beam_cached(_beam_cached_variant(reorder))(*args) for reorder in _REORDERS]
            answers.append(beam_cached(_beam_cached_variant(again=True))(*args))
            if not all(_apart_answers(answers[i], answers[j]) for i in range(len(answers)) for j in range(i)):
                continue
        what = (f"beam_search_cached(model, prompt of {length} token(s), beam_size={beam}, max_new_tokens={steps}, "
                f"eos_id={eos}, alpha={alpha}) on a GPT(layers={cfg['layers']}, vocab_size={cfg['vocab_size']}): "
                f"{purpose}")
        return Call(args, what=what)


def _apart_answers(a: tuple, b: tuple) -> bool:
    """Two (tokens, score, ...) answers differ: other tokens, or scores 1e-3 apart at least."""
    return a[0].tolist() != b[0].tolist() or abs(float(a[1]) - float(b[1])) > 1e-3


def _beam_cached_answer(answer: object, call: Call, what: str) -> tuple:
    """(tokens, score): what the catalogue compares; the forward passes are judged apart."""
    if not isinstance(answer, tuple) or len(answer) != 3:
        raise CheckFailed(f"{what}: expected (tokens, score)")
    return answer[0], answer[1]


RECOMPUTED = ("the tokens and the score are right, but a step after the first forwards {cols} positions per beam: "
              "the cache already holds the keys and values of the prompt and of the tokens before, so each step "
              "forwards only the new token of each alive beam, ids (alive, 1), with the cache reordered by the "
              "beams' parents")
PER_BEAM = ("the tokens and the score are right, but the model ran {calls} forward passes for {steps} steps: one "
            "forward_cached call per step, all alive beams as one batch (alive, 1), their caches stacked on the "
            "batch axis and reordered with index_select")


def _judge_beam_cached(case: Case) -> None:
    """The hypothesis and its score (within 1e-4) first, then the forward passes: the prompt once,
    then one pass per step of one new token per alive beam."""
    _explain_raised(case)
    got = value(case.answer, case.what)
    if not isinstance(got, tuple) or len(got) != 3:
        raise CheckFailed(f"{case.what}: expected (tokens, score)")
    tokens, score, forwarded = got
    if not isinstance(tokens, np.ndarray) or tokens.dtype.kind not in "iu" or tokens.ndim != 1:
        raise CheckFailed(f"{case.what}: the tokens should be a 1-d int64 tensor of the new token ids")
    expected_tokens, expected_score, expected_forwarded = case.expected
    same_tokens = tokens.shape == expected_tokens.shape and np.array_equal(tokens, expected_tokens)
    if not (same_tokens and np.allclose(to_array(score, case.what), expected_score, rtol=0, atol=case.spec.atol)):
        found = catalogued(case, (tokens, score))
        if found:
            case.fail(found)
        if same_tokens:
            case.fail("the tokens are right, but the score is not their summed log-probability divided by the "
                      "length penalty ((5 + n) / 6) ** alpha, as beam_search's")
        case.fail("it returns another hypothesis than beam_search without a cache: forward the prompt once, then "
                  "before each step reorder every block's keys and values by the parent index of the surviving "
                  "beams (index_select on the batch axis), and feed each alive beam's new token")
    forwarded = np.asarray(forwarded).reshape(-1, 2)
    later = forwarded[1:]
    if len(later) and later[:, 1].max() > 1:
        case.fail(RECOMPUTED.format(cols=int(later[:, 1].max())))
    if len(forwarded) > len(expected_forwarded) + 2:
        case.fail(PER_BEAM.format(calls=len(forwarded), steps=len(expected_forwarded)))


def _recomputed(model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6):
    """beam_search with forward_cached and no cache: every step forwards the whole beams."""
    return ref.beam_search(lambda ids: ref.forward_cached(model, ids)[0], prompt, beam_size, max_new_tokens, eos_id,
                           alpha)


@torch.no_grad()
def _per_beam(model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6):
    """Each beam's cache kept apart, one forward_cached call per beam and step."""
    logits, cache = ref.forward_cached(model, prompt[None])
    alive, finished = [(prompt.tolist(), 0.0, cache, logits[0, -1])], []
    for step in range(max_new_tokens):
        logp = torch.stack([torch.log_softmax(last.double(), dim=-1) for _, _, _, last in alive])
        scores = torch.tensor([score for _, score, _, _ in alive], dtype=torch.float64)[:, None] + logp
        best = torch.topk(scores.flatten(), min(beam_size, scores.numel())).indices.tolist()
        grown = []
        for flat in best:
            beam, token = divmod(flat, logp.shape[-1])
            seq, past = alive[beam][0] + [token], alive[beam][2]
            if token == eos_id:
                finished.append((seq, scores[beam, token].item()))
            else:
                grown.append((seq, scores[beam, token].item(), past))
        if not grown or step == max_new_tokens - 1:
            alive = [(seq, score, past, None) for seq, score, past in grown]
            break
        alive = []
        for seq, score, past in grown:
            logits, cache = ref.forward_cached(model, torch.tensor([[seq[-1]]]), past)
            alive.append((seq, score, cache, logits[0, -1]))
    start = len(prompt)
    ranked = [(score / ref.length_penalty(len(seq) - start, alpha), seq[start:])
              for seq, score in finished + [(seq, score) for seq, score, _, _ in alive]]
    score, tokens = max(ranked, key=lambda r: r[0])
    return torch.tensor(tokens, dtype=torch.int64), score


def _finishes_apart(call: Call) -> bool:
    """On this call, hypotheses finish (write eos_id) at two steps at least."""
    spec, flat, prompt, beam, steps, eos, alpha = call.args
    model = _gpt_of(json.loads(spec), _unpack_weights(spec, flat)).double()
    return len(_trace(model, torch.tensor(prompt), beam, steps, eos, alpha)[2]) > 1


def _stops_early(call: Call) -> bool:
    """On this call, no beam is alive before max_new_tokens steps."""
    spec, flat, prompt, beam, steps, eos, alpha = call.args
    model = _gpt_of(json.loads(spec), _unpack_weights(spec, flat)).double()
    return _trace(model, torch.tensor(prompt), beam, steps, eos, alpha)[4]


def _alive_wins(call: Call) -> bool:
    """On this call, the best hypothesis is one still alive after max_new_tokens steps."""
    spec, flat, prompt, beam, steps, eos, alpha = call.args
    model = _gpt_of(json.loads(spec), _unpack_weights(spec, flat)).double()
    tokens = _trace(model, torch.tensor(prompt), beam, steps, eos, alpha)[0]
    return len(tokens) == steps and tokens[-1] != eos


def _unpack_weights(spec, flat) -> dict:
    from coursekit.drivers.transformer import _unpack

    return _unpack(spec, flat)


def _unreordered_differs(call: Call) -> bool:
    """A cache not reordered gives another hypothesis or score on this call."""
    from coursekit.drivers.gpt import beam_cached

    return _apart_answers(*(beam_cached(fn)(*call.args) for fn in (ref.beam_search_cached,
                                                                    _beam_cached_variant("none"))))


BEAM_SEARCH_CACHED = Spec(
    id="gpt-beam_search_cached",
    function="beam_search_cached",
    driver="gpt.beam_cached",
    inputs=_beam_cached_calls,
    reference=ref.beam_search_cached,
    prepare=_beam_cached_answer,
    judge=_judge_beam_cached,
    atol=DEEP_ATOL,
    variant=_beam_cached_variant,
    depends=("gpt-forward_cached",),
    knobs=(
        Knob("reorder", (
            ("none", "the cache is not reordered: each beam keeps the past of its row, not of the beam it grew "
                     "from. Before each step, reorder every block's keys and values by the surviving beams' parent "
                     "index: k.index_select(0, parents), v.index_select(0, parents)"),
            ("keys", "only the keys are reordered by the parent index: the values keep each row's past. Reorder "
                     "both, k.index_select(0, parents) and v.index_select(0, parents), in every block"),
            ("values", "only the values are reordered by the parent index: the keys keep each row's past. Reorder "
                       "both, k.index_select(0, parents) and v.index_select(0, parents), in every block"),
            ("after", "the cache is reordered after the new tokens' keys and values are appended: each new token "
                      "was run against its row's past, not its parent's. Reorder the cache by the parent index "
                      "first, then call forward_cached with the new tokens"),
        )),
    ),
    mistakes=(
        Mistake("prompt_last_again", "the prompt's last token is fed again after the prompt's cache: it sits at "
                                     "two positions, and every new token one position late. The prompt's forward "
                                     "gives its cache and the logits of its last position; choose the first "
                                     "tokens from those, then feed only new tokens",
                _beam_cached_variant(again=True)),
    ),
    errors=(
        Raises("{what} raised {error}: beam_search_cached runs the model only through your forward_cached (the "
               "prompt once, then one new token per alive beam and step); calling model(ids), or beam_search, "
               "does not use the cache", match="not model\\(\\.\\.\\.\\)",
               example=lambda model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6: ref.beam_search(
                   model, prompt, beam_size, max_new_tokens, eos_id, alpha)),
        Raises("{what} raised {error}: the cache is not reordered to the alive beams: its batch axis must match "
               "the new tokens', one row per alive beam. Reorder it with the parent index, k.index_select(0, "
               "parents), which also repeats the prompt's row for the first beams",
               match="Sizes of tensors must match|size of tensor",
               example=lambda model, prompt, *rest: _beam_cached_unrepeated(model, prompt, *rest)),
    ),
    diagnosed=(
        Mistake("recomputed", RECOMPUTED.split("{cols}")[0], _recomputed),
        Mistake("per_beam", PER_BEAM.split("{calls}")[0], _per_beam),
    ),
    equivalent=(
        ("L11 -1 -> 1 #2", "the log-probabilities are 2-d, (alive, V): dim=1 is dim=-1"),
        ("L12 torch.tensor([score for _, score in alive], dtype=torch.f... -> torch.tensor([score for _, score in "
         "alive])", "the running scores rounded to float32 (relative 6e-8) are added to float64 log-probabilities: "
                    "far below the score's tolerance (1e-4) and the 1e-3 margins the calls are drawn with"),
        ("L14 -1 -> 1", "logp is 2-d, (alive, V): shape[1] is shape[-1]"),
        ("L32 max(ranked, key=lambda r: r[0]) -> max(ranked)", "ranked holds (score, tokens): max compares the "
                                                               "scores first, and the calls are drawn 1e-3 apart"),
        ("L33 torch.tensor(tokens, dtype=torch.int64) -> torch.tensor(tokens)", "a list of Python ints is int64"),
    ) + tuple((name, "one more forward pass after the last step, whose logits are never read: the same hypotheses "
                     "and scores, and one call more than the steps, which the judge allows (nanoGPT's loop, the "
                     "prompt but its last token first, makes as many); a beam search that stops with none alive "
                     "still breaks") for name in ("L25 max_new_tokens - 1 -> max_new_tokens + 1",
                                                 "L25 max_new_tokens - 1 -> max_new_tokens", "L25 1 -> 0")),
    rules=(
        Rule("beam_size = 1 is greedy decoding", lambda call: call.args[3] == 1),
        Rule("a beam larger than the first step's candidates", lambda call: call.args[3] > json.loads(
            call.args[0])["vocab_size"]),
        Rule("a prompt of one token", lambda call: len(call.args[2]) == 1),
        Rule("a prompt of several tokens", lambda call: len(call.args[2]) > 1),
        Rule("hypotheses finish at different steps", _finishes_apart),
        Rule("the search stops when no beam is alive", _stops_early),
        Rule("a hypothesis still alive after max_new_tokens steps can win", _alive_wins),
        Rule("the cache reordered by the beams' parents", _unreordered_differs),
    ),
)


@torch.no_grad()
def _beam_cached_unrepeated(model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6):
    """The prompt's cache (one row) handed on as it is with the new tokens of several beams."""
    logits, cache = ref.forward_cached(model, prompt[None])
    logp = torch.log_softmax(logits[0, -1].double(), dim=-1)
    top = torch.topk(logp, min(beam_size, len(logp))).indices
    logits, cache = ref.forward_cached(model, top[:, None], cache)
    return torch.tensor([int(top[0])]), float(logp[top[0]])


SPECS = (BLOCK, GPT, NEXT_TOKEN_LOSS, PERPLEXITY, GPT2_INIT, PARAM_GROUPS, NEXT_TOKEN_PROBS, FORWARD_CACHED, BEAM_SEARCH,
         BEAM_SEARCH_CACHED, GENERATE_BATCH)
