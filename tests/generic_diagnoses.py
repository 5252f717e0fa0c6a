"""Count the generic diagnoses the checks give the wrong implementations the tests hold.

A generic diagnosis says that something is wrong without saying what ("has the right shape
... but wrong values", "contains NaN or infinity where ...", "the mistake is inside a
sublayer", a bare "<function> raised <error>"). This tool judges, as grading does (in
process, collect/decode/verdict), every wrong implementation of the test suite:

- MISTAKES of every ``tests/test_checks_<topic>.py``;
- every spec's catalogue, ``diagnosed``, error rules' and hints' examples, probes' examples;
- with ``--mutants``, the mutants of ``grader.checks._mutants`` (when that module exists) that
  the checks reject;

on the public seed (and ``--seeds N`` student seeds), and prints the count of generic
diagnoses, then each one (``-v``). Run from the worktree root::

    .venv/bin/python -m tests.generic_diagnoses [-v | --all] [--seeds N] [--topic T] [--mutants]

To count on another checkout (e.g. main), run it with that checkout as the working directory.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import signal
import sys
import warnings

import numpy as np

from grader.checks._mutants import GENERIC

# an error whose own text says what was expected (a driver's, e.g. "it should be a class")
_EXPLAINED = re.compile(r"should|expected|must|is not a torch\.nn\.Module|returns nothing", re.I)


def generic(message: str | None, raised: tuple[str, ...] = ()) -> bool:
    """The diagnosis says only that something is wrong (see the module's docstring):
    ``raised`` are the errors the learner's function raised, and a diagnosis that ends with
    one of them ("<name> raised <error>") says nothing of what was expected."""
    if not message:
        return False
    if any(p.search(message) for p in GENERIC):
        return True
    return any(message.endswith(f"raised {error.rstrip('.')}") and not _EXPLAINED.search(error) for error in raised)


def _test_mistakes(topic: str) -> list[tuple[str, str, object]]:
    """(exercise, name, implementation) of the topic's tests' MISTAKES."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # (a test module may print while imported)
            module = importlib.import_module(f"tests.test_checks_{topic}")
    except ImportError:
        return []
    return [(exercise, getattr(fn, "__name__", repr(fn)), fn)
            for exercise, cases in getattr(module, "MISTAKES", {}).items() for fn, _ in cases]


def _spec_mistakes(spec) -> list[tuple[str, str, object]]:
    """(exercise, name, implementation) of everything the spec itself diagnoses."""
    found = [(spec.id, m.name, m.implementation) for m in spec.catalogue() + spec.diagnosed]
    found += [(spec.id, f"raises-{i}", rule.example) for i, rule in enumerate(spec.errors)]
    found += [(spec.id, f"hint-{i}", hint.example) for i, hint in enumerate(spec.hints)]
    found += [(spec.id, f"{p.name}-{m.name}", m.implementation) for p in spec.probes for m in p.examples]
    return found


def _mutants(exercise: str) -> list[tuple[str, str, object]]:
    """(exercise, name, implementation) of the reference's mutants (grader.checks._mutants),
    those that compile."""
    from grader.checks import get

    try:
        engine = importlib.import_module("grader.checks._mutants")
    except ImportError:
        return []
    found = []
    for mutant in engine.mutants(get(exercise)):
        try:
            found.append((exercise, mutant.name, mutant.implementation.get()))
        except Exception:  # (a mutant that does not compile is no learner's program)
            continue
    return found


@contextlib.contextmanager
def _budget():
    """The mutation engine's CPU budget for one seed's answers (a mutant may loop for ever)."""
    try:
        engine = importlib.import_module("grader.checks._mutants")
    except ImportError:
        yield
        return
    previous = signal.signal(signal.SIGPROF, engine._over_budget)
    signal.setitimer(signal.ITIMER_PROF, engine.CPU_BUDGET)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def judged(exercise: str, fn: object, seeds: list[int]) -> list[tuple[str | None, tuple[str, ...]]]:
    """The verdicts of ``fn`` for ``seeds`` (None: accepted), each with the errors it raised."""
    from grader.checks import Raised, answers_of, verdict

    said = []
    for seed in seeds:
        with np.errstate(all="ignore"), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            try:
                with _budget():
                    answers = answers_of(exercise, fn, seed)
                raised = tuple(a.message for a in answers if isinstance(a, Raised))
                said.append((verdict(exercise, seed, answers), raised))
            except BaseException as error:  # (a broken case, or over budget: reported, not fatal to the count)
                if isinstance(error, KeyboardInterrupt):
                    raise
                said.append((f"<grader error {type(error).__name__}: {error}>", ()))
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=0, help="student seeds besides the public one")
    parser.add_argument("--topic", help="one topic only")
    parser.add_argument("--mutants", action="store_true", help="also the mutants the checks reject")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every generic diagnosis")
    parser.add_argument("--all", action="store_true", help="print every diagnosis (generic ones marked GENERIC)")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    from grader.checks import exercise_ids, get, public_seed
    from grader.checks._core import _topics

    topics = [args.topic] if args.topic else _topics()
    total = count = 0
    for topic in topics:
        cases = _test_mistakes(topic)
        for exercise in exercise_ids(topic):
            cases += _spec_mistakes(get(exercise))
            if args.mutants:
                cases += _mutants(exercise)
        for exercise, name, fn in cases:
            seeds = [public_seed(exercise)] + list(range(args.seeds))
            for seed, (message, raised) in zip(seeds, judged(exercise, fn, seeds)):
                if message is None:
                    continue
                total += 1
                vague = generic(message, raised)
                count += vague
                if args.all or (vague and args.verbose):
                    print(f"{'GENERIC ' if vague and args.all else ''}{exercise} {name} seed {seed}: {message}")
        sys.stdout.flush()
    print(f"generic diagnoses: {count} of {total} rejected answers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
