"""Mistake and variant cases of notebook 11's checks (byte-pair encoding), run in process.

The catalogue of each spec (grader/checks/tokenization.py) is asserted by
tests/test_catalogue.py; here: wrong answers no catalogue lists, which the checks' further
questions must still name (a pair across words, a tie, stale counts, ids that do not decode
back), answers of the wrong kind that the drivers name, and valid alternatives that must
pass (another algorithm, numpy or torch ids, Counter or dict).
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from coursekit import probe
from grader.checks import answers_of, check, exercise_ids, get, public_seed, questions, verdict
from grader.checks.reference import tokenization as ref
from grader.wire import decode_payload
from tests.check_cases import shared_tests
from tests.conftest import solution_namespace
from tests.scope import student_seeds
from tests.test_visible_mutants import Property
from tests.test_visible_mutants import (
    test_a_visible_assert_naming_a_property_fails_for_every_mutant_that_breaks_it as visible_assert_holds)

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


@pytest.fixture(scope="module")
def tokenization_notebook() -> dict:
    """The reference solutions of notebook 11 (count_pairs, merge_pair, train_bpe, encode, decode)."""
    return solution_namespace("11_tokenization")


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- count_pairs

def _pairs_by(pairs_of, weight=lambda count: count):
    def count_pairs(words):
        pairs = {}
        for word, count in words.items():
            for pair in pairs_of(word):
                pairs[pair] = pairs.get(pair, 0) + weight(count)
        return pairs
    return count_pairs


def _pairs_mutating(words):
    """Right, but empties its input on the way (the grader hands each call a fresh copy)."""
    pairs = Counter()
    while words:
        word, count = words.popitem()
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    return pairs


def _pairs_counter(words):
    pairs = Counter()
    for word, count in words.items():
        for i in range(len(word) - 1):
            pairs[word[i], word[i + 1]] += count
    return pairs


def _pairs_defaultdict(words):
    pairs = defaultdict(int)
    for word, count in words.items():
        for left, right in zip(word[:-1], word[1:]):
            pairs[(left, right)] += count
    return pairs


# ---------------------------------------------------------------- merge_pair

def _merge_by(merge_word):
    def merge_pair(words, pair):
        merged = Counter()
        for word, count in words.items():
            merged[merge_word(word, *pair)] += count
        return merged
    return merge_pair


def _merge_comprehension(words, pair):
    """The real bug found in outside code: a dict comprehension keeps the last count of words
    that become equal after the merge."""
    return {ref.merge_word(word, *pair): count for word, count in words.items()}


def _merge_first_count_kept(words, pair):
    merged = {}
    for word, count in words.items():
        merged.setdefault(ref.merge_word(word, *pair), count)
    return merged


def _merge_joined(separator, split=lambda joined, separator: joined.split(separator)):
    """merge_pair by str.replace on the word's symbols joined by ``separator``: it also matches
    a symbol that only ends with left (or starts with right)."""
    def merge_pair(words, pair):
        left, right = pair
        merged = Counter()
        for word, count in words.items():
            joined = separator.join(word).replace(left + separator + right, left + right)
            merged[tuple(split(joined, separator))] += count
        return merged
    return merge_pair


def _merge_sennrich(words, pair):
    """Sennrich et al.'s merge_vocab: a regex on the symbols joined by spaces, split() after."""
    pattern = re.compile(r"(?<!\S)" + re.escape(" ".join(pair)) + r"(?!\S)")
    merged = Counter()
    for word, count in words.items():
        merged[tuple(pattern.sub("".join(pair), " ".join(word)).split())] += count
    return merged


def _merge_regex_unit_separator(words, pair):
    """The same regex merge on symbols joined by a character no symbol holds: right."""
    pattern = re.compile("(?<![^\x1f])" + re.escape("\x1f".join(pair)) + "(?![^\x1f])")
    merged = Counter()
    for word, count in words.items():
        merged[tuple(pattern.sub("".join(pair), "\x1f".join(word)).split("\x1f"))] += count
    return merged


def _merge_list_comprehension(words, pair):
    """Each place found with a list comprehension, then the word rebuilt, skipping the merged right halves."""
    merged = defaultdict(int)
    for word, count in words.items():
        places, taken = [], -2
        for i in [i for i in range(len(word) - 1) if (word[i], word[i + 1]) == tuple(pair)]:
            if i > taken + 1:
                places.append(i)
                taken = i
        out = []
        for i, symbol in enumerate(word):
            if i - 1 in places:
                continue
            out.append(symbol + word[i + 1] if i in places else symbol)
        merged[tuple(out)] += count
    return dict(merged)


def _from_the_right(word, a, b):
    out, i = [], len(word) - 1
    while i >= 0:
        if i > 0 and word[i - 1] == a and word[i] == b:
            out.insert(0, a + b)
            i -= 2
        else:
            out.insert(0, word[i])
            i -= 1
    return tuple(out)


def _drops_right(word, a, b):
    out, i = [], 0
    while i < len(word):
        out.append(word[i])
        i += 2 if i + 1 < len(word) and word[i] == a and word[i + 1] == b else 1
    return tuple(out)


def _merge_in_place(words, pair):
    merged = ref.merge_pair(words, pair)
    words.clear()
    words.update(merged)


def _merge_flag(words, pair):
    merged = {}
    for word, count in words.items():
        out, skip = [], False
        for i, symbol in enumerate(word):
            if skip:
                skip = False
                continue
            if i + 1 < len(word) and (symbol, word[i + 1]) == tuple(pair):
                out.append(symbol + word[i + 1])
                skip = True
            else:
                out.append(symbol)
        merged[tuple(out)] = merged.get(tuple(out), 0) + count
    return merged


def _merge_recursive(words, pair):
    def merge(word):
        if len(word) < 2:
            return word
        if word[:2] == tuple(pair):
            return (word[0] + word[1],) + merge(word[2:])
        return word[:1] + merge(word[1:])
    merged = Counter()
    for word, count in words.items():
        merged[merge(word)] += count
    return merged


# ---------------------------------------------------------------- train_bpe

def _training(pick=lambda pairs: min(pairs, key=lambda p: (-pairs[p], p)), words_of=None, merges_asked=lambda n: n):
    def train_bpe(text, num_merges):
        if words_of is None:
            found = [w for w in ref.pretokenize(text) if w not in SPECIALS]
        else:
            found = words_of(text)
        words = Counter(tuple(w) for w in found)
        merges = []
        for _ in range(merges_asked(num_merges)):
            pairs = ref.count_pairs(words)
            if not pairs:
                break
            best = pick(pairs)
            words = ref.merge_pair(words, best)
            merges.append(best)
        return merges
    return train_bpe


def _replace_merge(words, pair):
    """merge_pair with str.replace on the symbols joined by spaces: a word's space makes '' symbols."""
    merged = Counter()
    for word, count in words.items():
        merged[tuple(" ".join(word).replace(f"{pair[0]} {pair[1]}", pair[0] + pair[1]).split(" "))] += count
    return merged


def _train_with(merge_pair):
    """train_bpe as the notebook's, each merge made by ``merge_pair``."""
    def train_bpe(text, num_merges):
        words, merges = dict(Counter(tuple(w) for w in ref.pretokenize(text) if w not in SPECIALS)), []
        for _ in range(num_merges):
            pairs = ref.count_pairs(words)
            if not pairs:
                break
            merges.append(min(pairs, key=lambda p: (-pairs[p], p)))
            words = merge_pair(words, merges[-1])
        return merges
    return train_bpe


def _lines_as_words(text):
    return [line for line in text.replace("<eos>", "").split("\n") if line]


def _special_chars_regex(text):
    import re
    return re.findall(r" ?\S+|\s", text)  # GPT-2's words, but the special tokens are cut into characters


def _train_incremental(text, num_merges):
    """A faster training, with the same result: only the words that hold the merged pair are
    recounted, and the pair counts are updated instead of made anew."""
    words = Counter(tuple(w) for w in ref.pretokenize(text) if w not in SPECIALS)
    pairs = Counter()
    for word, count in words.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    merges = []
    for _ in range(num_merges):
        pairs = +pairs  # drop the pairs whose count fell to 0
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for word in [w for w in words if any(p == best for p in zip(w, w[1:]))]:
            count = words.pop(word)
            for pair in zip(word, word[1:]):
                pairs[pair] -= count
            new = ref.merge_word(word, *best)
            for pair in zip(new, new[1:]):
                pairs[pair] += count
            words[new] += count
    return merges


def _train_sorted_first(text, num_merges):
    words = Counter(tuple(w) for w in ref.pretokenize(text) if w not in SPECIALS)
    merges = []
    while len(merges) < num_merges:
        pairs = ref.count_pairs(words)
        if not pairs:
            return merges
        best = max(sorted(pairs), key=pairs.get)  # max keeps the first of equals: the smallest, sorted
        words = ref.merge_pair(words, best)
        merges.append(list(best))  # lists of two strings are as good as tuples
    return merges


def _train_most_common(text, num_merges):
    words = Counter(tuple(w) for w in ref.pretokenize(text) if w not in SPECIALS)
    merges = {}  # merges in a dict, {pair: rank}: its keys keep their order
    while len(merges) < num_merges:
        pairs = Counter(ref.count_pairs(words))
        if not pairs:
            break
        top = pairs.most_common(1)[0][1]
        best = sorted(p for p, n in pairs.items() if n == top)[0]
        merges[best] = len(merges)
        words = ref.merge_pair(words, best)
    return list(merges)


# ---------------------------------------------------------------- encode

def _encoder(segment):
    """bpe_encode with each word cut by ``segment(word, tokens, merges)``."""
    def bpe_encode(text, tokens, merges, byte_fallback=True):
        ids_of = {t: 260 + i for i, t in enumerate(tokens)}
        ids = []
        for word in ref.pretokenize(text):
            if word in SPECIALS:
                ids.append(SPECIALS.index(word))
                continue
            for symbol in segment(word, tokens, merges):
                if symbol in ids_of:
                    ids.append(ids_of[symbol])
                else:
                    ids += [4 + b for b in symbol.encode("utf-8")] if byte_fallback else [3]
        return ids
    return bpe_encode


def _in_order(word, tokens, merges):
    """Every merge in turn, everywhere in the word: the docstring's own wording."""
    symbols = tuple(word)
    for left, right in merges:
        symbols = ref.merge_word(symbols, left, right)
    return symbols


def _by_rank(word, tokens, merges):
    """The lowest-ranked pair in the word first, merges as a dict {pair: rank} (GPT-2's loop)."""
    rank = {tuple(m): r for r, m in enumerate(merges)}
    symbols = list(word)
    while len(symbols) > 1:
        r, best = min((rank.get(p, float("inf")), p) for p in zip(symbols, symbols[1:]))
        if r == float("inf"):
            break
        symbols = list(ref.merge_word(tuple(symbols), *best))
    return symbols


def _greedy_encoder(segment):
    """bpe_encode with the words cut by ``segment(word, vocabulary)`` instead of the merges."""
    return _encoder(lambda word, tokens, merges: segment(word, set(tokens)))


def _wordpiece(word, vocabulary):
    """The real bug found in outside code: the longest token that fits, from the left."""
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start + 1 and word[start:end] not in vocabulary:
            end -= 1
        pieces.append(word[start:end])
        start = end
    return pieces


def _by_length(word, vocabulary):
    """The vocabulary sorted longest first; at each place the first token the rest starts with."""
    ordered = sorted(vocabulary, key=len, reverse=True)
    pieces = []
    while word:
        piece = next((t for t in ordered if word.startswith(t)), word[0])
        pieces.append(piece)
        word = word[len(piece):]
    return pieces


def _from_the_end(word, vocabulary):
    pieces = []
    while word:
        start = next((i for i in range(len(word) - 1) if word[i:] in vocabulary), len(word) - 1)
        pieces.insert(0, word[start:])
        word = word[:start]
    return pieces


def _split_around_longest(word, vocabulary):
    """The tokens, longest first (and in sorted order among equals), each split out of the word
    wherever it stands; the pieces left are cut the same way."""
    for token in sorted(vocabulary, key=lambda t: (-len(t), t)):
        if len(token) > 1 and token in word:
            before, _, after = word.partition(token)
            return _split_around_longest(before, vocabulary) + [token] + _split_around_longest(after, vocabulary)
    return list(word)


def _encode_unspaced(text, tokens, merges, byte_fallback=True):
    """The space before each word taken off, as if it were only a separator."""
    ids = []
    for word in ref.pretokenize(text):
        ids += ref.bpe_encode(word if word.isspace() else word.lstrip(" "), tokens, merges, byte_fallback)
    return ids


def _encode_stripped(text, tokens, merges, byte_fallback=True):
    return [i for word in ref.pretokenize(text)
            for i in ref.bpe_encode(word if word in SPECIALS else word.strip(), tokens, merges, byte_fallback)]


def _encode_as(convert):
    return lambda text, tokens, merges, byte_fallback=True: convert(ref.bpe_encode(text, tokens, merges, byte_fallback))


def _encode_adds_bos_eos(text, tokens, merges, byte_fallback=True):
    return [1] + ref.bpe_encode(text, tokens, merges, byte_fallback) + [2]


def _encode_code_points(text, tokens, merges, byte_fallback=True):
    """Unknown characters as one id each, from their code point: not the bytes, not decodable."""
    known = set(tokens)
    return [i for word in ref.pretokenize(text) for i in (
        [SPECIALS.index(word)] if word in SPECIALS else
        [260 + tokens.index(s) if s in known else 4 + ord(s) % 256 for s in ref.segment(word, merges)])]


def _encode_reversed(text, tokens, merges, byte_fallback=True):
    return ref.bpe_encode(text, tokens, merges[::-1], byte_fallback)


# ---------------------------------------------------------------- decode

def _decode_bytes_join(ids, tokens):
    pieces = []
    for i in ids:
        if not 0 <= i < 260 + len(tokens):
            raise ValueError(f"no id {i}")
        pieces.append(SPECIALS[i].encode() if i < 4 else bytes([i - 4]) if i < 260 else tokens[i - 260].encode())
    return b"".join(pieces).decode(errors="replace")


def _decode_byte_list(ids, tokens):
    data = []
    for i in map(int, ids):
        if i < 0 or i >= 260 + len(tokens):
            raise ValueError("id out of range")
        data += list(ref.id_bytes(i, tokens))
    return bytes(data).decode("utf-8", "replace")


def _decode_ignoring(ids, tokens):
    data = b""
    for i in ids:
        if not 0 <= i < 260 + len(tokens):
            raise ValueError(i)
        data += ref.id_bytes(i, tokens)
    return data.decode("utf-8", errors="ignore")


def _decode_chr(ids, tokens):
    text = ""
    for i in ids:
        if i < 0 or i >= 260 + len(tokens):
            raise ValueError(f"bad id {i}")
        text += SPECIALS[i] if i < 4 else chr(i - 4) if i < 260 else tokens[i - 260]
    return text


def _decode_each_ignoring(ids, tokens):
    if any(not 0 <= i < 260 + len(tokens) for i in ids):
        raise ValueError("id outside the vocabulary")
    return "".join(ref.id_bytes(i, tokens).decode("utf-8", errors="ignore") for i in ids)


def _decode_latin1(ids, tokens):
    if any(not 0 <= i < 260 + len(tokens) for i in ids):
        raise ValueError("id outside the vocabulary")
    return b"".join(ref.id_bytes(i, tokens) for i in ids).decode("latin-1")


def _decode_upper_check_only(ids, tokens):
    """Checks the end of the vocabulary only: a negative id indexes from the end."""
    data = bytearray()
    for i in ids:
        if i >= 260 + len(tokens):
            raise ValueError(f"id {i} is past the vocabulary")
        data += SPECIALS[i].encode() if i < 4 else bytes([i - 4]) if i < 260 else tokens[i - 260].encode()
    return data.decode("utf-8", errors="replace")


# ---------------------------------------------------------------- to_jamo

def _jamo_checked(convert, refuse=lambda text: any("\u1100" <= ch <= "\u11ff" for ch in text)):
    def to_jamo(text):
        if refuse(text):
            raise ValueError("compose the text first: unicodedata.normalize('NFC', text)")
        return convert(text)
    return to_jamo


def _nfd_syllables(form="NFD"):
    return lambda text: "".join(unicodedata.normalize(form, ch) if "가" <= ch <= "힣" else ch for ch in text)


def _by_hand(vowel=lambda s: s % 588 // 28, base=0xAC00):
    """The Unicode Standard's arithmetic, as a learner writes it from a Korean blog post."""
    def to_jamo(text):
        out = []
        for ch in text:
            if 0xAC00 <= ord(ch) <= 0xD7A3:
                s = ord(ch) - base
                out += [chr(0x1100 + s // 588), chr(0x1161 + vowel(s))]
                if s % 28:
                    out.append(chr(0x11A7 + s % 28))
            else:
                out.append(ch)
        return "".join(out)
    return to_jamo


def _jamo_regex(text):
    if re.search("[\u1100-\u11ff]", text):
        raise ValueError("already decomposed: unicodedata.normalize('NFC', text) first")
    return re.sub("[가-힣]", lambda m: unicodedata.normalize("NFD", m.group()), text)


def _jamo_list(text):
    return list(_jamo_regex(text))


def _compose_by_hand(text):
    """Syllables by the arithmetic of the Unicode Standard (3.12), letter by letter."""
    out, i = [], 0
    while i < len(text):
        if i + 1 < len(text) and 0x1100 <= ord(text[i]) <= 0x1112 and 0x1161 <= ord(text[i + 1]) <= 0x1175:
            L, V, T = ord(text[i]) - 0x1100, ord(text[i + 1]) - 0x1161, 0
            if i + 2 < len(text) and 0x11A8 <= ord(text[i + 2]) <= 0x11C2:
                T = ord(text[i + 2]) - 0x11A7
            out.append(chr(0xAC00 + (L * 21 + V) * 28 + T))
            i += 3 if T else 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _compose_groups(text):
    from itertools import groupby
    return "".join(unicodedata.normalize("NFC", "".join(run)) if jamo else "".join(run)
                   for jamo, run in groupby(text, key=lambda ch: "\u1100" <= ch <= "\u11ff"))


def _compose_syllables(text):
    return re.sub("[\u1100-\u1112][\u1161-\u1175][\u11a8-\u11c2]?",
                  lambda m: unicodedata.normalize("NFC", m.group()), text)


def _compose_unchecked(text):
    """By hand, but reads the letter after every leading consonant, there or not."""
    out, i = [], 0
    while i < len(text):
        if 0x1100 <= ord(text[i]) <= 0x1112 and 0x1161 <= ord(text[i + 1]) <= 0x1175:
            T = ord(text[i + 2]) - 0x11A7 if i + 2 < len(text) and 0x11A8 <= ord(text[i + 2]) <= 0x11C2 else 0
            out.append(chr(0xAC00 + ((ord(text[i]) - 0x1100) * 21 + ord(text[i + 1]) - 0x1161) * 28 + T))
            i += 3 if T else 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


# ---------------------------------------------------------------- gpt2_pretokenize

def _gpt2_kind(ch):
    return "L" if ch.isalpha() else "N" if ch.isdecimal() else "S" if ch.isspace() else "P"


def _gpt2_by_hand(text):
    """GPT-2's pattern as a loop over the characters, as a learner writes it without regex."""
    pieces, i, n = [], 0, len(text)
    while i < n:
        contraction = next((c for c in ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d") if text.startswith(c, i)), None)
        if contraction:
            pieces.append(contraction)
            i += len(contraction)
            continue
        start = i
        if text[i] == " " and i + 1 < n and _gpt2_kind(text[i + 1]) != "S":
            i += 1
        kind = _gpt2_kind(text[i])
        if kind == "S":
            j = i
            while j < n and text[j].isspace():
                j += 1
            end = j if j == n else (j - 1 if j - i >= 2 else i + 1)
        else:
            end = i
            while end < n and _gpt2_kind(text[end]) == kind:
                end += 1
        pieces.append(text[start:end])
        i = end
    return pieces


def _gpt2_split_filter(text):
    pattern = r"('s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+)"
    return [piece for piece in re.split(pattern, text) if piece]


def _gpt2_pattern(pattern):
    return lambda text: re.findall(pattern, text)


# ---------------------------------------------------------------- encode_user_text

def _user_split(text, tokens, merges, allowed_special=()):
    """As the notebook's solution: the allowed strings split off with re.split, the rest encode_ordinary."""
    allowed = SPECIALS if allowed_special == "all" else list(allowed_special)
    if any(s not in SPECIALS for s in allowed):
        raise ValueError("allowed_special takes special tokens only")
    if not allowed:
        return ref.encode_ordinary(text, tokens, merges)
    ids = []
    for piece in re.split("(" + "|".join(map(re.escape, allowed)) + ")", text):
        ids += [SPECIALS.index(piece)] if piece in allowed else ref.encode_ordinary(piece, tokens, merges)
    return ids


def _user_scan(text, tokens, merges, allowed_special=()):
    """A scan: at each position the allowed string that starts there, else one more character of text."""
    allowed = list(SPECIALS) if allowed_special == "all" else sorted(allowed_special)
    for s in allowed:
        if s not in SPECIALS:
            raise ValueError(f"not a special token: {s}")
    ids, start, i = [], 0, 0
    while i < len(text):
        hit = next((s for s in allowed if text.startswith(s, i)), None)
        if hit:
            ids += ref.encode_ordinary(text[start:i], tokens, merges) + [SPECIALS.index(hit)]
            i = start = i + len(hit)
        else:
            i += 1
    return ids + ref.encode_ordinary(text[start:], tokens, merges)


def _user_always(text, tokens, merges, allowed_special=()):
    if allowed_special != "all" and any(s not in SPECIALS for s in allowed_special):
        raise ValueError("not a special token")
    return ref.bpe_encode(text, tokens, merges)


def _user_tiktoken_default(text, tokens, merges, allowed_special=()):
    allowed = set(SPECIALS) if allowed_special == "all" else set(allowed_special)
    if any(s in text for s in set(SPECIALS) - allowed):
        raise ValueError("the text holds a special token that is not allowed")
    return _user_split(text, tokens, merges, allowed_special)


def _user_replace_unk(text, tokens, merges, allowed_special=()):
    allowed = SPECIALS if allowed_special == "all" else list(allowed_special)
    for s in SPECIALS:
        if s not in allowed:
            text = text.replace(s, "")
    return _user_split(text, tokens, merges, allowed_special)


# ---------------------------------------------------------------- train_byte_bpe

def _byte_words(text):
    words = Counter()
    for word in ref.pretokenize(text):
        if word not in SPECIALS:
            data = word.encode("utf-8")
            words[tuple(data[i:i + 1] for i in range(len(data)))] += 1   # slices of bytes are bytes
    return words


def _byte_ids(text, num_merges):
    """minbpe's way: words as lists of ids 0-255, merges as ids, a vocab {id: bytes}, then as the
    docstring asks (tokens by id, merges as bytes)."""
    words = {tuple(word.encode("utf-8")): n for word, n in Counter(
        w for w in ref.pretokenize(text) if w not in SPECIALS).items()}
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    for k in range(num_merges):
        stats = Counter()
        for ids, n in words.items():
            for pair in zip(ids, ids[1:]):
                stats[pair] += n
        if not stats:
            break
        pair = min(stats, key=lambda p: (-stats[p], vocab[p[0]], vocab[p[1]]))
        new = 256 + k
        vocab[new] = vocab[pair[0]] + vocab[pair[1]]
        merged = Counter()
        for ids, n in words.items():
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
                    out.append(new)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
        merges.append((vocab[pair[0]], vocab[pair[1]]))
    return [vocab[i] for i in range(len(vocab))], merges


def _byte_sorted(text, num_merges):
    """The most frequent pair by sorting, bytearray tokens, merges as lists."""
    words = _byte_words(text)
    tokens, merges = [bytearray([i]) for i in range(256)], []
    while len(merges) < num_merges:
        pairs = ref.count_pairs(words)
        if not pairs:
            break
        best = sorted(pairs.items(), key=lambda item: (-item[1], item[0]))[0][0]
        words = ref.merge_pair(words, best)
        merges.append(list(best))
        tokens.append(bytearray(best[0] + best[1]))
    return tokens, merges


def _byte_with(change):
    def train_byte_bpe(text, num_merges):
        return change(*ref.train_byte_bpe(text, num_merges))
    return train_byte_bpe


def _byte_decode_bytearray(ids, tokens):
    """A bytearray grown id by id, decoded once at the end."""
    data = bytearray()
    for i in ids:
        if i < 0 or i >= len(tokens):
            raise ValueError("id outside the vocabulary")
        data += tokens[i]
    return data.decode("utf-8", "replace")


def _byte_decode_incremental(ids, tokens):
    """Python's incremental decoder, fed token by token as a stream, flushed at the end."""
    import codecs
    if any(not 0 <= i < len(tokens) for i in ids):
        raise ValueError("id outside the vocabulary")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return "".join(decoder.decode(tokens[i]) for i in ids) + decoder.decode(b"", final=True)


def _byte_decode_by(join_and_decode):
    def byte_decode(ids, tokens):
        for i in ids:
            if not 0 <= i < len(tokens):
                raise ValueError("id outside the vocabulary")
        return join_and_decode(ids, tokens)
    return byte_decode


MISTAKES = {
    "tokenization-count_pairs": [
        (_pairs_by(lambda w: zip(w, w[2:])), "stand side by side in no word"),
        (_pairs_by(lambda w: list(zip(w, w[1:]))[1:]), "it misses"),
        (_pairs_by(lambda w: zip(w, w[1:]), weight=lambda c: c * c), "counts are wrong"),
        (lambda words: list(ref.count_pairs(words).items()), "should return a dict, but it returns a list"),
        (lambda words: {f"{a} {b}": n for (a, b), n in ref.count_pairs(words).items()}, "(str, str) tuple"),
        (lambda words: {p: n / 1 for p, n in ref.count_pairs(words).items()}, "int count"),
        (lambda words: print(ref.count_pairs(words)), "returns nothing (None)"),
        (stub, "not answered yet"),
    ],
    "tokenization-merge_pair": [
        (_merge_by(_from_the_right), "merged differently"),
        (_merge_by(_drops_right), "no longer spell a word"),
        (lambda words, pair: {w: 2 * n for w, n in ref.merge_pair(words, pair).items()}, "do not add up"),
        (_merge_comprehension, "words that become equal after the merge keep one count"),
        (_merge_first_count_kept, "words that become equal after the merge keep one count"),
        (_merge_joined("|"), "it merges across symbol boundaries"),
        (_merge_joined("-"), "it merges across symbol boundaries"),
        (_merge_joined(" "), "it joins the symbols with spaces and uses str.replace"),
        (_merge_joined(" ", split=lambda joined, _: joined.split()), "a word lost its space"),
        (_merge_sennrich, "a word lost its space"),
        (_merge_in_place, "returns nothing (None)"),
        (lambda words, pair: list(ref.merge_pair(words, pair)), "should return a dict"),
        (stub, "not answered yet"),
    ],
    "tokenization-train_bpe": [
        (_training(merges_asked=lambda n: n - 1), "but it stops there"),
        (_training(merges_asked=lambda n: n + 1), "but it goes on to"),
        (_training(pick=lambda pairs: min(pairs, key=lambda p: (-pairs[p], p[::-1]))), "ties go to the smallest"),
        (_training(pick=lambda pairs: min(pairs, key=lambda p: (pairs[p], p))), "not the most frequent pair"),
        (_training(words_of=_lines_as_words), "joins two words"),
        (_training(words_of=_special_chars_regex), "joins characters of a special token"),
        (_train_with(_replace_merge), "has an empty symbol"),
        (_train_with(_merge_joined("|")), "a merge also joins symbols that only end with left"),
        (_train_with(_merge_joined("-")), "a merge also joins symbols that only end with left"),
        (_train_with(_merge_sennrich), "the words lose their spaces"),
        (_training(words_of=lambda text: [w.strip() for w in ref.pretokenize(text) if w not in SPECIALS]),
         "the words lose their spaces"),
        (lambda text, n: [a + b for a, b in ref.train_bpe(text, n)], "(str, str) tuple"),
        (lambda text, n: {pair: k for k, pair in enumerate(ref.train_bpe(text, n))}, "should return a list"),
        (stub, "not answered yet"),
    ],
    "tokenization-bpe_encode": [
        (_encode_adds_bos_eos, "special tokens are not the text's"),
        (_encode_code_points, "do not decode back to the text"),
        # reversed merges decode back as other tokens: longer ones or another count, and both messages say why
        (_encode_reversed, "in the order learned"),
        (_greedy_encoder(_wordpiece), "WordPiece's greedy match"),
        (_greedy_encoder(_by_length), "WordPiece's greedy match"),
        (_greedy_encoder(_from_the_end), "the longest token that ends the word"),
        (_greedy_encoder(_split_around_longest), "greedy"),
        (_encode_unspaced, "the space where a word starts is lost"),
        (_encode_stripped, "the words lose their spaces"),
        (lambda text, tokens, merges, byte_fallback=True: [tokens[i - 260] if i >= 260 else i
                                                           for i in ref.bpe_encode(text, tokens, merges, byte_fallback)],
         "returns tokens (str"),
        (lambda text, tokens, merges, byte_fallback=True: [ref.bpe_encode(w, tokens, merges, byte_fallback)
                                                           for w in ref.pretokenize(text)], "flat list"),
        (stub, "not answered yet"),
    ],
    "tokenization-bpe_decode": [
        (lambda ids, tokens: ref.bpe_decode(ids, tokens).strip(), "spaces, tabs or line breaks"),
        (lambda ids, tokens: ref.bpe_decode([i for i in ids if not 4 <= i < 260], tokens), "byte ids (4-259) are left out"),
        (_decode_ignoring, "are dropped (errors='ignore')"),
        (_decode_chr, "a byte id becomes the character chr(b)"),
        (_decode_each_ignoring, "of the text are missing, the others right and in order"),
        (_decode_latin1, "it decodes the bytes as Latin-1"),
        (_decode_upper_check_only, "for a negative id: it returned a value; it should raise ValueError"),
        (lambda ids, tokens: b"".join(ref.id_bytes(i, tokens) for i in ids), "returns bytes"),
        (lambda ids, tokens: [ref.bpe_decode([i], tokens) for i in ids], "should return one str"),
        (stub, "not answered yet"),
    ],
    "tokenization-to_jamo": [
        (_nfd_syllables(), "for a text already decomposed (NFD): it returned a value; it should raise ValueError"),
        (_jamo_checked(_nfd_syllables(), refuse=lambda text: unicodedata.normalize("NFC", text) != text),
         "only conjoining jamo (U+1100..U+11FF) are refused"),
        (_jamo_checked(_by_hand(vowel=lambda s: s % 588 // 21)), "its jamo differ from NFD's"),
        (_jamo_checked(_by_hand(base=0xAC01)), "jamo where NFD gives"),
        (_jamo_checked(lambda text: _nfd_syllables()(text).replace("\t", "    ")), "spaces, tabs or line breaks"),
        (_jamo_list, "returns a list of symbols"),
        (lambda text: print(_jamo_regex(text)), "returns nothing (None)"),
        (stub, "not answered yet"),
    ],
    "tokenization-from_jamo": [
        (lambda text: " ".join(unicodedata.normalize("NFC", word) for word in text.split(" ")),
         "NFC on the whole text also changes"),
        (_compose_unchecked, "a letter can stand alone at the end"),
        (lambda text: list(_compose_groups(text)), "returns a list of symbols"),
        (lambda text: _compose_syllables(text).replace("\n", " "), "spaces, tabs or line breaks"),
        (lambda text: print(_compose_groups(text)), "returns nothing (None)"),
        (stub, "not answered yet"),
    ],
    "tokenization-gpt2_pretokenize": [
        (_gpt2_pattern(r"'s|'t|'re|'ve|'m|'ll|'d| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+"), "letters and digits are in one piece"),
        (_gpt2_pattern(r"'s|'t|'re|'ve|'m|'ll|'d| ?[a-zA-Z]+| ?[0-9]+| ?[^\s\w]+|\s+(?!\S)|\s+"),
         "Hangul syllables are lost"),
        (_gpt2_pattern(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+"), "underscores are lost"),
        (_gpt2_pattern(r"'s|'t|'re|'ve|'m|'ll|'d|[^\W\d_]+\s?|\d+\s?|(?:[^\s\w]|_)+\s?|\s+"),
         "a piece ends with a space"),
        (_gpt2_pattern(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+"), "a run of whitespace takes the space of the word after it"),
        (_gpt2_pattern(r" ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"), "English contractions are not pieces"),
        (_gpt2_pattern(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s*"), "an empty piece"),
        (lambda text: "".join(_gpt2_by_hand(text)), "returns one str"),
        (lambda text: print(_gpt2_by_hand(text)), "returns nothing (None)"),
        (stub, "not answered yet"),
    ],
    "tokenization-encode_user_text": [
        (_user_always, "a special-token string that a user typed became its special id"),
        (_user_tiktoken_default, "tiktoken's encode raises by default"),
        (_user_replace_unk, "is dropped from the text"),
        (lambda text, tokens, merges, allowed_special=(): _user_split(text, tokens, [], allowed_special),
         "first different at position"),  # (the merges not applied: every character its own token)
        (lambda text, tokens, merges, allowed_special=(): [str(i) for i in _user_split(text, tokens, merges,
                                                                                          allowed_special)],
         "returns tokens (str"),
        (lambda text, tokens, merges, allowed_special=(): print(_user_split(text, tokens, merges, allowed_special)),
         "returns nothing (None)"),
        (stub, "not answered yet"),
    ],
    "tokenization-train_byte_bpe": [
        (_byte_with(lambda tokens, merges: (tokens[:256] + tokens[256:][::-1], merges[::-1])), "the first merge"),
        (_byte_with(lambda tokens, merges: (tokens[:256] + tokens[256:][::-1], merges)),
         "is not left + right of merge"),
        (_byte_with(lambda tokens, merges: (tokens[1:256] + [bytes([0])] + tokens[256:], merges)),
         "are not the 256 byte values in order"),
        (_byte_with(lambda tokens, merges: (tokens[:-1], merges[:-1]) if merges else (tokens, merges)),
         "but it stops there"),
        (_byte_with(lambda tokens, merges: (tokens[:256] + [(a, b) for a, b in merges], merges)),
         "never the pair (left, right)"),
        (_byte_with(lambda tokens, merges: ([t.decode("latin-1") for t in tokens], merges)), "a token is a str"),
        (lambda text, n: _byte_with(lambda tokens, merges: (list(range(len(tokens))), merges))(text, n),
         "a token is an int"),
        (_byte_with(lambda tokens, merges: tokens), "should return two things"),
        (lambda text, n: print(ref.train_byte_bpe(text, n)), "returns nothing (None)"),
        (stub, "not answered yet"),
    ],
    "tokenization-byte_decode": [
        (lambda ids, tokens: _byte_decode_by(lambda ids, tokens: b"".join(tokens[i] for i in ids).decode(
            "utf-8", "replace"))([i % len(tokens) for i in ids], tokens), "it should raise ValueError"),  # tokens[-1]
        (_byte_decode_by(lambda ids, tokens: b"".join(tokens[i] for i in ids).decode("utf-8", "replace").replace(
            "\ufffd", "?")), "are dropped or kept as other characters"),
        (_byte_decode_by(lambda ids, tokens: b"".join(tokens[i] for i in ids).decode("utf-8", "replace")[::-1]),
         "differs from the rule's at character"),
        (_byte_decode_by(lambda ids, tokens: "".join(tokens[i].decode("utf-8", "replace") for i in ids[:-1])),
         "too many: bytes of one character"),
        (_byte_decode_by(lambda ids, tokens: b"".join(tokens[i] for i in ids)), "returns bytes"),
        (_byte_decode_by(lambda ids, tokens: [tokens[i].decode("utf-8", "replace") for i in ids]),
         "should return one str"),
        (lambda ids, tokens: print(b"".join(tokens[i] for i in ids)), "returns nothing (None)"),
        (stub, "not answered yet"),
    ],
}


VARIANTS = {
    "tokenization-count_pairs": [_pairs_counter, _pairs_defaultdict, _pairs_mutating],
    "tokenization-merge_pair": [_merge_flag, _merge_recursive, _merge_regex_unit_separator, _merge_list_comprehension],
    "tokenization-train_bpe": [_train_incremental, _train_sorted_first, _train_most_common,
                               # a merge that overwrites the counts of words that become equal is right inside
                               # train_bpe: its words are distinct strings, and a merge keeps their characters
                               _train_with(_merge_comprehension)],
    "tokenization-bpe_encode": [_encoder(_in_order), _encoder(_by_rank), _encode_as(np.array), _encode_as(torch.tensor),
                                _encode_as(tuple)],
    "tokenization-bpe_decode": [_decode_bytes_join, _decode_byte_list],
    # the arithmetic of the Unicode Standard (3.12), NFKD syllable by syllable (a Hangul syllable
    # has no compatibility decomposition), a regular expression
    "tokenization-to_jamo": [_jamo_checked(_by_hand()), _jamo_checked(_nfd_syllables("NFKD")), _jamo_regex],
    "tokenization-from_jamo": [_compose_by_hand, _compose_groups, _compose_syllables],
    # the pattern as a loop over the characters (str.isalpha, str.isdecimal), and re.split with the pattern captured
    "tokenization-gpt2_pretokenize": [_gpt2_by_hand, _gpt2_split_filter],
    # re.split on the allowed strings, and a scan position by position
    "tokenization-encode_user_text": [_user_split, _user_scan],
    # minbpe's ids and vocab dict, and the top pair by sorting with bytearray tokens and list merges
    "tokenization-train_byte_bpe": [_byte_ids, _byte_sorted],
    # a bytearray grown id by id, and Python's incremental UTF-8 decoder fed token by token
    "tokenization-byte_decode": [_byte_decode_bytearray, _byte_decode_incremental],
}


globals().update(shared_tests("tokenization", MISTAKES, VARIANTS, solutions="tokenization_notebook", seeds=6))


def test_the_kernel_path_carries_text_both_ways(tokenization_notebook):
    """As while grading: the questions (text, lists of strings) go into the kernel as JSON, the
    answers (strings, ids, text) come back through the wire, and the verdict holds."""
    for exercise in exercise_ids("tokenization"):
        seed = public_seed(exercise)
        asked = probe.decode_questions(probe.encode_questions([q.call() for q in questions(exercise, seed)]))
        fn = tokenization_notebook[exercise.split("-", 1)[1]]
        payload = probe.collect(exercise, fn, asked, get(exercise).driver)
        assert verdict(exercise, seed, decode_payload(payload, exercise)) is None, exercise


def test_a_learner_who_changes_the_inputs_changes_no_later_question():
    """The grader's questions stay as drawn (the drivers hand out copies)."""
    check("tokenization-count_pairs", _pairs_mutating)
    check("tokenization-count_pairs", ref.count_pairs)


def test_hidden_texts_hold_what_the_checks_need():
    """Special tokens, characters no token covers, half a character, an id past the vocabulary."""
    for seed in range(4):
        train = questions("tokenization-train_bpe", seed)
        assert train[0].args[0].count("<eos>") >= 5 and len(ref.train_bpe(*train[1].args)) < train[1].args[1]
        encode = questions("tokenization-bpe_encode", seed)
        tokens = encode[0].args[1]
        assert any(s in encode[1].args[0] for s in SPECIALS) and not set(encode[2].args[0]) <= set("".join(tokens))
        assert [c.args[-1] for c in encode] == [True, True, True, False]
        decode = questions("tokenization-bpe_decode", seed)
        assert "\ufffd" in ref.bpe_decode(decode[1].args[0], decode[1].args[1]) and decode[2].raises == "ValueError"


def test_a_diagnosis_shows_no_hidden_text():
    """Positions and kinds, never the hidden words: no Hangul in any diagnosis of a wrong answer."""
    for exercise, cases in MISTAKES.items():
        for fn, _ in cases:
            message = verdict(exercise, 3, decode_payload(
                probe.collect(exercise, fn, [q.call() for q in questions(exercise, 3)], get(exercise).driver),
                exercise))
            assert message and not any("\uac00" <= ch <= "\ud7a3" for ch in message), (exercise, message)


# The real bugs that outside code got full marks with: every seed's hidden inputs must reject them.
REAL_BUGS = [("tokenization-merge_pair", _merge_comprehension, "words that become equal after the merge keep one count"),
             ("tokenization-bpe_encode", _greedy_encoder(_wordpiece), "WordPiece's greedy match")]
MANY_SEEDS = student_seeds(40)


@pytest.mark.parametrize("exercise,fn,diagnosis", REAL_BUGS, ids=[e for e, _, _ in REAL_BUGS])
def test_the_real_bugs_are_rejected_on_every_seed(exercise, fn, diagnosis):
    """Before issue 33 no hidden input made two words equal after a merge, and the words that
    tell BPE from a longest match were tried without the space they stand with in the text:
    a greedy encoder passed on some student seeds (8, 13, 15, 34 and 35 of these)."""
    for seed in [public_seed(exercise), *MANY_SEEDS]:
        message = verdict(exercise, seed, answers_of(exercise, fn, seed))
        assert message and diagnosis in message, (seed, message)


def _visible_tests(grade_id: str) -> str:
    """A test cell of the source notebook, its hidden part left out: what a learner runs."""
    import nbformat

    from grader.course import SOLUTIONS

    path = SOLUTIONS / "11_tokenization" / "11_tokenization.ipynb"
    source = next(c.source for c in nbformat.read(path, as_version=4).cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n", "", source, flags=re.S)


VISIBLE = [("merge_pair", _merge_comprehension, "words that become equal add their counts"),
           ("bpe_encode", _greedy_encoder(_wordpiece), "merges apply in the order learned"),
           ("bpe_decode", _decode_upper_check_only, "id -1 is below the vocabulary")]


@pytest.mark.parametrize("name,fn,said", VISIBLE, ids=[n for n, _, _ in VISIBLE])
def test_a_visible_test_fails_for_the_mistake_it_names(tokenization_notebook, name, fn, said):
    """The visible asserts name the rules the real bugs broke: a learner sees them fail before
    submitting (and the solution passes them)."""
    cell = _visible_tests(f"tokenization-{name}-test")
    exec(cell, dict(tokenization_notebook))
    with pytest.raises(AssertionError, match=re.escape(said)):
        exec(cell, {**tokenization_notebook, name: fn})


# Visible asserts that name a property, proven against every mutant of the reference that breaks
# it (tests/test_visible_mutants.py's machinery, with notebook 11's properties).

def _counts_do_not_add(merge_pair) -> bool:
    words = {("a", "b", "c"): 2, ("ab", "c"): 3, (" ", "a", "b"): 4, ("c",): 1}
    return dict(merge_pair(dict(words), ("a", "b"))) != {("ab", "c"): 5, (" ", "ab"): 4, ("c",): 1}


def _not_in_order(bpe_encode) -> bool:
    return list(bpe_encode("abc", ["a", "b", "c", "bc", "ab"], [("b", "c"), ("a", "b")])) != [260, 263]


def _no_round_trip(bpe_decode) -> bool:
    merges = [("고", "기"), (" ", "고기"), (" ", "기")]
    tokens, text = ref.learned_tokens("고기 고기를 기를", merges), "<bos>고기를\t 🙂  기를\n<eos>\x00\xff"
    return bpe_decode(ref.bpe_encode(text, tokens, merges), tokens) != text


def _pieces_lose_text(gpt2_pretokenize) -> bool:
    return any("".join(gpt2_pretokenize(text)) != text
               for text in ["<bos>나는 고기를  먹었다\n<eos>", "it's 12,000 won!!  🙂\t", "x_y 3cats 고양이가,  2마리"])


def _user_text_lost(encode_user_text) -> bool:
    merges = [("고", "기"), (" ", "고기"), ("e", "o")]
    tokens, text = ref.learned_tokens("고기 고기를 eos", merges), "<eos>고기를 <bos>x<<pad>>  eos\n<unk>"
    return any(ref.bpe_decode(list(encode_user_text(text, tokens, merges, allowed)), tokens) != text
               for allowed in [set(), {"<eos>"}, "all"])


VISIBLE_PROPERTIES = [
    Property("tokenization-gpt2_pretokenize", "the pieces put back together are the text", _pieces_lose_text),
    Property("tokenization-encode_user_text", "bpe_decode(encode_user_text(text, ...)) == text", _user_text_lost),
    Property("tokenization-merge_pair", "('고', '기', '를') becomes ('고기', '를')", _counts_do_not_add),
    Property("tokenization-bpe_encode", "merges apply in the order learned", _not_in_order),
    Property("tokenization-bpe_decode", "bpe_decode(bpe_encode(text)) == text", _no_round_trip),
]


@pytest.mark.parametrize("prop", VISIBLE_PROPERTIES, ids=[p.exercise for p in VISIBLE_PROPERTIES])
def test_a_visible_assert_naming_a_property_fails_for_every_mutant_that_breaks_it(prop, monkeypatch):
    visible_assert_holds(prop, monkeypatch)
