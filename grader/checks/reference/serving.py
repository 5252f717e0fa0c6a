"""References of notebook 16, serving (learner-style; the hidden checks compare with these).

The paged KV cache (section 1): Kwon et al. (2023), "Efficient Memory Management for Large Language
Model Serving with PagedAttention", Sec. 4.1-4.2.

Speculative decoding (section 2): one step of speculative sampling, Leviathan, Kalman and Matias
(2023), "Fast Inference from Transformers via Speculative Decoding", Algorithm 1; Chen et al. (2023),
"Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2.
"""
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


def speculative_step(draft_tokens, q, p, generator):
    """One step of speculative sampling: the accepted draft tokens, then one token more.

    draft_tokens (k,) int64: x_1 .. x_k, x_i drawn from q[i - 1]. q (k, V) float64: the draft's
    distributions. p (k + 1, V) float64: the target's, from one forward over the prompt and the k
    drafts (p[i - 1] judges x_i; p[k] follows all k). The only draws: u = torch.rand(k + 1,
    generator=generator, dtype=torch.float64), first and all at once. x_i is accepted while
    u[i - 1] < p_i(x_i) / q_i(x_i) (probability min(1, p_i(x_i) / q_i(x_i))); at the first rejection
    the last token is drawn from norm(max(0, p_i - q_i)), after k acceptances from p[k], by the
    inverse CDF: the first token j with u[k] < cumsum(w)[j] / sum(w) (torch.searchsorted(...,
    right=True), clamped to V - 1). Returns (n + 1,) int64: x_1 .. x_n accepted, then that token.
    Raises ValueError when the shapes do not fit.
    """
    k, V = q.shape
    if tuple(draft_tokens.shape) != (k,) or tuple(p.shape) != (k + 1, V):
        raise ValueError(f"draft_tokens should be (k,), q (k, V) and p (k + 1, V); got {tuple(draft_tokens.shape)}, "
                         f"{tuple(q.shape)} and {tuple(p.shape)}")
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    x = draft_tokens.long()
    for i in range(k):
        if not u[i] < p[i, x[i]] / q[i, x[i]]:
            return torch.cat([x[:i], _inverse_cdf(torch.clamp(p[i] - q[i], min=0), u[k])])
    return torch.cat([x, _inverse_cdf(p[k], u[k])])


def _inverse_cdf(w, u):
    """(1,) int64: the first j with u < cumsum(w)[j] / sum(w)."""
    cdf = (torch.cumsum(w, 0) / w.sum()).to(torch.float64)
    return torch.searchsorted(cdf, u.reshape(1), right=True).clamp(max=len(w) - 1)
