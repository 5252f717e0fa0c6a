"""Mutation testing of the hidden checks: mutants of each exercise's reference, judged as
learners' submissions.

The checks are proven against the mistakes we catalogue; learners make others. A mutant
is the reference with one small change a learner could make: a comparison boundary, an
arithmetic operator, an axis, an index off by one, a constant, a dropped statement or
term, two arguments swapped, another reduction. Each mutant is judged through the same
collect/decode/verdict path as a learner's submission, on the public seed and on student
seeds. A mutant the checks accept is either a gap in the hidden inputs or computes the
same function as the reference: then its spec declares it (``Spec.equivalent``, with the
reason), and it must still agree with the reference on every seed tried.

    python -m grader.checks._mutants [--topic T | --exercise ID ...] [--seeds N] [--jobs J]

prints, per exercise, the mutants killed out of the non-equivalent ones on the weakest
seed, the survivors, and the equivalent mutants with their evidence. ``make mutants``
runs it on every exercise; ``tests/test_mutants.py`` holds every exercise at 100% on a
few seeds.

Operators are data (``OPERATORS``): each maps an AST node to its replacements. Only the
reference's own code is mutated (a function's body, a class's methods), never the
helpers it calls: those are other exercises, with mutants of their own.
"""
from __future__ import annotations

import argparse
import ast
import copy
import inspect
import itertools
import re
import resource
import signal
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ._core import Spec, _one_thread, _quiet, exercise_ids, get, public_seed, questions, verdict

# CPU seconds one mutant may spend on one seed's questions. A mutant can loop for ever (a
# loop bound made unreachable); grading's CPU limit stops such a submission, so a mutant
# over the budget is rejected. CPU time, not wall time: the same on a loaded machine.
CPU_BUDGET = 20.0
# Bytes of address space a mutant may add: a loop that appends for ever gets a MemoryError
# (grading's memory limit stops such a submission) instead of the machine's memory.
MEMORY_BUDGET = 4 << 30


@dataclass(frozen=True)
class Mutant:
    """The reference with one change: ``name`` (``"L<line> <before> -> <after>"``, the line
    counted from the reference's ``def`` or ``class``) and the changed implementation."""

    name: str
    implementation: object


# --- operators: an AST node -> [(replacement node or None to drop it, short description)]

_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_ARITHMETIC = {ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.Div], ast.Div: [ast.Mult],
               ast.FloorDiv: [ast.Div, ast.Mult], ast.Mod: [ast.FloorDiv], ast.Pow: [ast.Mult],
               ast.MatMult: [ast.Mult]}
_REDUCTIONS = {"sum": ["mean", "max"], "mean": ["sum"], "max": ["min", "mean"], "min": ["max"],
               "amax": ["amin"], "amin": ["amax"], "argmax": ["argmin"], "argmin": ["argmax"],
               "logsumexp": ["amax"], "cumsum": ["cumprod"], "any": ["all"], "all": ["any"]}
# Functions whose first two arguments commute: swapping them is never a mutant.
_SYMMETRIC = {"transpose", "swapaxes", "maximum", "minimum", "min", "max", "add", "multiply", "logical_and",
              "logical_or", "logical_xor", "eq", "ne", "equal", "not_equal", "allclose", "isclose", "hypot"}


def _compare(node: ast.AST) -> list:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return [ast.Compare(node.left, [_COMPARE[type(node.ops[0])]()], node.comparators)]
    return []


def _arithmetic(node: ast.AST) -> list:
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITHMETIC:
        return [type(node)(**{**_fields(node), "op": op()}) for op in _ARITHMETIC[type(node.op)]]
    return []


def _dropped_term(node: ast.AST) -> list:
    """``a + b`` -> ``a`` and ``b``; ``a * b`` / ``a / b`` -> ``a`` (a factor dropped)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return [node.left, node.right]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.Pow)):
        return [node.left] if isinstance(node.op, (ast.Div, ast.Pow)) else [node.left, node.right]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        return [node.operand]
    return []


def _number(node: ast.AST) -> int | float | None:
    """A number written in the code: ``2``, ``1e-9``, or a negative one (``-1`` is ``-`` and ``1``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    return None


def _constant(node: ast.AST) -> list:
    """Numbers: an int n -> n + 1 and n - 1 (axes, indices, sizes); a float x -> 0, 1, -x;
    a boolean flipped."""
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return [ast.Constant(not node.value)]
    value = _number(node)
    if value is None:
        return []
    if isinstance(value, int):
        options = [value + 1, value - 1]
    else:
        options = [x for x in dict.fromkeys((0.0, 1.0, -value)) if x != value]
    return [ast.UnaryOp(ast.USub(), ast.Constant(-x)) if x < 0 else ast.Constant(x) for x in options]


# Calls a learner may forget (the value passes through unchanged), and functions a learner
# may mistake for another.
_FORGETTABLE = {"sqrt", "exp", "log", "abs", "tanh", "relu", "gelu", "sigmoid", "softmax", "log_softmax",
                "transpose", "swapaxes", "permute", "flip", "contiguous", "squeeze", "unsqueeze", "dropout",
                "T", "mT"}
_CONFUSED = {"tril": ["triu"], "triu": ["tril"], "exp": ["exp2"], "log": ["log2"], "softmax": ["log_softmax"],
             "maximum": ["minimum"], "minimum": ["maximum"], "floor": ["ceil"], "ceil": ["floor"],
             "any": ["all"], "all": ["any"], "argsort": ["sort"]}


def _forgotten_call(node: ast.AST) -> list:
    """``f(x)`` or ``x.f(...)`` -> ``x``, for the calls of ``_FORGETTABLE``; ``x.T`` -> ``x``."""
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
        return [node.value]
    if not isinstance(node, ast.Call):
        return []
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name not in _FORGETTABLE:
        return []
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id in _MODULES):
        return [func.value]  # a method: x.transpose(-2, -1) -> x
    return [node.args[0]] if node.args and not isinstance(node.args[0], ast.Starred) else []


# Names that are modules, not values: ``np.exp(x)`` is a function of x, ``x.exp()`` a method of x.
_MODULES = {"np", "numpy", "torch", "F", "nn", "math", "scipy", "special"}


def _confused_function(node: ast.AST) -> list:
    if isinstance(node, ast.Attribute) and node.attr in _CONFUSED:
        return [ast.Attribute(node.value, other, node.ctx) for other in _CONFUSED[node.attr]]
    if isinstance(node, ast.Name) and node.id in _CONFUSED and isinstance(node.ctx, ast.Load):
        return []  # a bare name may be the learner's own helper
    return []


def _keyword_dropped(node: ast.AST) -> list:
    """A call without one of its keyword arguments (an implicit ``dim``, a default ``keepdims``)."""
    if isinstance(node, ast.Call):
        return [ast.Call(node.func, node.args, node.keywords[:i] + node.keywords[i + 1:])
                for i in range(len(node.keywords)) if node.keywords[i].arg is not None]
    return []


def _swapped(node: ast.AST) -> list:
    if isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name not in _SYMMETRIC and ast.dump(node.args[0]) != ast.dump(node.args[1]):
            return [ast.Call(node.func, [node.args[1], node.args[0], *node.args[2:]], node.keywords)]
    return []


def _dropped_argument(node: ast.AST) -> list:
    """A call without its last positional argument (a mask, a bias, a cache not passed on)."""
    if isinstance(node, ast.Call) and len(node.args) >= 2 and not isinstance(node.args[-1], ast.Starred):
        return [ast.Call(node.func, node.args[:-1], node.keywords)]
    return []


def _reduction(node: ast.AST) -> list:
    if isinstance(node, ast.Attribute) and node.attr in _REDUCTIONS:
        return [ast.Attribute(node.value, other, node.ctx) for other in _REDUCTIONS[node.attr]]
    return []


def _off_by_one(node: ast.AST) -> list:
    """A slice bound or an index that is an expression (not a number: numbers are constants):
    one more and one less."""
    def shifted(expr):
        return [ast.BinOp(expr, ast.Add(), ast.Constant(1)), ast.BinOp(expr, ast.Sub(), ast.Constant(1))]

    if isinstance(node, ast.Slice):
        found = []
        for bound in ("lower", "upper"):
            expr = getattr(node, bound)
            if expr is not None and not isinstance(expr, (ast.Constant, ast.UnaryOp)):
                found += [ast.Slice(**{**_fields(node), bound: s}) for s in shifted(expr)]
        return found
    if isinstance(node, ast.Subscript) and isinstance(node.slice, (ast.Name, ast.BinOp)):
        return [ast.Subscript(node.value, s, node.ctx) for s in shifted(node.slice)]
    return []


def _dropped_statement(node: ast.AST) -> list:
    """A statement left out (a line the learner forgot): assignments, calls, guards, loops."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.If, ast.For, ast.While,
                         ast.Raise, ast.Assert)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return []  # a docstring
        return [None]
    return []


OPERATORS: tuple[tuple[str, Callable[[ast.AST], list]], ...] = (
    ("comparison", _compare), ("arithmetic", _arithmetic), ("dropped term", _dropped_term),
    ("constant", _constant), ("keyword dropped", _keyword_dropped), ("swapped arguments", _swapped),
    ("dropped argument", _dropped_argument),
    ("reduction", _reduction), ("off by one", _off_by_one), ("dropped statement", _dropped_statement),
    ("forgotten call", _forgotten_call), ("confused function", _confused_function),
)


def _fields(node: ast.AST) -> dict:
    return {name: getattr(node, name) for name in node._fields}


# --- building the mutants


class _Visit(ast.NodeTransformer):
    """Pre-order numbering of the nodes of a reference's bodies; with ``target``, the node of
    that number replaced by ``make(node)`` (None drops a statement: ``pass`` stands in where a
    body would be left empty). Decorators, base classes, arguments and their defaults are not
    visited: they are the exercise's signature, not the learner's code."""

    def __init__(self, target: int = -1, make: Callable | None = None):
        self.count, self.target, self.make, self.seen = -1, target, make, []

    def visit(self, node):
        self.count += 1
        self.seen.append(node)
        if self.count == self.target:
            return self.make(node)
        return self.generic_visit(node)

    def generic_visit(self, node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.body = [self.visit(n) for n in node.body]
        elif isinstance(node, ast.AnnAssign):  # (an annotation is never evaluated in a function)
            node.target = self.visit(node.target)
            node.value = node.value and self.visit(node.value)
        else:
            super().generic_visit(node)
        if isinstance(getattr(node, "body", None), list):
            node.body = [n for n in node.body if n is not None] or [ast.Pass()]
        return node


def _target(reference: object) -> tuple[object, dict]:
    """The reference's own code (a decorator's wrapped function) and the globals it runs in."""
    original = inspect.unwrap(reference) if callable(reference) and not isinstance(reference, type) else reference
    module = sys.modules[original.__module__]
    return original, module.__dict__


def _source_tree(reference: object) -> tuple[ast.Module, str]:
    original, _ = _target(reference)
    source = textwrap.dedent(inspect.getsource(original))
    return ast.parse(source), source


def _text(node: ast.AST | None) -> str:
    return " ".join(ast.unparse(node).split()) if node is not None else "(left out)"


def _describe(before: str, after: str, width: int = 60) -> tuple[str, str]:
    """The changed code before and after, each cut to ``width`` characters; when the cut hides
    the change (it lies late in a long line), cut both around the first character where they
    differ instead, so that the name still shows it."""
    def short(text: str) -> str:
        return text if len(text) <= width else text[:width - 3] + "..."

    if short(before) != short(after):
        return short(before), short(after)
    start = max(0, next(i for i, (x, y) in enumerate(itertools.zip_longest(before, after)) if x != y) - 20)

    def around(text: str) -> str:
        return "..." + text[start:start + width] + ("..." if start + width < len(text) else "")
    return around(before), around(after)


def mutants(spec: Spec) -> list[Mutant]:
    """Every mutant of ``spec``'s reference, in source order, each named uniquely.

    Raises:
        TypeError: the reference's source cannot be read (built in, or made at run time).
    """
    tree, _ = _source_tree(spec.reference)
    numbering = _Visit()
    numbering.visit(copy.deepcopy(tree))
    original, namespace = _target(spec.reference)
    name = tree.body[0].name
    negated = {id(n.operand) for n in numbering.seen if _number(n) is not None and isinstance(n, ast.UnaryOp)}
    found, names = [], set()
    for index, node in enumerate(numbering.seen):
        if id(node) in negated:
            continue  # (the digits of -1: the number -1 is mutated as a whole)
        for _, operator in OPERATORS:
            for replacement in operator(node):
                if _text(replacement) == _text(node):
                    continue  # (the same code: a node that unparses alike)
                before, after = _describe(_text(node), _text(replacement))
                label = f"L{getattr(node, 'lineno', 0)} {before} -> {after}"
                unique, n = label, 2
                while unique in names:
                    unique, n = f"{label} #{n}", n + 1
                names.add(unique)
                found.append(Mutant(unique, _Build(tree, index, replacement, namespace, name)))
    return found


@dataclass
class _Build:
    """A mutant's implementation, compiled when first used (a spec has hundreds)."""

    tree: ast.Module
    index: int
    replacement: ast.AST | None
    namespace: dict
    name: str
    _built: object = field(default=None, repr=False)

    def get(self) -> object:
        if self._built is None:
            replacement = self.replacement
            mutated = _Visit(self.index, lambda node: copy.deepcopy(replacement)).visit(copy.deepcopy(self.tree))
            module = ast.fix_missing_locations(mutated)
            scope = dict(self.namespace)
            exec(compile(module, f"<mutant of {self.name}>", "exec"), scope)  # noqa: S102 - our own reference
            self._built = scope[self.name]
        return self._built


class _OverBudget(BaseException):
    """Raised by the CPU timer: a BaseException, so that no driver's ``except Exception``
    takes it for the learner's error and carries on with the next question."""


def _over_budget(signum, frame):
    raise _OverBudget()


def judged(spec: Spec, implementation: object, seed: int) -> str | None:
    """The verdict on ``implementation`` as a learner's submission for ``seed`` (None: accepted),
    within :data:`CPU_BUDGET` CPU seconds."""
    from coursekit.probe import collect
    from ..wire import decode_payload

    previous = signal.signal(signal.SIGPROF, _over_budget)
    signal.setitimer(signal.ITIMER_PROF, CPU_BUDGET)
    limits = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + MEMORY_BUDGET, limits[1]))
    try:
        with _one_thread(), _quiet():
            asked = questions(spec.id, seed)
            payload = collect(spec.id, implementation, [q.call() for q in asked], spec.driver)
            answers = decode_payload(payload, spec.id)
        signal.setitimer(signal.ITIMER_PROF, 0)
        with _quiet():
            return verdict(spec.id, seed, answers)
    except _OverBudget:
        return f"ran past {CPU_BUDGET:g} CPU seconds (grading's time limit stops it)"
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _address_space() -> int:
    """This process's virtual memory now, in bytes (what RLIMIT_AS counts)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def seeds(n: int, exercise: str) -> list[int]:
    """The public seed, then ``n`` student seeds (0 .. n-1, as the tests draw them)."""
    return [public_seed(exercise), *range(n)]


@dataclass
class Score:
    """One exercise's mutants judged on ``seeds``: which seeds accepted each mutant."""

    exercise: str
    seeds: list[int]
    accepted: dict[str, list[int]]  # mutant name -> the seeds whose checks accepted it
    diagnoses: dict[str, str]  # mutant name -> its diagnosis on the first seed that rejected it
    equivalent: dict[str, str]  # declared: name -> reason
    unknown: list[str]  # declared equivalent, but no mutant has that name (a stale declaration)

    @property
    def counted(self) -> list[str]:
        """The mutants that must be rejected: all but the declared equivalent ones."""
        return [m for m in self.accepted if m not in self.equivalent]

    def killed(self, seed: int) -> int:
        return sum(1 for m in self.counted if seed not in self.accepted[m])

    def weakest(self) -> tuple[int, int]:
        """(seed, killed on it) for the seed that rejects fewest."""
        return min(((s, self.killed(s)) for s in self.seeds), key=lambda x: x[1])

    @property
    def survivors(self) -> dict[str, list[int]]:
        return {m: s for m, s in self.accepted.items() if s and m not in self.equivalent}

    @property
    def rejected_equivalent(self) -> dict[str, list[int]]:
        """Declared equivalent, yet rejected on some seed: the declaration is wrong."""
        return {m: [s for s in self.seeds if s not in self.accepted[m]] for m in self.equivalent
                if m in self.accepted and len(self.accepted[m]) < len(self.seeds)}

    @property
    def perfect(self) -> bool:
        return not self.survivors and not self.rejected_equivalent and not self.unknown


def score(exercise: str, tried: list[int], only: Callable[[str], bool] = lambda name: True) -> Score:
    """Judge every mutant of ``exercise`` (those whose name ``only`` accepts) on the seeds ``tried``."""
    spec = get(exercise)
    declared = dict(spec.equivalent)
    accepted, diagnoses = {}, {}
    everyone = mutants(spec)
    for mutant in everyone:
        if not only(mutant.name):
            continue
        try:
            implementation = mutant.implementation.get()
        except Exception:  # (a mutant that does not compile is no learner's program)
            continue
        accepted[mutant.name] = []
        for seed in tried:
            said = judged(spec, implementation, seed)
            if said is None:
                accepted[mutant.name].append(seed)
            else:
                diagnoses.setdefault(mutant.name, said)
    names = {m.name for m in everyone}
    return Score(exercise, tried, accepted, diagnoses, declared, sorted(set(declared) - names))


# Diagnoses that say a difference exists but not what it is ("has the right shape (2, 5), but
# 3 of its 10 values are wrong, only at ..." says where, so it is not one of them).
GENERIC = (re.compile(r"but wrong values"), re.compile(r"contains? NaN or infinity where"),
           re.compile(r"the mistake is inside a sublayer"))


def generic(diagnosis: str) -> bool:
    return any(pattern.search(diagnosis) for pattern in GENERIC)


def _report(result: Score, verbose: bool) -> list[str]:
    counted = len(result.counted)
    seed, killed = result.weakest() if result.seeds else (None, 0)
    percent = 100.0 * killed / counted if counted else 100.0
    lines = [f"{result.exercise:48} {killed:4d}/{counted:<4d} {percent:6.1f}%  weakest seed "
             f"{'public' if seed == result.seeds[0] else seed}  ({len(result.equivalent)} equivalent, "
             f"{sum(map(generic, result.diagnoses.values()))} generic diagnoses)"]
    for name, where in result.survivors.items():
        lines.append(f"    survives: {name}  (accepted on {len(where)} of {len(result.seeds)} seeds)")
    for name, where in result.rejected_equivalent.items():
        lines.append(f"    declared equivalent but rejected on {len(where)} seeds: {name}")
    for name in result.unknown:
        lines.append(f"    declared equivalent, but no such mutant (stale): {name}")
    if verbose:
        for name, reason in result.equivalent.items():
            lines.append(f"    equivalent: {name}: {reason} (accepted on all {len(result.seeds)} seeds)")
        for name, said in result.diagnoses.items():
            lines.append(f"    {'GENERIC ' if generic(said) else ''}{name}: {said}")
    return lines


def _score_lines(args: tuple) -> tuple[list[str], bool, int, int]:
    exercise, n_seeds, verbose = args
    import torch

    torch.set_num_threads(1)
    result = score(exercise, seeds(n_seeds, exercise))
    return _report(result, verbose), result.perfect, len(result.counted), result.weakest()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.checks._mutants",
                                     description="Mutation testing of the hidden checks.")
    parser.add_argument("--topic", action="append", default=[], help="only this topic's exercises")
    parser.add_argument("--exercise", action="append", default=[], help="only this exercise (repeatable)")
    parser.add_argument("--seeds", type=int, default=20, help="student seeds besides the public one (20)")
    parser.add_argument("--jobs", type=int, default=1, help="exercises judged at once (processes)")
    parser.add_argument("--verbose", action="store_true", help="every mutant's diagnosis and the equivalent ones")
    args = parser.parse_args(argv)
    chosen = args.exercise or [e for e in exercise_ids() if not args.topic or e.split("-")[0] in args.topic]
    unknown = [e for e in chosen if e not in exercise_ids()]
    if unknown:
        parser.error(f"no such exercise: {', '.join(unknown)}")
    jobs = [(e, args.seeds, args.verbose) for e in chosen]
    print(f"{'exercise':48} killed/non-equivalent on the weakest of {args.seeds + 1} seeds (public + {args.seeds})")
    total = killed = 0
    failed = []
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs) as pool:
            results = pool.map(_score_lines, jobs)
            for (exercise, _, _), (lines, perfect, counted, worst) in zip(jobs, results):
                print("\n".join(lines), flush=True)
                total, killed = total + counted, killed + worst
                failed += [] if perfect else [exercise]
    else:
        for job in jobs:
            lines, perfect, counted, worst = _score_lines(job)
            print("\n".join(lines), flush=True)
            total, killed = total + counted, killed + worst
            failed += [] if perfect else [job[0]]
    print(f"all: {killed}/{total} non-equivalent mutants killed on each exercise's weakest seed; "
          f"{len(chosen) - len(failed)} of {len(chosen)} exercises at 100%")
    if failed:
        print("below 100%: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
