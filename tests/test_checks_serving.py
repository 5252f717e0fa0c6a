"""Mistake and variant cases of notebook 16's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must score
full marks (exercise-standard.md, item 6). PagedKVCache goes through the driver of
coursekit/drivers/serving.py, as it does while grading. Small scripts: 6 seeds.
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


MISTAKES = {
    "serving-PagedKVCache": [
        (BlockPerAppend, "it takes a new block on every append"),
        (FreeForgetsBlocks, "free does not give the sequence's blocks back"),
        (ValuesFirst, "gather returns (values, keys)"),
        (SortedBlocks, "gather reads the blocks sorted by their id"),
        (DictOfTensors, "kept in a tensor per sequence, not in the pool"),
    ],
}

VARIANTS = {
    "serving-PagedKVCache": [TokenByToken, DequeFreeList, IndexSelectGather],
}

globals().update(shared_tests("serving", MISTAKES, VARIANTS, solutions="serving_notebook", seeds=6))
