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

from dataclasses import replace

import numpy as np

from coursekit.protocol import Raised, Unsupported

from ._core import Call, Case, CheckFailed, Hint, Mistake, Raises, Rule, Spec, judge_case, to_array, value
from .reference import positional_encoding as ref

LONG_ATOL = 1e-4


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


def _expect_value_error(case: Case) -> None:
    """The docstring promises ValueError for these arguments (``case.call.what``), for the reason in ``_WHY``."""
    got, call, why = case.answer, case.call.what, _WHY[case.spec.id]
    if isinstance(got, Raised):
        if got.message.startswith("ValueError"):
            return
        if got.message.startswith("NotImplementedError"):
            value(got, case.spec.function)  # its own diagnosis: not answered yet
        raise CheckFailed(f"{call} raised {got.message}; check the arguments first and raise "
                          f"ValueError, as the docstring says ({why})")
    raise CheckFailed(f"{call} returned a value; it should raise ValueError, as the docstring says ({why})")


_WHY = {
    "positional_encoding-sinusoidal_encoding": "max_len and d_model must be at least 1",
    "positional_encoding-shift_matrix": ("an odd d_model has a last sin column without a cos partner, "
                                         "and no matrix shifts it"),
    "positional_encoding-dot_by_offset": ("with an odd d_model the lone last sin column adds "
                                          "sin(w p) sin(w q), not a function of p - q"),
}


def _judge(case: Case) -> None:
    """Calls that must raise ValueError get their own judgement; the long table a looser atol;
    an answer that is no data is named with the call that returned it."""
    if isinstance(case.answer, Unsupported) and not case.call.raises:
        value(case.answer, case.what)
    if case.call.raises:
        _expect_value_error(case)
    elif case.call.what.endswith("a long table"):
        judge_case(replace(case, spec=replace(case.spec, atol=LONG_ATOL)))
    else:
        judge_case(case)


def _finite(got: np.ndarray) -> bool:
    # A NaN gets its own diagnosis first (as before hints were read), not a hint's.
    return bool(np.all(np.isfinite(got)))


# ---------------------------------------------------------------- order_gap

def _gap(outputs: str = "reorder", slots: bool = True, one_side: bool = False, sliced: bool = True,
         reduce=lambda d: np.abs(d).max()):
    """A learner's order_gap: outputs "reorder" (right), "none" or "inverse"; slots=False reorders
    the positions with the words; one_side adds them to the reordered sentence only; sliced=False
    adds the whole table."""
    def order_gap(x, order, pe=None):
        p = 0.0 if pe is None else (pe[: x.shape[0]] if sliced else pe)
        original = ref.self_attention(x if one_side else x + p)
        shuffled = ref.self_attention(x[order] + p if slots else (x + p)[order])
        target = {"reorder": original[order], "none": original, "inverse": original[np.argsort(order)]}[outputs]
        return float(reduce(shuffled - target))
    return order_gap


def _positions_on_the_original_only(x, order, pe=None):
    p = 0.0 if pe is None else pe[: x.shape[0]]
    return float(np.abs(ref.self_attention(x[order]) - ref.self_attention(x + p)[order]).max())


def _every_difference(x, order, pe=None):
    p = 0.0 if pe is None else pe[: x.shape[0]]
    return np.abs(ref.self_attention(x[order] + p) - ref.self_attention(x + p)[order])


def _order_gap_calls(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(x, order, pe, how: str) -> None:
        note = "pe=None" if pe is None else f"pe of shape {pe.shape}"
        what = f"order_gap(x, order, ...) for x of shape {x.shape}, {note}"
        args, kwargs = (x, order), {}
        if how == "positional":
            args = (x, order, pe)
        elif how == "keyword":
            kwargs = {"pe": pe}
        calls.append(Call(args, kwargs, what))

    def sentence(n: int, d_model: int, pe: np.ndarray | None):
        # With positions, draw until the largest |difference| is a negative entry, so that
        # forgetting np.abs shows (and the gap is clearly above 0).
        while True:
            x, order = rng.normal(size=(n, d_model)), _cycle(rng, n)
            if pe is None:
                return x, order
            diff = ref.self_attention(x[order] + pe[:n]) - ref.self_attention(x + pe[:n])[order]
            if np.abs(diff).max() > 0.05 and diff.max() < np.abs(diff).max() - 0.05:
                return x, order

    # 1-2. No positions (pe left out, then pe=None by keyword): the gap is 0.
    ask(*sentence(5, 4, None), None, "none")
    ask(*sentence(6, 8, None), None, "keyword")
    # 3. A table exactly as long as the sentence, by keyword; 4. a longer one, positionally.
    pe = ref.sinusoidal_encoding(5, 6)
    ask(*sentence(5, 6, pe), pe, "keyword")
    pe = ref.sinusoidal_encoding(9, 8)
    ask(*sentence(6, 8, pe), pe, "positional")
    return calls


def _one_number(answer: object, call: Call, what: str) -> np.ndarray:
    answer = to_array(answer, what)
    if answer.size != 1:
        raise CheckFailed(f"{what} should be one number, the largest absolute difference over every "
                          f"entry, but it has shape {answer.shape}: take np.abs(...).max() of the whole "
                          "difference")
    return answer.reshape(())


_WORDS = ("reorder the original sentence's outputs with the same `order`, so that row i of both "
          "belongs to the same word: self_attention(x)[order]")
_NONE_CHECK = "pe may be None: add positions only `if pe is not None:`"
_IF_PE = "Test for a missing table with `if pe is not None:`, not `if pe:`"

ORDER_GAP = Spec(
    id="positional_encoding-order_gap",
    function="order_gap",
    inputs=_order_gap_calls,
    reference=ref.order_gap,
    rules=(Rule("no positions (pe None): the gap is 0", lambda call: _pe_of(call) is None),
           Rule("a table exactly as long as the sentence", lambda call: _pe_of(call) is not None
                and len(_pe_of(call)) == len(call.args[0])),
           Rule("a table longer than the sentence: its first n rows", lambda call: _pe_of(call) is not None
                and len(_pe_of(call)) > len(call.args[0]))),
    equivalent=(("L3 0.0 -> 1.0", "without positions self-attention is permutation-equivariant for any input, x + 1 "
                 "included: the gap is 0 (to rounding) either way"),),
    judge=_judge,
    prepare=_one_number,
    mistakes=(
        Mistake("no_reorder", "it compares the outputs slot by slot, without reordering the original outputs: "
                f"each row of the reordered sentence belongs to another word than the same row of the original; {_WORDS}",
                _gap(outputs="none")),
        Mistake("inverse", "it reorders the original outputs with the inverse permutation (np.argsort(order)); "
                f"the reordered sentence is x[order], so word order[i] sits in slot i: {_WORDS}",
                _gap(outputs="inverse")),
        Mistake("positions_follow_words", "the gap is 0 although positions were given: either pe is ignored, or "
                "the positions were reordered together with the words (as in (x + pe[:n])[order]). The positions "
                "belong to the slots: the reordered sentence is x[order] + pe[:n], the original x + pe[:n]",
                _gap(slots=False)),
        Mistake("one_side", "it adds the positions to the reordered sentence only; add pe[:n] to both sentences",
                _gap(one_side=True)),
        Mistake("original_side", "it adds the positions to the original sentence only; add pe[:n] to both sentences",
                _positions_on_the_original_only),
        Mistake("mean", "it returns the mean absolute difference; return the largest one (np.abs(diff).max())",
                _gap(reduce=lambda d: np.abs(d).mean())),
        Mistake("sum", "it returns the sum of the absolute differences; return the largest one (np.abs(diff).max())",
                _gap(reduce=lambda d: np.abs(d).sum())),
        Mistake("signed", "it returns the largest signed difference; take the absolute value first "
                "(np.abs(diff).max())", _gap(reduce=lambda d: d.max())),
        Mistake("norm", "it returns the norm of the difference; return the largest absolute entry "
                "(np.abs(diff).max())", _gap(reduce=np.linalg.norm)),
    ),
    errors=(
        Raises("order_gap raised {error}. pe has max_len rows, more than the sentence's seq_len: add only the "
               "first seq_len rows, pe[:seq_len] (seq_len = x.shape[0])", match="broadcast",
               example=_gap(sliced=False)),
        Raises(f"order_gap raised {{error}}. {_NONE_CHECK}", match="unsupported operand|NoneType",
               example=lambda x, order, pe=None: _gap()(x, order, pe[: len(x)])),
        Raises(f"order_gap raised {{error}}. {_IF_PE}", match="truth value|Boolean value of Tensor",
               example=lambda x, order, pe=None: _gap()(x, order, pe if pe else None)),
    ),
    diagnosed=(
        Mistake("elementwise", "should be one number, the largest absolute difference over every entry",
                _every_difference),
    ),
    hints=(
        Hint("with pe=None the gap should be 0 (up to rounding): without positions, self-attention is "
             "permutation-equivariant, so each word gets the same output in both sentences. Compare "
             "self_attention(x[order]) with self_attention(x)[order]",
             lambda got, call: "pe=None" in call.what and _finite(got),
             example=lambda x, order, pe=None: 1.0),
    ),
)


# ---------------------------------------------------------------- sinusoidal_encoding

def _pe(start: int = 0, base: float = ref.BASE, power=lambda i, j, d: 2.0 * i / d, even=np.sin, odd=np.cos,
        halves: bool = False, width=lambda d: d):
    """A learner's sinusoidal_encoding: the angle of column j is pos / base ** power(j // 2, j, width);
    ``halves`` puts every sin column first, then the cos columns."""
    def sinusoidal_encoding(max_len, d_model):
        if max_len < 1 or d_model < 1:
            raise ValueError("max_len and d_model must be at least 1")
        w = width(d_model)
        pos = np.arange(start, start + max_len)[:, None]
        if halves:
            pairs = np.arange((d_model + 1) // 2)
            angles = pos / base ** power(pairs, 2 * pairs, w)
            return np.concatenate([even(angles), odd(angles)[:, : d_model // 2]], axis=1)
        j = np.arange(w)
        angles = pos / base ** power(j // 2, j, w)
        return np.where(j % 2 == 0, even(angles), odd(angles))[:, :d_model]
    return sinusoidal_encoding


def _last_column_zero(max_len, d_model):
    pe = ref.sinusoidal_encoding(max_len, d_model)
    if d_model % 2:
        pe[:, -1] = 0.0
    return pe


def _bracket(integers: bool):
    """pos / 10000 ** (2 * i) / d_model: the brackets misplaced (in int64, 10000 ** (2i) wraps to 0)."""
    def sinusoidal_encoding(max_len, d_model):
        if max_len < 1 or d_model < 1:
            raise ValueError("max_len and d_model must be at least 1")
        j = np.arange(d_model)
        with np.errstate(divide="ignore", invalid="ignore"):
            angles = np.arange(max_len)[:, None] / (10000 if integers else 10000.0) ** (2 * (j // 2)) / d_model
            return np.where(j % 2 == 0, np.sin(angles), np.cos(angles))
    return sinusoidal_encoding


def _table_calls(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(max_len: int, d_model: int, how: str, note: str = "") -> None:
        what = f"sinusoidal_encoding({max_len}, {d_model}){note}"
        if how == "keyword":
            calls.append(Call((), {"max_len": max_len, "d_model": d_model}, what))
        else:
            calls.append(Call((max_len, d_model), what=what))

    ask(int(rng.integers(9, 13)), 6, "positional")
    ask(int(rng.integers(20, 30)), 10, "keyword")
    ask(512, int(rng.choice([32, 48, 64])), "positional", note=", a long table")
    ask(int(rng.integers(7, 11)), 5, "positional", note=", odd d_model")
    for max_len, d_model in [(0, 6), (7, 0)]:
        calls.append(Call((max_len, d_model), what=f"sinusoidal_encoding({max_len}, {d_model})", raises="ValueError"))
    # The smallest sizes the docstring allows (>= 1): one position, then one column (a lone sin).
    ask(1, int(rng.choice([4, 8])), "positional", note=", one position")
    ask(int(rng.integers(3, 6)), 1, "keyword", note=", d_model 1")
    return calls


def _pe_of(call: Call) -> np.ndarray | None:
    return call.args[2] if len(call.args) > 2 else call.kwargs.get("pe")


def _k_of(call: Call) -> float:
    return call.args[0] if call.args else call.kwargs["k"]


def _embed_args(call: Call) -> tuple:
    return (call.args + (call.kwargs.get("table"), call.kwargs.get("pe")))[:3]


def _sizes(call: Call) -> tuple[int, int]:
    return (call.args or (call.kwargs["max_len"], call.kwargs["d_model"]))[:2]


def _table_shape(answer: object, call: Call, what: str) -> np.ndarray:
    max_len, d_model = _sizes(call)
    answer = to_array(answer, what)
    if answer.shape == (d_model, max_len):
        raise CheckFailed(f"{what} has shape {answer.shape}: the table is transposed; rows are positions "
                          f"and columns dimensions, shape (max_len, d_model) = {(max_len, d_model)}")
    if answer.shape in ((max_len, d_model + 1), (max_len, d_model - 1)):
        raise CheckFailed(f"{what} has shape {answer.shape}; expected {(max_len, d_model)}: with an odd "
                          "d_model the table still has d_model columns, the last one a sin without "
                          "its cos")
    return answer


_BRACKETS = ("the brackets: the whole 2i / d_model is the exponent, 10000 ** (2 * i / d_model); "
             "pos / 10000 ** (2 * i) / d_model divides by 10000^(2i) and then by d_model")


def _judge_table(case: Case) -> None:
    # A misplaced bracket in int64 gives inf and NaN from 2i >= 16 (10000 ** (2 * i) wraps
    # around), which no catalogued value matches: compare with NaN equal to NaN, before the
    # ordinary judgement. (The first table, d_model 6, is the same in floats and in int64,
    # so the float form names both.)
    if not case.call.raises and not isinstance(case.answer, Raised):
        atol = LONG_ATOL if case.what.endswith("a long table") else case.spec.atol
        try:
            got = to_array(case.answer, case.what)
        except CheckFailed:
            got = None
        expected = np.asarray(case.expected, dtype=np.float64)
        if got is not None and not (got.shape == expected.shape and np.allclose(got, expected, case.spec.rtol, atol)):
            wrong = np.asarray(case.spec.run(_bracket(integers=False), [case.call])[0], dtype=np.float64)
            if wrong.shape == got.shape and np.allclose(got, wrong, case.spec.rtol, atol, equal_nan=True):
                case.fail(_BRACKETS)
    _judge(case)


_UNEVEN = ("For an odd d_model there are (d_model + 1) // 2 sin columns (0, 2, 4, ...) but only "
           "d_model // 2 cos columns (1, 3, ...): give the cos columns the first d_model // 2 "
           "frequencies only (e.g. np.cos(angles[:, : d_model // 2]))")
_UNEVEN_ERRORS = "broadcast|shape mismatch|must match the existing size"


def _odd(call: Call) -> bool:
    return _sizes(call)[1] % 2 == 1


def _cos_for_every_pair(max_len, d_model):
    angles = np.arange(max_len)[:, None] * ref.BASE ** (-np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((max_len, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)  # one cos column too many for an odd d_model
    return pe


def _refuses_odd(max_len, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    return ref.sinusoidal_encoding(max_len, d_model)


def _no_size_check(max_len, d_model):
    column = np.arange(d_model)
    angles = np.arange(max_len)[:, None] / ref.BASE ** (2 * (column // 2) / max(d_model, 1))
    return np.where(column % 2 == 0, np.sin(angles), np.cos(angles))


def _asserts_sizes(max_len, d_model):
    assert max_len >= 1 and d_model >= 1, "sizes must be positive"
    return ref.sinusoidal_encoding(max_len, d_model)


def _first_column_fast(max_len, d_model):
    pe = ref.sinusoidal_encoding(max_len, d_model)
    pe[:, 0] = np.sin(1.1 * np.arange(max_len))
    return pe


def _row_zero_doubled(max_len, d_model):
    pe = ref.sinusoidal_encoding(max_len, d_model)
    pe[0] *= 2
    return pe


SINUSOIDAL_ENCODING = Spec(
    id="positional_encoding-sinusoidal_encoding",
    function="sinusoidal_encoding",
    inputs=_table_calls,
    reference=ref.sinusoidal_encoding,
    rules=(Rule("an even d_model", lambda call: not call.raises and _sizes(call)[1] % 2 == 0),
           Rule("an odd d_model: the last column a lone sin", lambda call: not call.raises and _sizes(call)[1] % 2 == 1
                and _sizes(call)[1] > 1),
           Rule("max_len < 1 raises ValueError", lambda call: call.raises == "ValueError" and _sizes(call)[0] < 1),
           Rule("d_model < 1 raises ValueError", lambda call: call.raises == "ValueError" and _sizes(call)[1] < 1),
           Rule("max_len = 1 is allowed", lambda call: not call.raises and _sizes(call)[0] == 1),
           Rule("d_model = 1 is allowed", lambda call: not call.raises and _sizes(call)[1] == 1)),
    prepare=_table_shape,
    judge=_judge_table,
    mistakes=(
        Mistake("start_at_1", "the positions start at 1; they start at 0 (the first row is sin(0) = 0 on the even "
                "columns and cos(0) = 1 on the odd ones): np.arange(max_len)", _pe(start=1)),
        Mistake("swapped", "sin and cos are swapped: the even columns 2i hold sin, the odd columns 2i + 1 hold cos",
                _pe(even=np.cos, odd=np.sin)),
        Mistake("column_index", "the exponent uses the column index j (10000^(j / d_model)); columns 2i and 2i + 1 "
                "share one frequency, 1 / 10000^(2i / d_model), with i = j // 2", _pe(power=lambda i, j, d: j / d)),
        Mistake("two_j", "the exponent is 2j / d_model with j the column index; it is 2i / d_model with i = j // 2, "
                "the index of the (sin, cos) pair", _pe(power=lambda i, j, d: 2.0 * j / d)),
        Mistake("pair_index_alone", "the exponent is i / d_model (the same table as base 100); it is "
                "pos / 10000^(2i / d_model), i = j // 2 the index of the pair", _pe(power=lambda i, j, d: i / d)),
        Mistake("integer_division", "every column has frequency 1: 2 * i // d_model is integer division, which is "
                "0; compute 2 * i / d_model in floats", _pe(power=lambda i, j, d: 2 * i // d)),
        Mistake("halves", "the sin and cos columns are in two halves (all sin, then all cos); they alternate: "
                "column 2i is sin, column 2i + 1 is cos of the same frequency", _pe(halves=True)),
        Mistake("multiplied", "the positions are multiplied by 10000^(2i / d_model); divide them by it "
                "(pos / 10000^(2i / d_model), frequencies from 1 down to about 1/10000)", _pe(base=1 / ref.BASE)),
        *(Mistake(f"base_{base:g}", f"the base of the frequencies is not 10000 (it looks like {base:g}): "
                  "pos / 10000^(2i / d_model)", _pe(base=base)) for base in (10.0, 1000.0, 1e5)),
        Mistake("odd_padded", "for an odd d_model it builds the table for d_model + 1 columns and drops the last, "
                "so every exponent is divided by d_model + 1; divide by d_model itself (2i / d_model), as the "
                "docstring says", _pe(width=lambda d: d + d % 2)),
        Mistake("odd_last_zero", "for an odd d_model the last column should be the sin of frequency "
                "i = (d_model - 1) // 2, not 0: give it sin(pos / 10000^((d_model - 1) / d_model))",
                _last_column_zero),
    ),
    diagnosed=(
        Mistake("transposed", "the table is transposed; rows are positions and columns dimensions",
                lambda max_len, d_model: ref.sinusoidal_encoding(max_len, d_model).T),
        Mistake("odd_width", "with an odd d_model the table still has d_model columns, the last one a sin "
                "without its cos", lambda max_len, d_model: ref.sinusoidal_encoding(max_len, d_model + d_model % 2)),
        Mistake("asserts", "check the arguments first and raise ValueError, as the docstring says",
                _asserts_sizes),
        Mistake("no_check", "returned a value; it should raise ValueError, as the docstring says",
                _no_size_check),
        Mistake("no_return", ", 6) returns nothing (None): is a `return` missing?", lambda max_len, d_model: None),
        Mistake("brackets", _BRACKETS, _bracket(integers=False)),
        Mistake("brackets_int", _BRACKETS, _bracket(integers=True)),
    ),
    errors=(
        Raises("{what} raised {error}; an odd d_model is valid: the last column is the sin of frequency "
               "i = (d_model - 1) // 2 and has no cos partner, as the docstring says",
               match=f"^ValueError(?!.*({_UNEVEN_ERRORS}))", when=_odd, example=_refuses_odd),
        Raises(f"sinusoidal_encoding raised {{error}}. {_UNEVEN}", match=_UNEVEN_ERRORS, when=_odd,
               example=_cos_for_every_pair),
    ),
    hints=(
        Hint("position 0 should be (0, 1, 0, 1, ...): sin(0) = 0 on the even columns, cos(0) = 1 on the odd ones; "
             "check that positions start at 0 and where sin and cos go",
             lambda a, call: _finite(a) and not np.allclose(a[0], np.arange(a.shape[1]) % 2, atol=1e-4),
             example=_row_zero_doubled),
        Hint("columns 0 and 1 should be sin(pos) and cos(pos) (frequency 10000^0 = 1); check the positions, the "
             "angle pos * frequency, and radians (np.sin takes radians)",
             lambda a, call: _finite(a) and not (np.allclose(a[:, 0], np.sin(np.arange(len(a))), atol=1e-4) and (
                 a.shape[1] < 2 or np.allclose(a[:, 1], np.cos(np.arange(len(a))), atol=1e-4))),
             example=_first_column_fast),
        Hint("columns 0 and 1 are right, later columns are not: column j has frequency 1 / 10000^(2i / d_model) "
             "with i = j // 2; check the exponent and the base", lambda a, call: _finite(a),
             example=_pe(base=20000.0)),
    ),
)


# ---------------------------------------------------------------- shift_matrix

def _shift(k_used=lambda k: k, transpose: bool = False, frequencies=ref.frequencies, step: int = 2,
           cos_only: bool = False):
    """A learner's shift_matrix: block i at rows/columns step*i, angle frequencies(d)[i] * k_used(k)."""
    def shift_matrix(k, d_model):
        if d_model % 2:
            raise ValueError("d_model must be even")
        m = np.zeros((d_model, d_model))
        for i, w in enumerate(frequencies(d_model)):
            r = step * i
            if r + 2 > d_model:
                break
            c, s = np.cos(w * k_used(k)), (0.0 if cos_only else np.sin(w * k_used(k)))
            m[r:r + 2, r:r + 2] = [[c, -s], [s, c]] if transpose else [[c, s], [-s, c]]
        return m
    return shift_matrix


def _power(scale: float, base: float = ref.BASE):
    """Frequencies base^(-scale * i / d_model) of the pairs i (the reference is scale 2, base 10000)."""
    return lambda d_model: base ** (-scale * np.arange(d_model // 2) / d_model)


def _shift_calls(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(k: int, d_model: int, how: str) -> None:
        what = f"shift_matrix(k, {d_model}) for a k {'above' if k > 0 else 'below'} 0"
        if how == "keyword":
            calls.append(Call((), {"k": k, "d_model": d_model}, what))
        else:
            calls.append(Call((k, d_model), what=what))

    ask(int(rng.integers(2, 6)), 6, "positional")
    ask(-int(rng.integers(2, 9)), 8, "keyword")
    ask(int(rng.integers(20, 60)), 10, "positional")
    calls.append(Call((3, 7), what="shift_matrix(3, 7)", raises="ValueError"))
    return calls


def _off_blocks(a: np.ndarray) -> bool:
    blocks = np.kron(np.eye(a.shape[0] // 2), np.ones((2, 2))).astype(bool)
    return a.shape[0] == a.shape[1] and a.shape[0] % 2 == 0 and bool(np.any(np.abs(a[~blocks]) > 1e-6))


SHIFT_MATRIX = Spec(
    id="positional_encoding-shift_matrix",
    function="shift_matrix",
    inputs=_shift_calls,
    reference=ref.shift_matrix,
    rules=(Rule("k above 0", lambda call: not call.raises and _k_of(call) > 0),
           Rule("k below 0", lambda call: not call.raises and _k_of(call) < 0),
           Rule("an odd d_model raises ValueError", lambda call: call.raises == "ValueError")),
    judge=_judge,
    mistakes=(
        Mistake("minus_k", "it is the shift by -k: each 2 x 2 block is transposed. The block of frequency w is "
                "[[cos(w k), sin(w k)], [-sin(w k), cos(w k)]] acting on (sin, cos): from sin(a + b) = "
                "sin a cos b + cos a sin b and cos(a + b) = cos a cos b - sin a sin b", _shift(transpose=True)),
        Mistake("ignores_k", "it ignores k: it is the shift by one position; use the angle w * k",
                _shift(k_used=lambda k: 1)),
        Mistake("ignores_k_transposed", "it ignores k and its transposed blocks shift by -1; use the angle w * k",
                _shift(k_used=lambda k: 1, transpose=True)),
        Mistake("pair_index_alone", "the blocks use the wrong frequencies: the angle of pair i is w_i k with "
                "w_i = 1 / 10000^(2i / d_model) (i / d_model in the exponent, or base 100, is wrong)",
                _shift(frequencies=_power(1.0))),
        Mistake("column_index", "the blocks use the wrong frequencies: the angle of pair i is w_i k with "
                "w_i = 1 / 10000^(2i / d_model), i = 0 .. d_model/2 - 1 the pair index (not the column index)",
                _shift(frequencies=_power(4.0))),
        Mistake("overlapping", "the blocks are in the wrong place: the block of pair i covers rows and columns "
                "2i and 2i + 1, so the blocks sit on the diagonal without overlapping", _shift(step=1)),
        Mistake("cos_only", "only the cos(w k) entries are there: each block also has sin(w k) above and -sin(w k) "
                "below the diagonal", _shift(cos_only=True)),
        *(Mistake(f"base_{base:g}", f"the frequencies use base {base:g}; the base is 10000",
                  _shift(frequencies=_power(2.0, base))) for base in (1000.0, 1e5)),
    ),
    diagnosed=(
        Mistake("no_check", "returned a value; it should raise ValueError, as the docstring says",
                lambda k, d_model: ref.shift_matrix(k, d_model - d_model % 2)),
    ),
    hints=(
        Hint("M should be block diagonal: the 2 x 2 block of pair i at rows and columns 2i, 2i + 1, zeros "
             "everywhere else (a shift never mixes two frequencies)", lambda a, call: _finite(a) and _off_blocks(a),
             example=lambda k, d_model: ref.shift_matrix(k, d_model) + 0.01),
        Hint("each block should be [[cos(w_i k), sin(w_i k)], [-sin(w_i k), cos(w_i k)]] with "
             "w_i = 1 / 10000^(2i / d_model); check it on the table: PE[pos + k] = M @ PE[pos]",
             lambda a, call: _finite(a), example=lambda k, d_model: np.eye(d_model) * 0.9),
    ),
)


# ---------------------------------------------------------------- dot_by_offset

def _dots(fn=np.cos, frequencies=ref.frequencies, factor: float = 1.0, keep_terms: bool = False):
    """A learner's dot_by_offset: factor * sum of fn(w * offset) over ``frequencies(d_model)``."""
    def dot_by_offset(offsets, d_model):
        if d_model % 2:
            raise ValueError("d_model must be even")
        terms = fn(np.asarray(offsets, dtype=float)[..., None] * frequencies(d_model))
        return terms if keep_terms else factor * terms.sum(-1)
    return dot_by_offset


def _offset_calls(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(offsets: np.ndarray, d_model: int, how: str) -> None:
        what = f"dot_by_offset(offsets, {d_model}) for offsets of shape {offsets.shape}"
        if how == "keyword":
            calls.append(Call((offsets,), {"d_model": d_model}, what))
        else:
            calls.append(Call((offsets, d_model), what=what))

    # Integer offsets of both signs, 0 included (the dot product of a position with itself).
    offsets = rng.integers(-40, 41, size=(3, 5))
    offsets[rng.integers(3), rng.integers(5)] = 0
    ask(offsets, 6, "positional")
    ask(np.concatenate([[0], rng.integers(1, 200, size=6), -rng.integers(1, 200, size=4)]), 16, "keyword")
    ask(rng.integers(-500, 501, size=(2, 7)), 64, "positional")
    calls.append(Call((rng.integers(-20, 21, size=4), 7), what="dot_by_offset(offsets, 7)", raises="ValueError"))
    return calls


def _offsets_and_width(call: Call) -> tuple[np.ndarray, int]:
    return call.args[0], (call.args[1] if len(call.args) > 1 else call.kwargs["d_model"])


def _summed(answer: object, call: Call, what: str) -> np.ndarray:
    offsets, d_model = _offsets_and_width(call)
    answer = to_array(answer, what)
    if answer.shape == offsets.shape + (d_model // 2,):
        raise CheckFailed(f"{what} has shape {answer.shape}: it returns the d_model / 2 terms "
                          "cos(w_i * offset) for each offset; sum them over i (the last axis)")
    return answer


def _wrong_at_zero(a: np.ndarray, call: Call) -> bool:
    offsets, d_model = _offsets_and_width(call)
    return _finite(a) and not np.allclose(a[offsets == 0], d_model / 2, atol=1e-4)


DOT_BY_OFFSET = Spec(
    id="positional_encoding-dot_by_offset",
    function="dot_by_offset",
    inputs=_offset_calls,
    reference=ref.dot_by_offset,
    rules=(Rule("offset 0 (d_model / 2)", lambda call: not call.raises and bool(np.any(call.args[0] == 0))),
           Rule("offsets of both signs", lambda call: not call.raises and call.args[0].min() < 0 < call.args[0].max()),
           Rule("an odd d_model raises ValueError", lambda call: call.raises == "ValueError")),
    equivalent=(("L9 np.asarray(offsets, dtype=np.float64) -> np.asarray(offsets)",
                 "offsets[..., None] * w is float64 whatever the offsets' dtype: w is float64"),),
    prepare=_summed,
    judge=_judge,
    mistakes=(
        Mistake("sin", "it sums sin(w_i * offset); the dot product is a sum of cos(w_i * offset): "
                "sin a sin b + cos a cos b = cos(a - b)", _dots(fn=np.sin)),
        Mistake("columns", "it sums d_model terms; there are d_model / 2 frequencies, one per (sin, cos) pair, and "
                "each pair gives one cos(w_i * offset)",
                _dots(frequencies=lambda d: ref.BASE ** (-2.0 * np.arange(d) / d))),
        Mistake("double", "it counts every (sin, cos) pair twice: each pair gives sin a sin b + cos a cos b = "
                "cos(w_i * offset) once, d_model / 2 terms in all", _dots(factor=2.0)),
        Mistake("pair_index_alone", "the frequencies are wrong: w_i = 1 / 10000^(2i / d_model), i = 0 .. "
                "d_model/2 - 1 (i / d_model in the exponent, or base 100, is wrong)", _dots(frequencies=_power(1.0))),
        Mistake("column_index", "the frequencies are wrong: w_i = 1 / 10000^(2i / d_model), i = 0 .. d_model/2 - 1 "
                "(the exponent 4i / d_model uses the column index 2i where the pair index i belongs)",
                _dots(frequencies=_power(4.0))),
        Mistake("multiplied", "it multiplies the offsets by 10000^(2i / d_model); the frequencies are its inverse, "
                "w_i = 1 / 10000^(2i / d_model)", _dots(frequencies=_power(2.0, 1 / ref.BASE))),
        *(Mistake(f"base_{base:g}", f"the frequencies use base {base:g}; the base is 10000",
                  _dots(frequencies=_power(2.0, base))) for base in (1000.0, 1e5)),
    ),
    diagnosed=(
        Mistake("terms_kept", "sum them over i (the last axis)", _dots(keep_terms=True)),
        Mistake("no_check", "returned a value; it should raise ValueError, as the docstring says",
                lambda offsets, d_model: np.cos(np.asarray(offsets, dtype=float)[..., None]
                                                * ref.BASE ** (-2.0 * np.arange(d_model // 2) / d_model)).sum(-1)),
    ),
    hints=(
        Hint("at offset 0 the dot product is |PE(p)|^2 = d_model / 2 (each pair gives sin^2 + cos^2 = 1): sum "
             "cos(w_i * offset) over the d_model / 2 pairs", _wrong_at_zero,
             example=lambda offsets, d_model: ref.dot_by_offset(offsets, d_model) + 1.0),
    ),
)


# ---------------------------------------------------------------- embed

def _embed_calls(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(batch: int, seq_len: int, vocab: int, d_model: int, max_len: int, how: str) -> None:
        # Token ids repeat within a sentence (one word at two positions) and stay below max_len,
        # so that indexing pe with them gives numbers, not an IndexError.
        token_ids = rng.integers(vocab, size=(batch, seq_len))
        token_ids[:, -1] = token_ids[:, 1]
        table = rng.normal(size=(vocab, d_model))
        pe = ref.sinusoidal_encoding(max_len, d_model)
        what = (f"embed(token_ids, table, pe) for token_ids {token_ids.shape}, table {table.shape}, "
                f"pe {pe.shape}")
        if how == "keyword":
            calls.append(Call((token_ids,), {"table": table, "pe": pe}, what))
        else:
            calls.append(Call((token_ids, table, pe), what=what))

    ask(2, 5, 7, 6, 9, "positional")
    ask(3, 4, 10, 8, 12, "keyword")
    ask(4, 6, 5, 10, 6, "positional")  # pe exactly seq_len long
    return calls


def _not_concatenated(answer: object, call: Call, what: str) -> np.ndarray:
    token_ids = call.args[0]
    table = call.args[1] if len(call.args) > 1 else call.kwargs["table"]
    answer = to_array(answer, what)
    if answer.shape == token_ids.shape + (2 * table.shape[1],):
        raise CheckFailed(f"{what} has shape {answer.shape}: it concatenates the positions to the word "
                          "embeddings; add them (same d_model, element by element)")
    return answer


def _embedding(positions=lambda pe, ids: pe[: ids.shape[1]], combine=lambda words, p: words + p):
    """A learner's embed: combine(table[token_ids], positions(pe, token_ids))."""
    return lambda token_ids, table, pe: combine(table[token_ids], positions(pe, token_ids))


def _rows_by_batch_torch(token_ids, table, pe):
    import torch

    token_ids, table, pe = (torch.as_tensor(a) for a in (token_ids, table, pe))
    return table[token_ids] + pe[: token_ids.shape[0]]


_PE_ROWS = ("pe has max_len rows, more than seq_len: add only the first seq_len rows, pe[:seq_len] with "
            "seq_len = token_ids.shape[1] (token_ids.shape[0] is the batch)")

EMBED = Spec(
    id="positional_encoding-embed",
    function="embed",
    inputs=_embed_calls,
    reference=ref.embed,
    rules=(Rule("pe longer than the sentence: its first seq_len rows", lambda call: len(_embed_args(call)[2])
                > _embed_args(call)[0].shape[1]),
           Rule("pe exactly seq_len long", lambda call: len(_embed_args(call)[2]) == _embed_args(call)[0].shape[1]),
           Rule("a word at two positions (the same embedding, two encodings)",
                lambda call: bool(np.all(_embed_args(call)[0][:, 1] == _embed_args(call)[0][:, -1])))),
    judge=_judge,
    prepare=_not_concatenated,
    mistakes=(
        Mistake("off_by_one", "the positions are off by one: the first word is at position 0, so add "
                "pe[:seq_len], not pe[1:seq_len + 1]", _embedding(positions=lambda pe, ids: pe[1:ids.shape[1] + 1])),
        Mistake("pe_by_token", "it indexes the positional table with the token ids (pe[token_ids]); the positions "
                "are 0 .. seq_len - 1, whatever the words: pe[:seq_len]",
                _embedding(positions=lambda pe, ids: pe[ids])),
        Mistake("words_only", "it returns the word embeddings without the positions: add pe[:seq_len]",
                _embedding(combine=lambda words, p: words)),
        Mistake("positions_only", "it returns the positions without the word embeddings: add table[token_ids]",
                _embedding(combine=lambda words, p: np.broadcast_to(p, words.shape))),
        Mistake("scaled", "it multiplies the embeddings by sqrt(d_model); in this notebook add them as they are "
                "(the scaling comes with the encoder, in the upcoming notebook 07)",
                _embedding(combine=lambda words, p: words * np.sqrt(words.shape[-1]) + p)),
        Mistake("multiplied", "it multiplies the embeddings by the positions; add them",
                _embedding(combine=lambda words, p: words * p)),
        Mistake("reversed", "the positions are reversed: the first word gets position 0, pe[:seq_len] in order",
                _embedding(positions=lambda pe, ids: pe[: ids.shape[1]][::-1])),
        Mistake("subtracted", "it subtracts the positional encodings from the word embeddings; add them",
                _embedding(combine=lambda words, p: words - p)),
        Mistake("ids_from_one", "it looks up row token_id - 1 of the table, as if the ids counted from 1; token id t "
                "is row t of the table (ids count from 0): table[token_ids]",
                lambda token_ids, table, pe: table[token_ids - 1] + pe[: token_ids.shape[1]]),
    ),
    diagnosed=(
        Mistake("concatenated", "it concatenates the positions to the word embeddings",
                _embedding(combine=lambda words, p: np.concatenate([words, np.broadcast_to(p, words.shape)], -1))),
    ),
    errors=(
        Raises(f"embed raised {{error}}. {_PE_ROWS}, broadcast over the batch", match="broadcast",
               example=_embedding(positions=lambda pe, ids: pe[: ids.shape[0]])),
        Raises("embed raised {error}. index the embedding table with the token ids (table[token_ids]) and the "
               "positional table with the positions 0 .. seq_len - 1 (pe[:seq_len])", match="index",
               example=_embedding(positions=lambda pe, ids: pe[len(pe)])),
        Raises(f"embed raised {{error}}. {_PE_ROWS}, to the embeddings table[token_ids]", match="must match the size",
               example=lambda token_ids, table, pe: _rows_by_batch_torch(token_ids, table, pe)),
    ),
)

SPECS = (ORDER_GAP, SINUSOIDAL_ENCODING, SHIFT_MATRIX, DOT_BY_OFFSET, EMBED)
