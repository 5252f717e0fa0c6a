"""The reference Transformer of notebook 09 against torch.nn.Transformer of the same size.

    .venv/bin/python bench/transformer.py [--rounds N] [--steps S]      (part of `make bench`)

Both models share the notebook's embeddings (x sqrt(d_model) + sinusoidal PE) and generator;
the reference stacks the notebook's EncoderLayer / DecoderLayer (nn.MultiheadAttention,
post-norm), the other is torch.nn.Transformer(d_model 64, 4 heads, 2 + 2 layers, d_ff 256,
dropout 0, batch_first=True), which adds one final LayerNorm after each stack. Same
batch of 128 sentence pairs of the toy EN->KO task, same training step (the notebook's
train_step, label_smoothed_loss, Adam(0.9, 0.98, 1e-9), noam_lr warmup 100 factor 0.5).

1. Training-step time: forward + backward + Adam, rounds alternating which model goes
   first; the median of the per-round ratios reference / torch (target: at most 1.5).
2. Accuracy after the same number of steps (--steps each, default 500, as the notebook: a
   step budget, never a wall-clock one), with the time each took, trained in alternating
   slices of 50 steps so that drifting load hits both alike: exact match of greedy
   translations on the held-out and compositional splits.
Threads: coursekit.training.THREADS (1), as in the notebook.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from coursekit import translation as tt  # noqa: E402
from coursekit.training import THREADS, evaluate, train  # noqa: E402
from grader.course import solution_namespace  # noqa: E402

D_MODEL, HEADS, D_FF, LAYERS, BATCH = 64, 4, 256, 2, 128


def torch_transformer(nb: dict, src_vocab: int, tgt_vocab: int) -> nn.Module:
    """The notebook's embeddings and generator around torch.nn.Transformer's stacks."""

    class TorchTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.d_model, self.pad_id = D_MODEL, tt.PAD_ID
            self.src_embed = nn.Embedding(src_vocab, D_MODEL)
            self.tgt_embed = nn.Embedding(tgt_vocab, D_MODEL)
            self.register_buffer("pe", nb["sinusoidal_encoding"](64, D_MODEL), persistent=False)
            self.core = nn.Transformer(D_MODEL, HEADS, LAYERS, LAYERS, D_FF, dropout=0.0, batch_first=True)
            self.generator = nn.Linear(D_MODEL, tgt_vocab)

        def encode(self, src, src_mask):
            x = self.src_embed(src) * math.sqrt(D_MODEL) + self.pe[: src.shape[1]]
            return self.core.encoder(x, src_key_padding_mask=~src_mask)

        def decode(self, memory, src_mask, tgt_in):
            T = tgt_in.shape[1]
            y = self.tgt_embed(tgt_in) * math.sqrt(D_MODEL) + self.pe[:T]
            future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
            y = self.core.decoder(y, memory, tgt_mask=future, memory_key_padding_mask=~src_mask)
            return self.generator(y)

        def forward(self, src, tgt_in):
            src_mask = src != self.pad_id
            return self.decode(self.encode(src, src_mask), src_mask, tgt_in)

    return TorchTransformer()


def build(nb: dict, which: str, task, seed: int = 0):
    torch.manual_seed(seed)
    src_vocab, tgt_vocab = len(task.src_vocab), len(task.tgt_vocab)
    if which == "reference":
        model = nb["Transformer"](src_vocab, tgt_vocab, D_MODEL, HEADS, D_FF, LAYERS, 64, tt.PAD_ID)
    else:
        model = torch_transformer(nb, src_vocab, tgt_vocab)
    nb["init_weights"](model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: nb["noam_lr"](k + 1, D_MODEL, 100, 0.5))
    return model, optimizer, scheduler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=500, help="training budget of each model, in steps")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.pop("NBGRADER_EXECUTION", None)
    nb = solution_namespace("09_transformer")
    threads = THREADS
    torch.set_num_threads(threads)
    task = tt.load_task()

    def loss_fn(logits, tgt_out):
        return nb["label_smoothed_loss"](logits, tgt_out, tt.PAD_ID, 0.1)

    # 1. step time on one fixed batch
    src, tgt = next(task.batches(BATCH, seed=0, shift=False))
    runs = {name: build(nb, name, task) for name in ("reference", "torch.nn.Transformer")}
    params = {name: sum(p.numel() for p in run[0].parameters()) for name, run in runs.items()}

    def timed(name: str) -> float:
        model, optimizer, scheduler = runs[name]
        start = time.perf_counter()
        nb["train_step"](model, src, tgt, optimizer, scheduler, loss_fn)
        return time.perf_counter() - start

    for name in runs:  # warm-up
        timed(name)
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(timed(name))
    ratio = statistics.median(a / b for a, b in zip(times["reference"], times["torch.nn.Transformer"]))

    # 2. accuracy after the same number of steps, trained in alternating slices so that load
    #    that drifts during the run hits both models alike
    states = {}
    for name in names:
        model, optimizer, scheduler = build(nb, name, task)
        states[name] = {"model": model, "opt": optimizer, "sched": scheduler, "steps": 0, "seconds": 0.0,
                        "batches": task.batches(BATCH, seed=0, shift=False)}
    while any(st["steps"] < args.steps for st in states.values()):
        for name in names:
            st = states[name]
            history = train(lambda batch, st=st: nb["train_step"](st["model"], *batch, st["opt"], st["sched"], loss_fn),
                            st["batches"], steps=min(50, args.steps - st["steps"]), progress=False)
            st["steps"] += history.steps
            st["seconds"] += history.wall
    results = {}
    max_len = task.tgt["train"].shape[1]
    for name in names:
        model = states[name]["model"].eval()

        def translate(s, model=model):
            return nb["greedy_decode"](model, s, tt.BOS_ID, tt.EOS_ID, tt.PAD_ID, max_len)

        held, _ = evaluate(translate, task.src["heldout"], task.tgt["heldout"][:, 1:], tt.EOS_ID)
        comp, _ = evaluate(translate, task.src["comp"], task.tgt["comp"][:, 1:], tt.EOS_ID)
        results[name] = (states[name]["seconds"], held, comp)

    load = os.getloadavg()
    print(f"Transformer (d_model {D_MODEL}, {HEADS} heads, d_ff {D_FF}, {LAYERS}+{LAYERS} layers) on the toy EN->KO "
          f"task, batch {BATCH}, {threads} torch thread(s), load average {load[0]:.1f}:")
    print(f"  {'model':<22} {'params':>8} {'step (median)':>14} {'time of ' + str(args.steps) + ' steps':>16} "
          f"{'held-out':>9} {'compositional':>14}")
    for name in names:
        seconds, held, comp = results[name]
        print(f"  {name:<22} {params[name]:>8,} {1000 * statistics.median(times[name]):>11.1f} ms "
              f"{seconds:>14.1f} s {100 * held:>8.1f}% {100 * comp:>13.1f}%")
    print(f"  training-step time ratio reference / torch.nn.Transformer (median of {args.rounds} alternating "
          f"rounds): {ratio:.2f}x (target <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
