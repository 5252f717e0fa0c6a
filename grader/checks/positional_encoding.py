"""Hidden checks of notebook 05, positional_encoding: word order, the sinusoidal table and its properties.

Sizes are pairwise distinct (seq_len 5, d_model 6, max_len 9, ...) and every table is
longer than it is wide, so that a transposed table or a table of the wrong length shows
in the shape. Every sinusoidal mistake the checks name changes entries at positions
>= 1 and columns >= 2 (position 0 and the first (sin, cos) pair hide most of them:
sin(0) = 0 whatever the frequency, and the first pair has frequency 1 whatever the
base). Permutations are one cycle through every slot (never their own inverse),
so that using the inverse shows.
Long tables (length 512) are compared with atol 1e-4: a float32 table differs from
the float64 reference by about 3e-5 there.
"""
from __future__ import annotations

import numpy as np

from ._core import RTOL, CheckFailed, Question, Raised, close, exercise, judge, to_array, value

LONG_ATOL = 1e-4


# ---------------------------------------------------------------- the reference

def _table(max_len: int, d_model: int, *, base: float = 10000.0, start: int = 0, exponent: str = "2i",
           even: str = "sin", layout: str = "interleaved", width: int | None = None) -> np.ndarray:
    """The sinusoidal table, with knobs for the known mistakes; the defaults are the reference.

    exponent: "2i" (reference: column j has frequency 1 / base^(2 (j // 2) / d_model)),
    "j" (base^(j / d_model)), "2j" (base^(2 j / d_model)), "i" (base^((j // 2) / d_model)),
    "int" (2 * i // d_model computed in integers: every frequency 1),
    "bracket" (pos / base^(2i) / d_model in floats), "bracket-int" (the same with base^(2i) in
    int64, which wraps around, as numpy and torch do: zeros, hence inf and NaN, from 2i >= 16);
    start: the first position; even: "sin" (reference) or "cos" on the even columns;
    layout: "interleaved" (reference) or "halves" (all sin columns, then all cos columns);
    width: the d_model used in the exponent (default d_model).
    """
    width = d_model if width is None else width
    pos = np.arange(start, start + max_len, dtype=np.float64)[:, None]
    if layout == "halves":
        half = (d_model + 1) // 2
        freq = base ** (-2.0 * np.arange(half) / width)
        sin, cos = np.sin(pos * freq), np.cos(pos * freq)
        return np.concatenate([sin, cos[:, : d_model - half]], axis=1)
    j = np.arange(d_model)
    i = j // 2
    first, second = (np.sin, np.cos) if even == "sin" else (np.cos, np.sin)
    if exponent in ("bracket", "bracket-int"):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            denominator = (int(base) ** (2 * i) if exponent == "bracket-int" else base ** (2.0 * i))
            angle = pos / denominator / width
            return np.where(j % 2 == 0, first(angle), second(angle))
    power = {"2i": 2.0 * i / width, "j": j / width, "2j": 2.0 * j / width, "i": i / width,
             "int": (2 * i // width).astype(float)}[exponent]
    angle = pos / base ** power
    return np.where(j % 2 == 0, first(angle), second(angle))


def _frequencies(d_model: int, *, base: float = 10000.0, exponent: str = "2i") -> np.ndarray:
    """The d_model // 2 frequencies w_i of the (sin, cos) pairs (knobs as in ``_table``)."""
    i = np.arange(d_model // 2)
    power = {"2i": 2.0 * i / d_model, "i": i / d_model, "2j": 4.0 * i / d_model}[exponent]
    return base ** -power


def _self_attention(x: np.ndarray) -> np.ndarray:
    """The notebook's read-only helper: softmax(x x^T / sqrt(d_model)) x, one sentence."""
    scores = x @ x.T / np.sqrt(x.shape[-1])
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ x


def _cycle(rng: np.random.Generator, n: int) -> np.ndarray:
    """A random permutation of range(n), n >= 4, that is one cycle through every slot.

    Then no slot keeps its word, and the pairs of slots that a comparison without
    reordering matches (one step along the cycle) differ from those that the inverse
    permutation matches (two steps): the two mistakes give different gaps.
    """
    ring = rng.permutation(n)
    order = np.empty(n, dtype=np.int64)
    order[ring] = np.roll(ring, -1)
    return order


def _raised(got: object, name: str, hints: dict[str, str]) -> None:
    """Turn a raised exception into a diagnosis, with advice for the messages in ``hints``."""
    if not isinstance(got, Raised):
        return
    if got.message.startswith("NotImplementedError"):
        value(got, name)  # its own diagnosis
    for fragment, advice in hints.items():
        if fragment in got.message:
            raise CheckFailed(f"{name} raised {got.message}. {advice}")
    raise CheckFailed(f"{name} raised {got.message}")


def _expect_value_error(got: object, call: str, why: str) -> None:
    if isinstance(got, Raised):
        if got.message.startswith("ValueError"):
            return
        if got.message.startswith("NotImplementedError"):
            value(got, call.split("(")[0])
        raise CheckFailed(f"{call} raised {got.message}; check the arguments first and raise "
                          f"ValueError, as the docstring says ({why})")
    raise CheckFailed(f"{call} returned a value; it should raise ValueError, as the docstring says ({why})")


# ---------------------------------------------------------------- order_gap

def _gap(x: np.ndarray, order: np.ndarray, pe: np.ndarray | None, *, outputs: str = "reorder",
         slots: bool = True, reduce: str = "max") -> float:
    """order_gap with knobs: outputs "reorder" (reference), "none" or "inverse"; slots=False
    reorders the positions with the words; reduce "max" (reference), "mean", "sum", "signed", "norm"."""
    n = x.shape[0]
    p = np.zeros_like(x) if pe is None else pe[:n]
    original = _self_attention(x + p)
    shuffled = _self_attention(x[order] + (p if slots else p[order]))
    inverse = np.argsort(order)
    diff = shuffled - {"reorder": original[order], "none": original, "inverse": original[inverse]}[outputs]
    return float({"max": np.abs(diff).max(), "mean": np.abs(diff).mean(), "sum": np.abs(diff).sum(),
                  "signed": diff.max(), "norm": np.linalg.norm(diff)}[reduce])


def _judge_gap(got: object, x: np.ndarray, order: np.ndarray, pe: np.ndarray | None, what: str) -> None:
    name = "order_gap"
    n = x.shape[0]
    _raised(got, name, {
        "broadcast": ("pe has max_len rows, more than the sentence's seq_len: add only the first "
                      "seq_len rows, pe[:seq_len] (seq_len = x.shape[0])"),
        "unsupported operand": "pe may be None: add positions only `if pe is not None:`",
        "NoneType": "pe may be None: add positions only `if pe is not None:`",
        "truth value": "Test for a missing table with `if pe is not None:`, not `if pe:`",
        "Boolean value of Tensor": "Test for a missing table with `if pe is not None:`, not `if pe:`",
    })
    answer = to_array(got, what)
    if answer.size != 1:
        raise CheckFailed(f"{what} should be one number, the largest absolute difference over every "
                          f"entry, but it has shape {answer.shape}: take np.abs(...).max() of the whole "
                          "difference")
    answer = answer.reshape(())
    expected = np.array(_gap(x, order, pe))
    words = ("reorder the original sentence's outputs with the same `order`, so that row i of both "
             "belongs to the same word: self_attention(x)[order]")
    mistakes = [
        ("it compares the outputs slot by slot, without reordering the original outputs: each row of "
         f"the reordered sentence belongs to another word than the same row of the original; {words}",
         _gap(x, order, pe, outputs="none")),
        ("it reorders the original outputs with the inverse permutation (np.argsort(order)); the "
         f"reordered sentence is x[order], so word order[i] sits in slot i: {words}",
         _gap(x, order, pe, outputs="inverse")),
    ]
    if pe is None:
        judge(answer, expected, what, mistakes, hints=[lambda a: (
            "with pe=None the gap should be 0 (up to rounding): without positions, self-attention is "
            "permutation-equivariant, so each word gets the same output in both sentences. Compare "
            "self_attention(x[order]) with self_attention(x)[order]")])
        return
    mistakes += [
        ("the gap is 0 although positions were given: either pe is ignored, or the positions were "
         "reordered together with the words (as in (x + pe[:n])[order]). The positions belong to the "
         "slots: the reordered sentence is x[order] + pe[:n], the original x + pe[:n]", 0.0),
        ("it adds the positions to the reordered sentence only; add pe[:n] to both sentences",
         float(np.abs(_self_attention(x[order] + pe[:n]) - _self_attention(x)[order]).max())),
        ("it returns the mean absolute difference; return the largest one (np.abs(diff).max())",
         _gap(x, order, pe, reduce="mean")),
        ("it returns the sum of the absolute differences; return the largest one (np.abs(diff).max())",
         _gap(x, order, pe, reduce="sum")),
        ("it returns the largest signed difference; take the absolute value first (np.abs(diff).max())",
         _gap(x, order, pe, reduce="signed")),
        ("it returns the norm of the difference; return the largest absolute entry (np.abs(diff).max())",
         _gap(x, order, pe, reduce="norm")),
    ]
    judge(answer, expected, what, mistakes)


@exercise("positional_encoding-order_gap", "order_gap")
def order_gap_questions(rng: np.random.Generator) -> list[Question]:
    asked = []

    def ask(x, order, pe, how: str) -> None:
        note = "pe=None" if pe is None else f"pe of shape {pe.shape}"
        what = f"order_gap(x, order, ...) for x of shape {x.shape}, {note}"
        args, kwargs = (x, order), {}
        if how == "positional":
            args = (x, order, pe)
        elif how == "keyword":
            kwargs = {"pe": pe}
        asked.append(Question(args, lambda got: _judge_gap(got, x, order, pe, what), kwargs))

    def sentence(n: int, d_model: int, pe: np.ndarray | None):
        # With positions, draw until the largest |difference| is a negative entry, so that
        # forgetting np.abs shows (and the gap is clearly above 0).
        while True:
            x, order = rng.normal(size=(n, d_model)), _cycle(rng, n)
            if pe is None:
                return x, order
            diff = _self_attention(x[order] + pe[:n]) - _self_attention(x + pe[:n])[order]
            if np.abs(diff).max() > 0.05 and diff.max() < np.abs(diff).max() - 0.05:
                return x, order

    # 1-2. No positions (pe left out, then pe=None by keyword): the gap is 0.
    ask(*sentence(5, 4, None), None, "none")
    ask(*sentence(6, 8, None), None, "keyword")
    # 3. A table exactly as long as the sentence, by keyword; 4. a longer one, positionally.
    pe = _table(5, 6)
    ask(*sentence(5, 6, pe), pe, "keyword")
    pe = _table(9, 8)
    ask(*sentence(6, 8, pe), pe, "positional")
    return asked


# ---------------------------------------------------------------- sinusoidal_encoding

def _judge_table(got: object, max_len: int, d_model: int, what: str, atol: float) -> None:
    name = "sinusoidal_encoding"
    odd = d_model % 2 == 1
    uneven = ("For an odd d_model there are (d_model + 1) // 2 sin columns (0, 2, 4, ...) but only "
              "d_model // 2 cos columns (1, 3, ...): give the cos columns the first d_model // 2 "
              "frequencies only (e.g. np.cos(angles[:, : d_model // 2]))")
    hints = {"broadcast": uneven, "shape mismatch": uneven, "must match the existing size": uneven}
    if (odd and isinstance(got, Raised) and got.message.startswith("ValueError")
            and not any(fragment in got.message for fragment in hints)):
        raise CheckFailed(f"{what} raised {got.message}; an odd d_model is valid: the last column is "
                          "the sin of frequency i = (d_model - 1) // 2 and has no cos partner, as the "
                          "docstring says")
    _raised(got, name, hints if odd else {})
    answer = to_array(got, what)
    expected = _table(max_len, d_model)
    if answer.shape == (d_model, max_len):
        raise CheckFailed(f"{what} has shape {answer.shape}: the table is transposed; rows are positions "
                          f"and columns dimensions, shape (max_len, d_model) = {expected.shape}")
    if answer.shape == (max_len, d_model + 1) or answer.shape == (max_len, d_model - 1):
        raise CheckFailed(f"{what} has shape {answer.shape}; expected {expected.shape}: with an odd "
                          "d_model the table still has d_model columns, the last one a sin without "
                          "its cos")
    mistakes = [
        ("the positions start at 1; they start at 0 (the first row is sin(0) = 0 on the even columns "
         "and cos(0) = 1 on the odd ones): np.arange(max_len)", _table(max_len, d_model, start=1)),
        ("sin and cos are swapped: the even columns 2i hold sin, the odd columns 2i + 1 hold cos",
         _table(max_len, d_model, even="cos")),
        ("the exponent uses the column index j (10000^(j / d_model)); columns 2i and 2i + 1 share one "
         "frequency, 1 / 10000^(2i / d_model), with i = j // 2", _table(max_len, d_model, exponent="j")),
        ("the exponent is 2j / d_model with j the column index; it is 2i / d_model with i = j // 2, "
         "the index of the (sin, cos) pair", _table(max_len, d_model, exponent="2j")),
        ("the exponent is i / d_model (the same table as base 100); it is pos / 10000^(2i / d_model), "
         "i = j // 2 the index of the pair",
         _table(max_len, d_model, exponent="i")),
        ("every column has frequency 1: 2 * i // d_model is integer division, which is 0; compute "
         "2 * i / d_model in floats", _table(max_len, d_model, exponent="int")),
        ("the sin and cos columns are in two halves (all sin, then all cos); they alternate: "
         "column 2i is sin, column 2i + 1 is cos of the same frequency", _table(max_len, d_model, layout="halves")),
        ("the positions are multiplied by 10000^(2i / d_model); divide them by it "
         "(pos / 10000^(2i / d_model), frequencies from 1 down to about 1/10000)",
         _table(max_len, d_model, base=1 / 10000.0)),
    ]
    for base in (10.0, 1000.0, 1e5):
        mistakes.append((f"the base of the frequencies is not 10000 (it looks like {base:g}): "
                         "pos / 10000^(2i / d_model)", _table(max_len, d_model, base=base)))
    if odd:
        mistakes.append(("for an odd d_model it builds the table for d_model + 1 columns and drops the last, "
                         "so every exponent is divided by d_model + 1; divide by d_model itself "
                         "(2i / d_model), as the docstring says",
                         _table(max_len, d_model + 1)[:, :d_model]))
        mistakes.append(("for an odd d_model the last column should be the sin of frequency "
                         "i = (d_model - 1) // 2, not 0: give it sin(pos / 10000^((d_model - 1) / d_model))",
                         np.concatenate([expected[:, :-1], np.zeros((max_len, 1))], axis=1)))

    if not close(answer, expected, RTOL, atol):
        for form, note in (("bracket", ""), ("bracket-int", " (in integers 10000 ** (2 * i) also overflows "
                                                             "int64 and wraps around silently)")):
            wrong = _table(max_len, d_model, exponent=form)
            if answer.shape == wrong.shape and np.allclose(answer, wrong, rtol=RTOL, atol=atol, equal_nan=True):
                raise CheckFailed(f"{what}: the brackets: the whole 2i / d_model is the exponent, "
                                  "10000 ** (2 * i / d_model); pos / 10000 ** (2 * i) / d_model divides by "
                                  f"10000^(2i) and then by d_model{note}")

    def first_row(a: np.ndarray) -> str | None:
        row0 = np.where(np.arange(d_model) % 2 == 0, 0.0, 1.0)
        if not np.allclose(a[0], row0, atol=1e-4):
            return ("position 0 should be (0, 1, 0, 1, ...): sin(0) = 0 on the even columns, cos(0) = 1 "
                    "on the odd ones; check that positions start at 0 and where sin and cos go")
        return None

    def first_pair(a: np.ndarray) -> str | None:
        pos = np.arange(max_len)
        if not np.allclose(a[:, 0], np.sin(pos), atol=1e-4) or (
                d_model > 1 and not np.allclose(a[:, 1], np.cos(pos), atol=1e-4)):
            return ("columns 0 and 1 should be sin(pos) and cos(pos) (frequency 10000^0 = 1); check "
                    "the positions, the angle pos * frequency, and radians (np.sin takes radians)")
        return None

    def later_pairs(a: np.ndarray) -> str | None:
        return ("columns 0 and 1 are right, later columns are not: column j has frequency "
                "1 / 10000^(2i / d_model) with i = j // 2; check the exponent and the base")

    judge(answer, expected, what, mistakes, hints=[first_row, first_pair, later_pairs], atol=atol)


@exercise("positional_encoding-sinusoidal_encoding", "sinusoidal_encoding")
def sinusoidal_encoding_questions(rng: np.random.Generator) -> list[Question]:
    asked = []

    def ask(max_len: int, d_model: int, how: str, atol: float = 1e-5, note: str = "") -> None:
        what = f"sinusoidal_encoding({max_len}, {d_model}){note}"
        args, kwargs = (max_len, d_model), {}
        if how == "keyword":
            args, kwargs = (), {"max_len": max_len, "d_model": d_model}
        asked.append(Question(args, lambda got: _judge_table(got, max_len, d_model, what, atol), kwargs))

    ask(int(rng.integers(9, 13)), 6, "positional")
    ask(int(rng.integers(20, 30)), 10, "keyword")
    ask(512, int(rng.choice([32, 48, 64])), "positional", atol=LONG_ATOL, note=", a long table")
    ask(int(rng.integers(7, 11)), 5, "positional", note=", odd d_model")
    for max_len, d_model in [(0, 6), (7, 0)]:
        call = f"sinusoidal_encoding({max_len}, {d_model})"
        asked.append(Question((max_len, d_model), lambda got, c=call: _expect_value_error(
            got, c, "max_len and d_model must be at least 1")))
    return asked


# ---------------------------------------------------------------- shift_matrix

def _shift(k: float, d_model: int, *, transpose: bool = False, exponent: str = "2i", base: float = 10000.0,
           step: int = 2, cos_only: bool = False) -> np.ndarray:
    """The block-diagonal shift matrix with knobs; step=1 puts block i at rows/columns i, i + 1."""
    m = np.zeros((d_model, d_model))
    for i, w in enumerate(_frequencies(d_model, base=base, exponent=exponent)):
        c, s = np.cos(w * k), (0.0 if cos_only else np.sin(w * k))
        block = np.array([[c, s], [-s, c]])
        r = step * i
        if r + 2 > d_model:
            break
        m[r:r + 2, r:r + 2] = block.T if transpose else block
    return m


def _judge_shift(got: object, k: int, d_model: int, what: str) -> None:
    name = "shift_matrix"
    _raised(got, name, {})
    answer = to_array(got, what)
    expected = _shift(k, d_model)
    mistakes = [
        ("it is the shift by -k: each 2 x 2 block is transposed. The block of frequency w is "
         "[[cos(w k), sin(w k)], [-sin(w k), cos(w k)]] acting on (sin, cos): from sin(a + b) = "
         "sin a cos b + cos a sin b and cos(a + b) = cos a cos b - sin a sin b", _shift(k, d_model, transpose=True)),
        ("it ignores k: it is the shift by one position; use the angle w * k", _shift(1, d_model)),
        ("it ignores k and its transposed blocks shift by -1; use the angle w * k",
         _shift(1, d_model, transpose=True)),
        ("the blocks use the wrong frequencies: the angle of pair i is w_i k with "
         "w_i = 1 / 10000^(2i / d_model) (i / d_model in the exponent, or base 100, is wrong)",
         _shift(k, d_model, exponent="i")),
        ("the blocks use the wrong frequencies: the angle of pair i is w_i k with "
         "w_i = 1 / 10000^(2i / d_model), i = 0 .. d_model/2 - 1 the pair index (not the column index)",
         _shift(k, d_model, exponent="2j")),
        ("the blocks are in the wrong place: the block of pair i covers rows and columns 2i and 2i + 1, "
         "so the blocks sit on the diagonal without overlapping", _shift(k, d_model, step=1)),
        ("only the cos(w k) entries are there: each block also has sin(w k) above and -sin(w k) below "
         "the diagonal", _shift(k, d_model, cos_only=True)),
    ]
    for base in (1000.0, 1e5):
        mistakes.append((f"the frequencies use base {base:g}; the base is 10000", _shift(k, d_model, base=base)))

    def block_diagonal(a: np.ndarray) -> str | None:
        mask = np.kron(np.eye(d_model // 2), np.ones((2, 2))).astype(bool)
        if np.any(np.abs(a[~mask]) > 1e-6):
            return ("M should be block diagonal: the 2 x 2 block of pair i at rows and columns 2i, 2i + 1, "
                    "zeros everywhere else (a shift never mixes two frequencies)")
        return ("each block should be [[cos(w_i k), sin(w_i k)], [-sin(w_i k), cos(w_i k)]] with "
                "w_i = 1 / 10000^(2i / d_model); check it on the table: PE[pos + k] = M @ PE[pos]")

    judge(answer, expected, what, mistakes, hints=[block_diagonal])


@exercise("positional_encoding-shift_matrix", "shift_matrix")
def shift_matrix_questions(rng: np.random.Generator) -> list[Question]:
    asked = []

    def ask(k: int, d_model: int, how: str) -> None:
        what = f"shift_matrix(k, {d_model}) for a k {'above' if k > 0 else 'below'} 0"
        args, kwargs = (k, d_model), {}
        if how == "keyword":
            args, kwargs = (), {"k": k, "d_model": d_model}
        asked.append(Question(args, lambda got: _judge_shift(got, k, d_model, what), kwargs))

    ask(int(rng.integers(2, 6)), 6, "positional")
    ask(-int(rng.integers(2, 9)), 8, "keyword")
    ask(int(rng.integers(20, 60)), 10, "positional")
    asked.append(Question((3, 7), lambda got: _expect_value_error(
        got, "shift_matrix(3, 7)", "an odd d_model has a last sin column without a cos partner, "
        "and no matrix shifts it")))
    return asked


# ---------------------------------------------------------------- dot_by_offset

def _dots(offsets: np.ndarray, d_model: int, *, fn=np.cos, terms: str = "pairs", exponent: str = "2i",
          base: float = 10000.0) -> np.ndarray:
    """sum_i fn(w_i * offset) with knobs; terms "pairs" (reference, d_model / 2 terms),
    "columns" (d_model terms, w_j = 1 / base^(2j / d_model)), "double" (each pair counted twice)."""
    if terms == "columns":
        w = base ** (-2.0 * np.arange(d_model) / d_model)
    else:
        w = _frequencies(d_model, base=base, exponent=exponent)
    total = fn(np.asarray(offsets, dtype=np.float64)[..., None] * w).sum(-1)
    return 2 * total if terms == "double" else total


def _judge_dots(got: object, offsets: np.ndarray, d_model: int, what: str) -> None:
    name = "dot_by_offset"
    _raised(got, name, {})
    answer = to_array(got, what)
    expected = _dots(offsets, d_model)
    if answer.shape == offsets.shape + (d_model // 2,):
        raise CheckFailed(f"{what} has shape {answer.shape}: it returns the d_model / 2 terms "
                          "cos(w_i * offset) for each offset; sum them over i (the last axis)")
    mistakes = [
        ("it sums sin(w_i * offset); the dot product is a sum of cos(w_i * offset): "
         "sin a sin b + cos a cos b = cos(a - b)", _dots(offsets, d_model, fn=np.sin)),
        ("it sums d_model terms; there are d_model / 2 frequencies, one per (sin, cos) pair, and each "
         "pair gives one cos(w_i * offset)", _dots(offsets, d_model, terms="columns")),
        ("it counts every (sin, cos) pair twice: each pair gives sin a sin b + cos a cos b = "
         "cos(w_i * offset) once, d_model / 2 terms in all", _dots(offsets, d_model, terms="double")),
        ("the frequencies are wrong: w_i = 1 / 10000^(2i / d_model), i = 0 .. d_model/2 - 1 "
         "(i / d_model in the exponent, or base 100, is wrong)", _dots(offsets, d_model, exponent="i")),
        ("the frequencies are wrong: w_i = 1 / 10000^(2i / d_model), i = 0 .. d_model/2 - 1 "
         "(the exponent 4i / d_model uses the column index 2i where the pair index i belongs)",
         _dots(offsets, d_model, exponent="2j")),
        ("it multiplies the offsets by 10000^(2i / d_model); the frequencies are its inverse, "
         "w_i = 1 / 10000^(2i / d_model)", _dots(offsets, d_model, base=1 / 10000.0)),
    ]
    for base in (1000.0, 1e5):
        mistakes.append((f"the frequencies use base {base:g}; the base is 10000",
                         _dots(offsets, d_model, base=base)))

    def at_zero(a: np.ndarray) -> str | None:
        if a.shape == offsets.shape and not np.allclose(a[offsets == 0], d_model / 2, atol=1e-4):
            return ("at offset 0 the dot product is |PE(p)|^2 = d_model / 2 (each pair gives "
                    "sin^2 + cos^2 = 1): sum cos(w_i * offset) over the d_model / 2 pairs")
        return None

    judge(answer, expected, what, mistakes, hints=[at_zero])


@exercise("positional_encoding-dot_by_offset", "dot_by_offset")
def dot_by_offset_questions(rng: np.random.Generator) -> list[Question]:
    asked = []

    def ask(offsets: np.ndarray, d_model: int, how: str) -> None:
        what = f"dot_by_offset(offsets, {d_model}) for offsets of shape {offsets.shape}"
        args, kwargs = (offsets, d_model), {}
        if how == "keyword":
            args, kwargs = (offsets,), {"d_model": d_model}
        asked.append(Question(args, lambda got: _judge_dots(got, offsets, d_model, what), kwargs))

    # Integer offsets of both signs, 0 included (the dot product of a position with itself).
    offsets = rng.integers(-40, 41, size=(3, 5))
    offsets[rng.integers(3), rng.integers(5)] = 0
    ask(offsets, 6, "positional")
    ask(np.concatenate([[0], rng.integers(1, 200, size=6), -rng.integers(1, 200, size=4)]), 16, "keyword")
    ask(rng.integers(-500, 501, size=(2, 7)), 64, "positional")
    odd = rng.integers(-20, 21, size=4)
    asked.append(Question((odd, 7), lambda got: _expect_value_error(
        got, "dot_by_offset(offsets, 7)", "with an odd d_model the lone last sin column adds "
        "sin(w p) sin(w q), not a function of p - q")))
    return asked


# ---------------------------------------------------------------- embed

def _judge_embed(got: object, token_ids: np.ndarray, table: np.ndarray, pe: np.ndarray, what: str) -> None:
    name = "embed"
    seq_len = token_ids.shape[1]
    _raised(got, name, {
        "broadcast": ("pe has max_len rows, more than seq_len: add only the first seq_len rows, "
                      "pe[:seq_len] with seq_len = token_ids.shape[1] (token_ids.shape[0] is the batch), "
                      "broadcast over the batch"),
        "index": ("index the embedding table with the token ids (table[token_ids]) and the positional "
                  "table with the positions 0 .. seq_len - 1 (pe[:seq_len])"),
        "must match the size": ("pe has max_len rows, more than seq_len: add only the first seq_len "
                                "rows, pe[:seq_len] with seq_len = token_ids.shape[1] (token_ids.shape[0] "
                                "is the batch), to the embeddings table[token_ids]"),
    })
    answer = to_array(got, what)
    words = table[token_ids]
    expected = words + pe[:seq_len]
    if answer.shape == words.shape[:-1] + (2 * table.shape[1],):
        raise CheckFailed(f"{what} has shape {answer.shape}: it concatenates the positions to the word "
                          "embeddings; add them (same d_model, element by element)")
    mistakes = []
    if pe.shape[0] > seq_len:
        mistakes.append(("the positions are off by one: the first word is at position 0, so add "
                         "pe[:seq_len], not pe[1:seq_len + 1]", words + pe[1:seq_len + 1]))
    mistakes += [
        ("it indexes the positional table with the token ids (pe[token_ids]); the positions are "
         "0 .. seq_len - 1, whatever the words: pe[:seq_len]", words + pe[token_ids]),
        ("it returns the word embeddings without the positions: add pe[:seq_len]", words),
        ("it returns the positions without the word embeddings: add table[token_ids]",
         np.broadcast_to(pe[:seq_len], words.shape)),
        ("it multiplies the embeddings by sqrt(d_model); in this notebook add them as they are "
         "(the scaling comes with the encoder, in the upcoming notebook 07)", words * np.sqrt(table.shape[1]) + pe[:seq_len]),
        ("it multiplies the embeddings by the positions; add them", words * pe[:seq_len]),
        ("the positions are reversed: the first word gets position 0, pe[:seq_len] in order",
         words + pe[:seq_len][::-1]),
    ]
    judge(answer, expected, what, mistakes)


@exercise("positional_encoding-embed", "embed")
def embed_questions(rng: np.random.Generator) -> list[Question]:
    asked = []

    def ask(batch: int, seq_len: int, vocab: int, d_model: int, max_len: int, how: str) -> None:
        # Token ids repeat within a sentence (one word at two positions) and stay below max_len,
        # so that indexing pe with them gives numbers, not an IndexError.
        token_ids = rng.integers(vocab, size=(batch, seq_len))
        token_ids[:, -1] = token_ids[:, 1]
        table = rng.normal(size=(vocab, d_model))
        pe = _table(max_len, d_model)
        what = (f"embed(token_ids, table, pe) for token_ids {token_ids.shape}, table {table.shape}, "
                f"pe {pe.shape}")
        args, kwargs = (token_ids, table, pe), {}
        if how == "keyword":
            args, kwargs = (token_ids,), {"table": table, "pe": pe}
        asked.append(Question(args, lambda got: _judge_embed(got, token_ids, table, pe, what), kwargs))

    ask(2, 5, 7, 6, 9, "positional")
    ask(3, 4, 10, 8, 12, "keyword")
    ask(4, 6, 5, 10, 6, "positional")  # pe exactly seq_len long
    return asked
