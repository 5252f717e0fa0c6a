"""Hidden checks of notebook 11, tokenization: byte-pair encoding, its five exercises.

The answers are text: dicts of symbol pairs, lists of merges, ids, a decoded string. The
drivers (``coursekit/drivers/tokenization.py``) hand them back as strings and int64 arrays
in a fixed order (the wire carries text); each spec's ``prepare`` checks their kinds, and
they are compared exactly (``rtol = atol = 0``), so that the catalogue of mistakes and the
knobs of train_bpe work as for any array answer. When no catalogued mistake
explains an answer, each exercise asks its own further questions (``_describe_*``): which
pairs are extra or missing, at which merge a learner's training first leaves the rule and
why (a pair across words, a tie, stale counts), whether encoded ids decode back to the text.
A diagnosis names positions and kinds, never the hidden text or tokens.

The hidden texts are sentences of the course's toy grammar (``coursekit.translation``) in
Korean and English, with special tokens, characters no tokenizer has seen and odd spacing.
"""
from __future__ import annotations

import random
import re
from typing import Callable

import numpy as np

from coursekit.drivers.tokenization import words_table
from coursekit.protocol import Raised, Unsupported
from coursekit.translation import SPECIALS, UNK_ID, detokenize_ko, sample_sentence, to_english, to_korean

from ._core import Call, Case, CheckFailed, Knob, Mistake, Raises, Spec, _equal, catalogued, judge_case
from .reference import tokenization as ref

# ---------------------------------------------------------------- answers as data


def _strings(part: object, what: str) -> tuple[str, ...]:
    if isinstance(part, tuple) and all(isinstance(s, str) for s in part):
        return part
    if isinstance(part, np.ndarray) and part.size == 0:  # an empty list travels as an empty array
        return ()
    raise CheckFailed(f"{what}: the grader could not read its strings back")


def _ints(part: object, what: str) -> np.ndarray:
    if isinstance(part, np.ndarray) and (part.size == 0 or part.dtype.kind in "iu") and part.ndim <= 1:
        return part.astype(np.int64).reshape(-1)
    raise CheckFailed(f"{what}: the grader could not read its numbers back")


def _table(*kinds: str) -> Callable[[object, Call, str], object]:
    """A driver's tuple answer, ``kinds`` ("strings" or "ints") in order, checked and made
    comparable: a list of strings as a tuple of str (empty too), numbers as int64."""
    read = {"strings": _strings, "ints": _ints}

    def prepare(answer: object, call: Call, what: str) -> tuple:
        if not isinstance(answer, tuple) or len(answer) != len(kinds):
            raise CheckFailed(f"{what}: the grader could not read the answer back")
        return tuple(read[kind](part, what) for kind, part in zip(kinds, answer))
    return prepare


def _text(answer: object, call: Call, what: str) -> str:
    if not isinstance(answer, str):
        raise CheckFailed(f"{what} should return one str")
    return answer


def _judged(describe: Callable[[Case], None]) -> Callable[[Case], None]:
    """The judge of every exercise here: raised errors and promised exceptions as for any
    exercise (``judge_case``), then exact equality, the catalogue (and knobs), and last
    ``describe``, the exercise's further questions, which raises the diagnosis."""
    def judge(case: Case) -> None:
        if case.call.raises or isinstance(case.answer, (Raised, Unsupported)):
            judge_case(case)
            return
        answer = case.spec.prepare(case.answer, case.call, case.what)
        if _equal(answer, case.spec.prepare(case.expected, case.call, case.what), 0.0, 0.0):
            return
        found = catalogued(case, answer)
        if found:
            case.fail(found)
        describe(case)
        case.fail("wrong answer")  # (describe always raises; this line is a guard)
    return judge


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ---------------------------------------------------------------- hidden texts


def _sentences(rng: np.random.Generator, korean: int, english: int) -> list[str]:
    """Sentences of the toy grammar, drawn from ``rng``, Korean and English shuffled together."""
    draw = random.Random(int(rng.integers(2**32)))
    lines = [detokenize_ko(to_korean(sample_sentence(draw))) for _ in range(korean)]
    lines += [" ".join(to_english(sample_sentence(draw))) for _ in range(english)]
    draw.shuffle(lines)
    return lines


def _flat(words: dict) -> tuple:
    """{word: count} as the question's arguments: the symbols, each word's length, the counts
    (the inverse of the driver's ``words_table``)."""
    return (tuple(s for word in words for s in word), np.array([len(w) for w in words], dtype=np.int64),
            np.array(list(words.values()), dtype=np.int64))


def _mid_training(rng: np.random.Generator, merges: int) -> dict:
    """{word: count} of a small corpus after some merges: multi-character symbols, words
    with their leading space, a one-symbol word, counts from 1 to 9."""
    text = " ".join(_sentences(rng, 3, 1))
    words = ref.word_counts(text)
    for pair in ref.train_bpe(text, merges):
        words = ref.merge_pair(words, pair)
    longer = [word for word in words if len(word) > 1]
    rng.shuffle(longer)
    table = {word: int(rng.integers(1, 10)) for word in longer[:7]}
    table[next((w for w in words if len(w) == 1), ("안",))] = int(rng.integers(2, 10))
    return table


# ---------------------------------------------------------------- count_pairs


def _pairs_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for merges in (0, 6):
        words = _mid_training(rng, merges)
        a, b = sorted({s for w in words for s in w})[:2]
        words[(a, b, a, b, a)] = int(rng.integers(2, 10))  # a pair twice in one word, at two places
        calls.append(Call(_flat(words), what=f"count_pairs(words) for {len(words)} words"
                                              f"{' after some merges' if merges else ''}"))
    return calls


def _counting(pairs_of: Callable[[tuple], list], weighted: bool = True):
    """A learner's count_pairs that counts ``pairs_of(word)`` of every word."""
    def count_pairs(words):
        pairs = {}
        for word, count in words.items():
            for pair in pairs_of(word):
                pairs[pair] = pairs.get(pair, 0) + (count if weighted else 1)
        return pairs
    return count_pairs


def _across_words(words):
    sequence = []
    for word, count in words.items():
        sequence += list(word) * count
    pairs = {}
    for pair in zip(sequence, sequence[1:]):
        pairs[pair] = pairs.get(pair, 0) + 1
    return pairs


def _pair_counts(prepared: tuple) -> dict:
    lefts, rights, counts = prepared
    return dict(zip(zip(lefts, rights), counts.tolist()))


def _describe_pairs(case: Case) -> None:
    got, want = (_pair_counts(case.spec.prepare(answer, case.call, case.what))
                 for answer in (case.answer, case.expected))
    words = words_table(*case.call.args)
    inside = {pair for word in words for pair in zip(word, word[1:])}
    if set(got) - inside:
        case.fail(f"it has {_plural(len(set(got) - inside), 'pair')} that stand side by side in no word: "
                  "count (word[i], word[i + 1]) inside each word, never across two words")
    if set(want) - set(got):
        case.fail(f"it misses {_plural(len(set(want) - set(got)), 'pair')} of {len(want)}: every position i of "
                  "every word, i + 1 < len(word)")
    wrong = sum(got[p] != n for p, n in want.items())
    case.fail(f"{wrong} of {len(want)} counts are wrong: each occurrence of a pair adds the count of its word")


COUNT_PAIRS = Spec(
    id="tokenization-count_pairs",
    function="count_pairs",
    inputs=_pairs_inputs,
    reference=ref.count_pairs,
    driver="tokenization.drive_count_pairs",
    prepare=_table("strings", "strings", "ints"),
    judge=_judged(_describe_pairs),
    rtol=0.0, atol=0.0,
    mistakes=(
        Mistake("across_words", "it counts pairs across word boundaries (the last symbol of one word with the "
                "first of the next): count inside each word only, a merge never joins two words", _across_words),
        Mistake("unweighted", "each word counts once: add the word's count, how often it occurs in the corpus",
                _counting(lambda w: zip(w, w[1:]), weighted=False)),
        Mistake("once_per_word", "a pair that occurs twice in one word is counted once: count every position, "
                "not the set of pairs", _counting(lambda w: set(zip(w, w[1:])))),
        Mistake("last_pair_missed", "it misses the last pair of each word: a word of n symbols has n - 1 pairs, "
                "i from 0 to len(word) - 2", _counting(lambda w: [(w[i], w[i + 1]) for i in range(len(w) - 2)])),
    ),
    errors=(
        Raises("{what} raised {error}: word[i + 1] runs past the end for the last i; a word of n symbols has "
               "n - 1 pairs (zip(word, word[1:]))",
               example=_counting(lambda w: [(w[i], w[i + 1]) for i in range(len(w))]), match="IndexError"),
    ),
    figures=("tokenization-count_pairs-figure",),
)


# ---------------------------------------------------------------- merge_pair


def _merge_inputs(rng: np.random.Generator) -> list[Call]:
    words = _mid_training(rng, 4)
    a, b = sorted({s for w in words for s in w if s.strip()})[-2:]
    spaced = next((s for w in words for s in w if s.startswith(" ") and len(s) > 1), " " + a)  # a leading space
    other = sorted({s for w in words for s in w if s.strip() and s not in (a, b)})[0]
    words[(spaced, a, b, spaced, a, b)] = int(rng.integers(2, 10))  # the pair twice in one word
    words[(other + a, b, b)] = int(rng.integers(2, 10))              # a symbol that ends in a: no place to merge
    first = Call(_flat(words) + (a, b), what=f"merge_pair(words, pair) for {len(words)} words")
    words = _mid_training(rng, 0)
    a = sorted({s for w in words for s in w if s.strip()})[0]
    words[(a, a, a)] = int(rng.integers(2, 10))                      # overlapping: the first two merge
    words[(" ", a, a, a, a)] = int(rng.integers(2, 10))
    return [first, Call(_flat(words) + (a, a), what=f"merge_pair(words, pair) for {len(words)} words and a "
                                                     "pair of two equal symbols")]


def _merging(merge_word: Callable[[tuple, str, str], tuple]):
    def merge_pair(words, pair):
        merged = {}
        for word, count in words.items():
            new = merge_word(word, *pair)
            merged[new] = merged.get(new, 0) + count
        return merged
    return merge_pair


def _first_only(word, a, b):
    for i in range(len(word) - 1):
        if word[i] == a and word[i + 1] == b:
            return word[:i] + (a + b,) + word[i + 2:]
    return word


def _no_skip(word, a, b):
    """Merges at every i where (a, b) starts, without stepping over the merged symbol."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(a + b)
        else:
            out.append(word[i])
        i += 1
    return tuple(out)


def _replaced(word, a, b):
    return tuple(" ".join(word).replace(f"{a} {b}", a + b).split(" "))


def _describe_merged(case: Case) -> None:
    got, want = (words_table(*case.spec.prepare(answer, case.call, case.what))
                 for answer in (case.answer, case.expected))
    spelled = {"".join(w) for w in want}
    if any("".join(w) not in spelled for w in got):
        case.fail("the symbols of a word no longer spell a word of the input: merging must keep every "
                  "character, in order (only two neighbouring symbols become one)")
    if sum(got.values()) != sum(want.values()):
        case.fail("the counts do not add up to the input's: every word keeps its count")
    wrong = sum(got.get(w) != n for w, n in want.items())
    case.fail(f"{wrong} of the {len(want)} words {'is' if wrong == 1 else 'are'} merged differently: replace each "
              "(left, right) side by side, from the left, by left + right, and step past the new symbol")


MERGE_PAIR = Spec(
    id="tokenization-merge_pair",
    function="merge_pair",
    inputs=_merge_inputs,
    reference=ref.merge_pair,
    driver="tokenization.drive_merge_pair",
    prepare=_table("strings", "ints", "ints"),
    judge=_judged(_describe_merged),
    rtol=0.0, atol=0.0,
    mistakes=(
        Mistake("first_only", "it merges only the first occurrence of the pair in a word: merge every "
                "occurrence, from the left", _merging(_first_only)),
        Mistake("no_skip", "after merging word[i] and word[i + 1] it looks at word[i + 1] again: step past "
                "both (i += 2), so (a, a, a) becomes (aa, a), not (aa, aa, a)", _merging(_no_skip)),
        Mistake("string_replace", "it joins the symbols with spaces and uses str.replace: a symbol that holds a "
                "space (a word's leading space) falls apart, and 'b c' also matches inside 'ab c'; compare "
                "whole symbols, pair by pair", _merging(_replaced)),
    ),
    figures=("tokenization-merge_pair-figure",),
)


# ---------------------------------------------------------------- train_bpe

_SPECIAL = re.compile("|".join(map(re.escape, SPECIALS)))

TIES = {  # how a learner picks among pairs of the top count
    "smallest": lambda pairs: min(pairs, key=lambda p: (-pairs[p], p)),
    "first_seen": lambda pairs: max(pairs, key=pairs.get),
    "largest": lambda pairs: max(pairs, key=lambda p: (pairs[p], p)),
}


def _learner_words(text: str, words: str, specials: str) -> list[str]:
    if words == "pretokenize":
        return [w for w in ref.pretokenize(text) if specials == "keep" or w not in SPECIALS]
    if specials == "skip":
        text = _SPECIAL.sub(" " if words == "split" else "", text)
    return text.split() if words == "split" else [text]


def _train_variant(tie: str = "smallest", recount: bool = True, words: str = "pretokenize",
                   specials: str = "skip", weights: bool = True, stop: bool = True):
    """train_bpe as a learner writes it, with one choice per knob (the defaults are right);
    ``stop=False`` forgets to stop when no pair is left (an error rule's example)."""
    def train_bpe(text, num_merges):
        counts = {}
        for word in _learner_words(text, words, specials):
            counts[tuple(word)] = (counts.get(tuple(word), 0) + 1) if weights else 1
        merges, pairs = [], ref.count_pairs(counts)
        for _ in range(num_merges):
            if recount:
                pairs = ref.count_pairs(counts)
            if not pairs and stop:
                break
            best = TIES[tie](pairs)
            if not recount:
                del pairs[best]
            counts = ref.merge_pair(counts, best)
            merges.append(best)
        return merges
    return train_bpe


TRAIN_KNOBS = (
    Knob("tie", (("first_seen", "ties are broken by the pair seen first (max(pairs, key=pairs.get) keeps the first "
                                "of equal counts); the stated rule is the smallest (left, right) in Python's order, "
                                "min(pairs, key=lambda p: (-pairs[p], p))"),
                 ("largest", "ties are broken towards the largest (left, right); the stated rule is the smallest, "
                             "min(pairs, key=lambda p: (-pairs[p], p))"))),
    Knob("recount", ((False, "the pair counts are not updated after a merge: merging (a, b) removes pairs and "
                             "makes new ones with the merged symbol, so count the pairs again before every merge"),)),
    Knob("words", (("whole", "it merges across word boundaries: the text is one sequence of characters, so a pair "
                             "can join the end of one word to the space of the next; split the text into words "
                             "(pretokenize) and merge inside each word"),
                   ("split", "it splits the text with str.split(), which drops the spaces and line breaks: the words "
                             "keep their leading space (use pretokenize), or decoding cannot put the text back"))),
    Knob("specials", (("keep", "special tokens are merged: a special token such as <eos> in the text is a word of its "
                               "own that is never split or merged; leave the special words out of the counts"),)),
    Knob("weights", ((False, "each distinct word counts once: weight every word by how often it occurs in the text "
                             "(a Counter of the words)"),)),
)


def _told_apart(calls: list[Call]) -> bool:
    """Every wrong knob setting gives merges of its own (ties included), and so does every pair
    of settings, unless it gives exactly what one of its settings gives alone (the whole text as
    one word has no word counts to get wrong): then that setting's diagnosis is the right one."""
    def answers(fn):
        return tuple(tuple(fn(*call.args)) for call in calls)

    single = [answers(_train_variant(**{k.name: setting})) for k in TRAIN_KNOBS for setting, _ in k.wrong]
    both = [answers(fn) for _, fn, _ in TRAINING.pairs()]
    told = [answers(ref.train_bpe)] + single + [a for a in both if a not in single]
    return len(set(told)) == len(told)


def _train_inputs(rng: np.random.Generator) -> list[Call]:
    """A text of seven lines, each ending in <eos>, and a tiny text that runs out of pairs;
    drawn again until the catalogued ways of training are told apart (``_told_apart``)."""
    for _ in range(50):
        lines = _sentences(rng, 4, 3)
        text = "".join(line + "<eos>\n" for line in lines)
        tiny = " ".join(_sentences(rng, 1, 0)[0].split()[:2])
        calls = [Call((text, 12), what=f"train_bpe(text, 12) on {len(lines)} lines of Korean and English, each "
                                        "ending in <eos>"),
                 Call((tiny, 40), what="train_bpe(text, 40) on a text of two words, fewer pairs than merges")]
        if _told_apart(calls):
            return calls
    raise RuntimeError("no hidden text tells the ways of training apart")  # (never seen: a course bug)


def _inside_words(left: str, right: str) -> bool:
    """(left, right) can stand side by side inside a word: whitespace only as a word's first
    character, and only a space there."""
    return not (any(ch.isspace() for ch in right + left[1:]) or left[:1].isspace() and left[:1] != " ")


def _describe_training(case: Case) -> None:
    text, _ = case.call.args
    got, want = (_merges_of(case.spec.prepare(answer, case.call, case.what)) for answer in (case.answer, case.expected))
    words = ref.word_counts(text)
    for k, (mine, right) in enumerate(zip(got, want)):
        if mine != right:
            _left_the_rule(case, k, mine, right, words)
        words = ref.merge_pair(words, mine)
    if len(got) < len(want):
        case.fail(f"its {len(got)} merges are right, but it stops there; expected {len(want)}: merge num_merges "
                  "times, stopping earlier only when no pair is left")
    case.fail(f"its first {len(want)} merges are right, but it goes on to {len(got)}: stop after num_merges, or as "
              "soon as no pair is left (every word one symbol)")


def _merges_of(prepared: tuple) -> list[tuple[str, str]]:
    return list(zip(*prepared))


def _left_the_rule(case: Case, k: int, mine: tuple, right: tuple, words: dict) -> None:
    """Merge k + 1 is not the rule's: say which part of the rule it leaves."""
    n, pairs = k + 1, ref.count_pairs(words)
    first = ("the first merge" if k == 0 else f"the first merge is right; merge {n}" if k == 1
             else f"the first {k} merges are right; merge {n}")
    after = " after the merges before it" if k else ""
    if mine not in pairs:
        if not all(mine):
            case.fail(f"{first} has an empty symbol '': a merge joins two symbols of a word, never an empty "
                      "string (does a split of a word make one?)")
        if not _inside_words(*mine):
            case.fail(f"{first} joins two words (a space or line break inside the pair): merge inside each word "
                      "of pretokenize(text) only")
        if any(mine[0] + mine[1] in special for special in SPECIALS):
            case.fail(f"{first} joins characters of a special token: <eos> and the others are words of their own, "
                      "left out of the counts")
        case.fail(f"{first} is a pair that stands side by side nowhere in the text{after}: count the pairs "
                  "again after every merge")
    if pairs[mine] == pairs[right]:
        case.fail(f"{first} has the top count, but so has another pair that comes first in Python's order: "
                  "ties go to the smallest (left, right)")
    unweighted = ref.count_pairs(dict.fromkeys(words, 1))
    if unweighted.get(mine) == max(unweighted.values()):
        case.fail(f"{first} is the most frequent pair if every word counts once: weight each word by its count")
    case.fail(f"{first} is not the most frequent pair{after}: count the pairs again after every merge, each word "
              "weighted by how often it occurs")


TRAINING = Spec(
    id="tokenization-train_bpe",
    function="train_bpe",
    depends=("tokenization-count_pairs", "tokenization-merge_pair"),  # its solution calls them
    inputs=_train_inputs,
    reference=ref.train_bpe,
    driver="tokenization.drive_train_bpe",
    prepare=_table("strings", "strings"),
    judge=_judged(_describe_training),
    rtol=0.0, atol=0.0,
    knobs=TRAIN_KNOBS,
    variant=_train_variant,
    errors=(
        Raises("{what} raised {error}: no pair is left before num_merges merges (every word is one symbol); "
               "stop when count_pairs finds none",
               example=_train_variant(stop=False),
               match=r"(min|max)\(\) (arg is an empty sequence|iterable argument is empty)"),
    ),
    figures=("tokenization-train_bpe-figure",),
)


# ---------------------------------------------------------------- bpe_encode

_WORD = re.compile(r" ?\S+|\s")


def _tokenizer(rng: np.random.Generator) -> tuple[str, tuple, list]:
    """A corpus of eight lines and the tokens and 30 merges learned on it (no token made twice,
    so that applying the merges in order and lowest rank first agree)."""
    for _ in range(50):
        corpus = "\n".join(_sentences(rng, 5, 3))
        merges = ref.train_bpe(corpus, 30)
        made = [a + b for a, b in merges]
        if len(set(made)) == len(made):
            return corpus, tuple(ref.learned_tokens(corpus, merges)), merges
    raise RuntimeError("no corpus without a token made twice")  # (never seen: a course bug)


def _longest_match(word: str, tokens) -> tuple[str, ...]:
    """WordPiece's greedy segmentation: the longest token from the left, else one character."""
    known, symbols, i = set(tokens), [], 0
    while i < len(word):
        j = next((j for j in range(len(word), i + 1, -1) if word[i:j] in known), i + 1)
        symbols.append(word[i:j])
        i = j
    return tuple(symbols)


def _greedy_differs(tokens, merges) -> str | None:
    """A word whose greedy longest match is not its BPE segmentation: x + y + z where the merge
    (y, z) comes before (x, y), so BPE makes (x, yz) and the greedy match (xy, z); None if the
    merges hold no such chain."""
    for r, (y, z) in enumerate(merges):
        for x, later in merges[r + 1:]:
            if later == y and ref.segment(x + y + z, merges) != _longest_match(x + y + z, tokens):
                return x + y + z
    return None


def _encode_inputs(rng: np.random.Generator) -> list[Call]:
    for _ in range(50):  # (a corpus whose merges hold no chain is drawn again)
        _, tokens, merges = _tokenizer(rng)
        greedy = _greedy_differs(tokens, merges)
        if greedy:
            break
    else:
        raise RuntimeError("no corpus tells BPE from a greedy longest match")  # (never seen: a course bug)
    merged = sorted((t for t in tokens if len(t) > 1 and not t.startswith(" ")), key=lambda t: (-len(t), t))
    telling = f" {merged[0] * 2} {greedy}"  # a merged token twice in one word (its pair twice), and the chain
    first, second = _sentences(rng, 1, 1)
    odd = f"{first}\t🙂 café  語\n{second}"  # characters no token covers, a tab, two spaces, a line break
    lefts, rights = tuple(a for a, _ in merges), tuple(b for _, b in merges)
    texts = [(f"{first}{telling}", True, "a sentence and two more words"),
             (f"<bos>{second}<eos><pad><pad> x<unk>y", True, "special tokens"),
             (odd, True, "characters no token covers"),
             (odd, False, "characters no token covers")]
    return [Call((text, tokens, lefts, rights, fallback),
                 what=f"bpe_encode(text, tokens, merges, byte_fallback={fallback}) for a text with {kind}")
            for text, fallback, kind in texts]


def _encode_variant(specials: bool = True, words: str = "pretokenize", segmenting: str = "merges",
                    unknown: str = "fallback", byte_offset: int = ref.BYTE_OFFSET,
                    token_offset: int = ref.FIRST_TOKEN_ID):
    """bpe_encode as a learner writes it (the defaults are right)."""
    def segment(word, tokens, merges):
        if segmenting == "longest":
            return _longest_match(word, tokens)
        symbols = tuple(word)
        for left, right in merges:
            symbols = _first_only(symbols, left, right) if segmenting == "first_only" else \
                ref.merge_word(symbols, left, right)
        return symbols

    def bpe_encode(text, tokens, merges, byte_fallback=True):
        ids_of = {token: token_offset + i for i, token in enumerate(tokens)}
        pieces = ref.pretokenize(text) if specials else _WORD.findall(text)
        if words == "split":
            pieces = [w for piece in pieces for w in ([piece] if piece in SPECIALS else piece.split())]
        ids = []
        for word in pieces:
            if specials and word in SPECIALS:
                ids.append(SPECIALS.index(word))
                continue
            for symbol in segment(word, tokens, merges):
                if symbol in ids_of:
                    ids.append(ids_of[symbol])
                elif unknown == "bytes" or unknown == "fallback" and byte_fallback:
                    ids += [byte_offset + b for b in symbol.encode("utf-8")]
                else:
                    ids.append(UNK_ID)
        return ids
    return bpe_encode


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _describe_encoding(case: Case) -> None:
    text, tokens, _, _, fallback = case.call.args
    got, want = (case.spec.prepare(answer, case.call, case.what)[0].tolist() for answer in (case.answer, case.expected))
    if any(not 0 <= i < ref.FIRST_TOKEN_ID + len(tokens) for i in got):
        case.fail("it returns ids outside the vocabulary: specials 0-3, bytes 4-259, tokens 260 + i")
    back, right = ref.bpe_decode(got, tokens), ref.bpe_decode(want, tokens)
    if back != right:
        if sorted(i for i in got if i < UNK_ID) != sorted(i for i in want if i < UNK_ID):
            case.fail("its ids do not decode back to the text: the special tokens are not the text's (each "
                      "special-token string in the text is one id, 0-3, and bpe_encode adds none of its own)")
        if fallback and got.count(UNK_ID) > want.count(UNK_ID):
            case.fail("a character no token covers became <unk>: with byte_fallback it is kept as its UTF-8 bytes")
        if back.split() == right.split():
            case.fail("its ids do not decode back to the text: spaces, tabs or line breaks are lost or changed")
        case.fail(f"its ids do not decode back to the text: from character {_first_difference(back, right) + 1} of "
                  f"{len(right)} on")
    more = "more" if len(got) > len(want) else "fewer"
    case.fail(f"its ids decode back to the text, but as {len(got)} tokens where BPE makes {len(want)} ({more}): "
              "in each word apply every merge, in the order learned, at every place it fits")


BPE_ENCODE = Spec(
    id="tokenization-bpe_encode",
    function="bpe_encode",
    depends=("tokenization-merge_pair",),  # its solution merges a word with merge_pair
    inputs=_encode_inputs,
    reference=ref.bpe_encode,
    driver="tokenization.drive_bpe_encode",
    prepare=lambda answer, call, what: (_ints(answer, what),),
    judge=_judged(_describe_encoding),
    rtol=0.0, atol=0.0,
    mistakes=(
        Mistake("specials_split", "special tokens are split into characters: <pad>, <bos>, <eos> and <unk> in the "
                "text are one token each, ids 0-3, never split or merged (pretokenize keeps them whole)",
                _encode_variant(specials=False)),
        Mistake("str_split", "it splits the text with str.split(): spaces and line breaks are lost, and the words "
                "miss the leading space their tokens start with; use pretokenize(text)",
                _encode_variant(words="split")),
        Mistake("first_place_only", "a merge is applied only at its first place in a word: merge every "
                "occurrence, from the left", _encode_variant(segmenting="first_only")),
        Mistake("longest_match", "it takes the longest token that fits from the left (WordPiece's greedy match); "
                "BPE applies the learned merges, in the order learned", _encode_variant(segmenting="longest")),
        Mistake("unk_with_fallback", "a character no token covers becomes <unk> although byte_fallback is True: "
                "with byte fallback it becomes its UTF-8 bytes, ids 4 + byte", _encode_variant(unknown="unk")),
        Mistake("fallback_ignored", "byte_fallback=False is ignored: without byte fallback a character no token "
                "covers becomes <unk> (id 3)", _encode_variant(unknown="bytes")),
        Mistake("byte_ids", "byte b gets id b: the bytes come after the four special tokens, id 4 + b",
                _encode_variant(byte_offset=0)),
        Mistake("token_ids", "tokens[i] gets id i: the learned tokens come after the 4 special tokens and the 256 "
                "bytes, id 260 + i", _encode_variant(token_offset=0)),
    ),
    errors=(
        Raises("{what} raised {error}: keep the signature bpe_encode(text, tokens, merges, byte_fallback=True); the "
               "grader passes byte_fallback by name",
               example=lambda text, tokens, merges: ref.bpe_encode(text, tokens, merges), match="byte_fallback"),
    ),
    figures=("tokenization-bpe_encode-figure",),
)


# ---------------------------------------------------------------- bpe_decode


def _decode_inputs(rng: np.random.Generator) -> list[Call]:
    _, tokens, merges = _tokenizer(rng)
    first, second = _sentences(rng, 1, 1)
    text = f"<bos>{first}\t🙂 語  {second}\n<eos><pad>"
    unseen = next(ch for ch in "힣흫핳릏콯" if ch not in tokens)  # a syllable no token covers: 3 bytes
    cut = [ref.BYTE_OFFSET + b for b in unseen.encode("utf-8")[:2]]  # half a character, as a model may emit
    ids = ref.bpe_encode(text, list(tokens), merges)
    return [Call((np.array(ids, dtype=np.int64), tokens),
                 what="bpe_decode(ids, tokens) for a text with special tokens and characters no token covers"),
            Call((np.array(ref.bpe_encode(f" {first}", list(tokens), merges) + cut
                           + ref.bpe_encode(f" {second}\n", list(tokens), merges), dtype=np.int64), tokens),
                 what="bpe_decode(ids, tokens) for ids with half a character's bytes, as a model may emit"),
            Call((np.array(ids[:3] + [ref.FIRST_TOKEN_ID + len(tokens)], dtype=np.int64), tokens), raises="ValueError",
                 what="bpe_decode(ids, tokens) for an id just past the vocabulary")]


def _decode_variant(together: bool = True, separator: bytes = b"", specials: bool = True,
                    byte_offset: int = ref.BYTE_OFFSET, checked: bool = True, errors: str = "replace"):
    """bpe_decode as a learner writes it (the defaults are right)."""
    def bpe_decode(ids, tokens):
        pieces = []
        for i in ids:
            if checked and not 0 <= i < ref.FIRST_TOKEN_ID + len(tokens):
                raise ValueError(f"id {i} is not in the vocabulary")
            if i < ref.BYTE_OFFSET:
                if specials:
                    pieces.append(SPECIALS[i].encode("utf-8"))
            elif i < ref.FIRST_TOKEN_ID:
                pieces.append(bytes([i - byte_offset]))
            else:
                pieces.append(tokens[i - ref.FIRST_TOKEN_ID].encode("utf-8"))
        if together:
            return separator.join(pieces).decode("utf-8", errors=errors)
        return separator.decode().join(piece.decode("utf-8", errors=errors) for piece in pieces)
    return bpe_decode


def _describe_decoding(case: Case) -> None:
    got, want = case.answer, case.expected
    if got.count("\ufffd") > want.count("\ufffd"):
        case.fail("it gives U+FFFD (the replacement character) where the bytes are valid UTF-8: collect the bytes "
                  "of all ids, then decode once")
    if got.split() == want.split():
        case.fail("spaces, tabs or line breaks are added or lost: the tokens already hold them; join with nothing")
    case.fail(f"the text differs from the one encoded, from character {_first_difference(got, want) + 1} of "
              f"{len(want)} on")


BPE_DECODE = Spec(
    id="tokenization-bpe_decode",
    function="bpe_decode",
    inputs=_decode_inputs,
    reference=ref.bpe_decode,
    driver="tokenization.drive_bpe_decode",
    prepare=_text,
    judge=_judged(_describe_decoding),
    rtol=0.0, atol=0.0,
    mistakes=(
        Mistake("token_by_token", "it decodes each id's bytes on its own: a Korean syllable or an emoji is 3-4 bytes "
                "that are no text apart (U+FFFD); collect the bytes of all ids, then decode once",
                _decode_variant(together=False)),
        Mistake("spaces_between", "it puts a space between tokens: a word's space is already inside its token; "
                "join with nothing", _decode_variant(separator=b" ")),
        Mistake("specials_dropped", "it drops the special tokens; bpe_decode is the inverse of bpe_encode, so "
                "<pad>, <bos>, <eos> and <unk> come back as their strings", _decode_variant(specials=False)),
        Mistake("byte_ids", "byte id 4 + b is byte b: subtract 4 (the special tokens come first)",
                _decode_variant(byte_offset=0)),
    ),
    errors=(
        Raises("{what} raised {error}: a model can emit byte tokens that are no valid UTF-8 (half a character); "
               "decode with errors='replace', which puts U+FFFD there",
               example=_decode_variant(errors="strict"), match="UnicodeDecodeError"),
        Raises("{what} raised {error}: an id outside the vocabulary should raise ValueError, as the docstring says; "
               "check 0 <= id < 260 + len(tokens) first",
               example=_decode_variant(checked=False), match="IndexError", when=lambda call: bool(call.raises)),
    ),
    figures=("tokenization-bpe_decode-figure",),
)

SPECS = (COUNT_PAIRS, MERGE_PAIR, TRAINING, BPE_ENCODE, BPE_DECODE)
