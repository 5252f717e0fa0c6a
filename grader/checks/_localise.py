"""Localisation of a module's mistake: the first named submodule, residual or norm whose tensors differ.

A module exercise (``Spec.submodules``: the names its docstring and skeleton give, ``*`` for
a layer's index) gets one diagnostic question per graded call, drawn like the graded ones
(same sizes, flags and masks; other values). Kernel-side, the spec's driver runs the
learner's module on it with forward hooks on those submodules (``coursekit.probe.watched``)
and hands back, as plain data, what each call of them received and returned. The grader
runs the reference the same way, in its own process, and compares the two in the
reference's order of computation: each submodule's input when its call starts, its output
when it ends, then the module's own output. The first tensor that differs is named, with
what it is made of on each side, as a sum or an activation of the tensors computed before
it (so a residual added to the wrong tensor, or to nothing, a missing activation, a
cross-attention fed the decoder's own states, or a dropout left on show for what they
are), and a submodule called too often or never (one norm used for two sublayers) is named.

These answers never count for points: ``localise(case)`` is read only when no catalogued
mistake explains a wrong answer, in place of "right shape but wrong values".
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from coursekit.probe import HOOKED, TRUNCATED

# Tensors taken as the same: intermediate float32 tensors of two valid implementations
# differ in the last bits only; a mistake is far above this.
RTOL, ATOL = 1e-3, 1e-4
NAME = "localise"  # the probe's name
MOST_TERMS = 24  # the latest terms tried three at a time

_ACTIVATIONS = {
    "relu": lambda t: np.maximum(t, 0.0),
    "gelu": lambda t: 0.5 * t * (1.0 + _erf(t / np.sqrt(2.0))),
    "gelu (tanh approximation)": lambda t: 0.5 * t * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (t + 0.044715 * t ** 3))),
    "silu": lambda t: t / (1.0 + np.exp(-t)),
    "tanh": np.tanh,
    "sigmoid": lambda t: 1.0 / (1.0 + np.exp(-t)),
}


def _erf(t: np.ndarray) -> np.ndarray:
    from math import erf
    return np.vectorize(erf)(t)


# ------------------------------------------------------------------ the questions

def probe(spec) -> object:
    """The diagnostic questions of ``spec`` (a :class:`~grader.checks._core.Probe`): its
    ``inputs`` drawn again, each graded call with the hooked names added (calls that must
    raise are skipped). ``Call.what`` tags the graded call it goes with: it is never shown."""
    from ._core import Probe

    def calls(rng: np.random.Generator) -> list:
        return [replace(call, kwargs={**call.kwargs, HOOKED: list(spec.submodules)}, what=_tag(i))
                for i, call in enumerate(spec.inputs(rng)) if not call.raises]

    return Probe(NAME, calls)


def _tag(index: int | None) -> str:
    """The ``Call.what`` of the hooked question that goes with graded call ``index`` (never shown)."""
    return f"(hooked, as graded call {index})"


# ------------------------------------------------------------------ the records

@dataclass(frozen=True)
class Event:
    """One call of a hooked submodule (``name`` "" is the module itself), its ``k``-th."""

    name: str
    k: int
    start: int
    end: int
    inputs: tuple
    output: np.ndarray | None
    training: bool
    parameters: tuple[str, ...] = ()  # the inputs' names in forward's signature

    @property
    def label(self) -> str:
        return _named(self.name) + (f" (its call {self.k + 1})" if self.k else "")


@dataclass(frozen=True)
class Record:
    """What the hooks saw: the submodules present (name -> class name; "" is the module) and
    the calls, in the order they started."""

    present: dict
    events: tuple[Event, ...]
    truncated: bool = False  # calls past the kernel's limit were left out

    def find(self, name: str, k: int) -> Event | None:
        return next((e for e in self.events if e.name == name and e.k == k), None)

    def count(self, name: str) -> int:
        return sum(e.name == name for e in self.events)


def _record(answer: object) -> Record | None:
    """The decoded answer of a hooked question as a :class:`Record`, or None (raised, unreadable)."""
    if not isinstance(answer, tuple) or len(answer) < 2:
        return None
    present, labels, chunks = answer[0], answer[1], answer[2:]
    if not isinstance(present, tuple) or not isinstance(labels, tuple):
        return None
    arrays = [a for chunk in chunks if isinstance(chunk, tuple) for a in chunk]
    events, seen, at = [], {}, 0
    for label in labels:
        parts = label.split("|") if isinstance(label, str) else []
        if len(parts) != 7:
            continue
        name, (start, end, n_in, n_out, training), parameters = parts[0], map(int, parts[1:6]), parts[6]
        taken = [np.asarray(a, dtype=np.float64) for a in arrays[at:at + n_in + n_out]]
        at += n_in + n_out
        if len(taken) != n_in + n_out:
            break
        k = seen[name] = seen.get(name, -1) + 1
        events.append(Event(name, k, start, end, tuple(taken[:n_in]), taken[n_in] if n_out else None,
                            bool(training), tuple(parameters.split(",")) if parameters else ()))
    named = [p for p in present if isinstance(p, str) and p != TRUNCATED]
    return Record(dict(p.rpartition(":")[::2] for p in named), tuple(events), TRUNCATED in present)


def _named(name: str) -> str:
    return name or "the module"


# ------------------------------------------------------------------ describing a tensor

@dataclass(frozen=True)
class Term:
    """A tensor computed before the point judged, by its words (e.g. "norm1's output")."""

    words: str
    value: np.ndarray
    event: Event | None = None


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))


def _dropped(t: np.ndarray, e: np.ndarray) -> bool:
    """``t`` is dropout of ``e``: some entries zeroed (where ``e`` is not), the rest scaled by one
    factor above 1 (1 / (1 - p))."""
    if t.shape != e.shape:
        return False
    zero = np.abs(t) <= ATOL
    live = ~zero & (np.abs(e) > 1e-3)
    if not np.any(zero & (np.abs(e) > 1e-3)) or not np.any(live):
        return False
    scale = float(np.median(t[live] / e[live]))
    return scale > 1.05 and bool(np.allclose(t[~zero], scale * e[~zero], rtol=RTOL, atol=ATOL))


def explain(t: np.ndarray, terms: list[Term]) -> tuple[str, tuple[Term, ...]] | None:
    """What ``t`` is, from ``terms`` (broadcast to its shape, as torch adds a (seq_len, d) table to
    a batch): one of them, an activation of one, dropout of one, the sum of two (one of them
    possibly dropped out), or of three. Returns (words, the terms used), or None."""
    fits = [Term(u.words, v, u.event) for u in terms if (v := _broadcast(u.value, t.shape)) is not None]
    for u in fits:
        if _same(t, u.value):
            return u.words, (u,)
    for u in fits:
        for name, f in _ACTIVATIONS.items():
            if _same(t, f(u.value)):
                return f"{name}({u.words})", (u,)
    for u in fits:
        if _dropped(t, u.value):
            return f"dropout of {u.words}", (u,)
    for u, v in itertools.combinations_with_replacement(fits, 2):
        if _same(t, u.value + v.value):
            return (f"2 × {u.words}" if u is v else f"{u.words} + {v.words}"), (u, v)
    for u, v in itertools.permutations(fits, 2):
        if _dropped(t - u.value, v.value):
            return f"{u.words} + dropout of {v.words}", (u, v)
    for u, v, w in itertools.combinations_with_replacement(fits[-MOST_TERMS:], 3):
        if _same(t, u.value + v.value + w.value):
            return " + ".join(_counted([u.words, v.words, w.words])), (u, v, w)
    return None


def _broadcast(value: np.ndarray, shape: tuple) -> np.ndarray | None:
    try:
        return np.broadcast_to(value, shape)
    except ValueError:
        return None


def _counted(words: list[str]) -> list[str]:
    """["a", "b", "b"] -> ["a", "2 × b"]."""
    return [w if words.count(w) == 1 else f"{words.count(w)} × {w}" for w in dict.fromkeys(words)]


def _terms(record: Record, before: int) -> list[Term]:
    """The tensors ``record`` holds that were computed before the clock ``before``: the module's
    inputs, each call's inputs (started before) and outputs (ended before); a value seen
    twice keeps its first words."""
    found: list[Term] = []

    def add(words, value, event):
        for i, u in enumerate(found):
            if u.value.shape == value.shape and np.array_equal(u.value, value):
                if u.event is not None and event.name and u.event.name.startswith(f"{event.name}."):
                    found[i] = Term(words, value, event)  # (a layer's output, rather than its last norm's)
                return
        found.append(Term(words, value, event))

    for event in sorted(record.events, key=lambda e: e.start):
        if event.name == "" and event.start < before:
            for i, value in enumerate(event.inputs):
                add(_input_words(event, i), value, event)
    for event in sorted(record.events, key=lambda e: e.end):
        if event.name and event.end < before and event.output is not None:
            add(f"{event.label}'s output", event.output, event)
    for event in sorted(record.events, key=lambda e: e.start):
        if event.name and event.start < before:
            for i, value in enumerate(event.inputs):
                add(_input_words(event, i), value, event)
    return found


# ------------------------------------------------------------------ comparing two records

def _points(record: Record) -> list[tuple[int, str, Event]]:
    """The reference's order of computation: (clock, "input" or "output", call)."""
    points = [(e.start, "input", e) for e in record.events if e.name] + [(e.end, "output", e) for e in record.events]
    return sorted(points, key=lambda p: p[0])


def _training(mine: Event, right: Event) -> str | None:
    """A submodule left in training mode (the module itself is in eval mode)."""
    if mine.training and not right.training:
        return (f"{mine.label} is in training mode (its .training is True) while the module is in eval mode: "
                "do not call .train() in forward or __init__; .eval() must reach every submodule")
    return None


def _missing(mine: Record, right: Record, event: Event) -> str:
    """Why the learner's module has no call ``event.k`` of ``event.name``: the submodule is not
    there (renamed), another one of its kind is called in its place, or it is called less often."""
    name = event.name
    if name not in mine.present:
        return (f"the grader cannot find the submodule {name} that the docstring names (it hooks your module's "
                "submodules by name): keep the skeleton's attribute names")
    extra = [n for n in right.present if n and n != name and mine.count(n) > right.count(n)
             and mine.present.get(n) == mine.present.get(name)]
    if extra:
        other, own = extra[0], ("norm" if _normalises(name) else "submodule")
        return (f"{other} is called {_times(mine.count(other))} and {name} {_times(mine.count(name))}: the same "
                f"{mine.present.get(name)} serves two places where each has its own; use {name} where the "
                f"docstring asks for it (each sublayer has its own {own}, with its own weights)")
    count = mine.count(name)
    return (f"{name} is {'never called' if not count else f'called {_times(count)}'}; it should be called "
            f"{_times(right.count(name))}")


def _times(n: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(n, f"{n} times")


def _input_words(event: Event, i: int) -> str:
    """An input of a call, by its parameter's name when the call has several (query, key, value)."""
    if not event.name:
        return f"the input {event.parameters[i]}" if i < len(event.parameters) else f"the module's input {i + 1}"
    if len(event.inputs) == 1:
        return f"{event.label}'s input"
    name = event.parameters[i] if i < len(event.parameters) else f"input {i + 1}"
    return f"{event.label}'s {name}"


def _difference(spec, kind: str, i: int | None, event: Event, mine_t: np.ndarray, right_t: np.ndarray,
                mine: Record, right: Record, clock: int, mine_clock: int) -> str:
    """The first tensor that differs, named (by the learner's parameter names), with what each
    side's is made of."""
    call = _call(mine, event)
    if kind == "output":
        where = f"{event.label}'s output" if event.name else f"the output of {spec.function}"
    else:
        where = _input_words(call if len(call.parameters) == len(event.parameters) else event, i)
    if mine_t.shape == right_t.shape and not np.all(np.isfinite(mine_t)) and np.all(np.isfinite(right_t)):
        return f"{where} is the first tensor the hooks see holding NaN or infinity, while {_before(right, clock)}"
    theirs = explain(right_t, _terms(right, clock))
    siblings = [Term(f"{_input_words(call, j)} (the same tensor)", value, None)
                for j, value in enumerate(call.inputs) if kind == "input" and j != i]
    ours = explain(mine_t, _terms(mine, mine_clock) + siblings)
    if mine_t.shape != right_t.shape:
        said = f"{where} has shape {mine_t.shape}; it should have {right_t.shape}"
    elif kind == "output" and event.name and all(_same(a, b) for a, b in zip(call.inputs, event.inputs)):
        inputs = "its input is" if len(event.inputs) == 1 else f"its inputs {', '.join(call.parameters)} are"
        return (f"{where} differs, though {inputs} right"
                + (f" (it returns {ours[0]})" if ours and theirs is None else "")
                + f": what else {event.label} is given (a mask, a flag) or how it is built (a "
                  f"{mine.present.get(event.name, 'module')}: its constructor's arguments, e.g. batch_first) "
                  "differs; if it is a class of yours, look at its forward")
    else:
        said = f"{where} differs, while {_before(right, clock)}"
    found = ([f"it is {ours[0]}"] if ours else []) + ([f"{'where it' if ours else 'it'} should be {theirs[0]}"]
                                                       if theirs else [])
    if found:
        said += ": " + ", ".join(found)
    if ours:
        said += _why(ours, theirs, event, right)
    elif mine_t.shape == right_t.shape and np.allclose(np.sort(mine_t, axis=None), np.sort(right_t, axis=None),
                                                        rtol=RTOL, atol=ATOL):
        said += f"{',' if found else ':'} it holds the right numbers in another arrangement: a transpose or " \
                "reshape is wrong"
    return said


def _before(record: Record, clock: int) -> str:
    """The submodules found right before the clock, the latest first (at most three named)."""
    names: list[str] = []
    for e in sorted(record.events, key=lambda e: -e.end):
        if e.name and e.end < clock and not any(e.name == n or e.name.startswith(f"{n}.") for n in names):
            names.append(e.name)
    if not names:
        return "the module's input is right"
    if len(names) > 3:
        return f"{', '.join(names[:3])} and everything before them are right"
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"{listed} before it {'is' if len(names) == 1 else 'are'} right"


def _call(record: Record, event: Event) -> Event:
    return record.find(event.name, event.k) or event


def _why(ours: tuple, theirs: tuple, event: Event, right: Record) -> str:
    """What the two descriptions show: a residual added to the wrong tensor or to nothing, a
    missing activation, dropout left on, a sublayer run out of the reference's order."""
    mine_words, mine_terms = ours
    right_words, right_terms = theirs or ("", ())
    notes = []
    if "dropout of" in mine_words and "dropout of" not in right_words:
        notes.append("dropout is still applied in eval mode: use nn.Dropout modules (switched off by .eval()) or "
                     "F.dropout(..., training=self.training)")
    elif len(right_terms) == 2 and len(mine_terms) == 1 and mine_terms[0].words in {t.words for t in right_terms}:
        lost = next(t for t in right_terms if t.words != mine_terms[0].words)
        notes.append(f"the residual is missing: {lost.words} is not added to {mine_terms[0].words}")
    elif len(right_terms) == 2 and len(mine_terms) == 2:
        kept = {t.words for t in mine_terms} & {t.words for t in right_terms}
        lost = [t for t in right_terms if t.words not in kept]
        wrong = [t for t in mine_terms if t.words not in kept]
        if len(kept) == 1 and lost and wrong:
            notes.append(_swapped_term(wrong[0], lost[0], right))
    elif _activation(right_words) and len(mine_terms) == 1 and mine_terms[0].words == right_terms[0].words:
        asked = _activation(right_words)
        notes.append(f"the activation is {_activation(mine_words)}, where the docstring asks for {asked}"
                     if _activation(mine_words) else f"the activation ({asked}) is missing")
    later = [t.event for t in mine_terms if t.event is not None and t.event.name
             and (right.find(t.event.name, t.event.k) or t.event).start > event.start]
    if later:
        said = f"it uses {later[0].label}, which comes after this point in the docstring's order of computation"
        if _normalises(later[0].name) or _normalises(event.name):
            said += (": are the norms placed as asked? Pre-norm is x + sublayer(norm(x)), post-norm "
                     "norm(x + sublayer(x))")
        notes.append(said)
    return "".join(f"; {n}" for n in notes)


def _swapped_term(wrong: Term, lost: Term, right: Record) -> str:
    """The sum takes ``wrong`` where it should take ``lost``: said as a residual added to a
    norm's output, or a norm applied to a sublayer's output, when ``wrong`` is a submodule
    applied to ``lost``."""
    said = f"the sum takes {wrong.words} where it should take {lost.words}"
    event = wrong.event
    if event is None or not event.name or not wrong.words.endswith("'s output") \
            or not any(_same(value, lost.value) for value in event.inputs):
        return said
    said = f"the sum takes {wrong.words}, {_named(event.name)} applied to {lost.words}, where it should take " \
           f"{lost.words} itself"
    if lost.event is not None and lost.words.endswith("'s output") and _is_sublayer(lost.event.name, right):
        return f"{said}: is {_named(event.name)} applied to the sublayer's output, inside the sublayer?"
    return f"{said}: is the residual added to the norm's output rather than to the sublayer's input?"


def _is_sublayer(name: str, record: Record) -> bool:
    """A hooked submodule that is neither a layer of a stack (``layers.0``: its output is the
    residual stream) nor a norm."""
    return bool(name) and not name.split(".")[-1].isdigit() and not _normalises(name)


def _normalises(name: str) -> bool:
    """A norm, by the names the course gives its norms (norm, norm1, ..., ln_f)."""
    return name.split(".")[-1].startswith(("norm", "ln"))


def _activation(words: str) -> str | None:
    """The activation a description starts with ("relu(linear1's output)"), if any."""
    return next((name for name in _ACTIVATIONS if words.startswith(f"{name}(")), None)


def _inside(spec, name: str, kind: str, mine: Record) -> str:
    """Said of a difference inside a layer of a stack (``layers.0`` in ``layers.0.linear2``, or
    the layer's output when its input is right): the layer is the learner's class, with its
    own check. A layer's input is the stack's business."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i].isdigit() and (i < len(parts) - 1 or kind != "input"):
            layer = ".".join(parts[:i + 1])
            cls = mine.present.get(layer)
            if cls and cls != spec.function:
                return (f". This is inside {layer}. The {spec.function} uses your {cls}: make that pass its own "
                        "checks first")
    return ""


def compare(spec, mine: Record, right: Record) -> str | None:
    """The first difference between the learner's record and the reference's, described; None
    if every hooked tensor agrees."""
    for clock, kind, event in _points(right):
        ours = mine.find(event.name, event.k)
        if ours is None:
            return None if mine.truncated else _missing(mine, right, event) + _inside(spec, event.name, "call", mine)
        said = _training(ours, event)
        if said:
            return said
        pairs = list(enumerate(zip(ours.inputs, event.inputs))) if kind == "input" else \
            [(None, (ours.output, event.output))] if event.output is not None else []
        for i, (a, b) in pairs:
            if a is None or not _same(a, b):
                if a is None:
                    return f"{ours.label} returns no tensor; it should return one"
                return _difference(spec, kind, i, event, a, b, mine, right, clock,
                                   ours.start if kind == "input" else ours.end) + _inside(spec, event.name, kind, mine)
    return None


# ------------------------------------------------------------------ the grader's entry

def localise(case) -> str | None:
    """Where the learner's module first differs from the reference on the hooked question that
    goes with ``case``'s call (else the first hooked question on which the outputs differ);
    None when the spec hooks nothing, the questions were not answered, or nothing differs."""
    spec = case.spec
    asked = [(call, answer) for p, call, answer in case.probed if p.name == NAME]
    if not spec.submodules or not asked:
        return None
    from ._core import _answer_of, _one_thread, _quiet

    asked.sort(key=lambda pair: pair[0].what != _tag(case.index))
    for i, (call, answer) in enumerate(asked):
        mine = _record(answer)
        if mine is None:
            continue
        with _one_thread(), _quiet():
            right = _record(_answer_of(spec, case.seed, (NAME, call.what), "reference", spec.reference, call))
        if right is None:
            continue
        said = compare(spec, mine, right)
        if said:
            return said
    return None
