"""Hidden checks of notebook 16, serving: a paged KV cache.

``PagedKVCache`` is a class: ``coursekit/drivers/serving.py`` builds the learner's cache and runs a
script of appends, gathers and frees on it, handing back every gather's keys and values, the same
positions read from the pool (``key_blocks``, ``value_blocks``) through the block table, and, after
each operation, the blocks in use (num_blocks - len(free_blocks)), the blocks the live tables hold
and how many distinct blocks they hold. The reference is ``reference/serving.py``.

The scripts interleave several sequences of random lengths (appends of 1 to 2 * block_size + 1
tokens, some ending exactly at a block's end), free some and append again so that freed blocks are
reused, and gather every live sequence: a contiguous reference (the keys appended to a sequence,
in order) is what every gather must give, whatever order the free list hands blocks out in. One
call runs the pool out of blocks (RuntimeError), one gathers a freed sequence (KeyError).
"""
from __future__ import annotations

import numpy as np

from ._core import Call, CheckFailed, Mistake, Raises, Rule, Spec, _equal, catalogued, judge_case
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

SPECS = (PAGED_KV_CACHE,)
