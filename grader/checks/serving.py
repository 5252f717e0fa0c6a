"""Hidden checks of notebook 16, serving: how a decoder is served.

Section 1, the paged KV cache: ``PagedKVCache`` is a class: ``coursekit/drivers/serving.py``
builds the learner's cache and runs a script of appends, gathers and frees on it, handing back every gather's keys and values, the same
positions read from the pool (``key_blocks``, ``value_blocks``) through the block table, and, after
each operation, the blocks in use (num_blocks - len(free_blocks)), the blocks the live tables hold
and how many distinct blocks they hold. The reference is ``reference/serving.py``.

The scripts interleave several sequences of random lengths (appends of 1 to 2 * block_size + 1
tokens, some ending exactly at a block's end), free some and append again so that freed blocks are
reused, and gather every live sequence: a contiguous reference (the keys appended to a sequence,
in order) is what every gather must give, whatever order the free list hands blocks out in. One
call runs the pool out of blocks (RuntimeError), one gathers a freed sequence (KeyError).

Section 2, speculative decoding: ``speculative_step``, one step of speculative sampling (Leviathan
et al. 2023, Algorithm 1; Chen et al. 2023). The driver (``coursekit/drivers/serving.py``) calls
the learner's function with a ``torch.Generator`` seeded by the grader, whose k + 1 uniforms the
docstring fixes (``torch.rand(k + 1, generator=generator, dtype=torch.float64)``, first), so
each seeded call has one right output. One more call asks for the exact distribution of the
step's output on a vocabulary of 3 tokens with k = 2: the driver enumerates the 9 draft sequences
and, for each, the accept/reject branches and the last token's inverse CDF, by bisection on
uniforms it chooses (no sampling); the reference's equals the target's (its first token is p[0]'s).
Sizes differ (k from 1 to 5, V from 5 to 7); every distribution has no zero, so every
token can be drafted and every ratio p/q is finite.

Section 3, multi-head latent attention: ``LatentAttention`` is a module: the driver of
``coursekit/drivers/serving.py`` builds the learner's class, loads the weights drawn here by name
(``W_q``, ``W_dkv``, ``kv_norm``, ``W_ukv``, ``W_o``) and feeds the tokens chunk by chunk with the
cache. The reference, ``reference/serving.py``, is the computation of transformers'
``DeepseekV2Attention`` (q_lora_rank None); the notebook matches the learner's module to it weight
for weight.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from coursekit.probe import collect

from ..wire import decode_payload
from ._core import Call, CheckFailed, Knob, Mistake, Raises, Rule, Spec, _equal, catalogued, judge_case
from .modern_decoder import _weight
from .reference import modern_decoder as modern
from .reference import serving as ref

APPEND, GATHER, FREE = 0, 1, 2
PARTS = ("gathered keys", "gathered values", "keys in the pool", "values in the pool", "block counts")


# ---------------------------------------------------------------- inputs

def _script(rng, budget, block_size, sequences, operations):
    """A script that never holds more than ``budget`` blocks: (rows (op, seq, n), total tokens appended)."""
    lengths, rows, total, next_seq = {}, [], 0, sequences
    live = list(range(sequences))
    free = budget
    for step in range(operations):
        seq = int(rng.choice(live))
        length = lengths.get(seq, 0)
        if rng.random() < 0.5:            # to the end of the last block exactly, or past it
            n = block_size - length % block_size + (block_size * int(rng.integers(0, 2)) if length % block_size
                                                     else int(rng.integers(0, 2)))
        else:
            n = int(rng.integers(1, 2 * block_size + 2))
        need = -(-(length + n) // block_size) - -(-length // block_size)
        if need > free or (step % 6 == 5 and length):
            if not length:                # a new sequence that does not fit: free the longest one first
                seq = max(lengths, key=lengths.get)
                length = lengths[seq]
            rows += [(GATHER, seq, 0), (FREE, seq, 0)]
            free += -(-length // block_size)
            lengths.pop(seq, None)
            live.remove(seq)
            live.append(next_seq)
            next_seq += 1
            continue
        rows += [(APPEND, seq, n), (GATHER, seq, 0)]
        free -= need
        lengths[seq] = length + n
        total += n
    for seq in sorted(lengths):
        rows.append((GATHER, seq, 0))
    return np.array(rows, dtype=np.int64), total


def _call(rng, num_blocks, block_size, heads, d_k, script, total, what, raises=""):
    keys = rng.normal(size=(heads, total, d_k)).astype(np.float32)
    values = rng.normal(size=(heads, total, d_k)).astype(np.float32)
    return Call((num_blocks, block_size, heads, d_k, script, keys, values), what=what, raises=raises)


def _paged_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # 1. block_size 4, 3 sequences at a time, within 12 blocks, 2 heads, d_k 3; 2. block_size 3, 4 sequences, 16.
    # The script keeps at most `budget` blocks in use; the pool is larger, so that a cache that takes too many
    # blocks (or never gives them back) answers every operation, and its counts show it.
    for budget, block_size, sequences, operations in [(12, 4, 3, 30), (16, 3, 4, 36)]:
        script, total = _script(rng, budget, block_size, sequences, operations)
        num_blocks = total // block_size + int(np.sum(script[:, 0] == APPEND)) + 2
        calls.append(_call(rng, num_blocks, block_size, 2, 3, script, total,
                           f"PagedKVCache({num_blocks}, block_size={block_size}, heads=2, d_k=3) with "
                           f"{sequences} sequences appended, gathered, freed and reused at random"))
    # 3. the pool filled exactly, twice (3 blocks of 2): no error while the free blocks are just enough.
    full = np.array([(APPEND, 0, 4), (APPEND, 1, 2), (GATHER, 0, 0), (GATHER, 1, 0), (FREE, 0, 0), (APPEND, 1, 3),
                     (GATHER, 1, 0)])
    calls.append(_call(rng, 3, 2, 2, 3, full, 9, "PagedKVCache(3, block_size=2, heads=2, d_k=3) filled to its last "
                                                 "block, twice"))
    # 4. more tokens than the pool holds: 4 blocks of 2, sequence 0 takes 3, sequence 1 asks for 2 (RuntimeError).
    calls.append(_call(rng, 4, 2, 2, 3, np.array([(APPEND, 0, 5), (APPEND, 1, 3)]), 8,
                       "PagedKVCache(4, block_size=2, ...) asked for more blocks than are free", "RuntimeError"))
    # 5. a sequence gathered after it was freed (KeyError).
    calls.append(_call(rng, 4, 2, 2, 3, np.array([(APPEND, 0, 3), (FREE, 0, 0), (GATHER, 0, 0)]), 3,
                       "PagedKVCache.gather of a sequence that was freed", "KeyError"))
    return calls


def _ops(call, kind):
    return [row for row in np.asarray(call.args[4]).tolist() if row[0] == kind]


def _spans(call) -> bool:
    """Some append writes into more than one block (its tokens cross a block's end)."""
    block_size, lengths = call.args[1], {}
    for op, seq, n in np.asarray(call.args[4]).tolist():
        if op == APPEND:
            start = lengths.get(seq, 0)
            if start // block_size != (start + n - 1) // block_size and n > block_size:
                return True
            lengths[seq] = start + n
        elif op == FREE:
            lengths.pop(seq, None)
    return False


def _ends_at_block_end(call) -> bool:
    block_size, lengths = call.args[1], {}
    for op, seq, n in np.asarray(call.args[4]).tolist():
        if op == APPEND:
            lengths[seq] = lengths.get(seq, 0) + n
            if lengths[seq] % block_size == 0 and not call.raises:
                return True
        elif op == FREE:
            lengths.pop(seq, None)
    return False


def _reused(call) -> bool:
    """An append comes after a free (the freed blocks are handed out again)."""
    rows = np.asarray(call.args[4]).tolist()
    first_free = next((i for i, row in enumerate(rows) if row[0] == FREE), None)
    return first_free is not None and any(row[0] == APPEND for row in rows[first_free:]) and not call.raises


# ---------------------------------------------------------------- mistakes (learner-style)

def _take(cache, table, length):
    """Blocks from the free list onto ``table`` until it holds ``length`` tokens (RuntimeError if too few)."""
    needed = -(-length // cache.block_size) - len(table)
    if needed > len(cache.free_blocks):
        raise RuntimeError("out of blocks")
    for _ in range(needed):
        table.append(cache.free_blocks.pop())


def _write(cache, seq, table, length, k, v):
    """k and v written at positions length ... through ``table``, as the reference does."""
    for i in range(k.shape[1]):
        block, offset = table[(length + i) // cache.block_size], (length + i) % cache.block_size
        cache.key_blocks[block, :, offset] = k[:, i]
        cache.value_blocks[block, :, offset] = v[:, i]
    cache.lengths[seq] = length + k.shape[1]


class _NewBlockEveryAppend(ref.PagedKVCache):
    def append(self, seq, k, v):
        length = self.lengths.get(seq, 0)
        table = self.block_tables.setdefault(seq, [])
        if not self.free_blocks:
            raise RuntimeError("out of blocks")
        table.append(self.free_blocks.pop())              # one block per append, full or not
        while len(table) * self.block_size < length + k.shape[1]:
            if not self.free_blocks:
                raise RuntimeError("out of blocks")
            table.append(self.free_blocks.pop())
        _write(self, seq, table, length, k, v)


def _per_token(boundary):
    """append token by token, a new block when ``boundary(position, block_size)``."""
    class PagedKVCache(ref.PagedKVCache):
        def append(self, seq, k, v):
            length = self.lengths.get(seq, 0)
            table = self.block_tables.setdefault(seq, [])
            for i in range(k.shape[1]):
                pos = length + i
                if boundary(pos, self.block_size):
                    if not self.free_blocks:
                        raise RuntimeError("out of blocks")
                    table.append(self.free_blocks.pop())
                block, offset = table[-1], pos % self.block_size
                self.key_blocks[block, :, offset] = k[:, i]
                self.value_blocks[block, :, offset] = v[:, i]
            self.lengths[seq] = length + k.shape[1]
    return PagedKVCache


_EarlyBoundary = _per_token(lambda pos, size: pos % size == size - 1 or pos == 0)   # a block before the last is full
_LateBoundary = _per_token(lambda pos, size: pos % size == 1 or pos == 0)           # the first token of a block lands in the full one


class _Swapped(ref.PagedKVCache):
    def append(self, seq, k, v):
        length = self.lengths.get(seq, 0)
        table = self.block_tables.get(seq, [])
        _take(self, table, length + k.shape[1])
        for i in range(k.shape[1]):
            # offset and block index swapped
            offset, block = divmod(length + i, self.block_size)
            self.key_blocks[table[block % len(table)], :, offset % self.block_size] = k[:, i]
            self.value_blocks[table[block % len(table)], :, offset % self.block_size] = v[:, i]
        self.block_tables[seq] = table
        self.lengths[seq] = length + k.shape[1]


class _SortedGather(ref.PagedKVCache):
    def gather(self, seq):
        table, length = sorted(self.block_tables[seq]), self.lengths[seq]       # by block id, not in table order
        heads, d_k = self.key_blocks.shape[1], self.key_blocks.shape[3]
        keys = self.key_blocks[table].transpose(0, 1).reshape(heads, -1, d_k)[:, :length]
        values = self.value_blocks[table].transpose(0, 1).reshape(heads, -1, d_k)[:, :length]
        return keys, values


class _FreeKeepsBlocks(ref.PagedKVCache):
    def free(self, seq):
        del self.block_tables[seq]                       # the blocks never go back to the free list
        del self.lengths[seq]


class _FreeTwice(ref.PagedKVCache):
    def free(self, seq):
        self.free_blocks.extend(self.block_tables[seq])  # back to the free list ...
        self.free_blocks.extend(self.block_tables.pop(seq))   # ... twice
        del self.lengths[seq]


class _KeysValuesSwapped(ref.PagedKVCache):
    def gather(self, seq):
        keys, values = super().gather(seq)
        return values, keys


class _Contiguous(ref.PagedKVCache):
    """A growing tensor per sequence; the pool's blocks are allocated but never written."""

    def append(self, seq, k, v):
        length = self.lengths.get(seq, 0)
        table = self.block_tables.get(seq, [])
        _take(self, table, length + k.shape[1])
        self.block_tables[seq] = table
        self.lengths[seq] = length + k.shape[1]
        if not hasattr(self, "buffers"):
            self.buffers = {}
        old = self.buffers.get(seq)
        self.buffers[seq] = (k.clone(), v.clone()) if old is None else (
            __import__("torch").cat([old[0], k], dim=1), __import__("torch").cat([old[1], v], dim=1))

    def gather(self, seq):
        self.lengths[seq]
        return self.buffers[seq]


class _NoPoolCheck(ref.PagedKVCache):
    def append(self, seq, k, v):
        length = self.lengths.get(seq, 0)
        table = self.block_tables.setdefault(seq, [])
        while len(table) * self.block_size < length + k.shape[1]:
            table.append(self.free_blocks.pop())             # IndexError on an empty free list
        _write(self, seq, table, length, k, v)


_NoFirstBlock = _per_token(lambda pos, size: pos % size == 0 and pos > 0)        # a new sequence gets no block


class _NoNewSequence(ref.PagedKVCache):
    def append(self, seq, k, v):
        if not self.block_tables:                             # only the first sequence is started
            self.block_tables[seq], self.lengths[seq] = [], 0
        length, table = self.lengths[seq], self.block_tables[seq]
        _take(self, table, length + k.shape[1])
        _write(self, seq, table, length, k, v)


# ---------------------------------------------------------------- the judge

def _segments(call):
    """(row index, seq, start, length) of every gather, start along the gathered axis."""
    lengths, start, out = {}, 0, []
    for i, (op, seq, n) in enumerate(np.asarray(call.args[4]).tolist()):
        if op == APPEND:
            lengths[seq] = lengths.get(seq, 0) + n
        elif op == GATHER:
            out.append((i, seq, start, lengths.get(seq, 0)))
            start += lengths.get(seq, 0)
        else:
            lengths.pop(seq, None)
    return out


def _before(call, row):
    """What came before operation ``row``, in words (no values)."""
    rows = np.asarray(call.args[4]).tolist()
    earlier = rows[:row]
    if any(op == FREE for op, _, _ in earlier):
        return "after a free, when freed blocks are handed out again"
    return "before any sequence was freed"


def _first_difference(case) -> str:
    call, got, want = case.call, case.answer, case.expected
    counts, right = np.asarray(got[4]), np.asarray(want[4])
    if counts.shape == right.shape and not np.array_equal(counts, right):
        row = int(np.argwhere(np.any(counts != right, axis=1))[0][0])
        op = ("an append", "a gather", "a free")[int(np.asarray(call.args[4])[row][0])]
        in_use, held, distinct = (int(x) for x in counts[row])
        if distinct < held:
            return (f"{case.what}: after {op}, two live sequences (or two places of one block table) hold the "
                    f"same block: a block may belong to one sequence at a time, taken off the free list once")
        if held != int(right[row][1]):
            return (f"{case.what}: after {op}, the block tables hold {held} blocks where the live sequences need "
                    f"{int(right[row][1])}, the sum of ceil(length / block_size): a sequence gets a new block only "
                    f"when its last block is full, and free gives all its blocks back")
        return (f"{case.what}: after {op}, num_blocks - len(free_blocks) is {in_use} where {int(right[row][0])} "
                f"blocks are in use: every block is either in one live sequence's table or on the free list")
    for part in range(4):
        a, b = np.asarray(got[part], dtype=np.float64), np.asarray(want[part], dtype=np.float64)
        if a.shape != b.shape or np.allclose(a, b, rtol=case.spec.rtol, atol=case.spec.atol):
            continue
        for row, seq, start, length in _segments(call):
            x, y = a[:, start:start + length], b[:, start:start + length]
            if np.allclose(x, y, rtol=case.spec.rtol, atol=case.spec.atol):
                continue
            bad = np.flatnonzero(~np.all(np.isclose(x, y, rtol=case.spec.rtol, atol=case.spec.atol), axis=(0, 2)))
            size = int(call.args[1])
            where = ("at the first position of a block" if np.all(bad % size == 0) else
                     "inside blocks" if not np.any(bad < size) else "from the sequence's first block on")
            moved = sorted(map(tuple, np.round(x.transpose(1, 0, 2).reshape(length, -1), 5).tolist())) == \
                sorted(map(tuple, np.round(y.transpose(1, 0, 2).reshape(length, -1), 5).tolist()))
            if part < 2:
                told = (f"gather's {('keys', 'values')[part]} are the tokens appended, but not in the order they "
                        f"were appended" if moved else
                        f"gather's {('keys', 'values')[part]} differ from the tokens appended to that sequence, in "
                        f"order, {where}")
                return (f"{case.what}: {told} ({_before(call, row)}): position p of a sequence is in block "
                        f"block_tables[seq][p // block_size], at offset p % block_size")
            return (f"{case.what}: the pool ({('key_blocks', 'value_blocks')[part - 2]}) read through the block "
                    f"table, position p at block block_tables[seq][p // block_size] and offset p % block_size, "
                    f"does not hold the tokens appended {where} ({_before(call, row)}): write each new token into "
                    f"the pool there, and gather from it")
    return ""


def _judge_paged(case) -> None:
    """The default judgement for errors and shapes; a wrong value is described by the first operation
    after which the counts, a gather or the pool differ (not by positions of the concatenated answer)."""
    answer, expected = case.answer, case.expected
    if (case.call.raises or not isinstance(answer, tuple) or len(answer) != len(PARTS)
            or any(np.shape(a) != np.shape(b) for a, b in zip(answer, expected))):
        return judge_case(case)
    if _equal(answer, expected, case.spec.rtol, case.spec.atol):
        return
    found = catalogued(case, answer)
    if found:
        case.fail(found)
    said = _first_difference(case)
    if said:
        raise CheckFailed(said)
    judge_case(case)


PAGED_KV_CACHE = Spec(
    id="serving-PagedKVCache",
    function="PagedKVCache",
    inputs=_paged_inputs,
    reference=ref.PagedKVCache,
    driver="serving.drive_paged_kv_cache",
    parts=PARTS,
    order=(4, 0, 1, 2, 3),
    judge=_judge_paged,
    rules=(
        Rule("an append spanning more than one block", _spans),
        Rule("an append ending exactly at a block's end", _ends_at_block_end),
        Rule("freed blocks reused by later appends", _reused),
        Rule("several sequences interleaved", lambda call: len({row[1] for row in _ops(call, APPEND)}) >= 3),
        Rule("an append that takes the last free blocks (no error)",
             lambda call: not call.raises and call.args[0] == 3),
        Rule("the pool out of blocks (RuntimeError)", lambda call: call.raises == "RuntimeError"),
        Rule("an unknown sequence (KeyError)", lambda call: call.raises == "KeyError"),
    ),
    mistakes=(
        Mistake("new_block_every_append", "it takes a new block on every append, even when the sequence's last "
                "block still has room: take one only when the last block is full (length % block_size == 0)",
                _NewBlockEveryAppend),
        Mistake("boundary_early", "it takes a new block one token too early, when the last block still has one free "
                "place: position p goes into block p // block_size, a new one only when p % block_size == 0",
                _EarlyBoundary),
        Mistake("boundary_late", "it takes a new block one token too late: the first token of a new block is "
                "written into the full one; position p goes into block p // block_size, a new one when "
                "p % block_size == 0", _LateBoundary),
        Mistake("index_offset_swapped", "the block index and the offset are swapped: position p is in block "
                "block_tables[seq][p // block_size], at offset p % block_size", _Swapped),
        Mistake("sorted_table", "gather reads the blocks sorted by their id, not in the order of the block table: "
                "blocks come off the free list in any order, so the table's order is the sequence's order",
                _SortedGather),
        Mistake("free_keeps_blocks", "free does not give the sequence's blocks back to the free list: "
                "free_blocks.extend(block_tables.pop(seq))", _FreeKeepsBlocks),
        Mistake("free_twice", "free gives each block back twice: the free list then hands one block to two "
                "sequences", _FreeTwice),
        Mistake("keys_values_swapped", "gather returns (values, keys): it should return (keys, values)",
                _KeysValuesSwapped),
        Mistake("contiguous_buffer", "the tokens are kept in a tensor per sequence, not in the pool's blocks: "
                "write them into key_blocks and value_blocks, and gather from there", _Contiguous),
    ),
    errors=(
        Raises("{what}: it raised {error}; a full pool should raise RuntimeError (raise RuntimeError(...)), "
               "before taking any block", _NoPoolCheck, match="^(MemoryError|IndexError|ValueError)",
               when=lambda call: call.raises == "RuntimeError"),
        Raises("{what}: it raised {error}: a position's block is past the end of the sequence's block table; "
               "take a new block before writing position p when p % block_size == 0 (a new sequence too)",
               _NoFirstBlock, match="^IndexError", when=lambda call: not call.raises),
        Raises("{what}: it raised {error}: append must start a sequence it has not seen (a new id) with an empty "
               "block table and length 0, and record both in block_tables and lengths",
               _NoNewSequence, match="^KeyError", when=lambda call: not call.raises),
    ),
)


_ID = "serving-speculative_step"
_DRIVER = "serving.speculative"


def _spec_variant(rule="ratio", offset="same", residual="clamped", bonus="once", keep="prefix", draws="upfront"):
    """speculative_step with some of its choices wrong (the spec's knobs)."""

    def speculative_step(draft_tokens, q, p, generator):
        k, V = q.shape
        if tuple(draft_tokens.shape) != (k,) or tuple(p.shape) != (k + 1, V):
            raise ValueError("draft_tokens should be (k,), q (k, V) and p (k + 1, V)")
        x = draft_tokens.long()
        u = torch.rand(k + 1, generator=generator, dtype=torch.float64) if draws == "upfront" else None

        def uniform(i):
            return u[i] if u is not None else torch.rand((), generator=generator, dtype=torch.float64)

        def sample(w, normalise=True):
            v = u[k] if u is not None else torch.rand((), generator=generator, dtype=torch.float64)
            cdf = torch.cumsum(w, 0) / (w.sum() if normalise else 1.0)
            return torch.searchsorted(cdf, v.reshape(1), right=True).clamp(max=V - 1)

        kept, rejected = [], None
        for i in range(k):
            judge = min(i + 1, k) if offset == "next" else i
            if rule == "ratio":
                accept = bool(uniform(i) < p[judge, x[i]] / q[i, x[i]])
            elif rule == "inverted":
                accept = bool(uniform(i) < q[i, x[i]] / p[judge, x[i]])
            else:                                   # greedy: the draft token must be the target's argmax
                uniform(i)
                accept = bool(x[i] == torch.argmax(p[judge]))
            if accept:
                if rejected is None or keep == "all_accepted":
                    kept.append(x[i].reshape(1))
            elif rejected is None:
                rejected = i
                if keep == "prefix":
                    break
        if rejected is None:
            out = kept + ([] if bonus == "forgotten" else [sample(p[k])])
        else:
            judge = min(rejected + 1, k) if offset == "next" else rejected
            base = p[judge] if residual == "from_p" else p[judge] - q[rejected]
            w = base if residual == "unclamped" else torch.clamp(base, min=0)
            out = kept + [sample(w, normalise=residual != "unnormalised")]
            if bonus == "after_rejection":
                out.append(sample(p[k]))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

    return speculative_step


def _residual_row(shift):
    """The reference, its residual at a rejection at i taken from p[i + shift] (p[-1] is p[k])."""

    def speculative_step(draft_tokens, q, p, generator):
        k, V = q.shape
        u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
        x = draft_tokens.long()
        for i in range(k):
            if not u[i] < p[i, x[i]] / q[i, x[i]]:
                return torch.cat([x[:i], ref._inverse_cdf(torch.clamp(p[i + shift] - q[i], min=0), u[k])])
        return torch.cat([x, ref._inverse_cdf(p[k], u[k])])

    return speculative_step


_RESIDUAL_ROW = ("the residual at a rejection is taken from another row of p than the one that judged the "
                 "rejected draft: at a rejection of draft_tokens[i], sample from max(0, p[i] - q[i]), the same i")


def _distributions(rng, rows, V, near=None):
    """``rows`` distributions over V tokens, none below 0.015; ``near`` (rows, V): mostly those."""
    d = rng.dirichlet(np.full(V, 0.8), size=rows)
    if near is not None:
        d = 0.75 * near + 0.25 * d
    d = d + 0.02
    return d / d.sum(-1, keepdims=True)


def _step_call(rng, k, V, close=False):
    q = _distributions(rng, k, V)
    p = _distributions(rng, k + 1, V, near=np.vstack([q, q[-1:]]) if close else None)
    draft = np.array([rng.choice(V, p=row) for row in q], dtype=np.int64)
    return Call((draft, q, p, int(rng.integers(2 ** 31))), what=f"speculative_step with k={k} drafts over V={V} "
                                                                    "tokens (a seeded generator)")


def _answer(fn, call):
    return decode_payload(collect(_ID, fn, [call.call()], _DRIVER), _ID)[0]


def _length(call):
    return len(np.asarray(_answer(ref.speculative_step, call)))


_LAZY = _spec_variant(draws="lazy")


def _step_calls(rng: np.random.Generator) -> list[Call]:
    calls = [_step_call(rng, k, V) for k, V in [(1, 5), (2, 6), (3, 7), (4, 5), (5, 6)]]
    wanted = [lambda c: _length(c) == len(c.args[0]) + 1,             # all k accepted: the bonus token
              lambda c: 2 <= _length(c) < len(c.args[0]),               # a rejection after an acceptance
              lambda c: _length(c) == 1]                                # the first draft rejected
    for test, (k, V) in zip(wanted, [(3, 6), (4, 7), (3, 5)]):
        while True:
            call = _step_call(rng, k, V, close=test is wanted[0] or test is wanted[1])
            if test(call):
                calls.append(call)
                break
    while not any(not np.array_equal(np.asarray(_answer(_LAZY, c)), np.asarray(_answer(ref.speculative_step, c)))
                  for c in calls):
        calls.append(_step_call(rng, 4, 6))
    q = _distributions(rng, 2, 3)
    p = _distributions(rng, 3, 3)
    calls.append(Call((None, q, p, None), what="the exact distribution of speculative_step's output with k=2 drafts "
                                               "over V=3 tokens (every draft sequence and branch enumerated)"))
    draft = np.array([0, 1], dtype=np.int64)
    calls.append(Call((draft, _distributions(rng, 2, 5), _distributions(rng, 2, 5), 7), raises="ValueError",
                      what="speculative_step with p of shape (k, V): the target's k + 1 rows are needed"))
    return calls


def _exact(call):
    return call.args[3] is None and not call.raises


SPECULATIVE_STEP = Spec(
    id=_ID,
    function="speculative_step",
    driver=_DRIVER,
    inputs=_step_calls,
    reference=ref.speculative_step,
    variant=_spec_variant,
    mistakes=(
        Mistake("residual_next_row", _RESIDUAL_ROW, _residual_row(1)),
        Mistake("residual_previous_row", _RESIDUAL_ROW, _residual_row(-1)),
    ),
    equivalent=(
        ("L18 1 -> 2", "drawing k + 2 doubles leaves u[0], ..., u[k] as they were; the extra draw moves only the "
                       "generator's later numbers, which one step's output does not show (the visible test checks "
                       "that exactly k + 1 are drawn)"),
        ("L21 u[i] < p[i, x[i]] / q[i, x[i]] -> u[i] <= p[i, x[i]] / q[i, x[i]]",
         "they differ only when a uniform equals the ratio exactly, a probability-0 event no seed here meets "
         "(min(1, ratio) is the probability of acceptance either way)"),
    ),
    figures=(f"{_ID}-figure",),
    rules=(
        Rule("ValueError: p is not (k + 1, V)", lambda call: call.raises == "ValueError"),
        Rule("all k drafts accepted: the bonus token from p[k]",
             lambda call: not call.raises and not _exact(call) and _length(call) == len(call.args[0]) + 1),
        Rule("the first draft rejected", lambda call: not call.raises and not _exact(call) and _length(call) == 1),
        Rule("a rejection after an acceptance",
             lambda call: not call.raises and not _exact(call) and 2 <= _length(call) <= len(call.args[0])),
        Rule("the exact distribution of the output (the target's)", _exact),
    ),
    knobs=(
        Knob("rule", (
            ("inverted", "the acceptance ratio is inverted: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), "
                         "the target's probability over the draft's (u < p[i, x] / q[i, x])"),
            ("greedy", "a draft token is accepted only when it is the target's argmax: that is greedy verification, "
                       "which changes the distribution; accept x_i when u[i] < p_i(x_i) / q_i(x_i)"),
        )),
        Knob("offset", (("next", "p and the drafts are off by one: p[i] (the target's distribution before x_{i+1}, "
                                 "0-based draft_tokens[i]) judges draft_tokens[i], and the residual at a rejection "
                                 "is max(0, p[i] - q[i]) of that same i; p[k] is only for the bonus token"),)),
        Knob("residual", (
            ("unclamped", "the residual is not clamped at 0: sample from max(0, p_i - q_i), renormalised; p_i - q_i "
                          "has negative entries"),
            ("unnormalised", "the residual max(0, p_i - q_i) is not renormalised: its entries sum to less than 1, "
                             "divide the cumulative sum by its total before comparing it with u[k]"),
            ("from_p", "at a rejection the token is drawn from p_i itself: draw it from the residual "
                       "norm(max(0, p_i - q_i)), which removes the mass the draft already proposed"),
        )),
        Knob("bonus", (
            ("forgotten", "when all k drafts are accepted the bonus token is missing: draw one more from p[k], "
                          "so a step returns k + 1 tokens"),
            ("after_rejection", "a bonus token from p[k] is added after a rejection too: after the first rejection "
                                "the step ends with the residual's token; p[k] is used only when all k are accepted"),
        )),
        Knob("keep", (("all_accepted", "drafts accepted after the first rejection are kept: the step stops at the "
                                       "first rejection (the later drafts were drawn after a rejected token)"),)),
        Knob("draws", (("lazy", "the uniforms are not drawn as the docstring fixes: first and all at once, u = "
                                "torch.rand(k + 1, generator=generator, dtype=torch.float64), u[i] judges "
                                "draft_tokens[i] and u[k] picks the last token, whatever happens"),)),
    ),
)


# ---------------------------------------------------------------- LatentAttention (DeepSeek-V2's MLA)

def _latent_variant(pairing="interleaved", rope_on="rope", scale="qk", norm="cached", order="right",
                    positions="true", mask="bottom_right", project=True):
    """LatentAttention with some choices changed: ``pairing`` ("interleaved"; "halves": Llama's rotate_half),
    ``rope_on`` ("rope"; "whole": RoPE over each whole head, nope and rope features, the keys rotated after the
    cache), ``scale`` ("qk": sqrt(nope_dim + rope_dim); "nope"; "v"), ``norm`` ("cached": the latent normalized
    before the cache; "missing"; "uncached": the cache holds the raw latent, normalized when read),
    ``order`` ("right"; "key_rope_first": keys [k_rope, k_nope] against queries [q_nope, q_rope];
    "query_rope_first": W_q's blocks read as [q_rope, q_nope]; "latent_last": W_dkv's output read as
    [k_rope, c_kv]; "value_first": W_ukv's blocks read as [v, k_nope]), ``positions`` ("true"; "restart"),
    ``mask`` ("bottom_right"; "top_left"); ``project`` False: no W_o."""

    class LatentAttention(ref.LatentAttention):
        def forward(self, x, cache=None):
            batch, new, _ = x.shape
            nope, rope, heads = self.nope_dim, self.rope_dim, self.heads
            past = 0 if cache is None else cache[0].shape[1]
            q = self.W_q(x).view(batch, new, heads, nope + rope).transpose(1, 2)
            if order == "query_rope_first":
                q_rope, q_nope = q.split([rope, nope], dim=-1)
            else:
                q_nope, q_rope = q.split([nope, rope], dim=-1)
            down = self.W_dkv(x)
            if order == "latent_last":
                k_rope, c_kv = down.split([rope, self.kv_rank], dim=-1)
            else:
                c_kv, k_rope = down.split([self.kv_rank, rope], dim=-1)
            if norm == "cached":
                c_kv = self.kv_norm(c_kv)

            def rotate(t, first, width):
                inv_freq = self.rope_theta ** (-torch.arange(0, width, 2, dtype=torch.float32) / width)
                angles = torch.arange(first, first + t.shape[-2], dtype=torch.float32)[:, None] * inv_freq
                if pairing == "halves":
                    return t * torch.cat([angles, angles], -1).cos() + modern.rotate_half(t) * torch.cat(
                        [angles, angles], -1).sin()
                angles = angles.repeat_interleave(2, dim=-1)
                return t * angles.cos() + ref.rotate_pairs(t) * angles.sin()

            start = 0 if positions == "restart" else past
            if rope_on == "rope":
                q_rope, k_rope = rotate(q_rope, start, rope), rotate(k_rope, start, rope)
            if cache is not None:
                c_kv, k_rope = torch.cat([cache[0], c_kv], dim=1), torch.cat([cache[1], k_rope], dim=1)
            latents = self.kv_norm(c_kv) if norm == "uncached" else c_kv
            kv = self.W_ukv(latents).view(batch, past + new, heads, nope + self.v_dim).transpose(1, 2)
            if order == "value_first":
                v, k_nope = kv.split([self.v_dim, nope], dim=-1)
            else:
                k_nope, v = kv.split([nope, self.v_dim], dim=-1)
            shared = k_rope[:, None].expand(-1, heads, -1, -1)
            keys = torch.cat([shared, k_nope] if order == "key_rope_first" else [k_nope, shared], dim=-1)
            queries = torch.cat([q_nope, q_rope], dim=-1)
            if rope_on == "whole":
                queries, keys = rotate(queries, start, nope + rope), rotate(keys, 0, nope + rope)
            d_k = {"qk": nope + rope, "nope": nope, "v": self.v_dim}[scale]
            scores = queries @ keys.transpose(2, 3) / math.sqrt(d_k)
            allowed = torch.ones(new, past + new, dtype=torch.bool).tril(diagonal=past if mask == "bottom_right"
                                                                          else 0)
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            out = (weights @ v).transpose(1, 2).reshape(batch, new, heads * self.v_dim)
            return (self.W_o(out) if project else out), (c_kv, k_rope)
    return LatentAttention


def _latent_calls(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (batch, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta, eps, chunks)
    # 1. nope_dim = rope_dim, v_dim apart, the defaults; 2. an eps of 0.5, as large as the latents' mean squares
    # (the norm's eps shows), rope_theta 100; 3. no cache, rope_dim 2, theta 50. Every size pairwise apart where
    # a swap would keep the shapes (nope_dim != v_dim on 1 and 3; nope_dim + rope_dim != v_dim).
    later = tuple(rng.permutation([1, 2, 3]).tolist())
    setups = [(2, 12, 3, 5, 4, 4, 6, None, None, (2,) + later[:2]),
              (2, 10, 4, 3, 2, 6, 2, 100.0, 0.5, (1, 1) + later[1:]),
              (1, 16, 2, 8, 6, 2, 4, 50.0, None, (5,))]
    for batch, d_model, heads, kv_rank, nope, rope, v_dim, theta, eps, chunks in setups:
        seq_len = sum(chunks)

        def linear(rows, columns):
            return rng.normal(scale=1 / np.sqrt(columns), size=(rows, columns))
        weights = (linear(heads * (nope + rope), d_model), linear(kv_rank + rope, d_model), _weight(rng, kv_rank),
                   linear(heads * (nope + v_dim), kv_rank), linear(d_model, heads * v_dim))
        x = rng.normal(size=(batch, seq_len, d_model)) * rng.uniform(0.5, 2.0, size=(batch, seq_len, 1))
        options = "".join(f", {name}={value:g}" for name, value in (("rope_theta", theta), ("eps", eps))
                          if value is not None)
        what = (f"LatentAttention(d_model={d_model}, heads={heads}, kv_rank={kv_rank}, nope_dim={nope}, "
                f"rope_dim={rope}, v_dim={v_dim}{options}) on x of shape {x.shape} fed "
                f"{' + '.join(map(str, chunks))} tokens")
        calls.append(Call((d_model, heads, kv_rank, nope, rope, v_dim, theta, eps) + weights
                          + (x, np.array(chunks, dtype=np.int64)), what=what))
    calls.append(Call((8, 2, 4, 2, 3, 2, None, None, np.zeros((10, 8)), np.zeros((7, 8)), np.ones(4),
                       np.zeros((8, 4)), np.zeros((8, 4)), np.zeros((1, 2, 8)), np.array([2], dtype=np.int64)),
                      raises="ValueError", what="LatentAttention(8, heads=2, kv_rank=4, nope_dim=2, rope_dim=3, "
                                                "v_dim=2): rope_dim is odd"))
    return calls


def _chunks(call: Call) -> list[int]:
    return np.asarray(call.args[-1]).tolist()


def _cache_size(answer: object, call: Call, what: str) -> object:
    """A cache of the wrong size named for what it holds: full keys and values, or a RoPE key per head
    (the answer is (output, latents, rope_keys)); any other answer as it is."""
    if (call.raises or not isinstance(answer, tuple) or len(answer) != 3
            or not all(isinstance(a, np.ndarray) and a.dtype.kind == "f" for a in answer)):
        return answer  # (an error, another kind of answer, or a diagnostic question's record)
    x, heads, kv_rank, rope = call.args[-2], call.args[1], call.args[2], call.args[4]
    tokens = x.shape[0] * x.shape[1]
    latents, rope_keys = answer[1:]
    if latents.shape == (x.shape[0], x.shape[1], kv_rank) and rope_keys.size == tokens * heads * rope:
        raise CheckFailed(f"{what}: the cache holds a RoPE key for each head ({heads} x {rope} numbers per token); "
                          f"DeepSeek-V2's decoupled key k_rope is one key shared by all heads (W_dkv's last "
                          f"rope_dim rows), cached once: (batch, positions, rope_dim)")
    held = (latents.size + rope_keys.size) / tokens
    if held > kv_rank + rope:
        raise CheckFailed(f"{what}: the cache holds {held:g} numbers per token; multi-head latent attention caches "
                          f"kv_rank + rope_dim = {kv_rank + rope}: the normalized latents c_kv (batch, positions, "
                          f"kv_rank) and the rotated RoPE keys shared by all heads (batch, positions, rope_dim). "
                          f"Cache those two and compute each head's keys and values from the latents with W_ukv "
                          f"at every call")
    return answer


class _Unchecked(ref.LatentAttention):
    """No check that rope_dim is even: the first forward fails instead."""

    def __init__(self, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta=10000.0, eps=1e-6):
        super().__init__(d_model, heads, kv_rank, nope_dim, rope_dim + rope_dim % 2, v_dim, rope_theta, eps)
        self.rope_dim = rope_dim
        self.W_q = torch.nn.Linear(d_model, heads * (nope_dim + rope_dim), bias=False)
        self.W_dkv = torch.nn.Linear(d_model, kv_rank + rope_dim, bias=False)


class _FullCache(ref.LatentAttention):
    """Caches every head's keys and values (as notebook 15's Attention), not the latents."""

    def forward(self, x, cache=None):
        batch, new, _ = x.shape
        out, (c_kv, k_rope) = super().forward(x)  # (this call's keys and values; the cache is judged first)
        kv = self.W_ukv(c_kv).view(batch, new, self.heads, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope[:, None].expand(-1, self.heads, -1, -1)], dim=-1)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        return out, (k, v)


class _RopePerHead(ref.LatentAttention):
    """Caches the shared RoPE key expanded to every head."""

    def forward(self, x, cache=None):
        if cache is not None:
            cache = (cache[0], cache[1][:, 0])
        out, (c_kv, k_rope) = super().forward(x, cache)
        return out, (c_kv, k_rope[:, None].expand(-1, self.heads, -1, -1).contiguous())


LATENT_ATTENTION = Spec(
    id="serving-LatentAttention",
    submodules=("W_q", "W_dkv", "kv_norm", "W_ukv", "W_o"),
    function="LatentAttention",
    inputs=_latent_calls,
    reference=ref.LatentAttention,
    driver="serving.drive_latent_attention",
    parts=("output", "cached latents", "cached rope keys"),
    prepare=_cache_size,
    variant=_latent_variant,
    equivalent=(
        ("L24 0 -> 1 #2", "cache[1], the cached rope keys, has the cached latents' length: past either way"),
        ("L24 0 -> -1 #2", "cache is a pair: cache[-1] is cache[1], the rope keys, of the latents' length"),
        ("L29 torch.arange(0, self.rope_dim, 2, dtype=torch.float32) -> torch.arange(0, self.rope_dim, 2)",
         "the integers 0, 2, ... divided by rope_dim (true division) are float32 all the same"),
        ("L30 torch.arange(past, past + new, dtype=torch.float32) -> torch.arange(past, past + new)",
         "integer positions times the float32 frequencies are float32: the same angles"),
        ("L31 -1 -> 1", "angles is 2-D, (new_len, rope_dim // 2): its axis 1 is its last"),
    ),
    rules=(
        Rule("several new tokens after a cache: positions past ... past + new_len - 1, the mask bottom-right",
             lambda call: not call.raises and any(n > 1 for n in _chunks(call)[1:])),
        Rule("one new token after a cache", lambda call: not call.raises and any(n == 1 for n in _chunks(call)[1:])),
        Rule("a rope_theta given, other than 10000", lambda call: call.args[6] not in (None, 10000.0)),
        Rule("nope_dim != v_dim (a swapped split shows)", lambda call: call.args[3] != call.args[5]),
        Rule("an eps as large as the latents' mean squares", lambda call: (call.args[7] or 0) >= 0.1),
        Rule("rope_dim odd: ValueError", lambda call: call.raises == "ValueError"),
    ),
    knobs=(
        Knob("pairing", (("halves", "RoPE rotates the halves (Llama's rotate_half, pairs (i, i + rope_dim/2)); "
                                    "DeepSeek's rotates the pairs (2i, 2i + 1), the interleaved layout (transformers' "
                                    "apply_rotary_emb multiplies them as complex numbers): angles "
                                    "repeat_interleave(2), (x_2i, x_2i+1) -> (-x_2i+1, x_2i)"),)),
        Knob("rope_on", (("whole", "RoPE rotates each whole head (nope_dim + rope_dim features): only q_rope and "
                                   "the shared k_rope are rotated, at frequencies rope_theta ** (-2i / rope_dim); "
                                   "k_nope and q_nope carry no position (the decoupled RoPE of DeepSeek-V2)"),)),
        Knob("scale", (
            ("nope", "the scores are divided by sqrt(nope_dim): each head's dot product has nope_dim + rope_dim terms "
                     "(q_nope.k_nope + q_rope.k_rope): divide by sqrt(nope_dim + rope_dim)"),
            ("v", "the scores are divided by sqrt(v_dim): the queries and keys have nope_dim + rope_dim features, "
                  "divide by sqrt(nope_dim + rope_dim)"),
        )),
        Knob("norm", (
            ("missing", "the latent is not normalized: c_kv = kv_norm(W_dkv(x)[..., :kv_rank]) (transformers' "
                        "kv_a_layernorm), before W_ukv"),
            ("uncached", "the cache holds the latents before kv_norm: normalize them first and cache the normalized "
                         "latents (transformers' cache holds kv_a_layernorm's output)"),
        )),
        Knob("order", (
            ("key_rope_first", "the keys are [k_rope, k_nope] while the queries are [q_nope, q_rope]: q_nope must "
                               "meet k_nope, so the keys are cat([k_nope, k_rope]), in the queries' order"),
            ("query_rope_first", "each head's block of W_q(x) is read as [q_rope, q_nope]: it is [q_nope, q_rope], "
                                 "nope_dim features then rope_dim (transformers' q.split([qk_nope_head_dim, "
                                 "qk_rope_head_dim]))"),
            ("latent_last", "W_dkv(x) is read as [k_rope, c_kv]: it is the latent first, then the RoPE key, "
                            "split([kv_rank, rope_dim]) (transformers' kv_a_proj_with_mqa)"),
            ("value_first", "each head's block of W_ukv(c_kv) is read as [v, k_nope]: it is [k_nope, v], nope_dim "
                            "features then v_dim (transformers' kv_b_proj)"),
        )),
        Knob("positions", (("restart", "with a cache the new tokens are rotated from position 0 again: after "
                                       "`past` cached tokens they sit at positions past ... past + new_len - 1"),)),
        Knob("mask", (("top_left", "the causal mask is aligned top-left: new token j (at position past + j) may "
                                   "attend to keys 0 ... past + j, torch.ones(new_len, past + new_len)"
                                   ".tril(diagonal=past), bottom-right"),)),
    ),
    mistakes=(
        Mistake("no_W_o", "the heads are merged but not projected: apply W_o (transformers' o_proj), "
                "(batch, new_len, heads * v_dim) -> (batch, new_len, d_model)", _latent_variant(project=False)),
    ),
    diagnosed=(
        Mistake("full_cache", "numbers per token; multi-head latent attention caches", _FullCache),
        Mistake("rope_per_head", "a RoPE key for each head", _RopePerHead),
    ),
    errors=(
        Raises("{what} raised {error}; it should raise ValueError, as the docstring says: rope_dim is odd there, "
               "and RoPE rotates pairs of features, so check rope_dim % 2 in __init__", example=_Unchecked,
               match=".", when=lambda call: bool(call.raises)),
    ),
    figures=("serving-LatentAttention-figure",),
)


# ---------------------------------------------------------------- SinkCache (StreamingLLM's attention sinks)

def _sink_variant(evict="middle", recent="window", positions="cache", query="last", groups="interleave",
                  softmax="keys"):
    """SinkCache with some choices changed: ``evict`` ("middle"; "oldest": the window alone, the sinks evicted
    too; "newest": the first n_sink + window tokens kept, the new ones dropped), ``recent`` ("window"; "one_more",
    "one_less": window +- 1 recent tokens; "sinks_inside": window - n_sink recent, the sinks counted in the
    window), ``positions`` ("cache": the keys rotated at 0 ... length - 1 at every step; "text": the keys and the
    query at their positions in the stream; "rotated_cached": each key rotated once, at its position in the cache
    when it came, and cached rotated; "rotated_twice": cached rotated, then rotated again at 0 ... length - 1),
    ``query`` ("last": length - 1; "length": one past the last key; "text": the stream's position while the keys
    are at the cache's; "unrotated"), ``groups`` ("interleave": query head h reads kv head h // group; "tile":
    h % kv_heads), ``softmax`` ("keys": over the last axis; "missing"; "log": log_softmax; "heads": over axis 1;
    "batch": over axis 0)."""

    class SinkCache:
        def __init__(self, n_sink, window, rope_theta=10000.0):
            if n_sink < 0 or window < 1:
                raise ValueError("n_sink must be >= 0 and window >= 1")
            self.n_sink, self.window, self.rope_theta = n_sink, window, rope_theta
            self.keys = self.values = None
            self.text = []                               # each cached token's position in the stream
            self.count = 0

        def attend(self, q, k, v):
            batch, heads, new, head_dim = q.shape
            kv_heads = k.shape[1]
            if new != 1 or tuple(k.shape) != (batch, kv_heads, 1, head_dim) or v.shape != k.shape or heads % kv_heads:
                raise ValueError("q (batch, heads, 1, head_dim), k and v (batch, kv_heads, 1, head_dim)")
            if positions in ("rotated_cached", "rotated_twice"):
                at = 0 if self.keys is None else min(self.keys.shape[2], self._capacity() - 1)
                k = ref.rope_at(k, torch.tensor([at]), self.rope_theta)
            keep = [] if self.keys is None else list(range(self.keys.shape[2]))
            if self.keys is not None:
                k, v = torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
            self.text.append(self.count)
            self.count += 1
            length, capacity = k.shape[2], self._capacity()
            if length > capacity:
                sinks = min(self.n_sink, capacity) if evict == "middle" else 0
                kept = (list(range(capacity)) if evict == "newest"
                        else list(range(sinks)) + list(range(length - (capacity - sinks), length)))
                k, v = k[:, :, kept], v[:, :, kept]
                self.text = [self.text[i] for i in kept]
            del keep
            self.keys, self.values = k, v
            cache_positions = torch.arange(k.shape[2])
            key_positions = torch.tensor(self.text) if positions == "text" else cache_positions
            keys = k if positions == "rotated_cached" else ref.rope_at(k, key_positions, self.rope_theta)
            if query == "unrotated":
                query_rotated = q
            else:
                at = {"last": key_positions[-1:], "length": cache_positions[-1:] + 1,
                      "text": torch.tensor(self.text[-1:])}[query]
                query_rotated = ref.rope_at(q, at, self.rope_theta)
            group = heads // kv_heads
            if groups == "tile":
                keys, values = keys.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
            else:
                keys, values = keys.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = query_rotated @ keys.transpose(2, 3) / math.sqrt(head_dim)
            weights = {"keys": lambda: torch.softmax(scores, dim=-1), "missing": lambda: scores,
                       "log": lambda: torch.log_softmax(scores, dim=-1), "heads": lambda: torch.softmax(scores, dim=1),
                       "batch": lambda: torch.softmax(scores, dim=0)}[softmax]()
            return weights @ values

        def _capacity(self):
            recent_tokens = {"window": self.window, "one_more": self.window + 1, "one_less": self.window - 1,
                             "sinks_inside": self.window - self.n_sink}[recent]
            return self.n_sink + max(recent_tokens, 0) if evict == "middle" else self.n_sink + self.window

    return SinkCache


def _sink_calls(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (batch, heads, kv_heads, head_dim, n_sink, window, rope_theta, steps): every one evicts but the last;
    # n_sink >= 1 but on the third (the window alone); window > n_sink on the first two (sinks_inside shows).
    setups = [(2, 6, 2, 4, 2, 3, None, 9), (1, 4, 4, 6, 1, 4, 100.0, 8), (2, 2, 1, 4, 0, 3, 50.0, 6),
              (3, 3, 1, 2, 3, 1, 10.0, 7), (2, 4, 2, 4, 2, 5, 100.0, 5)]
    for batch, heads, kv_heads, head_dim, n_sink, window, theta, steps in setups:
        q = rng.normal(size=(batch, heads, steps, head_dim)) * 1.5
        k = rng.normal(size=(batch, kv_heads, steps, head_dim)) * 1.5
        v = rng.normal(size=(batch, kv_heads, steps, head_dim))
        options = "" if theta is None else f", rope_theta={theta:g}"
        calls.append(Call((n_sink, window, theta, q, k, v, steps),
                          what=f"SinkCache(n_sink={n_sink}, window={window}{options}) fed {steps} tokens one at a "
                               f"time, q of shape ({batch}, {heads}, 1, {head_dim}), k and v ({batch}, {kv_heads}, 1, "
                               f"{head_dim})"))
    q, k = rng.normal(size=(1, 4, 2, 4)), rng.normal(size=(1, 2, 2, 4))
    bad = [(-1, 3, q, k, k, 2, "n_sink=-1: n_sink < 0"), (2, 0, q, k, k, 2, "window=0: window < 1"),
           (1, 2, rng.normal(size=(1, 4, 4, 4)), k, k, 2, "q of 2 tokens: one new token per attend"),
           (1, 2, q, rng.normal(size=(1, 3, 2, 4)), rng.normal(size=(1, 3, 2, 4)), 2,
            "k and v of 3 kv_heads for 4 query heads: kv_heads must divide heads"),
           (1, 2, q, k, rng.normal(size=(1, 2, 2, 3)), 2, "v of head_dim 3, k of 4: k and v disagree"),
           (1, 2, q, rng.normal(size=(1, 2, 2, 6)), rng.normal(size=(1, 2, 2, 6)), 2,
            "k and v of head_dim 6, q of 4: the query and the keys disagree"),
           (1, 2, q, rng.normal(size=(2, 2, 2, 4)), rng.normal(size=(2, 2, 2, 4)), 2,
            "k and v of batch 2, q of batch 1")]
    for n_sink, window, q_bad, k_bad, v_bad, steps, why in bad:
        calls.append(Call((n_sink, window, None, q_bad, k_bad, v_bad, steps), raises="ValueError",
                          what=f"SinkCache(n_sink={n_sink}, window={window}) with {why}"))
    return calls


def _evicts(call: Call) -> bool:
    return not call.raises and call.args[6] > call.args[0] + call.args[1]


SINK_CACHE = Spec(
    id="serving-SinkCache",
    function="SinkCache",
    inputs=_sink_calls,
    reference=ref.SinkCache,
    driver="serving.drive_sink_cache",
    parts=("outputs", "cached keys", "cached values", "cache lengths"),
    order=(3, 0, 1, 2),
    variant=_sink_variant,
    figures=("serving-SinkCache-figure",),
    rules=(
        Rule("past n_sink + window tokens: the middle evicted, positions within the cache", _evicts),
        Rule("n_sink 0: the window alone", lambda call: not call.raises and call.args[0] == 0 and _evicts(call)),
        Rule("never full: nothing evicted", lambda call: not call.raises and not _evicts(call)),
        Rule("grouped heads: kv_heads < heads", lambda call: not call.raises and call.args[4].shape[1] < call.args[3].shape[1]),
        Rule("a rope_theta given, other than 10000", lambda call: call.args[2] not in (None, 10000.0)),
        Rule("bad arguments: ValueError", lambda call: call.raises == "ValueError"),
    ),
    knobs=(
        Knob("evict", (
            ("oldest", "past n_sink + window tokens the oldest token is evicted, the sinks with it: that is the "
                       "window alone (StreamingLLM's Fig. 1b); keep the first n_sink tokens of the stream for ever and "
                       "evict the oldest token after them"),
            ("newest", "past n_sink + window tokens the cache keeps its first n_sink + window tokens and drops the "
                       "new ones: keep the first n_sink and the LAST window tokens (the new one among them), evict the "
                       "ones between"),
        )),
        Knob("recent", (
            ("one_more", "the cache keeps window + 1 recent tokens: the last window tokens, the new one among them, "
                         "so at most n_sink + window tokens in all"),
            ("one_less", "the cache keeps window - 1 recent tokens: the last window tokens, the new one among them, "
                         "so at most n_sink + window tokens in all"),
            ("sinks_inside", "the sinks are counted inside the window (at most window tokens in all): the cache holds "
                             "n_sink sinks AND the last window tokens, n_sink + window"),
        )),
        Knob("positions", (
            ("text", "the keys are rotated at their positions in the stream: StreamingLLM rotates them at their "
                     "positions in the cache, 0 ... length - 1, and the query at length - 1, so no distance exceeds "
                     "the cache's length (Sec. 3.2, positional encoding within the cache)"),
            ("rotated_cached", "the cached keys are rotated once, when they come, and kept rotated: after an eviction "
                               "a key moves to another place in the cache, so cache the keys before RoPE and rotate "
                               "them all at 0 ... length - 1 at every step"),
            ("rotated_twice", "the keys are rotated twice: the cache holds them already rotated and they are rotated "
                              "again when read; cache the keys before RoPE (self.keys unrotated), rotate them once, "
                              "at 0 ... length - 1"),
        )),
        Knob("query", (
            ("length", "the query is rotated at the cache's length, one past the last key: the new token's key is "
                       "the last, at position length - 1, and so is its query"),
            ("text", "the query is rotated at its position in the stream while the keys are at their positions in "
                     "the cache: rotate it at length - 1, the new token's place in the cache"),
            ("unrotated", "the query is not rotated: rotate it with RoPE at length - 1, the new token's place in the "
                          "cache, as the keys are at theirs"),
        )),
        Knob("groups", (("tile", "query head h reads key/value head h % kv_heads: with grouped heads it reads "
                                 "h // (heads // kv_heads), repeat_interleave, as notebook 15's Attention"),)),
        Knob("softmax", (
            ("missing", "the scores are used as weights without a softmax: weights = softmax(scores) over the cached "
                        "tokens, the last axis"),
            ("log", "the weights are log_softmax(scores): they must be softmax(scores), positive and summing to 1 "
                    "over the cached tokens"),
            ("heads", "the softmax runs over the heads (axis 1): it runs over the cached tokens, the last axis of "
                      "the scores (batch, heads, 1, length)"),
            ("batch", "the softmax runs over the batch (axis 0): it runs over the cached tokens, the last axis of "
                      "the scores (batch, heads, 1, length)"),
        )),
    ),
    equivalent=(
        ("L22 k.shape[2] > self.n_sink + self.window -> k.shape[2] >= self.n_sink + self.window",
         "at exactly n_sink + window tokens, the first n_sink and the last window are all of them: the 'eviction' "
         "keeps the cache as it is"),
    ),
)

SPECS = (PAGED_KV_CACHE, SPECULATIVE_STEP, LATENT_ATTENTION, SINK_CACHE)
