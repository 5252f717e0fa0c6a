"""Time BPE training with a full recount of the pairs before every merge (notebook 11's
train_bpe) against the incremental updates of its train_bpe_incremental.

    .venv/bin/python bench/bpe_incremental.py [--rounds N]      (part of `make bench`)

Both train on the same {word: count} for the same number of merges, in the same process:
the training text's first N sentences, each sentence one word (so that the distinct words
grow with the corpus), N = 500, 2000 and 8000, 100 merges. Rounds alternate which goes
first, so that machine load hits both alike. Prints, per corpus size, the median seconds of
each and the median of the per-round ratios full / incremental (target: at least 2), and
checks that both learn the same merges.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coursekit import translation as tt  # noqa: E402
from grader.course import solution_namespace  # noqa: E402

SIZES = (500, 2000, 8000)
MERGES = 100


def full_recount(notebook: dict, words: dict, num_merges: int) -> list:
    """train_bpe's loop on given words: count_pairs before every merge, then merge_pair."""
    merges = []
    for _ in range(num_merges):
        pairs = notebook["count_pairs"](words)
        if not pairs:
            break
        merges.append(min(pairs, key=lambda pair: (-pairs[pair], pair)))
        words = notebook["merge_pair"](words, merges[-1])
    return merges


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    notebook = solution_namespace("11_tokenization")
    sentences = [tt.detokenize_ko(ko) for _, ko in tt.make_splits()["train"]]
    worst = float("inf")
    for size in SIZES:
        words = dict(Counter(tuple(sentence) for sentence in sentences[:size]))
        times: dict[str, list[float]] = {"full": [], "incremental": []}
        ratios = []
        for round_ in range(args.rounds):
            order = ["full", "incremental"] if round_ % 2 == 0 else ["incremental", "full"]
            for name in order:
                start = time.perf_counter()
                if name == "full":
                    merges_full = full_recount(notebook, dict(words), MERGES)
                else:
                    merges_incremental, _, _ = notebook["train_bpe_incremental"](dict(words), MERGES)
                times[name].append(time.perf_counter() - start)
            ratios.append(times["full"][-1] / times["incremental"][-1])
        if merges_full != merges_incremental:
            print(f"{size} sentences: the two trainings learned different merges (a course bug)")
            return 1
        ratio = statistics.median(ratios)
        worst = min(worst, ratio)
        print(f"{size:5d} sentences, {MERGES} merges: full recount {statistics.median(times['full']):.3f} s, "
              f"incremental {statistics.median(times['incremental']):.3f} s, ratio {ratio:.1f}")
    print(f"BPE training, full recount / incremental: at least {worst:.1f} (target: at least 2)")
    return 0 if worst >= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
