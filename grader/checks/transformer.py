"""Hidden checks of notebook 09, transformer: the full model, the label-smoothed loss, the
warmup schedule, greedy decoding and one training step.

The references are learner-style torch code (``reference/transformer.py``), run through the
same drivers as the learner's (``coursekit/drivers/transformer.py``), which load the weights
drawn here by name; greedy decoding and the training step get the drivers' stand-in models.

Sizes are pairwise distinct: src_vocab 11, tgt_vocab 13, d_model 12, 3 heads (d_k 4),
d_ff 20, batch 2, source length 5, target length 6, so that swapped embeddings or axes
either raise or show. Sentence 1 of every batch is padded (source and target). Mask
convention of the course: True = may attend / real token; torch's masks are the reverse.
Logits at padding positions of tgt_in are not checked (no loss is computed there).
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import torch
import torch.nn.functional as F

from ._core import (Call, Knob, Case, CheckFailed, Hint, Mistake, Probe, Raised, Raises, Rule, Spec, Unsupported,
                    _explain_raised, close, judge_case, to_array, value)
from .encoder import RATE_IN_EVAL
from .reference import transformer as ref

DEEP_ATOL = 1e-4  # two-layer stacks in float32


# ---------------------------------------------------------------- the model

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
    return draw_weights(rng, _param_shapes(cfg))


def draw_weights(rng, shapes) -> dict:
    """Weights (name -> array) for ``shapes`` [(name, shape), ...] of the scale a trained model has:
    layer norms near 1 with a bias (a norm ignores a plain scale), embeddings of norm ~1, matrices of
    gain ~1 (notebook 12's model draws its weights here too)."""
    p = {}
    for name, shape in shapes:
        if "norm" in name:
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


def _tokens(rng, batch, length, vocab, pad, lengths):
    ids = rng.integers(0, vocab, size=(batch, length))
    ids = np.where(ids == pad, (pad + 1) % vocab, ids)
    for b, n in enumerate(lengths):
        ids[b, n:] = pad
    return ids.astype(np.int64)


def _model_calls(rng: np.random.Generator) -> list[Call]:
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
        asked.append(Call((spec, flat, src, tgt_in), what=what))
    return asked


def _variant(name: str, **methods):
    """The reference Transformer with some methods replaced: a learner's class with one mistake."""
    return type("Transformer", (ref.Transformer,), dict(methods, __doc__=name))


def _embedding(scale=math.sqrt, src_pe=True, tgt_pe=True, swap=False, dropout=None):
    """encode/decode whose embedding step has a mistake (scale, positions, tables, dropout)."""

    def embed(self, table, ids, pe):
        x = table(ids) * scale(self.d_model) + (self.pe[: ids.shape[1]] if pe else 0)
        return dropout(x) if dropout else self.dropout(x)

    def encode(self, src, src_mask):
        x = embed(self, self.tgt_embed if swap else self.src_embed, src, src_pe)
        for layer in self.encoder_layers:
            x = layer(x, src_key_padding_mask=~src_mask)
        return x

    def decode(self, memory, src_mask, tgt_in):
        y = embed(self, self.src_embed if swap else self.tgt_embed, tgt_in, tgt_pe)
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_mask=~ref.causal_mask(tgt_in.shape[1]), memory_key_padding_mask=~src_mask)
        return self.generator(y)

    return {"encode": encode, "decode": decode}


def _decoder_masks(future=lambda T: ~ref.causal_mask(T), memory=lambda src_mask: ~src_mask):
    """decode with the causal mask or the memory's padding mask wrong (torch's masks: True = ignore)."""

    def decode(self, memory_, src_mask, tgt_in):
        y = self.dropout(self.tgt_embed(tgt_in) * math.sqrt(self.d_model) + self.pe[: tgt_in.shape[1]])
        for layer in self.decoder_layers:
            y = layer(y, memory_, tgt_mask=future(tgt_in.shape[1]), memory_key_padding_mask=memory(src_mask))
        return self.generator(y)

    return {"decode": decode}


def _unmasked_encoder(self, src, src_mask):
    x = self.dropout(self.src_embed(src) * math.sqrt(self.d_model) + self.pe[: src.shape[1]])
    for layer in self.encoder_layers:
        x = layer(x)
    return x


def _after(fn):
    """decode followed by ``fn`` of the logits."""
    return {"decode": lambda self, memory, src_mask, tgt_in: fn(ref.Transformer.decode(self, memory, src_mask, tgt_in))}


def _shared_layers(self, *args, **kwargs):
    ref.Transformer.__init__(self, *args, **kwargs)
    self.encoder_layers = torch.nn.ModuleList([self.encoder_layers[0]] * len(self.encoder_layers))


def _whole_table(self, src, src_mask):
    x = self.src_embed(src) * math.sqrt(self.d_model) + self.pe  # (not cut to src_len)
    for layer in self.encoder_layers:
        x = layer(x, src_key_padding_mask=~src_mask)
    return x


def _positional_mask(self, src, src_mask):
    x = self.dropout(self.src_embed(src) * math.sqrt(self.d_model) + self.pe[: src.shape[1]])
    for layer in self.encoder_layers:
        x = layer(x, ~src_mask)  # torch's second argument is the (len, len) attention mask
    return x


def _memories(layerwise=False, chained=True, kept=True):
    """forward whose decoder layers read the wrong memory: decoder layer i the output of encoder
    layer i (``layerwise``), or an encoder whose layers each read the embeddings (not ``chained``);
    or (not ``kept``) whose layers' outputs are never assigned."""

    def forward(self, src, tgt_in):
        src_mask = src != self.pad_id
        embedded = self.dropout(self.src_embed(src) * math.sqrt(self.d_model) + self.pe[: src.shape[1]])
        x, outputs = embedded, []
        for layer in self.encoder_layers:
            out = layer(x if chained else embedded, src_key_padding_mask=~src_mask)
            x = out if kept else x
            outputs.append(x)
        y = self.dropout(self.tgt_embed(tgt_in) * math.sqrt(self.d_model) + self.pe[: tgt_in.shape[1]])
        for i, layer in enumerate(self.decoder_layers):
            out = layer(y, outputs[i] if layerwise else x, tgt_mask=~ref.causal_mask(tgt_in.shape[1]),
                        memory_key_padding_mask=~src_mask)
            y = out if kept else y
        return self.generator(y)

    return {"forward": forward}


def _forward_apart(self, src, tgt_in):
    """forward right, but decode (which greedy_decode calls) ignores the source padding."""
    src_mask = src != self.pad_id
    return ref.Transformer.decode(self, self.encode(src, src_mask), src_mask, tgt_in)


SWAPPED = _variant("embeddings swapped", **_embedding(swap=True))
SWAPPED_DIAGNOSIS = ("src_embed and tgt_embed are swapped: src_embed embeds the source ids (encoder), tgt_embed "
                     "the target ids (decoder)")
TOKEN_IDS_TOO_LARGE = ("token ids beyond an embedding's size. Are src_embed and tgt_embed swapped (src_embed = "
                       "nn.Embedding(src_vocab, d_model) embeds src, tgt_embed embeds tgt_in)?")


def _real(logits: object, call: Call, what: str) -> np.ndarray:
    """Logits at the positions that are not padding in tgt_in (the only ones a loss reads)."""
    logits = to_array(logits, what)
    cfg, tgt_in = json.loads(call.args[0]), call.args[3]
    real = tgt_in != cfg["pad_id"]
    return logits[real] if logits.shape == real.shape + (cfg["tgt_vocab"],) else logits


def _logits(answer: object, call: Call, what: str) -> np.ndarray:
    """What is compared: the first forward's logits, at the real positions."""
    if not isinstance(answer, tuple) or len(answer) != 3:
        raise CheckFailed(f"{what}: expected the logits, one tensor (batch, tgt_len, tgt_vocab)")
    return _real(answer[0], call, what)


def _judge_model(case: Case) -> None:
    """The model's own order: how it raised, the shape, dropout in eval mode, the catalogue,
    then whether decode(encode(...)) agrees with forward (greedy_decode relies on it)."""
    what, answer = case.what, case.answer
    if isinstance(answer, Raised) and "index out of range" in answer.message:
        raise CheckFailed(f"{what} raised {answer.message}: {TOKEN_IDS_TOO_LARGE}")
    _explain_raised(case)
    first = _logits(answer, case.call, what)
    full = to_array(answer[0], what)
    expected = to_array(case.expected[0], what)
    if full.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {full.shape}; expected (batch, tgt_len, tgt_vocab) = {expected.shape}: "
                          "the generator projects every target position to tgt_vocab logits")
    second = _real(answer[1], case.call, what)
    # NaN in both calls is the same output: the hint about NaN says more than "dropout" would
    if second.shape != first.shape or not np.allclose(first, second, rtol=case.spec.rtol, atol=DEEP_ATOL,
                                                      equal_nan=True):
        raise CheckFailed(f"{what}: two calls in eval mode gave different outputs, so dropout is still on in "
                          "eval mode. Use nn.Dropout modules (model.eval() switches them off), or "
                          "F.dropout(x, p, training=self.training)")
    swapped = case.spec.run(SWAPPED, [case.call])[0]
    if not isinstance(swapped, (Raised, Unsupported)) and close(first, _logits(swapped, case.call, what),
                                                               atol=DEEP_ATOL):
        case.fail(SWAPPED_DIAGNOSIS)
    judge_case(case)
    third = to_array(answer[2], what)
    if third.shape != expected.shape or not close(_real(third, case.call, what),
                                                  _real(expected, case.call, what), atol=DEEP_ATOL):
        raise CheckFailed(f"{what}: forward(src, tgt_in) is right, but decode(encode(src, src_mask), src_mask, tgt_in) "
                          "with src_mask = src != pad_id differs from it. forward should be exactly that; "
                          "greedy_decode relies on encode and decode")


def _config(call: Call) -> dict:
    return json.loads(call.args[0])


def _different_lengths(ids: np.ndarray, pad: int) -> bool:
    return len(set(np.sum(ids != pad, axis=-1).tolist())) > 1


_MODEL_RULES = (
    Rule("src_len != tgt_len", lambda call: call.args[2].shape[1] != call.args[3].shape[1]),
    Rule("padding in the source", lambda call: _different_lengths(call.args[2], _config(call)["pad_id"])),
    Rule("padding in the target", lambda call: _different_lengths(call.args[3], _config(call)["pad_id"])),
    Rule("pad_id != 0", lambda call: _config(call)["pad_id"] != 0),
    Rule("two layers", lambda call: _config(call)["layers"] >= 2),
    Rule("src_vocab != tgt_vocab", lambda call: _config(call)["src_vocab"] != _config(call)["tgt_vocab"]),
)

TRANSFORMER = Spec(
    id="transformer-Transformer",
    submodules=("src_embed", "tgt_embed", "encoder_layers.*", "decoder_layers.*", "generator",
                "encoder_layers.*.self_attn", "encoder_layers.*.norm1", "encoder_layers.*.linear1",
                "encoder_layers.*.linear2", "encoder_layers.*.norm2", "decoder_layers.*.self_attn",
                "decoder_layers.*.multihead_attn", "decoder_layers.*.norm1", "decoder_layers.*.norm2",
                "decoder_layers.*.norm3", "decoder_layers.*.linear1", "decoder_layers.*.linear2"),
    function="Transformer",
    driver="transformer.model",
    inputs=_model_calls,
    rules=_MODEL_RULES,
    equivalent=(
        ("L9 False -> True", "a persistent buffer differs only in the state_dict; the weights are loaded by name"),
        ("L9 ...ng(max_len, d_model), persistent=False) -> ...ng(max_len, d_model))",
         "a persistent buffer differs only in the state_dict; the weights are loaded by name"),
        ("L11 nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout,... -> "
         "nn.TransformerEncoderLayer(d_model, heads, d_ff, batch_fi...", RATE_IN_EVAL),
        ("L13 nn.TransformerDecoderLayer(d_model, heads, d_ff, dropout,... -> "
         "nn.TransformerDecoderLayer(d_model, heads, d_ff, batch_fi...", RATE_IN_EVAL),
    ),
    reference=ref.Transformer,
    prepare=_logits,
    judge=_judge_model,
    atol=DEEP_ATOL,
    mistakes=(
        Mistake("no_scale", "the embeddings are not multiplied by sqrt(d_model) (Sec. 3.4): embed(ids) * "
                "math.sqrt(d_model), then add the positional encoding",
                _variant("no scale", **_embedding(scale=lambda d: 1.0))),
        Mistake("scale_d_model", "the embeddings are multiplied by d_model; the paper multiplies them by "
                "sqrt(d_model)", _variant("scaled by d_model", **_embedding(scale=float))),
        Mistake("no_positions", "there is no positional encoding: add pe[:seq_len] to the scaled embeddings of "
                "both src and tgt_in", _variant("no positions", **_embedding(src_pe=False, tgt_pe=False))),
        Mistake("positions_src_only", "the positional encoding is added to the source embeddings only: the "
                "decoder's input needs it too", _variant("positions in the encoder", **_embedding(tgt_pe=False))),
        Mistake("positions_tgt_only", "the positional encoding is added to the target embeddings only: the "
                "encoder's input needs it too", _variant("positions in the decoder", **_embedding(src_pe=False))),
        Mistake("no_causal_mask", "the decoder's self-attention has no causal mask, so position t sees the target "
                "tokens after it. Pass tgt_mask=causal_mask(tgt_len) to every decoder layer",
                _variant("no causal mask", **_decoder_masks(future=lambda T: None))),
        Mistake("causal_hides_diagonal", "the causal mask hides the diagonal: a position must attend to itself too "
                "(position 0 then sees nothing at all). Use torch.tril(ones, diagonal=0): position t sees "
                "positions 0 ... t", _variant("diagonal hidden", **_decoder_masks(
                    future=lambda T: ~torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1)))),
        Mistake("causal_one_ahead", "the causal mask lets each position see one token ahead (torch.triu/tril off "
                "by one): position t may attend to positions 0 ... t only, torch.tril(ones, diagonal=0)",
                _variant("one ahead", **_decoder_masks(
                    future=lambda T: ~torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=1)))),
        Mistake("no_memory_mask", "the cross-attention ignores the source padding: pass memory_padding_mask="
                "src_mask (True = real token) to every decoder layer",
                _variant("no memory mask", **_decoder_masks(memory=lambda src_mask: None))),
        Mistake("no_encoder_mask", "the encoder's self-attention ignores the source padding: pass src_mask (True "
                "= real token) to every encoder layer", _variant("no encoder mask", encode=_unmasked_encoder)),
        Mistake("probabilities", "it returns probabilities (a softmax of the logits): return the generator's raw "
                "logits; the loss applies log_softmax itself", _variant("softmax", **_after(lambda z: z.softmax(-1)))),
        # (the first model has two layers: a wrong memory shows there)
        Mistake("memory_per_layer", "decoder layer i reads the output of encoder layer i as its memory; every decoder "
                "layer's cross-attention reads the encoder's FINAL output, memory = encode(src, src_mask)",
                _variant("memory per layer", **_memories(layerwise=True))),
        Mistake("encoder_not_chained", "each encoder layer is applied to the embeddings instead of to the previous "
                "layer's output (the loop does not carry x forward): x = layer(x, src_key_padding_mask=...)",
                _variant("encoder not chained", **_memories(chained=False))),
        Mistake("layers_unused", "the logits come from the target embeddings alone: the layers' outputs are not "
                "kept. Assign each one, x = layer(x, ...) in the encoder and y = layer(y, memory, ...) in the decoder",
                _variant("layers unused", **_memories(kept=False))),
        Mistake("log_probabilities", "it returns log-probabilities: return the generator's raw logits; the loss "
                "applies log_softmax itself", _variant("log_softmax", **_after(lambda z: z.log_softmax(-1)))),
    ),
    hints=(
        Hint("NaN in the logits: some query has no key left. Is the causal mask hiding the diagonal (a position "
             "must see itself: torch.tril(..., diagonal=0)), or is a mask inverted (torch's key_padding_mask and "
             "attn_mask use True = ignore)?", lambda got, call: bool(np.isnan(got).any()),
             # (a float mask built as (~allowed) * -inf: 0 * -inf is NaN where attending is allowed)
             example=_variant("float mask", **_decoder_masks(
                 future=lambda T: (~ref.causal_mask(T)).float() * float("-inf")))),
    ),
    errors=(
        Raises("{what}: the grader could not load its weights into your model: {error}",
               match="has no parameter|should have shape|one tensor|does not name|has no method",
               example=_variant("one layer repeated", __init__=_shared_layers)),
        Raises("{what} raised {error}. The positional encoding must be cut to the sequence length: pe[:seq_len], "
               "not the whole max_len table", match="must match the size.*dimension 1",
               example=_variant("whole table", encode=_whole_table)),
        Raises("{what} raised {error}", example=_variant("mask as attn_mask", encode=_positional_mask)),
    ),
    diagnosed=(
        # Swapped tables raise for most draws (ids beyond the smaller table) and give wrong logits for
        # the rest; either way the diagnosis names the two embeddings.
        Mistake("swapped_embeddings", "src_embed and tgt_embed", SWAPPED),
        Mistake("functional_dropout", "dropout is still on in eval mode", _variant(
            "F.dropout", **_embedding(dropout=lambda x: F.dropout(x, 0.3)))),
        Mistake("decode_ignores_src_mask", "greedy_decode relies on encode and decode", _variant(
            "forward apart", forward=_forward_apart, **_decoder_masks(memory=lambda src_mask: None))),
    ),
)


# ---------------------------------------------------------------- label-smoothed loss

def _loss_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    for shape, vocab, pad, eps, lengths in [((3, 5), 7, 0, 0.1, (5, 2, 4)), ((2, 4), 9, 3, 0.25, (4, 1)),
                                            ((2, 6), 6, 1, 0.0, (6, 3))]:
        logits = rng.normal(scale=2.0, size=shape + (vocab,))
        target = _tokens(rng, shape[0], shape[1], vocab, pad, lengths)
        what = (f"label_smoothed_loss(logits {logits.shape}, target {target.shape}, pad_id={pad}, smoothing={eps})")
        asked.append(Call((logits, target, pad, eps), what=what))
    # 2-D logits (tokens, V) and float32 logits
    logits = rng.normal(scale=1.5, size=(7, 8)).astype(np.float32)
    target = rng.integers(1, 8, size=7).astype(np.int64)
    target[[2, 5]] = 0
    what = "label_smoothed_loss(logits (7, 8) float32, target (7,), pad_id=0, smoothing=0.2)"
    asked.append(Call((logits, target, 0, 0.2), what=what))
    return asked


def _loss_probe(rng: np.random.Generator, smoothing: float) -> list[Call]:
    """Logits that are log-probabilities, and counts of real tokens per sentence that tell every
    reduction apart: (6, 3, 1) of 6 positions, (5, 1, 3, 2) of 5."""
    calls = []
    for batch, length, vocab, pad, lengths in [(3, 6, 5, 0, (6, 3, 1)), (4, 5, 6, 2, (5, 1, 3, 2))]:
        logits = rng.normal(scale=1.5, size=(batch, length, vocab))
        logits -= np.log(np.exp(logits).sum(-1, keepdims=True))
        calls.append(Call((logits, _tokens(rng, batch, length, vocab, pad, lengths), pad, smoothing),
                          what=f"label_smoothed_loss on log-probabilities, smoothing={smoothing}"))
    return calls


def _scalar(answer: object, call: Call, what: str) -> np.ndarray:
    """The loss as a 0-d array; one loss per token, or any other shape, is diagnosed here."""
    arr = to_array(answer, what)
    target = np.asarray(call.args[1])
    if arr.size == target.size or arr.shape == target.shape:
        raise CheckFailed(f"{what} returns one loss per token, shape {arr.shape}: average over the non-padding "
                          "tokens and return a scalar")
    if arr.shape not in ((), (1,)):
        raise CheckFailed(f"{what} should be a scalar (a 0-d tensor), but it has shape {arr.shape}")
    return arr.reshape(())


_LOGS = {"log_softmax": lambda z: F.log_softmax(z, dim=-1), "logits": lambda z: z,
         "softmax": lambda z: z.softmax(-1),
         # F.log_softmax(logits) without dim: torch picks dim=0 for 3-D logits (the batch), dim=1 for 2-D
         "implicit": lambda z: F.log_softmax(z, dim=0 if z.dim() in (0, 1, 3) else 1)}


def _smoothed(spread="nonpad", keep_pads=False, reduce="mean", log="log_softmax", divergence="cross_entropy"):
    """label_smoothed_loss with some of its choices made wrong (the spec's knobs): the target
    distribution (spread), the positions averaged over (the real tokens; with ``keep_pads``
    every position, the true class's mass added to the row (True) or set in it ("scatter",
    which differs on a padding target's row), or "only" the padding), the reduction (mean, sum, per-sentence mean, the
    sum over all positions' count or over the batch size), what stands for the
    log-probabilities, and cross-entropy against KL divergence."""

    def label_smoothed_loss(logits, target, pad_id, smoothing):
        V = logits.shape[-1]
        log_probs, t = _LOGS[log](logits).reshape(-1, V), target.reshape(-1)
        rows = torch.arange(len(t))
        others = {"nonpad": V - 1, "all": V, "over_V": V, "others": V - 2, "true_only_eps": V - 1}[spread]
        q = torch.full_like(log_probs, smoothing / others)
        if spread != "all":
            q[:, pad_id] = 0.0
        if spread == "others":
            q[rows, t] = 1 - smoothing
        elif keep_pads is True:  # (the true class's mass added to the row: a padding target's row holds 1 - eps)
            q[rows, t] += 1 if spread == "true_only_eps" else 1 - smoothing
        else:  # (set, as scatter_ does: a padding target's row holds 1 - eps + eps / (V - 1) too)
            q[rows, t] = smoothing / others + (1 if spread == "true_only_eps" else 1 - smoothing)
        per_token = -(q * log_probs).sum(-1)
        if divergence == "kl":  # KL(q || p) = -H(q) - sum q log p: the cross-entropy less q's entropy
            per_token = per_token + torch.special.xlogy(q, q).sum(-1)
        every = torch.ones_like(t, dtype=torch.bool)
        kept = {False: t != pad_id, True: every, "scatter": every, "only": t == pad_id}[keep_pads]
        if reduce == "sentence_mean":
            per_token, kept = per_token.reshape(target.shape), kept.reshape(target.shape)
            return torch.stack([row[k].mean() for row, k in zip(per_token, kept) if k.any()]).mean()
        total = per_token[kept].sum()
        return {"mean": total / kept.sum(), "sum": total, "all_count": total / t.numel(),
                "batch": total / target.shape[0]}[reduce]

    return label_smoothed_loss


def _unpacks_the_shape(logits, target, pad_id, smoothing):
    batch, length, vocab = logits.shape  # (tokens, V) logits have two axes
    return ref.label_smoothed_loss(logits, target, pad_id, smoothing)


def _scatter_without_axis(logits, target, pad_id, smoothing):
    V = logits.shape[-1]
    q = torch.full_like(logits, smoothing / (V - 1))
    q.scatter_(-1, target, 1 - smoothing)  # index needs the same number of axes: target.unsqueeze(-1)
    return -(q * F.log_softmax(logits, -1)).sum(-1)[target != pad_id].mean()


def _float_target(logits, target, pad_id, smoothing):
    V = logits.shape[-1]
    return F.nll_loss(F.log_softmax(logits, -1).reshape(-1, V), target.reshape(-1).float(), ignore_index=pad_id)


def _real_counts(call: Call) -> list:
    """The number of non-pad targets of each sentence (one sentence for 1-D targets)."""
    target = np.atleast_2d(call.args[1])
    return np.sum(target != call.args[2], axis=-1).tolist()


_LOSS_RULES = (
    Rule("sentences with different numbers of non-pad targets", lambda call: len(set(_real_counts(call))) > 1),
    Rule("a sentence of one non-pad target", lambda call: 1 in _real_counts(call)),
    Rule("pad_id != 0", lambda call: call.args[2] != 0),
    Rule("smoothing 0", lambda call: call.args[3] == 0),
    Rule("smoothing > 0", lambda call: call.args[3] > 0),
    Rule("(tokens, V) logits", lambda call: np.ndim(call.args[0]) == 2),
    Rule("float32 logits", lambda call: call.args[0].dtype == np.float32),
)

LABEL_SMOOTHED_LOSS = Spec(
    id="transformer-label_smoothed_loss",
    function="label_smoothed_loss",
    driver="tensors",
    inputs=_loss_calls,
    rules=_LOSS_RULES,
    equivalent=(
        ("L11 -1 -> 1",
         "log_probs is reshaped to (tokens, V): its dim=1 is its last axis, dim=-1"),
    ),
    reference=ref.label_smoothed_loss,
    prepare=_scalar,
    mistakes=(
        Mistake("negated", "the loss is negative: the minus sign is missing. The cross-entropy is -sum_c q_c log p_c "
                "(log-probabilities are negative, the loss positive)",
                lambda logits, target, pad_id, smoothing: -ref.label_smoothed_loss(logits, target, pad_id, smoothing)),
        Mistake("class_mean", "it averages over the V classes where the cross-entropy sums over them: "
                "-(q * log_probs).sum(dim=-1), then the mean over the non-padding tokens",
                lambda logits, target, pad_id, smoothing:
                ref.label_smoothed_loss(logits, target, pad_id, smoothing) / logits.shape[-1]),
    ),
    # The choices of the loss are knobs: each wrong setting is a catalogued mistake, and two
    # wrong at once (e.g. a sum that also keeps the padding) are named together.
    variant=_smoothed,
    knobs=(
        Knob("spread", (
            ("all", "it puts smoothing mass on the padding class (torch's label_smoothing spreads eps / V over "
                    "all V classes, padding included). Give padding probability 0 and spread eps over the other "
                    "V - 1 classes: eps / (V - 1) each, plus 1 - eps on the true class"),
            ("over_V", "it spreads eps / V over the non-padding classes, so the target distribution sums to "
                       "1 - eps / V, not 1: with padding excluded there are V - 1 classes, eps / (V - 1) each"),
            ("others", "the true class gets 1 - eps and eps is spread over the V - 2 other non-padding classes; "
                       "the stated convention spreads eps over all V - 1 non-padding classes, the true one "
                       "included, so the true class gets 1 - eps + eps / (V - 1)"),
            ("true_only_eps", "the true class gets 1 + eps / (V - 1): subtract eps from it (1 - eps + "
                              "eps / (V - 1)), so the distribution sums to 1"),
        )),
        Knob("keep_pads", ((True, "padding positions are not ignored: average only over the tokens whose target "
                                  "is not pad_id"),
                           ("scatter", "padding positions are not ignored: average only over the tokens whose target "
                                       "is not pad_id"),
                           ("only", "it averages over the padding positions only: the mask is inverted; keep the "
                                    "tokens whose target is not pad_id (target != pad_id)"))),
        Knob("reduce", (
            ("sum", "it sums over the tokens; take the mean over the non-padding tokens"),
            ("sentence_mean", "it averages per sentence, then over sentences; average over all non-padding "
                              "tokens of the batch at once (as F.cross_entropy's 'mean' with ignore_index does)"),
            ("all_count", "it divides the sum over the non-padding tokens by the number of all positions, padding "
                          "included: divide by the number of non-padding tokens (their mean)"),
            ("batch", "it sums over the tokens and divides by the batch size (a loss per sentence, averaged); take "
                      "the mean over the non-padding tokens"),
        )),
        Knob("log", (
            ("logits", "it uses the logits as log-probabilities: take F.log_softmax(logits, dim=-1) first"),
            ("softmax", "it uses probabilities (softmax) where log-probabilities belong: "
                        "F.log_softmax(logits, dim=-1)"),
            ("implicit", "log_softmax runs over the batch axis for (batch, seq_len, V) logits: F.log_softmax "
                         "without a dim picks dim=0 for a 3-D tensor. Normalize over the vocabulary, "
                         "F.log_softmax(logits, dim=-1)"),
        )),
        Knob("divergence", (("kl", "it computes the KL divergence KL(q || p) = sum q log(q / p); the loss asked "
                                   "is the cross-entropy -sum q log p, which is larger by the entropy of q (the "
                                   "two have the same gradient, but not the same value)"),)),
    ),
    # How the loss is reduced, whatever its target distribution (smoothing 0 makes them all one-hot, and KL
    # equal to the cross-entropy); then the divergence and the target distribution. Logits that are
    # already log-probabilities make log_softmax a no-op, so a forgotten one changes nothing there.
    probes=(
        Probe("reduction", lambda rng: _loss_probe(rng, 0.0), reads=("keep_pads", "reduce", "log"),
              right="the loss is averaged over the right tokens"),
        Probe("divergence", lambda rng: _loss_probe(rng, 0.3), reads=("divergence", "spread", "keep_pads", "reduce"),
              right="the smoothed target distribution and the cross-entropy are right"),
    ),
    errors=(
        Raises("{what} raised {error}: scatter_/gather need an index with the same number of axes as the tensor, "
               "target.unsqueeze(-1)", match="scatter|gather|Index tensor must have", example=_scatter_without_axis),
        Raises("{what} raised {error}: logits may be (tokens, V) as well as (batch, seq_len, V). Flatten them, "
               "logits.reshape(-1, logits.shape[-1]) and target.reshape(-1), instead of unpacking the shape",
               match="values to unpack", example=_unpacks_the_shape),
        Raises("{what} raised {error}: token ids index: keep target int64 (torch.long)",
               match="expected scalar type Long|must be of type Long|dtype to be Long", example=_float_target),
        Raises("{what} raised {error}", example=lambda logits, target, pad_id, smoothing: logits.log_softmax()),
    ),
    diagnosed=(
        Mistake("per_token", "returns one loss per token", lambda logits, target, pad_id, smoothing:
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")),
    ),
)


# ---------------------------------------------------------------- learning-rate schedule

def _schedule_calls(rng: np.random.Generator) -> list[Call]:
    asked = []
    d_model = int(rng.choice([48, 64, 96]))
    warmup = int(rng.choice([40, 50, 70]))
    for step, factor in [(1, 1.0), (int(rng.integers(5, 20)), 2.0), (warmup, 0.5),
                         (int(rng.integers(3 * warmup, 5 * warmup)), 1.5), (int(rng.integers(2, warmup - 5)), 1.0)]:
        args = (step, d_model, warmup, factor)
        what = f"noam_lr(step={step}, d_model={d_model}, warmup={warmup}, factor={factor})"
        asked.append(Call(args, what=what))
    # the default factor (by position only)
    asked.append(Call((7, 32, 25), what="noam_lr(7, 32, 25)"))
    asked.append(Call((0, 64, 50), what="noam_lr(step=0, d_model=64, warmup=50)", raises="ValueError"))
    return asked


def _one_number(answer: object, call: Call, what: str) -> np.ndarray:
    arr = to_array(answer, what)
    if arr.shape not in ((), (1,)):
        raise CheckFailed(f"{what} should be one number, but it has shape {arr.shape}")
    return arr.reshape(())


def _judge_schedule(case: Case) -> None:
    """Step 0 must raise ValueError (the docstring); every other step is judged by value."""
    if not case.call.raises:
        if not isinstance(case.answer, Raised):
            value(case.answer, case.what)  # (a missing return named with its call, as before)
        return judge_case(case)
    what, got = case.what, case.answer
    if not isinstance(got, Raised):
        case.fail("returned a value; steps start at 1, so it should raise ValueError, as the docstring says")
    if got.message.startswith("ValueError"):
        return None
    if got.message.startswith("NotImplementedError"):
        value(got, "noam_lr")
    if got.message.startswith("ZeroDivisionError"):
        raise CheckFailed(f"{what} raised {got.message}; check step < 1 first and raise ValueError, as the "
                          "docstring says")
    raise CheckFailed(f"{what} raised {got.message}; it should raise ValueError, as the docstring says")


def _noam(s, d_model, warmup, factor, warmup_power=-1.5, d_model_power=-0.5, pick=min, offset=0):
    """The schedule's formula with one exponent, the min or the step count changed."""
    if s < 1:
        raise ValueError("steps start at 1")
    s += offset
    return factor * d_model ** d_model_power * pick(s ** -0.5, s * warmup ** warmup_power)


def _asserted_step(step, d_model, warmup, factor=1.0):
    assert step >= 1, "steps start at 1"
    return _noam(step, d_model, warmup, factor)


def _steps(call: Call) -> tuple:
    """(step, warmup) of a call."""
    return call.args[0], call.args[2]


_SCHEDULE_RULES = (
    Rule("step 1", lambda call: _steps(call)[0] == 1),
    Rule("1 < step < warmup", lambda call: 1 < _steps(call)[0] < _steps(call)[1]),
    Rule("step == warmup", lambda call: _steps(call)[0] == _steps(call)[1]),
    Rule("step > warmup", lambda call: _steps(call)[0] > _steps(call)[1]),
    Rule("factor by its default", lambda call: len(call.args) == 3 and not call.raises),
    Rule("factor != 1", lambda call: len(call.args) > 3 and call.args[3] != 1),
    Rule("step 0 raises ValueError", lambda call: call.raises == "ValueError"),
)

NOAM_LR = Spec(
    id="transformer-noam_lr",
    function="noam_lr",
    inputs=_schedule_calls,
    rules=_SCHEDULE_RULES,
    reference=ref.noam_lr,
    prepare=_one_number,
    judge=_judge_schedule,
    rtol=1e-6,
    atol=1e-12,
    mistakes=(
        Mistake("warmup_half", "the warmup term uses warmup ** -0.5; the paper has step * warmup ** -1.5 (Sec. 5.3)",
                lambda s, d, w, f=1.0: _noam(s, d, w, f, warmup_power=-0.5)),
        Mistake("d_model_positive", "it multiplies by d_model ** 0.5; the paper has d_model ** -0.5",
                lambda s, d, w, f=1.0: _noam(s, d, w, f, d_model_power=0.5)),
        Mistake("max", "it takes the max of the two terms; the paper takes the min (a linear rise, then step ** -0.5)",
                lambda s, d, w, f=1.0: _noam(s, d, w, f, pick=max)),
        Mistake("from_zero", "it counts steps from 0 (uses step + 1): the step number passed in is already 1-based",
                lambda s, d, w, f=1.0: _noam(s, d, w, f, offset=1)),
        Mistake("no_factor", "factor is ignored: multiply the schedule by factor",
                lambda s, d, w, f=1.0: _noam(s, d, w, 1.0)),
        Mistake("no_d_model", "d_model ** -0.5 is missing", lambda s, d, w, f=1.0: _noam(s, d, w, f, d_model_power=0)),
    ),
    errors=(
        Raises("{what} raised {error}", example=lambda s, d, w, f=1.0: f * d ** -0.5 * np.min(s ** -0.5, s * w ** -1.5)),
    ),
    diagnosed=(
        Mistake("no_step_check", "check step < 1 first and raise ValueError",
                lambda s, d, w, f=1.0: f * d ** -0.5 * min(s ** -0.5, s * w ** -1.5)),
        Mistake("assert_step", "it should raise ValueError, as the docstring says", _asserted_step),
        Mistake("clamped_step", "returned a value; steps start at 1",
                lambda s, d, w, f=1.0: _noam(max(s, 1), d, w, f)),
    ),
)


# ---------------------------------------------------------------- greedy decoding

def _greedy_calls(rng: np.random.Generator) -> list[Call]:
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
        asked.append(Call((plan, src, bos, eos, pad, max_len, vocab, junk), what=what))
    return asked


def _decoder(stop_at_eos=True, keep_bos=False, early_exit=True, any_stop=False, position=-1, last_only=False,
             encode_each_step=False, bounded=True, write_eos=True, mask=lambda src, pad_id: src != pad_id,
             pick=lambda logits: logits.argmax(-1), layout=lambda ys: ys, whole=False):
    """A greedy_decode with one of the known mistakes switched on (defaults: right); ``whole``:
    the argmax at every position is fed back (the prefix re-predicted), not only the last one's."""

    @torch.no_grad()
    def greedy_decode(model, src, bos_id, eos_id, pad_id, max_len):
        src_mask = mask(src, pad_id)
        memory = model.encode(src, src_mask)
        ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        step = 0
        while step < max_len or not bounded:
            step += 1
            if encode_each_step:
                memory = model.encode(src, src_mask)
            logits = model.decode(memory, src_mask, ys[:, -1:] if last_only else ys)
            nxt = pick(logits[:, position])
            ended = nxt == eos_id
            if stop_at_eos:
                nxt = nxt.masked_fill(done, pad_id)
            if not write_eos:
                nxt = nxt.masked_fill(ended, pad_id)
            prefix = torch.cat([ys[:, :1], pick(logits)[:, :-1]], 1) if whole else ys
            ys = torch.cat([prefix, nxt[:, None]], 1)
            done |= ended if not write_eos else nxt == eos_id
            if any_stop and done.any():
                break
            if early_exit and done.all():
                break
        return layout(ys if keep_bos else ys[:, 1:])

    return greedy_decode


def _judge_greedy(case: Case) -> None:
    """Tokens first (the catalogue by exact equality: ids are integers), then how the stand-in
    was used: one encode, the source mask."""
    what = case.what
    if isinstance(case.answer, Raised) and re.search("more than .* times", case.answer.message):
        case.fail(LOOP_UNBOUNDED)  # (the stand-in raises after max_len + 3 calls of decode)
    _explain_raised(case)
    got = value(case.answer, "greedy_decode")
    if not isinstance(got, tuple) or len(got) != 3:
        raise CheckFailed(f"{what}: expected one int64 tensor of token ids")
    raw, calls, mask_ok = got
    if isinstance(raw, (Raised, Unsupported)) or isinstance(raw, tuple):
        to_array(raw, what)
    if not isinstance(raw, np.ndarray) or raw.dtype.kind not in "iub":
        kind = getattr(raw, "dtype", type(raw))
        raise CheckFailed(f"{what} returns {kind} values; return token ids as an int64 tensor (argmax gives int64)")
    tokens, expected = raw.astype(np.int64), case.expected[0]
    if np.array_equal(tokens, expected):
        pass
    else:
        for mistake, wrong in case.mistaken():
            if isinstance(wrong, tuple) and isinstance(wrong[0], np.ndarray) and np.array_equal(wrong[0], tokens):
                case.fail(mistake.diagnosis)
        if tokens.shape != expected.shape:
            raise CheckFailed(f"{what} has shape {tokens.shape}; expected {expected.shape} (batch, steps run), "
                              "without BOS, stopping when every sentence has produced EOS or after max_len steps")
        raise CheckFailed(f"{what} returns other tokens than greedy decoding gives: at each step feed the "
                          "prefix so far to model.decode, take the argmax over the vocabulary (the last axis) "
                          "at the last position, append it")
    encodes = int(np.asarray(calls).reshape(-1)[0])
    if encodes != 1:
        raise CheckFailed(f"{what} called model.encode {encodes} times: encode the source once, before the "
                          "loop, and reuse the memory")
    if not bool(np.asarray(mask_ok).reshape(-1)[0]):
        raise CheckFailed(f"{what} did not pass src_mask = (src != pad_id) (a bool tensor, True = real token) to "
                          "model.encode and model.decode")


LOOP_UNBOUNDED = ("the loop does not stop after max_len steps. Loop for at most max_len steps (for _ in "
                  "range(max_len)) and break early when every sentence has its EOS")
NO_STOP = ("it does not stop a sentence at its EOS: every token after a sentence's EOS must be pad_id (keep a "
           "`finished` flag per sentence and write pad_id once it is set)")

def _eos_steps(call: Call) -> list:
    """The step at which each sentence's plan reaches EOS within max_len (None: never)."""
    plan, eos, max_len = call.args[0], call.args[3], call.args[5]
    return [int(np.argmax(row[:max_len] == eos)) if np.any(row[:max_len] == eos) else None for row in plan]


_GREEDY_RULES = (
    Rule("EOS reached at different steps in a batch",
         lambda call: len({s for s in _eos_steps(call) if s is not None}) > 1),
    Rule("a sentence without EOS in max_len steps", lambda call: None in _eos_steps(call)),
    Rule("every sentence finished before max_len",
         lambda call: None not in _eos_steps(call) and max(_eos_steps(call)) < call.args[5] - 1),
    Rule("EOS at the first step", lambda call: 0 in _eos_steps(call)),
    Rule("padding in the source", lambda call: _different_lengths(call.args[1], call.args[4])),
)

GREEDY_DECODE = Spec(
    id="transformer-greedy_decode",
    function="greedy_decode",
    driver="transformer.greedy",
    inputs=_greedy_calls,
    rules=_GREEDY_RULES,
    equivalent=(
        ("L7 torch.full((src.shape[0], 1), bos_id, dtype=torch.long) -> torch.full((src.shape[0], 1), bos_id)",
         "torch.full with an int fill value (bos_id is an int) makes int64, torch.long, already"),
        ("L10 -1 -> 1 #2",
         "decode(...)[:, -1] is (batch, vocab): its dim=1 is its last axis, dim=-1"),
    ),
    reference=ref.greedy_decode,
    judge=_judge_greedy,
    mistakes=(
        Mistake("keep_bos", "it keeps BOS as the first column: return the generated tokens only, ys[:, 1:]",
                _decoder(keep_bos=True)),
        Mistake("no_stop", NO_STOP, _decoder(stop_at_eos=False, early_exit=False)),
        Mistake("no_pad", NO_STOP, _decoder(stop_at_eos=False)),
        Mistake("no_early_exit", "tokens after EOS are padded, but the loop runs on to max_len after every "
                "sentence has finished: break as soon as all sentences have produced EOS (the output is then "
                "shorter than max_len)", _decoder(early_exit=False)),
        Mistake("any_stop", "it stops as soon as ANY sentence produces EOS; stop when ALL of them have",
                _decoder(any_stop=True)),
        Mistake("first_position", "it takes the prediction at the first position, logits[:, 0]; the next token is "
                "predicted at the LAST position, logits[:, -1]", _decoder(position=0)),
        Mistake("last_only", "it feeds the decoder only the last token; feed the whole prefix [BOS, y1, ..., yt] "
                "every step (the decoder attends over all of it)", _decoder(last_only=True)),
        Mistake("drop_eos", "EOS itself is missing from the output: keep the EOS token, then pad_id after it",
                _decoder(write_eos=False)),
        Mistake("whole_sequence", "it feeds back the argmax at every position, so each step re-predicts the whole "
                "sequence and overwrites the pad_id after a finished sentence's EOS: keep the tokens chosen so far and "
                "append only the argmax at the last position, logits[:, -1].argmax(-1)", _decoder(whole=True)),
    ),
    errors=(
        Raises("{what} raised {error}", example=lambda model, src, bos_id, eos_id, pad_id, max_len: model(src, src)),
    ),
    diagnosed=(
        Mistake("unbounded", LOOP_UNBOUNDED, _decoder(bounded=False)),
        Mistake("encode_each_step", "encode the source once", _decoder(encode_each_step=True)),
        Mistake("src_mask_not_bool", "did not pass src_mask = (src != pad_id)",
                _decoder(mask=lambda src, pad_id: (src != pad_id).long())),
        Mistake("float_tokens", "return token ids as an int64 tensor", _decoder(layout=lambda ys: ys.float())),
        Mistake("transposed", "(batch, steps run), without BOS", _decoder(layout=lambda ys: ys.T)),
        Mistake("argmin", "returns other tokens than greedy decoding gives", _decoder(pick=lambda z: z.argmin(-1))),
    ),
)


# ---------------------------------------------------------------- one training step

def _tiny_arrays(rng, src_vocab, tgt_vocab, d):
    return {"src_embed": rng.normal(scale=0.5, size=(src_vocab, d)),
            "tgt_embed": rng.normal(scale=0.5, size=(tgt_vocab, d)),
            "out_weight": rng.normal(scale=0.5, size=(tgt_vocab, d)),
            "out_bias": rng.normal(scale=0.1, size=(tgt_vocab,))}


def _tiny_spec(arrays, pad):
    names = ("src_embed", "tgt_embed", "out_weight", "out_bias")
    spec = json.dumps({"pad_id": pad, "params": [[n, list(arrays[n].shape)] for n in names]})
    return spec, np.concatenate([arrays[n].ravel() for n in names])


def _training_calls(rng: np.random.Generator) -> list[Call]:
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
    asked.append(Call((spec, flat, np.stack(srcs), np.stack(tgts), lrs, "sgd"), what=what))
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
    asked.append(Call((spec2, flat2, np.stack(srcs2), np.stack(tgts2), np.array([0.05]), "adam"), what=what2))
    return asked


def _judge_exact_steps(case: Case) -> None:
    """Three SGD steps: what the model and loss_fn were given, the mode, then the parameters."""
    what = case.what
    losses, snaps, first_in, first_target, modes, counts = case.answer
    counts = np.asarray(counts).reshape(-1)
    steps = len(case.call.args[2])
    if counts[0] == 0 or counts[1] == 0:
        raise CheckFailed(f"{what} did not call " + ("the model" if counts[0] == 0 else "loss_fn") +
                          ": compute logits = model(src, tgt_in), then loss = loss_fn(logits, tgt_out)")
    if counts[0] != steps:
        raise CheckFailed(f"{what} called the model {int(counts[0] / steps)} times per step: once is enough")
    tgt, first_in, first_target = np.asarray(case.call.args[3][0]), np.asarray(first_in), np.asarray(first_target)
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
    if not np.asarray(modes).reshape(-1).all():
        raise CheckFailed(f"{what}: the model was in eval mode during the step: call model.train() first (the "
                          "notebook evaluates in between, which switches dropout off)")
    exp_losses, exp_snaps = (np.asarray(a, dtype=np.float64) for a in case.expected[:2])
    losses, snaps = np.asarray(losses, dtype=np.float64).reshape(-1), np.asarray(snaps, dtype=np.float64)
    same = lambda a, b: close(a, np.asarray(b, dtype=np.float64), rtol=1e-6, atol=1e-9)
    if same(snaps, exp_snaps):
        if not close(losses, exp_losses.reshape(-1), rtol=1e-6, atol=1e-8):
            raise CheckFailed(f"{what} returns other losses than loss_fn gave: return loss.item() of this step's "
                              "loss (computed before the update)")
        return
    for mistake, wrong in case.mistaken():
        if isinstance(wrong, tuple) and same(snaps, wrong[1]):
            case.fail(mistake.diagnosis)
    initial = np.asarray(case.call.args[1], dtype=np.float64)
    if close(snaps[-1], initial):
        raise CheckFailed(f"{what}: the parameters did not change: call loss.backward(), then optimizer.step()")
    raise CheckFailed(f"{what}: after the steps the parameters differ from one optimizer.step() per call on the "
                      "gradient of this step's loss: zero_grad, backward, optimizer.step(), scheduler.step()")


def _judge_training(case: Case) -> None:
    """The SGD call is judged exactly; on the Adam call the loss must fall to half."""
    _explain_raised(case)
    value(case.answer, "train_step")
    if case.call.args[5] == "sgd":
        return _judge_exact_steps(case)
    losses = to_array(case.answer[0], case.what).reshape(-1)
    if len(losses) < 2 or not np.all(np.isfinite(losses)):
        case.fail("the losses are not finite numbers")
    if not losses[-5:].mean() < 0.5 * losses[0]:
        case.fail(f"the loss did not fall to half its first value in {len(losses)} steps "
                  f"(first {losses[0]:.3f}, last {losses[-1]:.3f})")
    return None


def _stepper(shift="right", zero_grad=True, scheduler="after", train_mode=True, backward=1, item=True,
             no_grad=False, forward_twice=False):
    """A train_step with one of the known mistakes switched on (defaults: right)."""

    def train_step(model, src, tgt, optimizer, scheduler_, loss_fn):
        if train_mode:
            model.train()
        tgt_in, tgt_out = {"right": (tgt[:, :-1], tgt[:, 1:]), "none": (tgt, tgt),
                           "reversed": (tgt[:, 1:], tgt[:, :-1])}[shift]
        if scheduler == "before":
            scheduler_.step()
        with torch.set_grad_enabled(not no_grad):
            if forward_twice:
                model(src, tgt_in)
            loss = loss_fn(model(src, tgt_in), tgt_out)
        if zero_grad:
            optimizer.zero_grad()
        for _ in range(backward):
            loss.backward()
        if backward:
            optimizer.step()
        if scheduler == "after":
            scheduler_.step()
        return loss.item() if item else 2 * loss.item()

    return train_step


_TRAINING_RULES = (
    Rule("several steps with a changing learning rate",
         lambda call: len(call.args[2]) > 1 and len(set(np.ravel(call.args[4]).tolist())) > 1),
    Rule("padding in the targets", lambda call: bool(np.any(call.args[3] == json.loads(call.args[0])["pad_id"]))),
)

TRAIN_STEP = Spec(
    id="transformer-train_step",
    function="train_step",
    driver="transformer.training",
    inputs=_training_calls,
    rules=_TRAINING_RULES,
    reference=ref.train_step,
    judge=_judge_training,
    mistakes=(
        Mistake("no_zero_grad", "the gradients are not reset: call optimizer.zero_grad() before loss.backward(), "
                "or they add up over steps", _stepper(zero_grad=False)),
        Mistake("scheduler_never", "the scheduler is never stepped: call scheduler.step() after optimizer.step(), "
                "once per step", _stepper(scheduler="never")),
        Mistake("scheduler_first", "scheduler.step() comes before optimizer.step(), so every step uses the next "
                "step's learning rate: optimizer.step() first, then scheduler.step()", _stepper(scheduler="before")),
    ),
    errors=(
        Raises("{what} raised {error}: the loss must come from the model's logits with autograd on (no "
               "torch.no_grad(), no .item() before backward)", match="does not require grad",
               example=_stepper(no_grad=True)),
        Raises("{what} raised {error}: compute the logits and the loss anew in every step",
               match="backward through the graph a second time", example=_stepper(backward=2)),
        Raises("{what} raised {error}", example=lambda model, src, tgt, optimizer, scheduler, loss_fn:
               optimizer.step(loss_fn(model(src, tgt[:, :-1]), tgt[:, 1:]))),
    ),
    diagnosed=(
        Mistake("not_shifted", "the targets are not shifted", _stepper(shift="none")),
        Mistake("shift_reversed", "the shift is reversed", _stepper(shift="reversed")),
        Mistake("eval_mode", "call model.train() first", _stepper(train_mode=False)),
        Mistake("two_forwards", "times per step: once is enough", _stepper(forward_twice=True)),
        Mistake("no_update", "the parameters did not change", _stepper(backward=0)),
        Mistake("other_losses", "returns other losses than loss_fn gave", _stepper(item=False)),
    ),
)

SPECS = (TRANSFORMER, LABEL_SMOOTHED_LOSS, NOAM_LR, GREEDY_DECODE, TRAIN_STEP)
