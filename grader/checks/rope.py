"""Hidden checks of notebook 13, rope: rotary position embeddings (Su et al. 2021, RoFormer).

Sizes are pairwise distinct so that a swapped axis raises or shows: angles for 6 or 7
positions of d_k 8, 10 or 14 features; x of (batch 2, heads 3, seq_len 5, d_k 8); the attention
module at d_model 24 with 3 heads (d_k 8), on 5 or 6 positions, and 4 queries against 6 keys
(each rotated by its own positions). ``apply_rope`` gets random
angles in (-pi, pi), not only a table of ``rope_angles``, so that the rotation's formula is
checked on every pair, slow ones included (at base 10000 the last pairs of a short sequence
hardly turn). One base is not 10000, so that a base typed in is caught. The attention
module goes through ``coursekit.probe``'s ``attention_module`` driver, which loads the
weights drawn here into the learner's W_q ... W_o by name.
"""
from __future__ import annotations

import numpy as np
import torch

from ._core import Call, Hint, Knob, Mistake, Raises, Rule, Spec
from .multi_head import _weights
from .reference import rope as ref

PAIRINGS = ref.PAIRINGS


# ---------------------------------------------------------------- rope_angles

def _angles_calls(rng: np.random.Generator) -> list[Call]:
    seq_len = int(rng.integers(6, 8))
    d_k = int(rng.choice([8, 10, 14]))  # (even, and no multiple of 3: d_k % 3 is not a check of oddness)
    base = float(rng.choice([100.0, 500.0]))
    return [
        Call((seq_len, d_k), what=f"rope_angles({seq_len}, {d_k})"),
        Call((seq_len + 1, 6), {"base": base}, what=f"rope_angles({seq_len + 1}, 6, base={base:g})"),
        Call((4, 7), what="rope_angles(4, 7), an odd d_k", raises="ValueError"),
    ]


def _angles_variant(exponent="2i", start=0, sign=-1, base_used=None):
    """A learner's rope_angles: ``exponent`` is what multiplies 1/d_k in the exponent of the base
    ("2i": the paper; "i": the pair index alone; "4i": the column index j = 2i where i belongs),
    ``start`` the first position, ``sign`` the exponent's sign, ``base_used`` a base typed in."""
    factor = {"2i": 2, "i": 1, "4i": 4}[exponent]

    def rope_angles(seq_len, d_k, base=10000.0):
        if d_k % 2:
            raise ValueError("d_k must be even")
        i = np.arange(d_k // 2)
        theta = (base_used or base) ** (sign * factor * i / d_k)
        return np.arange(start, start + seq_len)[:, None] * theta
    return rope_angles


def _repeated(seq_len, d_k, base=10000.0):
    return np.repeat(ref.rope_angles(seq_len, d_k, base).numpy(), 2, axis=-1)


def _tiled(seq_len, d_k, base=10000.0):
    angles = ref.rope_angles(seq_len, d_k, base).numpy()
    return np.concatenate([angles, angles], axis=-1)


ROPE_ANGLES = Spec(
    id="rope-rope_angles",
    function="rope_angles",
    inputs=_angles_calls,
    reference=ref.rope_angles,
    variant=_angles_variant,
    equivalent=(
        ("L9 torch.arange(d_k // 2, dtype=torch.float64) -> torch.arange(d_k // 2)", "integer pair indices: -2 * i "
         "/ d_k is then float32, a float32 answer that the tolerance accepts (as Llama's float32 angles)"),
        ("L9 d_k // 2 -> d_k / 2", "d_k is even (odd raises first): torch.arange(d_k / 2) is the same d_k // 2 "
         "indices, as floats"),
        ("L10 torch.arange(seq_len, dtype=torch.float64) -> torch.arange(seq_len)", "integer positions times the "
         "float64 frequencies are the same float64 angles"),
    ),
    rules=(
        Rule("the default base, 10000", lambda call: not call.raises and "base" not in call.kwargs),
        Rule("a base given, other than 10000", lambda call: call.kwargs.get("base", 10000.0) != 10000.0),
        Rule("d_k / 2 pairs, more than one", lambda call: not call.raises and call.args[1] // 2 > 1),
        Rule("an odd d_k: ValueError", lambda call: call.raises == "ValueError" and call.args[1] % 2 == 1),
        Rule("an even d_k that is no multiple of 3 (so that only oddness raises)",
             lambda call: not call.raises and call.args[1] % 3 > 0),
    ),
    knobs=(
        Knob("exponent", (
            ("i", "the frequencies fall too slowly: theta_i = base ** (-2i / d_k), with 2i in the exponent, not "
                  "i (pair i holds features 2i and 2i + 1, so the exponent steps by 2 / d_k)"),
            ("4i", "the frequencies fall too fast: the exponent is -2i / d_k with i the PAIR index (0 ... d_k/2 - 1); "
                   "it uses the column index j = 2i in its place, base ** (-2j / d_k)"),
        )),
        Knob("start", ((1, "the positions are counted from 1; the first position is m = 0, whose angles are all 0 "
                           "(the first token is not rotated)"),)),
        Knob("sign", ((1, "the frequencies grow with i: theta_i = base ** (-2i / d_k) has a minus sign, so that "
                          "pair 0 turns fastest (1 radian per position) and the last pairs slowest"),)),
        Knob("base_used", ((10000.0, "it ignores the base argument and uses 10000: theta_i = base ** (-2i / d_k) "
                                     "with the base given"),)),
    ),
    mistakes=(
        Mistake("repeated", "it returns one angle per feature, (seq_len, d_k), each angle twice: return one angle "
                "per pair, (seq_len, d_k // 2); apply_rope pairs the features", _repeated),
        Mistake("tiled", "it returns the angles twice side by side, (seq_len, d_k), the cos/sin table of the halves "
                "pairing: return one angle per pair, (seq_len, d_k // 2); apply_rope pairs the features", _tiled),
        Mistake("transposed", "it returns (d_k // 2, seq_len): one row per position, one column per pair, "
                "angles[m, i] = m * theta_i", lambda seq_len, d_k, base=10000.0:
                ref.rope_angles(seq_len, d_k, base).T),
    ),
    hints=(
        Hint("the first row (position 0) should be all 0: a rotation by 0 leaves the first position as it is",
             lambda got, call: got.ndim == 2 and not np.allclose(got[0], 0.0),
             example=lambda seq_len, d_k, base=10000.0: ref.rope_angles(seq_len, d_k, base) + 0.5),
    ),
    figures=("rope-rope_angles-figure",),
)


# ---------------------------------------------------------------- apply_rope

def _rotate_pairs(x, layout):
    """The partner of every feature, signed: (-b, a) in the place of (a, b), pairs laid out as ``layout``."""
    a, b = ref.pair_halves(x, layout)
    return ref.unpair(-b, a, layout)


def _full_width(table, layout):
    """A (..., d_k / 2) table spread over d_k features in the layout of ``layout``'s pairs."""
    return ref.unpair(table, table, layout)


def _apply_variant(sign=1, pairing="asked", table="matching"):
    """A learner's apply_rope as rotate-half code: x * cos + rotate(x) * sin on full-width tables.

    ``sign`` -1 rotates backwards; ``pairing`` which pairs it rotates ("asked", always
    "interleaved" or "halves", or "swapped": the other one); ``table`` "other" lays the cos/sin
    tables out for the other pairing than the one it rotates (the pairing mixed up).
    """
    def apply_rope(x, angles, pairing_asked="interleaved"):
        if pairing_asked not in PAIRINGS:
            raise ValueError(f"unknown pairing {pairing_asked!r}")
        other = {"interleaved": "halves", "halves": "interleaved"}
        used = {"asked": pairing_asked, "swapped": other[pairing_asked]}.get(pairing, pairing)
        layout = used if table == "matching" else other[used]
        x = torch.as_tensor(x, dtype=torch.float64)
        angles = torch.as_tensor(angles, dtype=torch.float64)
        cos, sin = _full_width(angles.cos(), layout), _full_width(sign * angles.sin(), layout)
        return x * cos + _rotate_pairs(x, used) * sin

    def named(x, angles, pairing="interleaved"):
        return apply_rope(x, angles, pairing)
    return named


def _apply_calls(rng: np.random.Generator) -> list[Call]:
    def angles(seq_len, d_k):
        return rng.uniform(-np.pi, np.pi, size=(seq_len, d_k // 2))

    x4 = rng.normal(size=(2, 3, 5, 8))
    x3 = rng.normal(size=(3, 6, 10))
    x2 = rng.normal(size=(7, 6))
    return [
        Call((x4, angles(5, 8)), what="apply_rope(x, angles) for x (2, 3, 5, 8), angles (5, 4), default pairing"),
        Call((x4, angles(5, 8)), {"pairing": "halves"},
             what="apply_rope(x, angles, pairing='halves') for x (2, 3, 5, 8), angles (5, 4)"),
        Call((x3, angles(6, 10)), {"pairing": "interleaved"},
             what="apply_rope(x, angles, pairing='interleaved') for x (3, 6, 10), angles (6, 5)"),
        Call((x2, ref.rope_angles(7, 6, 100.0).numpy()), {"pairing": "halves"},
             what="apply_rope(x, rope_angles(7, 6, base=100), pairing='halves') for x (7, 6)"),
        Call((x2, angles(7, 6)), {"pairing": "pairs"}, what="apply_rope(x, angles, pairing='pairs')",
             raises="ValueError"),
    ]


def _pair_norms(x: np.ndarray, pairing: str) -> np.ndarray:
    a, b = ref.pair_halves(torch.as_tensor(x, dtype=torch.float64), pairing)
    return (a ** 2 + b ** 2).numpy()


def _lengths_changed(got: np.ndarray, call: Call) -> bool:
    x = call.args[0]
    pairing = call.kwargs.get("pairing", "interleaved")
    return got.shape == x.shape and not np.allclose(_pair_norms(got, pairing), _pair_norms(x, pairing), atol=1e-6)


def _cos_only(x, angles, pairing="interleaved"):
    cos = _full_width(torch.as_tensor(angles).cos(), pairing)
    return torch.as_tensor(x) * cos


APPLY_ROPE = Spec(
    id="rope-apply_rope",
    function="apply_rope",
    inputs=_apply_calls,
    reference=ref.apply_rope,
    variant=_apply_variant,
    equivalent=(
        ("L10 x = torch.as_tensor(x) -> (left out)", "the grader hands torch code tensors (coursekit.probe), so "
         "torch.as_tensor(x) is x"),
        ("L11 angles = torch.as_tensor(angles, dtype=torch.float64) -> (left out)", "the grader hands torch code "
         "tensors, the angles float64: torch.as_tensor(angles, dtype=torch.float64) is angles"),
        ("L11 torch.as_tensor(angles, dtype=torch.float64) -> torch.as_tensor(angles)", "the angles handed in are "
         "float64 tensors already"),
    ),
    rules=(
        Rule("the default pairing (interleaved)", lambda call: not call.raises and "pairing" not in call.kwargs),
        Rule("pairing='interleaved' given", lambda call: call.kwargs.get("pairing") == "interleaved"),
        Rule("pairing='halves'", lambda call: call.kwargs.get("pairing") == "halves"),
        Rule("leading axes before (seq_len, d_k)", lambda call: not call.raises and call.args[0].ndim > 2),
        Rule("angles of any size, beyond rope_angles' (|angle| > 1 on the last pair)",
             lambda call: not call.raises and bool(np.any(np.abs(call.args[1][:, -1]) > 1.0))),
        Rule("an unknown pairing: ValueError", lambda call: call.raises == "ValueError"),
    ),
    knobs=(
        Knob("sign", ((-1, "it rotates the wrong way (the inverse rotation, by -angle): pair (a, b) becomes "
                           "(a cos - b sin, a sin + b cos), RoFormer's eq. 15"),)),
        Knob("pairing", (
            ("interleaved", "it always pairs features (2i, 2i + 1); with pairing='halves' pair i is features i and "
                            "i + d_k/2 (rotate_half of GPT-NeoX and Hugging Face transformers)"),
            ("halves", "it always pairs features (i, i + d_k/2); with pairing='interleaved' (the default, RoFormer's "
                       "eq. 15) pair i is features 2i and 2i + 1"),
            ("swapped", "the pairings are swapped: 'interleaved' pairs features (2i, 2i + 1), 'halves' pairs "
                        "(i, i + d_k/2)"),
        )),
        Knob("table", (("other", "the pairing is mixed up: it rotates the right pairs, but its cos and sin tables "
                                 "are laid out for the other pairing (repeat_interleave belongs to pairs (2i, 2i + 1), "
                                 "cat([t, t]) to pairs (i, i + d_k/2)), so feature j meets another pair's angle"),)),
    ),
    errors=(
        Raises("{what} raised {error}: the angles are (seq_len, d_k // 2), one per pair: take the pairs of x first "
               "(two tensors of (..., seq_len, d_k // 2)), or spread the angles over d_k features in the pairing's "
               "layout", match="broadcast|must match the size|operands could not",
               example=lambda x, angles, pairing="interleaved": np.asarray(x) * np.cos(np.asarray(angles))),
    ),
    hints=(
        Hint("a rotation keeps the length of every pair, sqrt(a^2 + b^2); yours changes it: each pair should become "
             "(a cos - b sin, a sin + b cos)", _lengths_changed, example=_cos_only),
    ),
    figures=("rope-apply_rope-figure", "rope-apply_rope-figure-2"),
)


# ---------------------------------------------------------------- RotaryMultiHeadAttention

D_MODEL, HEADS, BATCH = 24, 3, 2


def _rotary(where="heads", values=False, keys=True, pairing="interleaved"):
    """A learner's RotaryMultiHeadAttention: ``where`` the rotation happens ("heads": each head's
    (..., seq_len, d_k) with d_k frequencies; "d_model": the projected (batch, seq_len, d_model)
    before the split, with d_model frequencies; "input": the inputs before W_q and W_k), whether
    the values and the keys are rotated too, and in which ``pairing``."""
    def rotate(x, size):
        return ref.apply_rope(x, ref.rope_angles(x.shape[-2], size), pairing)

    class RotaryMultiHeadAttention(ref.RotaryMultiHeadAttention):
        def forward(self, query, key, value, mask=None):
            if where == "input":
                query, key = rotate(query, self.d_model), rotate(key, self.d_model) if keys else key
                value = rotate(value, self.d_model) if values else value
            q, k, v = self.W_q(query), self.W_k(key), self.W_v(value)
            if where == "d_model":
                q, k = rotate(q, self.d_model), rotate(k, self.d_model) if keys else k
                v = rotate(v, self.d_model) if values else v
            q, k, v = (ref.split_heads(t, self.heads) for t in (q, k, v))
            if where == "heads":
                q, k = rotate(q, self.d_k), rotate(k, self.d_k) if keys else k
                v = rotate(v, self.d_k) if values else v
            if mask is not None:
                mask = mask.unsqueeze(-3)
            out, weights = ref.scaled_dot_product_attention(q, k, v, mask)
            return self.W_o(ref.merge_heads(out)), weights
    return RotaryMultiHeadAttention


def _rotary_calls(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(x, mask, note, memory=None):
        p = _weights(rng, D_MODEL)
        key = x if memory is None else memory
        args = (D_MODEL, HEADS) + tuple(p[f"{kind}_{n}"] for n in "qkvo" for kind in ("W", "b")) + (x, key, key, mask)
        kind = f"self-attention, x {x.shape}" if memory is None else f"query {x.shape}, key and value {key.shape}"
        calls.append(Call(args, what=f"RotaryMultiHeadAttention(d_model={D_MODEL}, heads={HEADS}) on {kind}{note}"))

    ask(rng.normal(size=(BATCH, 5, D_MODEL)), np.tril(np.ones((5, 5), dtype=bool)), ", causal mask (5, 5)")
    ask(rng.normal(size=(BATCH, 6, D_MODEL)), None, ", no mask")
    lengths = rng.permutation([4, 5, 6])[:2]
    padding = (np.arange(6) < lengths[:, None])[:, None, :]
    ask(rng.normal(size=(BATCH, 6, D_MODEL)), padding, f", padding mask {padding.shape}")
    # q_len 4, k_len 6: the queries and the keys each have their own positions (0 ... 3 and 0 ... 5)
    ask(rng.normal(size=(BATCH, 4, D_MODEL)), None, ", no mask", memory=rng.normal(size=(BATCH, 6, D_MODEL)))
    return calls


def _cross(call: Call) -> bool:
    return len(call.args) > 2 and call.args[-4].shape != call.args[-3].shape


class _NotRotated(ref.RotaryMultiHeadAttention):
    def rotate(self, q, k, v):
        return q, k, v


class _LostReturn(ref.RotaryMultiHeadAttention):
    def rotate(self, q, k, v):
        return None


class _OneTable(ref.RotaryMultiHeadAttention):
    """The angles of the queries' length, used for the keys too."""

    def rotate(self, q, k, v):
        angles = ref.rope_angles(q.shape[-2], self.d_k)
        return ref.apply_rope(q, angles), ref.apply_rope(k, angles), v


class _NoW_o(ref.RotaryMultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.rotate(*(ref.split_heads(layer(x), self.heads) for layer, x in
                                [(self.W_q, query), (self.W_k, key), (self.W_v, value)]))
        out, weights = ref.scaled_dot_product_attention(q, k, v, None if mask is None else mask.unsqueeze(-3))
        return ref.merge_heads(out), weights


class _SoftmaxOverQueries(ref.RotaryMultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.rotate(*(ref.split_heads(layer(x), self.heads) for layer, x in
                                [(self.W_q, query), (self.W_k, key), (self.W_v, value)]))
        scores = q @ k.transpose(-2, -1) / self.d_k ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask.unsqueeze(-3), float("-inf"))
        weights = torch.softmax(scores, dim=-2).nan_to_num()
        return self.W_o(ref.merge_heads(weights @ v)), weights


ROTARY_MULTI_HEAD_ATTENTION = Spec(
    id="rope-RotaryMultiHeadAttention",
    submodules=("W_q", "W_k", "W_v", "W_o"),
    function="RotaryMultiHeadAttention",
    depends=("rope-rope_angles", "rope-apply_rope"),  # its solution calls them
    inputs=_rotary_calls,
    reference=ref.RotaryMultiHeadAttention,
    driver="attention_module",
    parts=("output", "weights"),
    order=(1, 0),
    variant=_rotary,
    equivalent=tuple((name, "the heads are 4-D, (batch, heads, seq_len, d_k): shape[2] is shape[-2]")
                     for name in ("L6 -2 -> 2", "L7 -2 -> 2")),
    rules=(
        Rule("q_len != k_len: the queries and the keys rotated by their own positions", _cross),
        Rule("a causal mask (q_len, k_len)", lambda call: call.args[-1] is not None and call.args[-1].ndim == 2),
        Rule("a padding mask (batch, 1, k_len)", lambda call: call.args[-1] is not None
             and call.args[-1].shape[1] == 1),
        Rule("no mask", lambda call: call.args[-1] is None),
    ),
    knobs=(
        Knob("where", (
            ("d_model", "it rotates the projected (batch, seq_len, d_model) vectors with d_model frequencies before "
                        "the split: rotate each head's queries and keys, (batch, heads, seq_len, d_k), with "
                        "rope_angles(seq_len, d_k), so that every head has the whole range of frequencies"),
            ("input", "it rotates the inputs before W_q and W_k: rotate the queries and keys after the projection "
                      "(and the head split), so that q_m . k_n depends on m - n only"),
        )),
        Knob("values", ((True, "it rotates the values too: RoPE rotates only the queries and keys, whose dot product "
                               "it makes relative; the values carry content, not position"),)),
        Knob("keys", ((False, "it rotates the queries only: rotate the keys too (q_m . k_n depends on m - n only "
                              "when both are rotated by their own positions)"),)),
        Knob("pairing", (("halves", "it rotates pairs (i, i + d_k/2); the docstring asks for the interleaved "
                                    "pairs (2i, 2i + 1) of RoFormer: apply_rope's default"),)),
    ),
    mistakes=(
        Mistake("not_rotated", "nothing is rotated: its output is notebook 06's MultiHeadAttention's. Rotate each "
                "head's queries and keys with apply_rope(..., rope_angles(seq_len, d_k))", _NotRotated),
    ),
    errors=(
        Raises("{what} raised {error}: something it uses returned None. Does your rope_angles or apply_rope miss "
               "a `return`? Fix that one first", match="NoneType|cannot unpack", example=_LostReturn),
        Raises("{what} raised {error}: the queries have q_len positions and the keys k_len; rotate each with the "
               "angles of its own length, rope_angles(q.shape[-2], d_k) and rope_angles(k.shape[-2], d_k)",
               match="must match the size|broadcast", when=_cross, example=_OneTable),
    ),
    hints=(
        Hint("each query's weights over the keys should sum to 1: softmax over the last axis (the keys)",
             lambda w, call: bool(np.all(np.isfinite(w))) and not np.allclose(w.sum(-1), 1.0, atol=1e-4),
             example=_SoftmaxOverQueries, part=1),
        Hint("the weights are right but the output is not: mix the values (not rotated) with the weights, merge the "
             "heads (merge_heads) and apply W_o", lambda out, call: True, example=_NoW_o, part=0),
    ),
    figures=("rope-RotaryMultiHeadAttention-figure", "rope-RotaryMultiHeadAttention-figure-2"),
)



# ---------------------------------------------------------------- rotary_attention_step (a KV cache)

def _step_calls(rng: np.random.Generator) -> list[Call]:
    """A sequence fed in chunks (several tokens first, then one and several after a cache), and one
    token at a time with another base; q, k, v of (batch 2, heads 3, seq_len, d_k)."""
    calls = []
    for seq_len, d_k, chunks, base in [(8, 8, (3, 1, 2, 2), None), (6, 10, (1,) * 6, float(rng.choice([100.0, 500.0])))]:
        if base is None:
            chunks = (3,) + tuple(rng.permutation(chunks[1:]).tolist())
        q, k, v = (rng.normal(size=(BATCH, HEADS, seq_len, d_k)).astype(np.float32) for _ in range(3))
        kwargs = {} if base is None else {"base": base}
        calls.append(Call((q, k, v, np.array(chunks, dtype=np.int64)), kwargs,
                          what=f"rotary_attention_step on q, k, v of ({BATCH}, {HEADS}, {seq_len}, {d_k}) fed "
                               f"{' + '.join(map(str, chunks))} tokens" + (f", base={base:g}" if base else "")))
    q, v = (rng.normal(size=(BATCH, HEADS, 3, 8)).astype(np.float32) for _ in range(2))
    k = rng.normal(size=(BATCH, HEADS, 2, 8)).astype(np.float32)
    calls.append(Call((q, k, v, np.array([3], dtype=np.int64)), what="rotary_attention_step(q, k, v) with 3 queries "
                      "but 2 keys", raises="ValueError"))
    return calls


def _step_variant(positions="true", read="once", stored="rotated", mask="bottom_right", update="append"):
    """A learner's rotary_attention_step with some choices wrong (the spec's knobs): where the new
    tokens are rotated, whether the keys read from the cache are rotated again, whether the cache
    stores them rotated, the causal mask's alignment, what the returned cache holds."""
    def rotary_attention_step(q, k, v, cache=None, base=10000.0):
        past = 0 if cache is None else cache[0].shape[-2]
        new, d_k = q.shape[-2], q.shape[-1]
        if k.shape[-2] != new or v.shape[-2] != new:
            raise ValueError("q, k and v must hold the same new tokens")
        first = {"true": past, "queries_zero": past, "both_zero": 0, "plus_one": past + 1,
                 "minus_one": max(past - 1, 0)}[positions]
        q_first = 0 if positions == "queries_zero" else first
        q = ref.apply_rope(q, ref.rope_angles(q_first + new, d_k, base)[q_first:])
        rotated_new = stored == "rotated" and read == "once"
        k_new = ref.apply_rope(k, ref.rope_angles(first + new, d_k, base)[first:]) if rotated_new else k
        keys = k_new if cache is None else torch.cat([cache[0], k_new], dim=-2)
        values = v if cache is None else torch.cat([cache[1], v], dim=-2)
        if read == "again":   # the cached keys (rotated) and the new ones rotated together, and stored so
            keys = ref.apply_rope(keys, ref.rope_angles(past + new, d_k, base))
        read_keys = keys
        if stored == "raw":   # the keys stored as they came, rotated at 0 ... past + new - 1 when read
            read_keys = ref.apply_rope(keys, ref.rope_angles(past + new, d_k, base))
        allowed = {"bottom_right": torch.ones(new, past + new, dtype=torch.bool).tril(diagonal=past),
                   "top_left": torch.ones(new, past + new, dtype=torch.bool).tril(),
                   "future": torch.ones(new, past + new, dtype=torch.bool).triu(diagonal=past), "none": None}[mask]
        out, _ = ref.scaled_dot_product_attention(q, read_keys, values, allowed)
        if update == "new_only":
            return out, (k_new, v)
        if update == "kept" and cache is not None:
            return out, cache
        return out, (keys, values)
    return rotary_attention_step


def _raw_cache(q, k, v, cache=None, base=10000.0):
    """Not rotated at all: notebook 06's causal attention with a cache."""
    past = 0 if cache is None else cache[0].shape[-2]
    keys = k if cache is None else torch.cat([cache[0], k], dim=-2)
    values = v if cache is None else torch.cat([cache[1], v], dim=-2)
    mask = torch.ones(q.shape[-2], keys.shape[-2], dtype=torch.bool).tril(diagonal=past)
    return ref.scaled_dot_product_attention(q, keys, values, mask)[0], (keys, values)


def _several_after_cache(call: Call) -> bool:
    return not call.raises and any(c > 1 for c in np.asarray(call.args[3])[1:])


ROTARY_ATTENTION_STEP = Spec(
    id="rope-rotary_attention_step",
    function="rotary_attention_step",
    depends=("rope-rope_angles", "rope-apply_rope"),  # its solution calls them
    driver="rope.cached_steps",
    inputs=_step_calls,
    reference=ref.rotary_attention_step,
    parts=("output", "cached keys", "cached values"),
    variant=_step_variant,
    equivalent=(
        ("L12 0 -> 1 #2", "cache[1], the cached values, has the cached keys' shape: their length is past as well"),
        ("L12 0 -> -1 #2", "cache is a pair: cache[-1] is cache[1], the values, of the keys' shape"),
    ) + tuple((name, "q, k, v and the cache are 4-D, (batch, heads, positions, d_k): axis 2 is axis -2")
              for name in ("L12 -2 -> 2", "L13 -2 -> 2", "L14 -2 -> 2", "L14 -2 -> 2 #2", "L19 -2 -> 2",
                           "L19 -2 -> 2 #2")),
    rules=(
        Rule("several new tokens after a cache: queries at past ... past + new_len - 1, the causal mask aligned "
             "bottom-right", _several_after_cache),
        Rule("one new token after a cache", lambda call: not call.raises and any(
            c == 1 for c in np.asarray(call.args[3])[1:])),
        Rule("several tokens in the first call (no cache): causal among themselves",
             lambda call: not call.raises and np.asarray(call.args[3])[0] > 1),
        Rule("a base given, other than 10000", lambda call: call.kwargs.get("base", 10000.0) != 10000.0),
        Rule("q, k and v of different lengths: ValueError", lambda call: call.raises == "ValueError"),
    ),
    knobs=(
        Knob("positions", (
            ("queries_zero", "the new queries are rotated from position 0: after `past` cached tokens new token j "
                             "is at position past + j, its query rotated by rope_angles(past + new_len, d_k)[past:] "
                             "as its key is"),
            ("both_zero", "the new queries and keys are rotated from position 0 at every call (section 5's module "
                          "as it is): after `past` cached tokens they sit at positions past ... past + new_len - 1, "
                          "rope_angles(past + new_len, d_k)[past:]"),
            ("plus_one", "the new tokens are rotated one position too far, from past + 1: the first token is at "
                         "position 0, and after `past` cached tokens the next one is at position past"),
            ("minus_one", "the new tokens after a cache are rotated one position too early, from past - 1: the "
                          "cache holds positions 0 ... past - 1, so the next token is at position past"),
        )),
        Knob("read", (("again", "the cached keys are rotated again when read (the cache and the new keys rotated "
                                "together at 0 ... past + new_len - 1): they are stored rotated at their positions, "
                                "so rotate only the new keys, then concatenate"),)),
        Knob("stored", (("raw", "the outputs are right, but the cache holds the keys unrotated (rotated afresh "
                                "at every step): store them rotated, so that each step rotates only its new "
                                "keys"),)),
        Knob("mask", (
            ("top_left", "the causal mask is aligned top-left: new token j (at position past + j) may attend to "
                         "keys 0 ... past + j, torch.ones(new_len, past + new_len).tril(diagonal=past), the mask "
                         "aligned bottom-right"),
            ("none", "several new tokens in one call see each other's future: mask new token j to keys 0 ... "
                     "past + j, torch.ones(new_len, past + new_len).tril(diagonal=past)"),
            ("future", "the mask keeps the future and hides the past (triu in the place of tril): new token j may "
                       "attend to keys 0 ... past + j, torch.ones(new_len, past + new_len).tril(diagonal=past)"),
        )),
        Knob("update", (
            ("new_only", "the cache returned holds only the new keys and values, so the next call forgets the "
                         "earlier positions: return the concatenation of the cached and the new ones"),
            ("kept", "the cache is not updated after the first call: return the concatenation of the cached and "
                     "the new keys and values, so that the next call sees this one's tokens"),
        )),
    ),
    mistakes=(
        Mistake("not_rotated", "nothing is rotated: rotate the new queries and keys by apply_rope with the angles "
                "of their positions, past ... past + new_len - 1", _raw_cache),
    ),
    errors=(
        Raises("{what} raised {error}: concatenate the cached and the new keys (and values) along the positions "
               "axis, dim=-2 of (batch, heads, positions, d_k)", match="Sizes of tensors must match",
               example=lambda q, k, v, cache=None, base=10000.0: _step_variant()(
                   q, k, v, None if cache is None else (cache[0].transpose(-2, -1), cache[1]), base)),
    ),
    figures=("rope-rotary_attention_step-figure",),
)

SPECS = (ROPE_ANGLES, APPLY_ROPE, ROTARY_MULTI_HEAD_ATTENTION, ROTARY_ATTENTION_STEP)
