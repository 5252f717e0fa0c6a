"""What a call costs: the bytes its tensors hold at the peak, and the fastest of several runs.

Notebook 14 measures attention against sequence length. Both measurements are meant to
give the same picture on a laptop and on a shared, loaded server:

- memory is *counted*, not sampled: every allocation and free of PyTorch's CPU allocator
  during the call, in order, as torch.profiler records them (its ``[memory]`` events).
  The peak is the same on every run and every machine, whatever else the machine does;
  the resident set size of the process (RSS) would not be;
- time is the fastest of several runs, taken in turns with the calls it is compared with
  (a, b, a, b, ...), so that a burst of load elsewhere slows every contender alike; a
  short call runs more often, until its runs add up to a few hundredths of a second.
  Compare times as ratios measured in one run, never as absolute seconds.
"""
from __future__ import annotations

import os
import timeit
from typing import Any, Callable


def peak_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """The most bytes that CPU tensors allocated during ``fn(*args, **kwargs)`` held at once.

    Counts what PyTorch's allocator handed out while the call ran, minus what it took back,
    at its highest: the call's intermediate tensors and its result, not the arguments
    (allocated before) and not numpy arrays (numpy has its own allocator).

    Returns:
        An int, in bytes (0 for a call that allocates no tensor).

    Source: torch.autograd.profiler.profile(profile_memory=True), whose memory events record
    each allocation (positive bytes) and free (negative bytes) of the CPU allocator.
    """
    # The profiler's C++ side (kineto) prints a line on stderr when it starts and stops,
    # unless its log level is above them; it reads the level when first used.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from torch.autograd import profiler

    # use_kineto=False: the operator and memory events only, without the tracing of CPU
    # activity that torch.profiler.profile sets up on first use (seconds, for nothing here)
    with profiler.profile(profile_memory=True, use_kineto=False) as prof:
        fn(*args, **kwargs)
    events = sorted((e for e in prof.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def fastest_seconds(calls: dict[str, Callable[[], Any]], repeats: int = 3, at_least: float = 0.05,
                    most: int = 200) -> dict[str, float]:
    """The fastest run of each call, the calls run in turns (a, b, a, b, ...).

    Rounds go on until every call has run ``repeats`` times and has spent ``at_least``
    seconds in all (a call of a millisecond runs about 50 times: its fastest run is then
    one that nothing else disturbed), but no more than ``most`` rounds.

    Args:
        calls: name -> a function of no arguments (e.g. ``lambda: attention(q, k, v)``).
        repeats: the fewest runs of each call, at least 1.
        at_least: seconds each call should have run in all.
        most: the most rounds.

    Returns:
        name -> seconds of its fastest run, in the order of ``calls``.

    Raises:
        ValueError: ``repeats`` or ``most`` is less than 1.
    """
    if repeats < 1 or most < 1:
        raise ValueError(f"repeats and most must be at least 1, got {repeats} and {most}")
    best = dict.fromkeys(calls, float("inf"))
    spent = dict.fromkeys(calls, 0.0)
    rounds = 0
    while rounds < repeats or (min(spent.values()) < at_least and rounds < most):
        for name, call in calls.items():
            seconds = timeit.Timer(call).timeit(number=1)
            best[name] = min(best[name], seconds)
            spent[name] += seconds
        rounds += 1
    return best
