"""Time the reference MultiHeadAttention of notebook 06 against torch.nn.MultiheadAttention.

    .venv/bin/python bench/multi_head.py [--rounds N]      (part of `make bench`)

Both modules hold the same weights (loaded with the notebook's own load_torch_weights)
and run forward and backward on the same CPU, in the same process: self-attention on
batch 32, length 128, d_model 256, 8 heads, float32, the loss the sum of the outputs.
Both return the attention weights (the reference per head, PyTorch averaged over the
heads, its default need_weights=True), so both materialize them. Rounds alternate which
module goes first, so that machine load hits both alike. Prints the median seconds of
each and the median of the per-round ratios (target: at most 1.5). PyTorch without the
weights (need_weights=False, its fused kernel) is printed for information.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from grader.course import solution_namespace  # noqa: E402

BATCH, LENGTH, D_MODEL, HEADS = 32, 128, 256, 8
STEPS = 3  # forward + backward passes per timed sample


def step(module, x: torch.Tensor, **kwargs) -> None:
    module.zero_grad(set_to_none=True)
    x.grad = None
    output, _ = module(x, x, x, **kwargs)
    output.sum().backward()


def timed(module, x: torch.Tensor, **kwargs) -> float:
    start = time.perf_counter()
    for _ in range(STEPS):
        step(module, x, **kwargs)
    return (time.perf_counter() - start) / STEPS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    notebook = solution_namespace("06_multi_head")
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_bias.normal_(std=0.1)
        theirs.out_proj.bias.normal_(std=0.1)
    ours = notebook["load_torch_weights"](notebook["MultiHeadAttention"](D_MODEL, HEADS), theirs)
    x = torch.randn(BATCH, LENGTH, D_MODEL, requires_grad=True)
    with torch.no_grad():  # same function, or the timing compares different things
        difference = (ours(x, x, x)[0] - theirs(x, x, x)[0]).abs().max().item()
    assert difference < 1e-4, f"the modules differ by {difference:.1e}"

    runs = {"reference MultiHeadAttention": (ours, {}),
            "torch.nn.MultiheadAttention": (theirs, {}),
            "torch, need_weights=False": (theirs, {"need_weights": False})}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for module, kwargs in runs.values():  # warm-up: allocator, thread pool, kernels
        timed(module, x, **kwargs)
    names = list(runs)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            module, kwargs = runs[name]
            times[name].append(timed(module, x, **kwargs))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"multi-head attention, forward + backward, batch {BATCH}, length {LENGTH}, d_model {D_MODEL}, "
          f"{HEADS} heads, float32, {torch.get_num_threads()} threads; median of {args.rounds} "
          f"alternating rounds of {STEPS} steps:")
    for name, median in medians.items():
        print(f"  {name:<30} {1000 * median:8.1f} ms   (min {1000 * min(times[name]):.1f}, "
              f"max {1000 * max(times[name]):.1f})")
    def ratio(other: str) -> float:  # per round, so that load that drifts between rounds cancels
        return statistics.median(a / b for a, b in zip(times["reference MultiHeadAttention"], times[other]))

    print(f"  ratio reference / torch (median of the per-round ratios): "
          f"{ratio('torch.nn.MultiheadAttention'):.2f}x (target <= 1.5x)")
    print(f"  for information, against torch without the weights (need_weights=False): "
          f"{ratio('torch, need_weights=False'):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
