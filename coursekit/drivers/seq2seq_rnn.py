"""Drivers of notebook 10, seq2seq_rnn: the GRU encoder-decoder, loaded by name and called.

``seq2seq_model(cls)`` builds the learner's ``Seq2SeqGRU``, copies the grader's weights into
the parameters its docstring names, switches it to eval mode and calls it on the grader's
token ids. It holds no reference and no secret; its error messages reach the learner as the
diagnosis, so they name the attribute to create or fix.
"""
from __future__ import annotations

from typing import Any

# The parameters a Seq2SeqGRU has, in the order the grader sends their values.
COMMON = ("src_embed.weight", "tgt_embed.weight",
          "encoder.weight_ih_l0", "encoder.weight_hh_l0", "encoder.bias_ih_l0", "encoder.bias_hh_l0",
          "decoder.weight_ih", "decoder.weight_hh", "decoder.bias_ih", "decoder.bias_hh",
          "out.weight", "out.bias")
ATTENTION = ("attn_W_q.weight", "attn_W_k.weight", "attn_v.weight")

_CREATE = {
    "src_embed": "self.src_embed = nn.Embedding(src_vocab, d_emb, padding_idx=pad_id)",
    "tgt_embed": "self.tgt_embed = nn.Embedding(tgt_vocab, d_emb, padding_idx=pad_id)",
    "encoder": "self.encoder = nn.GRU(d_emb, d_hidden, batch_first=True)",
    "decoder": "self.decoder = nn.GRUCell(d_emb + d_hidden, d_hidden) with attention, "
               "nn.GRUCell(d_emb, d_hidden) without",
    "out": "self.out = nn.Linear(2 * d_hidden, tgt_vocab) with attention, nn.Linear(d_hidden, tgt_vocab) without",
    "attn_W_q": "self.attn_W_q = nn.Linear(d_hidden, d_hidden, bias=False)",
    "attn_W_k": "self.attn_W_k = nn.Linear(d_hidden, d_hidden, bias=False)",
    "attn_v": "self.attn_v = nn.Linear(d_hidden, 1, bias=False)",
}


def parameter_names(attention: bool) -> tuple:
    """The names of the arrays the grader sends, in order."""
    return COMMON + (ATTENTION if attention else ())


def _state_name(name: str, state: dict) -> str:
    """The learner's key for ``name``: a decoder that is an nn.GRU names its weights ..._l0."""
    if name.startswith("decoder.") and name not in state and f"{name}_l0" in state:
        return f"{name}_l0"
    return name


def seq2seq_model(cls: Any) -> Any:
    """A Seq2SeqGRU class -> fn(src_vocab, tgt_vocab, d_emb, d_hidden, attention, pad_id, *params,
    src, tgt_in) returning the logits, or (logits, attention_weights) when attention is on.

    Builds ``cls(src_vocab, tgt_vocab, d_emb, d_hidden, attention=..., pad_id=...)``, copies the
    given arrays (``parameter_names(attention)`` order) into the parameters of those names
    (an nn.GRU decoder's ``weight_ih_l0`` ... stand for an nn.GRUCell's ``weight_ih`` ...),
    switches to eval mode and calls ``forward(src, tgt_in)`` on int64 tensors without autograd.
    """
    import torch

    def run(src_vocab, tgt_vocab, d_emb, d_hidden, attention, pad_id, *arrays):
        if not isinstance(cls, type):
            raise TypeError(f"it should be a class (an nn.Module subclass), but it is a {type(cls).__name__}")
        attention = bool(attention)
        names = parameter_names(attention)
        params, (src, tgt_in) = arrays[:len(names)], arrays[len(names):]
        owner = f"Seq2SeqGRU(attention={attention})"
        model = cls(int(src_vocab), int(tgt_vocab), int(d_emb), int(d_hidden), attention=attention,
                    pad_id=int(pad_id))
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{owner} is not a torch.nn.Module: subclass nn.Module and call super().__init__() first")
        state = model.state_dict()
        wanted = {}
        for name, array in zip(names, params):
            key = _state_name(name, state)
            attribute = name.split(".")[0]
            if key not in state:
                raise AttributeError(f"{owner} has no parameter {name}: create it in __init__ as "
                                     f"{_CREATE[attribute]}")
            if tuple(state[key].shape) != tuple(array.shape):
                raise ValueError(f"{owner}.{key} has shape {tuple(state[key].shape)}; the docstring's sizes give "
                                 f"{tuple(array.shape)}: {_CREATE[attribute]}")
            wanted[key] = torch.as_tensor(array, dtype=state[key].dtype)
        extra = [k for k in state if k not in wanted and not (not attention and k.startswith("attn_"))]
        if extra:
            raise ValueError(f"{owner} has parameters the docstring does not name: {', '.join(extra[:4])}. "
                             "The grader loads known weights by name and cannot set these: build only the "
                             "layers the docstring lists")
        model.load_state_dict(wanted, strict=False)
        model.eval()
        with torch.no_grad():
            logits = model(torch.as_tensor(src, dtype=torch.int64), torch.as_tensor(tgt_in, dtype=torch.int64))
        if isinstance(logits, (tuple, list)):
            raise TypeError(f"{owner}.forward returns a {type(logits).__name__}; it should return the logits "
                            "alone, one tensor (batch, tgt_len, tgt_vocab)")
        if not attention:
            return logits
        weights = getattr(model, "attention_weights", None)
        if weights is None:
            raise AttributeError(f"{owner} has no attribute attention_weights after forward: store the "
                                 "weights of every step as self.attention_weights, (batch, tgt_len, src_len)")
        return logits, weights

    return run
