"""Time-budgeted training on a CPU, shared by notebooks 09 and 10.

Nothing here is an exercise: it is the plumbing around the learner's model.

* ``grading()``: True while nbgrader executes the notebook (it sets
  ``NBGRADER_EXECUTION``); notebooks then train for a few seconds only.
* ``pick_threads()``: one torch thread unless two are measurably faster right now.
  On a shared, loaded machine two OpenMP threads can be 5-10x *slower* than one.
* ``train(step_fn, batches, seconds, ...)``: calls ``step_fn(batch) -> loss`` for each
  batch with a tqdm progress bar and stops *before* a step that would overrun the
  wall-clock budget. Returns a ``History`` (losses, learning rates, seconds).
* ``exact_match(pred, ref, eos_id)`` and ``evaluate(decode_fn, src, ref, eos_id)``:
  whole-sentence accuracy of greedy translations.
* ``init_weights(model)``, ``count_parameters(model)`` and ``recorded_attention(attention)``:
  Xavier initialisation, the size of a model, and the attention weights of a layer's calls
  (for the pictures).
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

__all__ = ["History", "count_parameters", "evaluate", "exact_match", "grading", "init_weights", "pick_threads",
           "recorded_attention", "train"]


def grading() -> bool:
    """True while nbgrader runs the notebook (the environment variable NBGRADER_EXECUTION is set)."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def _matmul_seconds(threads: int, repeats: int = 10) -> float:
    """Median time of a feed-forward-sized matmul + backward ((1536, 64) @ (64, 256)) with ``threads``."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1536, 64, generator=g, requires_grad=True)
    b = torch.randn(64, 256, generator=g)
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        (a @ b).relu().sum().backward()
        times.append(time.perf_counter() - start)
    times = sorted(times[2:])
    return times[len(times) // 2]


def pick_threads(max_threads: int = 2, speedup: float = 1.3, verbose: bool = True) -> int:
    """Set and return torch's thread count: 1, unless ``max_threads`` are safe and faster now.

    More threads are tried only when the machine is idle enough that they will not fight
    other processes for the cores (1-minute load average + max_threads <= cores + 0.5):
    OpenMP threads that wait for a busy core make every step several times *slower*. Then
    they must be ``speedup`` times faster on a small matmul + backward. The environment
    variable ``COURSE_THREADS`` overrides both.
    """
    forced = os.environ.get("COURSE_THREADS")
    if forced:
        n = max(1, int(forced))
        torch.set_num_threads(n)
        return n
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    best, reason = 1, f"load average {load:.1f} on {cores} cores"
    if max_threads > 1 and cores > 1 and load + max_threads <= cores + 0.5:
        one, more = _matmul_seconds(1), _matmul_seconds(max_threads)
        if one / more >= speedup:
            best = max_threads
        reason += (f"; a test step took {1e3 * one:.1f} ms with 1 thread, {1e3 * more:.1f} ms with "
                   f"{max_threads}")
    elif max_threads > 1:
        reason += ": more threads would wait for busy cores"
    torch.set_num_threads(best)
    if verbose:
        print(f"torch threads: {best} ({reason})")
    return best


@dataclass
class History:
    """What ``train`` recorded: one entry per completed step."""

    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)      # learning rate used by each step
    seconds: list[float] = field(default_factory=list)  # wall time since the start, after each step
    threads: int = 1
    stopped: str = ""                                    # "budget", "max_steps" or "batches"

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def wall(self) -> float:
        return self.seconds[-1] if self.seconds else 0.0

    def smoothed(self, window: int = 20) -> list[float]:
        """Running mean of the loss over the last ``window`` steps (for plots)."""
        out, total = [], 0.0
        for i, loss in enumerate(self.losses):
            total += loss
            if i >= window:
                total -= self.losses[i - window]
            out.append(total / min(i + 1, window))
        return out

    def __repr__(self) -> str:
        last = f", last loss {self.losses[-1]:.3f}" if self.losses else ""
        return (f"History({self.steps} steps in {self.wall:.1f} s, {self.threads} thread(s), "
                f"stopped: {self.stopped or '-'}{last})")


def train(step_fn: Callable[[Any], float], batches: Iterable, seconds: float,
          max_steps: int | None = None, desc: str = "training",
          optimizer: torch.optim.Optimizer | None = None, progress: bool = True,
          postfix_every: int = 10) -> History:
    """Run ``step_fn(batch)`` for each batch until the wall-clock budget is spent.

    step_fn:   does one optimisation step on ``batch`` and returns the loss (a float
               or a 0-d tensor); it owns the model, optimizer and scheduler.
    batches:   any iterable (an endless generator is fine); training also stops when
               it is exhausted.
    seconds:   wall-clock budget. Training stops *before* a step that would overrun
               it, judged by the duration of the previous step.
    max_steps: optional cap on the number of steps.
    optimizer: if given, the learning rate of its first parameter group is recorded
               before each step (so ``History.lrs[i]`` is the rate step i used).
    """
    history = History(threads=torch.get_num_threads())
    from tqdm.auto import tqdm

    bar = tqdm(total=max_steps, desc=desc, disable=not progress, mininterval=0.5,
               unit="step", dynamic_ncols=True)
    start = time.perf_counter()
    last = 0.0
    history.stopped = "batches"
    try:
        for batch in batches:
            elapsed = time.perf_counter() - start
            if max_steps is not None and history.steps >= max_steps:
                history.stopped = "max_steps"
                break
            if elapsed + last > seconds:
                history.stopped = "budget"
                break
            lr = optimizer.param_groups[0]["lr"] if optimizer is not None else math.nan
            t0 = time.perf_counter()
            loss = float(step_fn(batch))
            now = time.perf_counter()
            last = now - t0
            history.losses.append(loss)
            history.lrs.append(float(lr))
            history.seconds.append(now - start)
            bar.update(1)
            if history.steps % postfix_every == 0 or history.steps == 1:
                recent = history.losses[-postfix_every:]
                bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}", refresh=False)
    finally:
        bar.close()
    return history


def exact_match(pred: torch.Tensor, ref: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(batch,) bool: does each predicted sentence equal its reference, up to and including EOS?

    pred: (batch, p) int64 token ids without BOS (what greedy decoding returns).
    ref:  (batch, r) int64 token ids without BOS, each row ending in EOS then padding
          (the decoder's *target*, e.g. ``tgt_out``).
    A prediction with no EOS is wrong; whatever follows EOS is ignored.
    """
    pred, ref = torch.as_tensor(pred), torch.as_tensor(ref)
    out = torch.zeros(len(ref), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(pred.tolist(), ref.tolist())):
        if eos_id in p and eos_id in r:
            out[i] = p[: p.index(eos_id)] == r[: r.index(eos_id)]
    return out


@torch.no_grad()
def evaluate(decode_fn: Callable[[torch.Tensor], torch.Tensor], src: torch.Tensor,
             ref: torch.Tensor, eos_id: int, batch_size: int = 500) -> tuple[float, torch.Tensor]:
    """Exact-match accuracy of ``decode_fn(src_batch) -> pred`` over ``src`` in batches.

    Returns (accuracy in [0, 1], (n,) bool tensor of which sentences were right).
    """
    right = []
    for i in range(0, len(src), batch_size):
        right.append(exact_match(decode_fn(src[i:i + batch_size]), ref[i:i + batch_size], eos_id))
    right = torch.cat(right) if right else torch.zeros(0, dtype=torch.bool)
    return (right.float().mean().item() if len(right) else math.nan), right


def init_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Xavier-uniform initialisation of every weight matrix (and embedding) of ``model``, in
    place; returns ``model``. Biases and norms keep PyTorch's initial values."""
    for parameter in model.parameters():
        if parameter.dim() > 1:
            torch.nn.init.xavier_uniform_(parameter)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """The number of numbers ``model`` learns (every parameter's elements, summed)."""
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def recorded_attention(attention: torch.nn.MultiheadAttention):
    """While the ``with`` block runs, record the weights of every call of ``attention``.

    Yields a list that gets one tensor (batch, heads, q_len, k_len) per call, whatever
    ``need_weights`` the caller asked for: the layer's own output is left as it was, and the
    weights are computed again from the same query, key, value and masks.

    Raises:
        TypeError: ``attention`` is not a torch.nn.MultiheadAttention (it alone takes these
        arguments).
    """
    if not isinstance(attention, torch.nn.MultiheadAttention):
        raise TypeError(f"recorded_attention needs a torch.nn.MultiheadAttention, not {type(attention).__name__}")
    calls: list = []

    def record(module, args, kwargs, output):
        query, key, value = (kwargs[name] if name in kwargs else args[i]
                             for i, name in enumerate(("query", "key", "value")))
        with torch.no_grad():
            # module.forward, not module(...): calling the module would run this hook again
            _, weights = module.forward(query, key, value, key_padding_mask=kwargs.get("key_padding_mask"),
                                        attn_mask=kwargs.get("attn_mask"), need_weights=True,
                                        average_attn_weights=False)
        calls.append(weights)

    handle = attention.register_forward_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()
