"""Training on a step budget on a CPU, shared by notebooks 09 and 10.

Nothing here is an exercise: it is the plumbing around the learner's model.

* ``grading()``: True while nbgrader executes the notebook (it sets ``NBGRADER_EXECUTION``);
  the notebooks then do not train: the hidden checks load known weights.
* ``train(step_fn, batches, steps, ...)``: calls ``step_fn(batch) -> loss`` for a fixed
  number of batches, with one torch thread and a tqdm progress bar whose estimate of the
  time left is the only thing the clock decides. Returns a ``History`` (losses, learning
  rates, seconds). The same seeds and steps give the same model whatever the machine's
  load or number of cores, on every Intel x86-64 processor with AVX2 (``import coursekit``
  pins torch's kernels and MKL to AVX2) and torch 2.13.0 (``REFERENCE``); ``arithmetic_note()``
  says when that did not take, and why an AMD or ARM processor or another torch may differ
  slightly.
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
import platform
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from . import ARITHMETIC

__all__ = ["REFERENCE", "THREADS", "History", "arithmetic_note", "count_parameters", "evaluate", "exact_match", "grading",
           "init_weights", "recorded_attention", "torch_threads", "train"]

# Training and evaluation run on one torch thread. The count can be part of the numerics: where
# MKL is not pinned (coursekit's MKL_CBWR came too late), two threads split a sum into two
# partial sums and add them in another order, so the same seed gives other losses within a
# few steps (tests/test_training.py); and on a shared, busy
# machine two OpenMP threads that wait for each other were ten times slower than one.
THREADS = 1


def grading() -> bool:
    """True while nbgrader runs the notebook (the environment variable NBGRADER_EXECUTION is set)."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


# Where the numbers the notebooks' prose quotes come from: the grading environment's pins
# (constraints.txt and environment.yml; tests/test_environment.py keeps them the same).
REFERENCE = {"processor": "Intel x86-64 with AVX2", "torch": "2.13.0", "python": "3.11"}


def vendor() -> str:
    """The processor's maker as its CPUID names it ("GenuineIntel", "AuthenticAMD"), or "" when
    the system does not say (Linux's /proc/cpuinfo, else what Windows puts in platform.processor())."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    found = [name for name in ("GenuineIntel", "AuthenticAMD") if name in platform.processor()]
    return found[0] if found else ""


def _reference() -> str:
    return (f"the text's numbers come from {REFERENCE['processor']}, torch {REFERENCE['torch']} and "
            f"Python {REFERENCE['python']} (the course's pins)")


def arithmetic_note() -> str | None:
    """Why this kernel's numbers may differ from the notebook's prose, in one line, or None.

    The prose's numbers come from ``REFERENCE``: Intel x86-64 with AVX2, torch 2.13.0, Python
    3.11. On x86-64, ``import coursekit`` pins torch's kernels to AVX2 (``ATEN_CPU_CAPABILITY``)
    and MKL's matrix products to its AVX2 path (``MKL_CBWR``), which torch reads at its first
    operation: a kernel that computed with torch before it imported coursekit keeps the
    processor's own choice, and a processor without AVX2 has none to give. MKL honours
    ``MKL_CBWR=AVX2`` on Intel processors only: on an AMD processor it takes a path of its own
    (only ``MKL_CBWR=COMPATIBLE``, MKL's slower SSE2 path, is the same on both;
    tests/test_training.py measures both on emulated processors). Another processor family
    (ARM: a recent Mac, a Raspberry Pi) has other vector units, and another torch release
    other kernels. All of these add a sum's terms in another order, so the model trains the
    same way but its last digits, and so some numbers the text quotes, may differ slightly.
    None when nothing differs.
    """
    version = str(torch.__version__).split("+")[0]
    other_torch = (f"torch {version}, not {REFERENCE['torch']}, whose kernels may add a sum's terms in another order"
                   if version != REFERENCE["torch"] else None)
    if not ARITHMETIC:
        machine = platform.machine() or "unknown"
        why = f"this {machine} processor is not x86-64: its vector units add a sum's terms in another order"
        return (f"{_reference()}; {why}{'; and ' + other_torch if other_torch else ''}: the model trains "
                "the same way, but its last digits, and so some numbers below, may differ slightly")
    used = torch.backends.cpu.get_cpu_capability()
    pinned = ARITHMETIC["ATEN_CPU_CAPABILITY"]
    asked = os.environ.get("ATEN_CPU_CAPABILITY", pinned)
    if used != "AVX2" and asked.lower() != pinned:
        return (f"ATEN_CPU_CAPABILITY={asked} is set, so torch computes with {used}, not the course's AVX2: "
                "unset it and restart the kernel to get the numbers the text quotes")
    if used not in ("AVX2", "DEFAULT"):
        return (f"torch computes with {used}, not the course's AVX2, because it ran before coursekit was "
                "imported: restart the kernel and run the cells from the top to get the numbers the text quotes")
    if used == "DEFAULT":
        return (f"{_reference()}; this processor has no AVX2{'; and ' + other_torch if other_torch else ''}: "
                "the model trains the same way, but its last digits, and so some numbers below, may differ "
                "slightly from those the text quotes")
    if vendor() == "AuthenticAMD":
        return (f"{_reference()}; on this AMD processor MKL computes matrix products on a path of its own "
                f"(MKL_CBWR pins Intel's){'; and ' + other_torch if other_torch else ''}: the model trains the "
                "same way, but its last digits, and so some numbers below, may differ slightly")
    if other_torch:
        return (f"{_reference()}; this kernel has {other_torch}: the model trains the same way, but its last "
                f"digits, and so some numbers below, may differ slightly (`pip install torch=={REFERENCE['torch']}` "
                "gives the text's numbers)")
    return None


@contextlib.contextmanager
def torch_threads(threads: int = THREADS):
    """Run the ``with`` block on ``threads`` torch threads (default ``THREADS``, 1), then
    restore the count torch had before."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class History:
    """What ``train`` recorded: one entry per completed step."""

    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)      # learning rate used by each step
    seconds: list[float] = field(default_factory=list)  # wall time since the start, after each step
    threads: int = THREADS

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def wall(self) -> float:
        """Seconds the steps took on this machine (the only number here that depends on it)."""
        return self.seconds[-1] if self.seconds else 0.0

    @property
    def ms_per_step(self) -> float:
        """Mean wall time of a step in milliseconds on this machine (NaN before the first step)."""
        return 1e3 * self.wall / self.steps if self.steps else math.nan

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
        return f"History({self.steps} steps{last}; {self.wall:.1f} s here, {self.ms_per_step:.0f} ms per step)"


def train(step_fn: Callable[[Any], float], batches: Iterable, steps: int, desc: str = "training",
          optimizer: torch.optim.Optimizer | None = None, progress: bool = True,
          postfix_every: int = 10, threads: int = THREADS) -> History:
    """Run ``step_fn(batch)`` on the next ``steps`` batches, on ``threads`` torch threads.

    step_fn:   does one optimisation step on ``batch`` and returns the loss (a float
               or a 0-d tensor); it owns the model, optimizer and scheduler.
    batches:   any iterable (an endless generator is fine); training stops early only if
               it runs out.
    steps:     int >= 0, the number of steps: the budget. The clock never stops training;
               the progress bar estimates the time left.
    optimizer: if given, the learning rate of its first parameter group is recorded
               before each step (so ``History.lrs[i]`` is the rate step i used).
    threads:   torch's thread count during training (restored afterwards); fixed, because
               it changes the order of float additions and hence the numbers.

    Raises:
        ValueError: ``steps`` is negative.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    note = arithmetic_note() if steps else None
    if note:
        warnings.warn(note, stacklevel=2)
    history = History(threads=threads)
    from tqdm.auto import tqdm

    bar = tqdm(total=steps, desc=desc, disable=not progress or steps == 0, mininterval=0.5,
               unit="step", dynamic_ncols=True)
    start = time.perf_counter()
    try:
        with torch_threads(threads):
            for _, batch in zip(range(steps), batches):
                lr = optimizer.param_groups[0]["lr"] if optimizer is not None else math.nan
                loss = step_fn(batch)
                loss = float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
                history.losses.append(loss)
                history.lrs.append(float(lr))
                history.seconds.append(time.perf_counter() - start)
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
def evaluate(decode_fn: Callable[[torch.Tensor], torch.Tensor], src: torch.Tensor, ref: torch.Tensor,
             eos_id: int, batch_size: int = 500, pad_id: int = 0, threads: int = THREADS) -> tuple[float, torch.Tensor]:
    """Exact-match accuracy of ``decode_fn(src_batch) -> pred`` over ``src``, on ``threads`` torch threads.

    src: (n, S) int64, right-padded with ``pad_id``; ref: (n, r) int64 references without BOS.
    The sentences are decoded in batches of up to ``batch_size`` of about one source length
    (sorted by it, padding columns trimmed): a batch of short sentences then stops decoding
    early instead of waiting for the longest sentence of the split.

    Returns (accuracy in [0, 1], NaN for no sentence; (n,) bool tensor of which sentences
    were right, in the order of ``src``).
    """
    right = torch.zeros(len(src), dtype=torch.bool)
    if not len(src):
        return math.nan, right
    lengths = (src != pad_id).sum(1)
    order = torch.sort(lengths, stable=True).indices
    with torch_threads(threads):
        for i in range(0, len(src), batch_size):
            rows = order[i:i + batch_size]
            batch = src[rows][:, : max(int(lengths[rows].max()), 1)]
            right[rows] = exact_match(decode_fn(batch), ref[rows], eos_id)
    return right.float().mean().item(), right


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
