"""Reference solutions of notebook 16, serving (learner-style; the hidden checks compare with these)."""
from __future__ import annotations

import torch


class PagedKVCache:
    """A KV cache in fixed-size blocks of one preallocated pool (vLLM's PagedAttention).

    key_blocks, value_blocks: (num_blocks, heads, block_size, d_k); free_blocks: the ids of the
    free blocks; block_tables: seq -> its blocks in order; lengths: seq -> its tokens.
    """

    def __init__(self, num_blocks, block_size, heads, d_k):
        self.block_size = block_size
        self.key_blocks = torch.zeros(num_blocks, heads, block_size, d_k)
        self.value_blocks = torch.zeros(num_blocks, heads, block_size, d_k)
        self.free_blocks = list(range(num_blocks))
        self.block_tables = {}
        self.lengths = {}

    def append(self, seq, k, v):
        length = self.lengths.get(seq, 0)
        table = self.block_tables.get(seq, [])
        needed = -(-(length + k.shape[1]) // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise RuntimeError(f"out of blocks: {needed} more needed, {len(self.free_blocks)} free")
        for _ in range(needed):
            table.append(self.free_blocks.pop())
        for i in range(k.shape[1]):
            block, offset = table[(length + i) // self.block_size], (length + i) % self.block_size
            self.key_blocks[block, :, offset] = k[:, i]
            self.value_blocks[block, :, offset] = v[:, i]
        self.block_tables[seq] = table
        self.lengths[seq] = length + k.shape[1]

    def gather(self, seq):
        table, length = self.block_tables[seq], self.lengths[seq]
        heads, d_k = self.key_blocks.shape[1], self.key_blocks.shape[3]
        keys = self.key_blocks[table].transpose(0, 1).reshape(heads, -1, d_k)[:, :length]
        values = self.value_blocks[table].transpose(0, 1).reshape(heads, -1, d_k)[:, :length]
        return keys, values

    def free(self, seq):
        self.free_blocks.extend(self.block_tables.pop(seq))
        del self.lengths[seq]
