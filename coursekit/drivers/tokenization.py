"""Drivers of notebook 11, tokenization: the learner's BPE functions, called on Python data.

The grader's questions carry text, lists of strings and arrays; a learner's function takes
and returns dicts keyed by tuples of symbols, lists of (left, right) merges and lists of
ids. Each driver builds those from the question, calls the learner's function on a fresh
copy, checks that what comes back is of the promised kind (its error says what to fix)
and hands it back in a fixed order, as plain data: strings and int64 arrays (None as it is,
so that a missing ``return`` is named as one). They hold no reference and no secret, and
judge nothing.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np


def words_table(symbols: list, lengths: Any, counts: Any) -> dict:
    """{word as a tuple of symbols: count}, from the flat symbols and each word's length (the
    grader reads its own questions and the drivers' answers back with it too)."""
    words, start = {}, 0
    for length, count in zip(np.asarray(lengths).tolist(), np.asarray(counts).tolist()):
        words[tuple(symbols[start:start + length])] = count
        start += length
    return words


# The errors below name kinds, never values: a value would show the grader's hidden text.

def _type_of(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _count(value: Any, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner} should map each key to an int count, but one count is {_type_of(value)}")
    return int(value)


def _symbols(key: Any, owner: str, size: int | None = None) -> tuple:
    """A key or merge: a tuple (or list) of str, of ``size`` items when given."""
    if (not isinstance(key, (tuple, list)) or not all(isinstance(s, str) for s in key)
            or (size is not None and len(key) != size) or not key):
        shape = f"a ({', '.join(['str'] * size)}) tuple" if size else "a tuple of str (the symbols)"
        raise TypeError(f"{owner}: each item should be {shape}, but one is {_type_of(key)}")
    return tuple(key)


def _mapping(result: Any, owner: str) -> Mapping:
    if not isinstance(result, Mapping):  # (None is handed back as it is: a missing return is named)
        raise TypeError(f"{owner} should return a dict, but it returns a {type(result).__name__}")
    return result


def drive_count_pairs(fn: Any) -> Any:
    """count_pairs(words) -> fn(symbols, lengths, counts) returning (lefts, rights, counts),
    the learner's {(left, right): count} sorted by pair."""
    def run(symbols, lengths, counts):
        pairs = fn(words_table(symbols, lengths, counts))
        if pairs is None:
            return None
        table = sorted((_symbols(pair, "count_pairs's keys", 2), _count(n, "count_pairs"))
                       for pair, n in _mapping(pairs, "count_pairs").items())
        return ([p[0] for p, _ in table], [p[1] for p, _ in table],
                np.array([n for _, n in table], dtype=np.int64))
    return run


def drive_merge_pair(fn: Any) -> Any:
    """merge_pair(words, pair) -> fn(symbols, lengths, counts, left, right) returning the
    learner's {word: count} sorted by word, flat: (symbols, lengths, counts)."""
    def run(symbols, lengths, counts, left, right):
        merged = fn(words_table(symbols, lengths, counts), (left, right))
        if merged is None:
            return None
        table = sorted((_symbols(word, "merge_pair's keys"), _count(n, "merge_pair"))
                       for word, n in _mapping(merged, "merge_pair").items())
        return ([s for word, _ in table for s in word], np.array([len(w) for w, _ in table], dtype=np.int64),
                np.array([n for _, n in table], dtype=np.int64))
    return run


def drive_train_bpe(fn: Any) -> Any:
    """train_bpe(text, num_merges) -> the same, returning the merges as (lefts, rights)."""
    def run(text, num_merges):
        merges = fn(text, int(num_merges))
        if merges is None:
            return None
        if not isinstance(merges, (list, tuple)):
            raise TypeError(f"train_bpe should return a list of (left, right) merges, but it returns a "
                            f"{type(merges).__name__}")
        merges = [_symbols(m, "train_bpe's list of merges", 2) for m in merges]
        return [m[0] for m in merges], [m[1] for m in merges]
    return run


def _id_array(result: Any, owner: str) -> np.ndarray:
    """A list (array, tensor) of int ids as an int64 array."""
    if hasattr(result, "tolist") and not isinstance(result, (list, tuple)):
        result = result.tolist()  # a numpy array or a torch tensor
    if not isinstance(result, (list, tuple)):
        raise TypeError(f"{owner} should return a list of int ids, but it returns a {type(result).__name__}")
    for item in result:
        if isinstance(item, str):
            raise TypeError(f"{owner} should return ids (int), but it returns tokens (str): look each token up, "
                            "its id is 260 + its index in tokens")
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise TypeError(f"{owner} should return a flat list of int ids, but one item is a "
                            f"{type(item).__name__}: extend the list with a word's ids (ids += ...), "
                            "do not append the word's list")
    return np.array(result, dtype=np.int64)


def drive_bpe_encode(fn: Any) -> Any:
    """bpe_encode(text, tokens, merges, byte_fallback=...) -> fn(text, tokens, lefts, rights,
    byte_fallback) returning the ids as an int64 array."""
    def run(text, tokens, lefts, rights, byte_fallback):
        ids = fn(text, list(tokens), list(zip(lefts, rights)), byte_fallback=bool(byte_fallback))
        return None if ids is None else _id_array(ids, "bpe_encode")
    return run


def drive_bpe_decode(fn: Any) -> Any:
    """bpe_decode(ids, tokens) -> the same, ids as a list of Python ints; the answer must be a str."""
    def run(ids, tokens):
        text = fn([int(i) for i in np.asarray(ids).tolist()], list(tokens))
        if text is None:
            return None
        if isinstance(text, (bytes, bytearray)):
            raise TypeError("bpe_decode should return a str, but it returns bytes: turn them into text once, "
                            "at the end, with .decode('utf-8', errors='replace')")
        if not isinstance(text, str):
            raise TypeError(f"bpe_decode should return one str, but it returns a {type(text).__name__}: join the "
                            "pieces with ''.join(...)")
        return text
    return run


def _text_driver(name: str) -> Any:
    """A driver of a text -> text function: the answer must be one str (a list of symbols is named)."""
    def drive(fn: Any) -> Any:
        def run(text):
            result = fn(text)
            if result is None:
                return None
            if isinstance(result, (list, tuple)) and all(isinstance(s, str) for s in result):
                raise TypeError(f"{name} should return one str, but it returns a list of symbols: join them, "
                                "''.join(...), so that the text's other characters and spaces stay as they are")
            if not isinstance(result, str):
                raise TypeError(f"{name} should return one str, but it returns a {type(result).__name__}")
            return result
        return run
    return drive


drive_to_jamo = _text_driver("to_jamo")      # to_jamo(text) -> text
drive_from_jamo = _text_driver("from_jamo")  # from_jamo(text) -> text


def drive_gpt2_pretokenize(fn: Any) -> Any:
    """gpt2_pretokenize(text) -> the same, returning the pieces as a list of str."""
    def run(text):
        pieces = fn(text)
        if pieces is None:
            return None
        if isinstance(pieces, str):
            raise TypeError("gpt2_pretokenize should return a list of str (the pieces), but it returns one str: "
                            "re.findall(pattern, text) gives the list")
        if not isinstance(pieces, (list, tuple)) or not all(isinstance(p, str) for p in pieces):
            raise TypeError(f"gpt2_pretokenize should return a list of str (the pieces), but it returns {_type_of(pieces)}"
                            + (" with an item that is no str" if isinstance(pieces, (list, tuple)) else ""))
        if any(p == "" for p in pieces):
            raise TypeError("gpt2_pretokenize returns an empty piece: every piece holds at least one character "
                            "(a pattern that can match nothing, such as \\s*, adds empty matches)")
        return list(pieces)
    return run


def drive_encode_user_text(fn: Any) -> Any:
    """encode_user_text(text, tokens, merges, allowed_special) -> fn(text, tokens, lefts, rights,
    allowed) returning the ids as an int64 array; ``allowed`` is "all" or the allowed strings
    with spaces between them ("" for none), handed to the learner as "all" or a set of str (as
    tiktoken takes it)."""
    def run(text, tokens, lefts, rights, allowed):
        allowed = allowed if allowed == "all" else set(allowed.split())
        ids = fn(text, list(tokens), list(zip(lefts, rights)), allowed_special=allowed)
        return None if ids is None else _id_array(ids, "encode_user_text")
    return run


def _byte_token(value: Any, owner: str) -> str:
    """One byte-level token (bytes), as hex for the wire; the likely other kinds named."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, bool) or isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: a token is an int, not bytes: iterating over a bytes object gives ints "
                        "(tuple(word.encode('utf-8')) is a tuple of ints, and left + right adds them as numbers); "
                        "write each byte b as bytes([b])")
    if isinstance(value, str):
        raise TypeError(f"{owner}: a token is a str, not bytes: the symbols are the UTF-8 bytes of the words, "
                        "word.encode('utf-8'), each byte b as bytes([b]), never its characters")
    if isinstance(value, (tuple, list)):
        raise TypeError(f"{owner}: a token is {_type_of(value)}, not bytes: a new token is left + right, the two "
                        "bytes objects joined into one, never the pair (left, right)")
    raise TypeError(f"{owner}: a token is {_type_of(value)}, not bytes")


def drive_train_byte_bpe(fn: Any) -> Any:
    """train_byte_bpe(text, num_merges) -> the same, returning (tokens, lefts, rights), each a
    list of bytes written as hex strings (the wire carries text)."""
    def run(text, num_merges):
        result = fn(text, int(num_merges))
        if result is None:
            return None
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(f"train_byte_bpe should return two things, (tokens, merges), but it returns "
                            f"{_type_of(result)}")
        tokens, merges = result
        if not isinstance(tokens, (list, tuple)) or not isinstance(merges, (list, tuple)):
            raise TypeError(f"train_byte_bpe should return (tokens, merges), two lists, but it returns "
                            f"({_type_of(tokens)}, {_type_of(merges)})")
        for merge in merges:
            if not isinstance(merge, (tuple, list)) or len(merge) != 2:
                raise TypeError(f"train_byte_bpe's merges: each should be a (left, right) tuple of bytes, but one is "
                                f"{_type_of(merge)}")
        return ([_byte_token(t, "train_byte_bpe's tokens") for t in tokens],
                [_byte_token(m[0], "train_byte_bpe's merges") for m in merges],
                [_byte_token(m[1], "train_byte_bpe's merges") for m in merges])
    return run


def drive_byte_decode(fn: Any) -> Any:
    """byte_decode(ids, tokens) -> fn(ids, tokens as hex strings) calling the learner's with a
    list of Python ints and a list of bytes; the answer must be a str."""
    def run(ids, tokens):
        text = fn([int(i) for i in np.asarray(ids).tolist()], [bytes.fromhex(t) for t in tokens])
        if text is None:
            return None
        if isinstance(text, (bytes, bytearray)):
            raise TypeError("byte_decode should return a str, but it returns bytes: decode the joined bytes once, "
                            "b''.join(...).decode('utf-8', errors='replace')")
        if not isinstance(text, str):
            raise TypeError(f"byte_decode should return one str, but it returns {_type_of(text)}")
        return text
    return run
