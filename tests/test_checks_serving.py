"""Mistake and variant cases of notebook 16's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must score
full marks (exercise-standard.md, item 6). PagedKVCache and speculative_step go through the drivers
of coursekit/drivers/serving.py (for speculative_step, a seeded generator and the exact distribution
by enumeration), as they do while grading. 3 student seeds (speculative_step's exact distribution is
the slow part).
"""
from __future__ import annotations

import math
from collections import deque

import pytest
import torch

from tests.check_cases import shared_tests
from tests.conftest import solution_namespace


@pytest.fixture(scope="module")
def serving_notebook() -> dict:
    """The reference solutions of notebook 16 (PagedKVCache)."""
    return solution_namespace("16_serving")


class _Pool:
    """The attributes every case below shares; each case writes append, gather and free."""

    def __init__(self, num_blocks, block_size, heads, d_k):
        self.block_size, self.block_tables, self.lengths = block_size, {}, {}
        self.key_blocks, self.value_blocks = (torch.zeros(num_blocks, heads, block_size, d_k) for _ in "kv")
        self.free_blocks = list(range(num_blocks))

    def gather(self, seq):
        table, length = self.block_tables[seq], self.lengths[seq]
        keys = torch.cat([self.key_blocks[b] for b in table], dim=1)[:, :length]
        values = torch.cat([self.value_blocks[b] for b in table], dim=1)[:, :length]
        return keys, values

    def free(self, seq):
        for block in self.block_tables.pop(seq):
            self.free_blocks.append(block)
        del self.lengths[seq]

    def _write(self, seq, k, v):
        length, table = self.lengths[seq], self.block_tables[seq]
        for i in range(k.shape[1]):
            p = length + i
            self.key_blocks[table[p // self.block_size], :, p % self.block_size] = k[:, i]
            self.value_blocks[table[p // self.block_size], :, p % self.block_size] = v[:, i]
        self.lengths[seq] = length + k.shape[1]


# ---------------------------------------------------------------- valid variants

class TokenByToken(_Pool):
    """A new block whenever the next position starts one (vLLM's block manager, one token at a time)."""

    def append(self, seq, k, v):
        self.block_tables.setdefault(seq, [])
        self.lengths.setdefault(seq, 0)
        have = len(self.block_tables[seq]) * self.block_size
        if math.ceil((self.lengths[seq] + k.shape[1] - have) / self.block_size) > len(self.free_blocks):
            raise RuntimeError("the pool is out of blocks")
        for i in range(k.shape[1]):
            p = self.lengths[seq]
            if p % self.block_size == 0:
                self.block_tables[seq].append(self.free_blocks.pop(0))      # FIFO: the lowest id first
            block = self.block_tables[seq][-1]
            self.key_blocks[block, :, p % self.block_size] = k[:, i]
            self.value_blocks[block, :, p % self.block_size] = v[:, i]
            self.lengths[seq] = p + 1


class DequeFreeList(_Pool):
    """The free list a deque, blocks handed out from the left and given back on the right."""

    def __init__(self, num_blocks, block_size, heads, d_k):
        super().__init__(num_blocks, block_size, heads, d_k)
        self.free_blocks = deque(range(num_blocks))

    def append(self, seq, k, v):
        if seq not in self.block_tables:
            self.block_tables[seq], self.lengths[seq] = [], 0
        total = self.lengths[seq] + k.shape[1]
        more = math.ceil(total / self.block_size) - len(self.block_tables[seq])
        if more > len(self.free_blocks):
            raise RuntimeError(f"need {more} blocks, {len(self.free_blocks)} free")
        self.block_tables[seq] += [self.free_blocks.popleft() for _ in range(more)]
        self._write(seq, k, v)


class IndexSelectGather(_Pool):
    """Vectorised: the positions' blocks and offsets as index tensors, written and read at once."""

    def append(self, seq, k, v):
        table, length = self.block_tables.get(seq, []), self.lengths.get(seq, 0)
        n = k.shape[1]
        while len(table) * self.block_size < length + n:
            if not self.free_blocks:
                raise RuntimeError("no free block")
            table.append(self.free_blocks.pop())
        pos = torch.arange(length, length + n)
        blocks = torch.tensor(table)[pos // self.block_size]
        self.key_blocks[blocks, :, pos % self.block_size] = k.transpose(0, 1)
        self.value_blocks[blocks, :, pos % self.block_size] = v.transpose(0, 1)
        self.block_tables[seq], self.lengths[seq] = table, length + n

    def gather(self, seq):
        pos = torch.arange(self.lengths[seq])
        blocks = torch.tensor(self.block_tables[seq])[pos // self.block_size]
        keys = self.key_blocks[blocks, :, pos % self.block_size].transpose(0, 1)
        values = self.value_blocks[blocks, :, pos % self.block_size].transpose(0, 1)
        return keys, values


# ---------------------------------------------------------------- mistakes (learner-style)

class BlockPerAppend(_Pool):
    def append(self, seq, k, v):
        self.block_tables.setdefault(seq, [])
        self.lengths.setdefault(seq, 0)
        while True:                                        # always one more block, then as many as the tokens need
            if not self.free_blocks:
                raise RuntimeError("out of blocks")
            self.block_tables[seq].append(self.free_blocks.pop())
            if len(self.block_tables[seq]) * self.block_size >= self.lengths[seq] + k.shape[1]:
                break
        self._write(seq, k, v)


class FreeForgetsBlocks(DequeFreeList):
    def free(self, seq):
        self.block_tables.pop(seq)
        self.lengths.pop(seq)


class ValuesFirst(DequeFreeList):
    def gather(self, seq):
        keys, values = super().gather(seq)
        return values, keys


class SortedBlocks(_Pool):
    def append(self, seq, k, v):
        IndexSelectGather.append(self, seq, k, v)

    def gather(self, seq):
        length = self.lengths[seq]
        keys = torch.cat([self.key_blocks[b] for b in sorted(self.block_tables[seq])], dim=1)[:, :length]
        values = torch.cat([self.value_blocks[b] for b in sorted(self.block_tables[seq])], dim=1)[:, :length]
        return keys, values


class DictOfTensors(DequeFreeList):
    """Counts the blocks, but keeps each sequence's tokens in a tensor of its own."""

    def append(self, seq, k, v):
        if seq not in self.block_tables:
            self.block_tables[seq], self.lengths[seq] = [], 0
            self.store = getattr(self, "store", {})
            self.store[seq] = (k[:, :0], v[:, :0])
        more = math.ceil((self.lengths[seq] + k.shape[1]) / self.block_size) - len(self.block_tables[seq])
        if more > len(self.free_blocks):
            raise RuntimeError("out of blocks")
        self.block_tables[seq] += [self.free_blocks.popleft() for _ in range(more)]
        self.store[seq] = (torch.cat([self.store[seq][0], k], 1), torch.cat([self.store[seq][1], v], 1))
        self.lengths[seq] += k.shape[1]

    def gather(self, seq):
        self.lengths[seq]
        return self.store[seq]


# ---------------------------------------------------------------- speculative_step

def _pick(w, u):
    cdf = torch.cumsum(w, 0) / w.sum()
    return torch.searchsorted(cdf, u.reshape(1), right=True).clamp(max=len(w) - 1)


def ratio_inverted(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    for i in range(k):
        x = draft_tokens[i]
        if u[i] >= min(1.0, float(q[i, x] / p[i, x])):
            return torch.cat([draft_tokens[:i], _pick(torch.clamp(p[i] - q[i], min=0), u[k])])
    return torch.cat([draft_tokens, _pick(p[k], u[k])])


def residual_from_target(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    out = []
    for i in range(k):
        x = int(draft_tokens[i])
        if u[i] < p[i, x] / q[i, x]:
            out.append(x)
        else:
            out.append(int(_pick(p[i], u[k])))
            return torch.tensor(out)
    out.append(int(_pick(p[k], u[k])))
    return torch.tensor(out)


def residual_unclamped(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    accept = u[:k] < p[torch.arange(k), draft_tokens] / q[torch.arange(k), draft_tokens]
    n = k if bool(accept.all()) else int(torch.argmin(accept.int()))
    w = p[k] if n == k else p[n] - q[n]          # max(0, .) forgotten
    return torch.cat([draft_tokens[:n], _pick(w, u[k])])


def greedy_verification(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    for i in range(k):
        if draft_tokens[i] != p[i].argmax():
            return torch.cat([draft_tokens[:i], _pick(torch.clamp(p[i] - q[i], min=0), u[k])])
    return torch.cat([draft_tokens, _pick(p[k], u[k])])


def no_bonus(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    for i in range(k):
        if not u[i] < p[i, draft_tokens[i]] / q[i, draft_tokens[i]]:
            return torch.cat([draft_tokens[:i], _pick(torch.clamp(p[i] - q[i], min=0), u[k])])
    return draft_tokens.clone()


def judged_by_next(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    for i in range(k):
        if not u[i] < p[i + 1, draft_tokens[i]] / q[i, draft_tokens[i]]:
            return torch.cat([draft_tokens[:i], _pick(torch.clamp(p[i + 1] - q[i], min=0), u[k])])
    return torch.cat([draft_tokens, _pick(p[k], u[k])])


# valid: min(1, ratio) written out, u * q < p, the CDF by counting, a list of ints
def with_min_and_counting(draft_tokens, q, p, generator):
    k, V = q.shape
    if p.shape != (k + 1, V) or draft_tokens.shape != (k,):
        raise ValueError("p must be (k + 1, V) and q (k, V)")
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    tokens = []
    for i, x in enumerate(draft_tokens.tolist()):
        if u[i].item() < min(1.0, (p[i, x] / q[i, x]).item()):
            tokens.append(x)
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        residual = residual / residual.sum()
        tokens.append(min(int((torch.cumsum(residual, 0) <= u[k]).sum()), V - 1))
        return torch.tensor(tokens, dtype=torch.int64)
    tokens.append(min(int((torch.cumsum(p[k], 0) / p[k].sum() <= u[k]).sum()), V - 1))
    return torch.tensor(tokens, dtype=torch.int64)


def vectorised(draft_tokens, q, p, generator):
    k, V = q.shape
    if tuple(p.shape) != (k + 1, V):
        raise ValueError(f"p should be (k + 1, V) = ({k + 1}, {V}), got {tuple(p.shape)}")
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    idx = torch.arange(k)
    rejected = (u[:k] * q[idx, draft_tokens] >= p[idx, draft_tokens]).nonzero()
    if len(rejected) == 0:
        return torch.cat([draft_tokens, _pick(p[k], u[k])])
    n = int(rejected[0])
    return torch.cat([draft_tokens[:n], _pick(torch.relu(p[n] - q[n]), u[k])])


MISTAKES = {
    "serving-PagedKVCache": [
        (BlockPerAppend, "it takes a new block on every append"),
        (FreeForgetsBlocks, "free does not give the sequence's blocks back"),
        (ValuesFirst, "gather returns (values, keys)"),
        (SortedBlocks, "gather reads the blocks sorted by their id"),
        (DictOfTensors, "kept in a tensor per sequence, not in the pool"),
    ],
    "serving-speculative_step": [
        (ratio_inverted, "the acceptance ratio is inverted"),
        (residual_from_target, "at a rejection the token is drawn from p_i itself"),
        (residual_unclamped, "the residual is not clamped at 0"),
        (greedy_verification, "accepted only when it is the target's argmax"),
        (no_bonus, "the bonus token is missing"),
        (judged_by_next, "p and the drafts are off by one"),
    ],
}

VARIANTS = {
    "serving-PagedKVCache": [TokenByToken, DequeFreeList, IndexSelectGather],
    "serving-speculative_step": [with_min_and_counting, vectorised],
}

globals().update(shared_tests("serving", MISTAKES, VARIANTS, solutions="serving_notebook", seeds=3))
