"""References of notebook 11, tokenization: byte-pair encoding with byte fallback.

The rules the notebook states, written once for the grader (plain Python, no numpy):

- ids: the special tokens ``<pad> <bos> <eos> <unk>`` are 0-3, byte ``b`` is ``4 + b``
  (4-259), learned token ``tokens[i]`` is ``260 + i``;
- ``pretokenize``: text -> words, a special-token string is a word of its own, any other
  word is ``" ?\\S+"`` (a word with its leading space) or one whitespace character; the
  words put back together are the text;
- a merge never crosses a word boundary, never touches a special token; the most
  frequent pair is merged, ties going to the smallest ``(left, right)`` in Python's order;
- encode applies the merges in the order they were learned; a symbol that is no token
  becomes its UTF-8 bytes (byte fallback) or ``<unk>``; decode is its exact inverse;
- ``to_jamo``: each Hangul syllable (U+AC00..U+D7A3) as its 2 or 3 conjoining jamo (NFD),
  every other character kept; text that already holds conjoining jamo (U+1100..U+11FF) is
  refused, so that ``from_jamo`` (NFC on each run of jamo) is its exact inverse.

Source: Sennrich, Haddow and Birch (2016), "Neural Machine Translation of Rare Words with
Subword Units", Algorithm 1; byte fallback as in SentencePiece (its byte_fallback option, later than Kudo and Richardson, 2018).
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter

from coursekit.translation import SPECIALS, UNK_ID

BYTE_OFFSET = len(SPECIALS)  # byte b has id 4 + b
FIRST_TOKEN_ID = BYTE_OFFSET + 256  # tokens[i] has id 260 + i

_SPECIAL = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")
_WORD = re.compile(r" ?\S+|\s")


def pretokenize(text: str) -> list[str]:
    """Text -> words (``"".join(words) == text``); a special-token string is a word of its own."""
    words: list[str] = []
    for piece in _SPECIAL.split(text):
        words += [piece] if piece in SPECIALS else _WORD.findall(piece)
    return words


def word_counts(text: str) -> dict[tuple[str, ...], int]:
    """Each word of ``text`` but the special tokens, as a tuple of its characters, with its count."""
    return dict(Counter(tuple(word) for word in pretokenize(text) if word not in SPECIALS))


def count_pairs(words: dict) -> dict[tuple[str, str], int]:
    """{word (tuple of symbols): count} -> {(left, right): how often the two stand side by side}."""
    pairs: Counter = Counter()
    for word, count in words.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    return dict(pairs)


def merge_pair(words: dict, pair: tuple[str, str]) -> dict[tuple[str, ...], int]:
    """{word: count} with ``pair`` merged in every word, from the left, stepping past each
    merged place; counts of words that become equal add up."""
    left, right = pair
    merged: Counter = Counter()
    for word, count in words.items():
        symbols, skip = [], False
        for i, symbol in enumerate(word):  # (a for loop: no change to it can loop for ever)
            if skip:
                skip = False  # the right half of the pair just merged
            elif i + 1 < len(word) and symbol == left and word[i + 1] == right:
                symbols.append(left + right)
                skip = True
            else:
                symbols.append(symbol)
        merged[tuple(symbols)] += count
    return dict(merged)


def merge_word(word: tuple[str, ...], left: str, right: str) -> tuple[str, ...]:
    """``word`` with every (left, right) side by side, from the left, made one symbol: the
    one word of a one-word corpus merged."""
    (merged,) = merge_pair({tuple(word): 1}, (left, right))
    return merged


def train_bpe(text: str, num_merges: int) -> list[tuple[str, str]]:
    """The merges, in order: at most ``num_merges``, fewer when no pair is left; each the most
    frequent pair, ties to the smallest (left, right)."""
    words = Counter(tuple(word) for word in pretokenize(text) if word not in SPECIALS)
    merges = []
    for _ in range(num_merges):
        pairs = count_pairs(words)
        if not pairs:
            break
        merges.append(min(pairs, key=lambda pair: (-pairs[pair], pair)))
        words = merge_pair(words, merges[-1])
    return merges


def learned_tokens(text: str, merges: list) -> list[str]:
    """The training text's characters (sorted), then each merge's new token once, in order."""
    tokens = sorted({ch for word in word_counts(text) for ch in word})
    seen = set(tokens)
    for left, right in merges:
        if left + right not in seen:
            tokens.append(left + right)
            seen.add(left + right)
    return tokens


def segment(word: str, merges: list) -> tuple[str, ...]:
    """A word's symbols after every merge, in the order learned."""
    symbols = tuple(word)
    for left, right in merges:
        symbols = merge_word(symbols, left, right)
    return symbols


def bpe_encode(text: str, tokens: list, merges: list, byte_fallback: bool = True) -> list[int]:
    """Text -> ids: special tokens whole, each word's characters merged by every merge in the
    order learned, then each symbol's id, else its UTF-8 bytes (``byte_fallback``) or <unk>."""
    ids_of = {token: FIRST_TOKEN_ID + i for i, token in enumerate(tokens)}
    ids = []
    for word in pretokenize(text):
        if word in SPECIALS:
            ids.append(SPECIALS.index(word))
            continue
        symbols = tuple(word)
        for left, right in merges:
            symbols = merge_word(symbols, left, right)
        for symbol in symbols:
            if symbol in ids_of:
                ids.append(ids_of[symbol])
            elif byte_fallback:
                ids += [BYTE_OFFSET + b for b in symbol.encode("utf-8")]
            else:
                ids.append(UNK_ID)
    return ids


def id_bytes(i: int, tokens: list) -> bytes:
    """The bytes of one id: a special token's string, a byte, a token's UTF-8.

    Raises:
        ValueError: ``i`` is negative or not below 260 + len(tokens).
    """
    table = [s.encode("utf-8") for s in SPECIALS] + [bytes([b]) for b in range(256)] + [
        t.encode("utf-8") for t in tokens]
    if not 0 <= i < len(table):
        raise ValueError(f"id {i} is not in the vocabulary (0 .. {len(table) - 1})")
    return table[i]


def bpe_decode(ids: list, tokens: list) -> str:
    """Ids -> text: all their bytes, decoded once; bytes that are not UTF-8 become U+FFFD.

    Raises:
        ValueError: an id is negative or not below 260 + len(tokens).
    """
    data = bytearray()
    for i in ids:  # (Python ints: the driver passes them so)
        if not 0 <= i < FIRST_TOKEN_ID + len(tokens):
            raise ValueError(f"id {i} is not in the vocabulary")
        if i < BYTE_OFFSET:
            data += SPECIALS[i].encode("utf-8")
        elif i < FIRST_TOKEN_ID:
            data.append(i - BYTE_OFFSET)
        else:
            data += tokens[i - FIRST_TOKEN_ID].encode("utf-8")
    return data.decode("utf-8", errors="replace")


# The Unicode block of conjoining jamo: leading consonants (choseong) U+1100.., vowels
# (jungseong) U+1161.., final consonants (jongseong, batchim) U+11A8..U+11C2, old Hangul after.
_CONJOINING = re.compile("[\u1100-\u11ff]")
_JAMO_RUN = re.compile("[\u1100-\u11ff]+")


def to_jamo(text: str) -> str:
    """Text -> text with each Hangul syllable (U+AC00..U+D7A3) as its 2 or 3 conjoining jamo
    (NFD), every other character as it is.

    Raises:
        ValueError: ``text`` holds conjoining jamo (U+1100..U+11FF) already.
    """
    if _CONJOINING.search(text):
        raise ValueError("the text holds conjoining jamo (U+1100..U+11FF) already: compose it first, "
                         "unicodedata.normalize('NFC', text)")
    return "".join(unicodedata.normalize("NFD", ch) if "\uac00" <= ch <= "\ud7a3" else ch for ch in text)


def from_jamo(text: str) -> str:
    """The inverse of ``to_jamo``: each run of conjoining jamo composed (NFC), nothing else touched;
    a letter that makes no syllable with its neighbours (a lone final) stays as it is."""
    return _JAMO_RUN.sub(lambda run: unicodedata.normalize("NFC", run.group()), text)



def gpt2_pretokenize(text: str) -> list[str]:
    r"""Text -> GPT-2's pieces (``"".join(pieces) == text``): an English contraction ('s 't 're
    've 'm 'll 'd), a run of letters, of digits or of other characters (punctuation, symbols),
    each with the one space before it; a run of whitespace keeps its last space for the word
    after it (``\s+(?!\S)``), and whitespace at the end is one piece.

    GPT-2's pattern (Radford et al., 2019, section 2.2; its encoder.py) with ``re``'s Unicode
    classes for the ``regex`` module's ``\p{L}`` and ``\p{N}``: a letter is ``[^\W\d_]`` (a word
    character that is no digit and no underscore), a digit ``\d`` (a Unicode decimal digit).
    """
    contraction = r"'(?:s|t|re|ve|m|ll|d)"
    letters = " ?" + r"[^\W\d_]+"
    digits = " ?" + r"\d+"
    other = " ?" + r"(?:[^\s\w]|_)+"
    spaces_before_a_word = r"\s+" + r"(?!\S)"
    pattern = "|".join([contraction, letters, digits, other, spaces_before_a_word, r"\s+"])
    return re.findall(pattern, text)


def encode_ordinary(text: str, tokens: list, merges: list) -> list[int]:
    """Text -> ids with no special token at all (tiktoken's encode_ordinary): each word of
    ``" ?\\S+|\\s"``, a special-token string in it too, merged and looked up, else its UTF-8 bytes."""
    ids_of = {token: FIRST_TOKEN_ID + i for i, token in enumerate(tokens)}
    ids = []
    for word in _WORD.findall(text):
        for symbol in segment(word, merges):
            ids += [ids_of[symbol]] if symbol in ids_of else [BYTE_OFFSET + b for b in symbol.encode("utf-8")]
    return ids


def encode_user_text(text: str, tokens: list, merges: list, allowed_special=()) -> list[int]:
    """Text -> ids where only the special-token strings of ``allowed_special`` (a collection of
    them, or "all") become their ids 0-3; every other character, a special-token string that
    is not allowed too, is ordinary text (``encode_ordinary``), as tiktoken's
    ``encode(text, allowed_special=..., disallowed_special=())``.

    Raises:
        ValueError: ``allowed_special`` holds a string that is no special token.
    """
    if allowed_special == "all":
        allowed_special = SPECIALS
    for special in allowed_special:
        if special not in SPECIALS:
            raise ValueError(f"{special!r} is no special token; allowed_special takes some of {SPECIALS} or 'all'")
    allowed = [special for special in SPECIALS if special in allowed_special]
    if not allowed:
        return encode_ordinary(text, tokens, merges)
    ids = []
    for piece in re.split("(" + "|".join(map(re.escape, allowed)) + ")", text):
        if piece in allowed:
            ids.append(SPECIALS.index(piece))
        else:
            ids += encode_ordinary(piece, tokens, merges)
    return ids


def byte_word_counts(text: str) -> dict[tuple[bytes, ...], int]:
    """Each word of ``text`` but the special tokens, as a tuple of its UTF-8 bytes (each a
    ``bytes`` of length 1), with its count."""
    words: Counter = Counter()
    for word in pretokenize(text):
        if word not in SPECIALS:
            words[tuple(bytes([b]) for b in word.encode("utf-8"))] += 1
    return dict(words)


def train_byte_bpe(text: str, num_merges: int) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """Byte-level BPE: (tokens, merges). ``tokens[i] == bytes([i])`` for the 256 byte values,
    whichever occur, then one token per merge, ``tokens[256 + k] == left + right`` of merge k;
    the merges as ``train_bpe`` picks them (the most frequent pair, ties to the smallest
    ``(left, right)`` in Python's order of bytes), on the words of ``pretokenize`` written as
    their UTF-8 bytes, special tokens left out; fewer than ``num_merges`` when no pair is left.

    Source: Radford et al. (2019), section 2.2 (BPE on bytes, a base vocabulary of 256); the
    layout of minbpe's vocab (ids 0-255 the bytes, 256 + k the merge k)."""
    words = byte_word_counts(text)
    tokens = [bytes([i]) for i in range(256)]
    merges: list[tuple[bytes, bytes]] = []
    for _ in range(num_merges):
        pairs = count_pairs(words)
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        words = merge_pair(words, best)
        merges.append(best)
        tokens.append(best[0] + best[1])
    return tokens, merges


def byte_encode(text: str, tokens: list, merges: list) -> list[int]:
    """Text -> byte-level ids: each word of ``pretokenize`` (a special-token string is a word of
    text here: this vocabulary has no special ids) as its UTF-8 bytes, merged by every merge in
    the order learned, each token's id its index in ``tokens`` (the first, should two be equal)."""
    ids_of: dict = {}
    for i, token in enumerate(tokens):
        ids_of.setdefault(bytes(token), i)
    ids = []
    for word in pretokenize(text):
        (symbols,) = merge_pairs_in_order({tuple(bytes([b]) for b in word.encode("utf-8")): 1}, merges)
        ids += [ids_of[symbol] for symbol in symbols]
    return ids


def merge_pairs_in_order(words: dict, merges: list) -> dict:
    """``words`` with every merge applied, in the order learned."""
    for pair in merges:
        words = merge_pair(words, pair)
    return words


def byte_decode(ids: list, tokens: list) -> str:
    """Byte-level ids -> text: the tokens' bytes joined, then decoded once as UTF-8 with
    ``errors="replace"`` (each invalid sequence one U+FFFD).

    Raises:
        ValueError: an id outside 0 .. len(tokens) - 1.
    """
    for i in ids:
        if not 0 <= i < len(tokens):
            raise ValueError("an id is outside the vocabulary, 0 .. len(tokens) - 1")
    return b"".join(tokens[i] for i in ids).decode("utf-8", errors="replace")
