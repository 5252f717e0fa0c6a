"""Mistake and variant cases of notebook 16's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must score
full marks (exercise-standard.md, item 6). PagedKVCache and speculative_step go through the drivers
of coursekit/drivers/serving.py (for speculative_step, a seeded generator and the exact distribution
by enumeration), as they do while grading. 3 student seeds (speculative_step's exact distribution is
the slow part). LatentAttention is a module, built and loaded by name as notebook 15's are.
"""
from __future__ import annotations

import math
from collections import deque

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

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


# ---------------------------------------------------------------- LatentAttention (DeepSeek-V2's MLA)

class _Latent(nn.Module):
    """A learner's LatentAttention: the layers, written out; the cases below write forward(x, cache)."""

    def __init__(self, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta=10000.0, eps=1e-6,
                 rope_width=None):
        super().__init__()
        if rope_dim % 2:
            raise ValueError("rope_dim must be even")
        self.heads, self.kv_rank, self.nope, self.rope, self.v_dim = heads, kv_rank, nope_dim, rope_dim, v_dim
        self.theta = rope_theta
        self.W_q = nn.Linear(d_model, heads * (nope_dim + rope_dim), bias=False)
        self.W_dkv = nn.Linear(d_model, kv_rank + (rope_width or rope_dim), bias=False)
        self.kv_norm = nn.RMSNorm(kv_rank, eps=eps)
        self.W_ukv = nn.Linear(kv_rank, heads * (nope_dim + v_dim), bias=False)
        self.W_o = nn.Linear(heads * v_dim, d_model, bias=False)

    def queries(self, x):
        b, n, _ = x.shape
        return self.W_q(x).view(b, n, self.heads, -1).transpose(1, 2).split([self.nope, self.rope], dim=-1)

    def latents(self, x):
        c_kv, k_rope = self.W_dkv(x).split([self.kv_rank, self.W_dkv.out_features - self.kv_rank], dim=-1)
        return self.kv_norm(c_kv), k_rope

    def cos_sin(self, start, new, width=None):
        width = width or self.rope
        inv = 1.0 / self.theta ** (torch.arange(0, width, 2).float() / width)
        freqs = torch.outer(torch.arange(start, start + new).float(), inv).repeat_interleave(2, dim=-1)
        return freqs.cos(), freqs.sin()

    @staticmethod
    def pairs(t):
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)

    def rotate(self, t, start, width=None):
        cos, sin = self.cos_sin(start, t.shape[-2], width)
        return t * cos + self.pairs(t) * sin

    def heads_of(self, c_kv):
        b, n, _ = c_kv.shape
        return self.W_ukv(c_kv).view(b, n, self.heads, -1).transpose(1, 2).split([self.nope, self.v_dim], dim=-1)

    def attend(self, q, k, v, scale=None):
        new, total = q.shape[-2], k.shape[-2]
        mask = torch.ones(new, total, dtype=torch.bool).tril(diagonal=total - new)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return self.W_o(out.transpose(1, 2).flatten(2))

    def step(self, x, cache, scale=None, start=None, rope_first=False):
        past = 0 if cache is None else cache[0].shape[1]
        q_nope, q_rope = self.queries(x)
        c_kv, k_rope = self.latents(x)
        first = past if start is None else start
        q_rope, k_rope = self.rotate(q_rope, first), self.rotate(k_rope, first)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], 1), torch.cat([cache[1], k_rope], 1)
        k_nope, v = self.heads_of(c_kv)
        shared = k_rope[:, None].expand(-1, self.heads, -1, -1)
        k = torch.cat([shared, k_nope] if rope_first else [k_nope, shared], -1)
        return self.attend(torch.cat([q_nope, q_rope], -1), k, v, scale), (c_kv, k_rope)


class SdpaLatent(_Latent):
    """torch's RMSNorm and scaled_dot_product_attention, the pairs rotated by even/odd slices."""

    def forward(self, x, cache=None):
        return self.step(x, cache)


class TransformersLatent(_Latent):
    """transformers' way: the pairs as complex numbers times e^(i m theta), the cache (batch, 1, positions, d)."""

    def forward(self, x, cache=None):
        b, n, _ = x.shape
        past = 0 if cache is None else cache[0].shape[2]
        q_nope, q_pe = self.queries(x)
        c_kv, k_pe = self.latents(x)
        inv = 1.0 / self.theta ** (torch.arange(0, self.rope, 2).float() / self.rope)
        freqs = torch.polar(torch.ones(n, self.rope // 2), torch.outer(torch.arange(past, past + n).float(), inv))

        def rotate(t):
            pairs = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
            return torch.view_as_real(pairs * freqs).flatten(-2)
        q_pe, k_pe = rotate(q_pe.contiguous()), rotate(k_pe.view(b, 1, n, self.rope).contiguous())
        c_kv = c_kv.view(b, 1, n, self.kv_rank)
        if cache is not None:
            c_kv, k_pe = torch.cat([cache[0], c_kv], 2), torch.cat([cache[1], k_pe], 2)
        k_nope, v = self.heads_of(c_kv[:, 0])
        k = torch.cat([k_nope, k_pe.expand(-1, self.heads, -1, -1)], -1)
        q = torch.cat([q_nope, q_pe], -1)
        weights = (q @ k.transpose(-1, -2) * (self.nope + self.rope) ** -0.5)
        total = k.shape[-2]
        weights = weights + torch.full((n, total), float("-inf")).triu(total - n + 1)
        out = weights.softmax(-1) @ v
        return self.W_o(out.transpose(1, 2).reshape(b, n, -1)), (c_kv, k_pe)


class AbsorbedLatent(_Latent):
    """The absorbed form (DeepSeek-V2, section 2.1.2): W_UK folded into the query, W_UV after the weights; the
    heads' keys and values are never built."""

    def forward(self, x, cache=None):
        b, n, _ = x.shape
        past = 0 if cache is None else cache[0].shape[1]
        q_nope, q_rope = self.queries(x)
        c_kv, k_rope = self.latents(x)
        q_rope, k_rope = self.rotate(q_rope, past), self.rotate(k_rope, past)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], 1), torch.cat([cache[1], k_rope], 1)
        W = self.W_ukv.weight.view(self.heads, self.nope + self.v_dim, self.kv_rank)
        W_uk, W_uv = W[:, :self.nope], W[:, self.nope:]                       # (heads, nope, kv_rank), ...
        q_latent = torch.einsum("bhnd,hdr->bhnr", q_nope, W_uk)              # the query in the latent space
        scores = (torch.einsum("bhnr,btr->bhnt", q_latent, c_kv)
                  + torch.einsum("bhnd,btd->bhnt", q_rope, k_rope)) / math.sqrt(self.nope + self.rope)
        total = c_kv.shape[1]
        scores = scores.masked_fill(torch.ones(n, total, dtype=torch.bool).triu(total - n + 1), float("-inf"))
        mixed = torch.einsum("bhnt,btr->bhnr", scores.softmax(-1), c_kv)     # weights over the latents
        out = torch.einsum("bhnr,hvr->bnhv", mixed, W_uv).reshape(b, n, -1)
        return self.W_o(out), (c_kv, k_rope)


class LlamaHalves(_Latent):
    """notebook 15's RoPE reused: rotate_half."""

    def rotate(self, t, start, width=None):
        inv = 1.0 / self.theta ** (torch.arange(0, self.rope, 2).float() / self.rope)
        freqs = torch.outer(torch.arange(start, start + t.shape[-2]).float(), inv)
        emb = torch.cat([freqs, freqs], -1)
        x1, x2 = t.chunk(2, dim=-1)
        return t * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()

    def forward(self, x, cache=None):
        return self.step(x, cache)


class FullCache(_Latent):
    """Caches every head's keys and values, as notebook 15's Attention did."""

    def forward(self, x, cache=None):
        past = 0 if cache is None else cache[0].shape[2]
        q_nope, q_rope = self.queries(x)
        c_kv, k_rope = self.latents(x)
        q_rope, k_rope = self.rotate(q_rope, past), self.rotate(k_rope, past)
        k_nope, v = self.heads_of(c_kv)
        k = torch.cat([k_nope, k_rope[:, None].expand(-1, self.heads, -1, -1)], -1)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        return self.attend(torch.cat([q_nope, q_rope], -1), k, v), (k, v)


class RopeKeyPerHead(_Latent):
    """A RoPE key for each head: W_dkv of kv_rank + heads * rope_dim rows."""

    def __init__(self, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta=10000.0, eps=1e-6):
        super().__init__(d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta, eps,
                         rope_width=heads * rope_dim)

    def forward(self, x, cache=None):
        return self.step(x, cache)


class ScaledByNope(_Latent):
    def forward(self, x, cache=None):
        return self.step(x, cache, scale=1 / math.sqrt(self.nope))


class NoLatentNorm(_Latent):
    def latents(self, x):
        return self.W_dkv(x).split([self.kv_rank, self.rope], dim=-1)

    def forward(self, x, cache=None):
        return self.step(x, cache)


class PositionsFromZero(_Latent):
    def forward(self, x, cache=None):
        return self.step(x, cache, start=0)


class RopeFirstKeys(_Latent):
    def forward(self, x, cache=None):
        return self.step(x, cache, rope_first=True)


class RopeOnWholeHead(_Latent):
    """RoPE on the whole head, the keys rotated when read from the cache."""

    def forward(self, x, cache=None):
        past = 0 if cache is None else cache[0].shape[1]
        q_nope, q_rope = self.queries(x)
        c_kv, k_rope = self.latents(x)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], 1), torch.cat([cache[1], k_rope], 1)
        k_nope, v = self.heads_of(c_kv)
        width = self.nope + self.rope
        k = self.rotate(torch.cat([k_nope, k_rope[:, None].expand(-1, self.heads, -1, -1)], -1), 0, width)
        q = self.rotate(torch.cat([q_nope, q_rope], -1), past, width)
        return self.attend(q, k, v), (c_kv, k_rope)


# ---------------------------------------------------------------- SinkCache (StreamingLLM)

def _rope(x, positions, theta):
    """RoPE, halves layout, at the given positions (a learner's helper, written with chunk and outer)."""
    inv = 1.0 / theta ** (torch.arange(0, x.shape[-1], 2).float() / x.shape[-1])
    emb = torch.outer(torch.as_tensor(positions).float(), inv).repeat(1, 2)
    x1, x2 = x.chunk(2, dim=-1)
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


class _Sinks:
    """What the cases below share: the checks, and attention over the cache rotated at given positions."""

    def __init__(self, n_sink, window, rope_theta=10000.0):
        if n_sink < 0 or window < 1:
            raise ValueError("n_sink >= 0, window >= 1")
        self.n_sink, self.window, self.theta = n_sink, window, rope_theta
        self.keys = self.values = None

    def _checked(self, q, k, v):
        b, h, n, d = q.shape
        if n != 1 or k.shape != v.shape or k.shape[0] != b or k.shape[2:] != (1, d) or h % k.shape[1]:
            raise ValueError("bad shapes")

    def _joined(self, k, v, evict_past, recent):
        """The cache with k and v appended; past ``evict_past`` tokens, the first n_sink and the last ``recent``."""
        keys = k if self.keys is None else torch.cat([self.keys, k], 2)
        values = v if self.values is None else torch.cat([self.values, v], 2)
        if keys.shape[2] > evict_past:
            keys = torch.cat([keys[:, :, :self.n_sink], keys[:, :, keys.shape[2] - recent:]], 2)
            values = torch.cat([values[:, :, :self.n_sink], values[:, :, values.shape[2] - recent:]], 2)
        self.keys, self.values = keys, values
        return keys, values

    def _attend(self, q, keys, values, key_positions, query_position):
        group = q.shape[1] // keys.shape[1]
        keys = _rope(keys, key_positions, self.theta).repeat_interleave(group, 1)
        scores = _rope(q, [query_position], self.theta) @ keys.transpose(-1, -2) * q.shape[-1] ** -0.5
        return F.softmax(scores, dim=-1) @ values.repeat_interleave(group, 1)


class DequeSinks(_Sinks):
    """The sinks in a list, the window in a deque(maxlen=window) of single tokens; keys and values joined."""

    def __init__(self, n_sink, window, rope_theta=10000.0):
        super().__init__(n_sink, window, rope_theta)
        self.sinks, self.recent = [], deque(maxlen=window)

    def attend(self, q, k, v):
        self._checked(q, k, v)
        (self.sinks if len(self.sinks) < self.n_sink else self.recent).append((k, v))
        tokens = self.sinks + list(self.recent)
        self.keys = torch.cat([t[0] for t in tokens], dim=2)
        self.values = torch.cat([t[1] for t in tokens], dim=2)
        n = self.keys.shape[2]
        return self._attend(q, self.keys, self.values, range(n), n - 1)


class IndexedSinks(_Sinks):
    """Eviction by index arithmetic: the positions to keep as one index tensor, index_select; the attention
    by einsum with a -inf-free softmax written out."""

    def attend(self, q, k, v):
        self._checked(q, k, v)
        keys = k if self.keys is None else torch.cat([self.keys, k], 2)
        values = v if self.values is None else torch.cat([self.values, v], 2)
        n = keys.shape[2]
        keep = torch.cat([torch.arange(min(self.n_sink, n)), torch.arange(max(min(self.n_sink, n), n - self.window), n)])
        self.keys, self.values = keys.index_select(2, keep), values.index_select(2, keep)
        m = self.keys.shape[2]
        group = q.shape[1] // k.shape[1]
        rotated = _rope(self.keys, range(m), self.theta)
        rotated = rotated[:, torch.arange(q.shape[1]) // group]
        scores = torch.einsum("bhqd,bhkd->bhqk", _rope(q, [m - 1], self.theta), rotated) / math.sqrt(q.shape[-1])
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        weights = weights / weights.sum(-1, keepdim=True)
        return torch.einsum("bhqk,bhkd->bhqd", weights, self.values[:, torch.arange(q.shape[1]) // group])


class RolledSinks(_Sinks):
    """A fixed buffer of n_sink + window slots filled in place; when full, the window's part is rolled left by one
    (torch.roll) and the new token written in the last slot. float64 inside."""

    def attend(self, q, k, v):
        self._checked(q, k, v)
        size = self.n_sink + self.window
        if self.keys is None:
            self.buffer = [torch.zeros(k.shape[:2] + (size, k.shape[3]), dtype=torch.float64) for _ in "kv"]
            self.filled = 0
        if self.filled == size:
            for buf, new in zip(self.buffer, (k, v)):
                buf[:, :, self.n_sink:] = torch.roll(buf[:, :, self.n_sink:], -1, dims=2)
                buf[:, :, -1:] = new
        else:
            for buf, new in zip(self.buffer, (k, v)):
                buf[:, :, self.filled:self.filled + 1] = new
            self.filled += 1
        self.keys, self.values = (buf[:, :, :self.filled].float() for buf in self.buffer)
        return self._attend(q.double(), self.buffer[0][:, :, :self.filled], self.buffer[1][:, :, :self.filled],
                            range(self.filled), self.filled - 1).float()


class WindowAlone(_Sinks):
    """deque(maxlen=n_sink + window): the oldest token evicted, sinks and all."""

    def __init__(self, n_sink, window, rope_theta=10000.0):
        super().__init__(n_sink, window, rope_theta)
        self.tokens = deque(maxlen=n_sink + window)

    def attend(self, q, k, v):
        self.tokens.append((k, v))
        self.keys, self.values = (torch.cat([t[i] for t in self.tokens], 2) for i in (0, 1))
        n = self.keys.shape[2]
        return self._attend(q, self.keys, self.values, range(n), n - 1)


class SinksInWindow(_Sinks):
    """At most `window` tokens in all: the sinks, then window - n_sink recent."""

    def attend(self, q, k, v):
        keys, values = self._joined(k, v, self.window, self.window - self.n_sink)
        n = keys.shape[2]
        return self._attend(q, keys, values, range(n), n - 1)


class TextPositions(_Sinks):
    """The keys rotated at their positions in the stream (a counter), Mistral-style."""

    def attend(self, q, k, v):
        self.seen = getattr(self, "seen", 0) + 1
        keys, values = self._joined(k, v, self.n_sink + self.window, self.window)
        n = keys.shape[2]
        where = list(range(min(self.n_sink, n))) + list(range(self.seen - (n - min(self.n_sink, n)), self.seen))
        return self._attend(q, keys, values, where, self.seen - 1)


class RotatedThenRotatedAgain(_Sinks):
    """Each key rotated at its place when it comes, cached so, and rotated again at 0 ... n - 1 when read."""

    def attend(self, q, k, v):
        place = 0 if self.keys is None else min(self.keys.shape[2], self.n_sink + self.window - 1)
        k = _rope(k, [place], self.theta)
        keys, values = self._joined(k, v, self.n_sink + self.window, self.window)
        n = keys.shape[2]
        return self._attend(q, keys, values, range(n), n - 1)


class QueryOnePast(_Sinks):
    """The query rotated at the cache's length (where the next token would go)."""

    def attend(self, q, k, v):
        keys, values = self._joined(k, v, self.n_sink + self.window, self.window)
        n = keys.shape[2]
        return self._attend(q, keys, values, range(n), n)


class EvictsNewest(_Sinks):
    """Slices the first n_sink + window tokens: once full, nothing new gets in."""

    def attend(self, q, k, v):
        keys = k if self.keys is None else torch.cat([self.keys, k], 2)
        values = v if self.values is None else torch.cat([self.values, v], 2)
        self.keys, self.values = keys[:, :, :self.n_sink + self.window], values[:, :, :self.n_sink + self.window]
        n = self.keys.shape[2]
        return self._attend(q, self.keys, self.values, range(n), n - 1)


class WindowPlusOne(_Sinks):
    """`if length >= n_sink + window` ... keeps window - 1 recent tokens: off by one."""

    def attend(self, q, k, v):
        keys, values = self._joined(k, v, self.n_sink + self.window - 1, self.window - 1)
        n = keys.shape[2]
        return self._attend(q, keys, values, range(n), n - 1)


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
    "serving-LatentAttention": [
        (LlamaHalves, "RoPE rotates the halves"),
        (FullCache, "multi-head latent attention caches kv_rank + rope_dim"),
        (RopeKeyPerHead, "one RoPE key shared by all heads (not one per head)"),
        (ScaledByNope, "divided by sqrt(nope_dim)"),
        (NoLatentNorm, "the latent is not normalized"),
        (PositionsFromZero, "rotated from position 0 again"),
        (RopeFirstKeys, "the keys are [k_rope, k_nope]"),
        (RopeOnWholeHead, "RoPE rotates each whole head"),
    ],
    "serving-SinkCache": [
        (WindowAlone, "the oldest token is evicted, the sinks with it"),
        (SinksInWindow, "the sinks are counted inside the window"),
        (TextPositions, "the keys are rotated at their positions in the stream"),
        (RotatedThenRotatedAgain, "the keys are rotated twice"),
        (QueryOnePast, "the query is rotated at the cache's length"),
        (EvictsNewest, "keeps its first n_sink + window tokens and drops the new"),
        (WindowPlusOne, "the cache keeps window - 1 recent tokens"),
    ],
}

VARIANTS = {
    "serving-PagedKVCache": [TokenByToken, DequeFreeList, IndexSelectGather],
    "serving-speculative_step": [with_min_and_counting, vectorised],
    "serving-LatentAttention": [SdpaLatent, TransformersLatent, AbsorbedLatent],
    "serving-SinkCache": [DequeSinks, IndexedSinks, RolledSinks],
}

globals().update(shared_tests("serving", MISTAKES, VARIANTS, solutions="serving_notebook", seeds=3))
