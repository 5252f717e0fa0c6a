"""Hidden checks of notebook 11, tokenization: byte-pair encoding (five exercises), Hangul
below the syllable, to_jamo and from_jamo (two), and GPT-2's pre-tokenizer, gpt2_pretokenize
(one: its pieces, judged against the pattern of GPT-2's encoder.py written with re's classes).

The answers are text: dicts of symbol pairs, lists of merges, ids, a decoded string. The
drivers (``coursekit/drivers/tokenization.py``) hand them back as strings and int64 arrays
in a fixed order (the wire carries text); each spec's ``prepare`` checks their kinds, and
they are compared exactly (``rtol = atol = 0``), so that the catalogue of mistakes and the
knobs of train_bpe work as for any array answer. When no catalogued mistake
explains an answer, each exercise asks its own further questions (``_describe_*``): which
pairs are extra or missing, at which merge a learner's training first leaves the rule and
why (a pair across words, a tie, stale counts), whether encoded ids decode back to the text,
which kind of jamo (leading, vowel, final) a decomposition gets wrong. A diagnosis names
positions and kinds, never the hidden text or tokens.

The hidden texts are sentences of the course's toy grammar (``coursekit.translation``) in
Korean and English, with special tokens, characters no tokenizer has seen and odd spacing;
to_jamo's and from_jamo's add syllables from the whole block U+AC00..U+D7A3 and characters
that a normalization of the whole text changes.
"""
from __future__ import annotations

import itertools
import random
import re
import unicodedata
from collections import Counter
from typing import Callable

import numpy as np

from coursekit.drivers.tokenization import words_table
from coursekit.protocol import Raised, Unsupported
from coursekit.translation import SPECIALS, UNK_ID, detokenize_ko, sample_sentence, to_english, to_korean

from ._core import Call, Case, CheckFailed, Knob, Mistake, Raises, Rule, Spec, _equal, catalogued, judge_case
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


def _crosses(call: Call) -> bool:
    """The last symbol of a word and the first of the next (in the dict's order) make a pair
    that stands inside no word: counting across words adds it."""
    words = list(words_table(*call.args))
    inside = {pair for word in words for pair in zip(word, word[1:])}
    return any((a[-1], b[0]) not in inside for a, b in zip(words, words[1:]))


PAIRS_RULES = (
    Rule("a pair at two places in one word", lambda call: any(
        len(set(zip(w, w[1:]))) < len(w) - 1 for w in words_table(*call.args))),
    Rule("words of counts other than 1: each occurrence of a pair adds its word's count",
         lambda call: any(n > 1 for n in words_table(*call.args).values())),
    Rule("a word of one symbol has no pairs", lambda call: any(len(w) == 1 for w in words_table(*call.args))),
    Rule("pairs never cross from one word to the next", _crosses),
)


COUNT_PAIRS = Spec(
    id="tokenization-count_pairs",
    function="count_pairs",
    inputs=_pairs_inputs,
    reference=ref.count_pairs,
    driver="tokenization.drive_count_pairs",
    prepare=_table("strings", "strings", "ints"),
    judge=_judged(_describe_pairs),
    rtol=0.0, atol=0.0,
    rules=PAIRS_RULES,
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
    """Two corpora mid-training and a pair for each (the second a pair of two equal symbols),
    with the words each rule of the docstring needs (``MERGE_RULES``)."""
    words = _mid_training(rng, 4)
    a, b = sorted({s for w in words for s in w if s.strip()})[-2:]
    spaced = next((s for w in words for s in w if s.startswith(" ") and len(s) > 1), " " + a)  # a leading space
    other = sorted({s for w in words for s in w if s.strip() and s not in (a, b)})[0]
    words[(spaced, a, b, spaced, a, b)] = int(rng.integers(2, 10))  # the pair twice in one word
    words[(other + a, b, b)] = int(rng.integers(2, 10))              # a symbol that ends in a: no place to merge
    words[(a, b + other)] = int(rng.integers(2, 10))                 # a symbol that starts with b: none either
    words[(" ", a, b)] = int(rng.integers(2, 5))                     # two words that become equal: the counts add
    words[(" ", a + b)] = int(rng.integers(5, 10))
    first = Call(_flat(words) + (a, b), what=f"merge_pair(words, pair) for {len(words)} words")
    words = _mid_training(rng, 0)
    a = sorted({s for w in words for s in w if s.strip()})[0]
    words[(a, a, a)] = int(rng.integers(2, 10))                      # overlapping: the first two merge
    words[(" ", a, a, a, a)] = int(rng.integers(2, 10))
    words[(" ", a, a, a)] = int(rng.integers(2, 5))                  # becomes (" ", aa, a), as the next one
    words[(" ", a + a, a)] = int(rng.integers(5, 10))
    return [first, Call(_flat(words) + (a, a), what=f"merge_pair(words, pair) for {len(words)} words and a "
                                                     "pair of two equal symbols")]


def _merging(merge_word: Callable[[tuple, str, str], tuple], add: bool = True):
    """A learner's merge_pair that merges each word with ``merge_word``; ``add=False`` writes
    each merged word's count over the count of an equal word merged before it."""
    def merge_pair(words, pair):
        merged = {}
        for word, count in words.items():
            new = merge_word(word, *pair)
            merged[new] = merged.get(new, 0) + count if add else count
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


def _replaced(word, a, b, separator=" "):
    """str.replace on the symbols joined by ``separator``: it also matches a symbol that only
    ends with a (or starts with b), and a space separator cuts a symbol that holds a space."""
    return tuple(separator.join(word).replace(f"{a}{separator}{b}", a + b).split(separator))


def _describe_merged(case: Case) -> None:
    """What a wrong merge_pair did, from what its answer holds: symbols no merge makes (an empty
    one, one across a symbol boundary), words that lost their space or a character, counts that
    do not add up, or words merged differently."""
    words, (left, right) = words_table(*case.call.args[:3]), case.call.args[3:5]
    got, want = (words_table(*case.spec.prepare(answer, case.call, case.what))
                 for answer in (case.answer, case.expected))
    if any("" in word for word in got):
        case.fail("a word has an empty symbol '': splitting a joined string on ' ' cuts a symbol that holds a "
                  "space (a word's leading space) in two; keep each word a tuple of symbols, pair by pair")
    spelled = {"".join(w) for w in want}
    if any("".join(w) not in spelled for w in got):
        if {"".join(w) for w in got} - spelled <= {w.replace(" ", "") for w in spelled}:
            case.fail("a word lost its space: the leading space ' ' (where a word starts) is a symbol, or part of "
                      "one, and must stay in the word (does a split() or strip() drop it?)")
        case.fail("the symbols of a word no longer spell a word of the input: merging must keep every "
                  "character, in order (only two neighbouring symbols become one)")
    made = {s for w in got for s in w} - {s for w in words for s in w} - {left + right}
    if made:
        case.fail("it merges across symbol boundaries: it makes a symbol that is no symbol of the input and not "
                  "left + right, joining a symbol that only ends with left (or starts with right) to its "
                  "neighbour, as str.replace on the joined symbols does; compare whole symbols, pair by pair")
    if set(got) == set(want) and all(got[w] <= n for w, n in want.items()):
        case.fail("words that become equal after the merge keep one count: their counts must add up "
                  "(merged[new] = merged.get(new, 0) + count, or a Counter's +=), not overwrite each other")
    if sum(got.values()) != sum(want.values()):
        case.fail("the counts do not add up to the input's: every word keeps its count")
    wrong = sum(got.get(w) != n for w, n in want.items())
    case.fail(f"{wrong} of the {len(want)} words {'is' if wrong == 1 else 'are'} merged differently: replace each "
              "(left, right) side by side, from the left, by left + right, and step past the new symbol")


def _merge_case(call: Call) -> tuple[dict, tuple[str, str]]:
    """A merge_pair question as (words, pair)."""
    return words_table(*call.args[:3]), tuple(call.args[3:5])


def _pair_places(word: tuple, left: str, right: str) -> int:
    """How often (left, right) is merged in ``word`` (from the left, stepping past each)."""
    return len(word) - len(ref.merge_word(word, left, right))


def _part_of_a_symbol(words: dict, left: str, right: str) -> bool:
    """A symbol ends with left before right, and one starts with right after left, without
    being them: only whole symbols merge, on either side."""
    sides = [(x, y) for w in words for x, y in zip(w, w[1:])]
    return (any(x != left and x.endswith(left) and y == right for x, y in sides)
            and any(x == left and y != right and y.startswith(right) for x, y in sides))


def _overlapping(call: Call) -> bool:
    """The pair is two equal symbols (a, a) and a word holds a run of three or more a: fewer
    merges than places where the pair starts."""
    words, (left, right) = _merge_case(call)
    return left == right and any(_pair_places(w, left, right) < sum(p == (left, right) for p in zip(w, w[1:]))
                                 for w in words)


MERGE_RULES = (
    Rule("words that become equal after a merge add their counts",
         lambda call: len(ref.merge_pair(*_merge_case(call))) < len(_merge_case(call)[0])),
    Rule("the pair at two places in one word",
         lambda call: any(_pair_places(w, *_merge_case(call)[1]) > 1 for w in _merge_case(call)[0])),
    Rule("symbols compared whole: a symbol that ends with left or starts with right is not merged",
         lambda call: _part_of_a_symbol(_merge_case(call)[0], *_merge_case(call)[1])),
    Rule("a symbol that holds a space (a word's leading space) is merged",
         lambda call: any(" " in s and len(s) > 1 for w in ref.merge_pair(*_merge_case(call)) for s in w)),
    Rule("(a, a, a) with the pair (a, a) merges the first two and steps past both", _overlapping),
)


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
        Mistake("counts_overwritten", "words that become equal after the merge keep one count: their counts must "
                "add up (merged[new] = merged.get(new, 0) + count, or a Counter's +=), not overwrite each other",
                _merging(ref.merge_word, add=False)),
    ),
    rules=MERGE_RULES,
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
                   specials: str = "skip", weights: bool = True, stop: bool = True, merge: str = "pairs"):
    """train_bpe as a learner writes it, with one choice per knob (the defaults are right);
    ``stop=False`` forgets to stop when no pair is left (an error rule's example); ``merge``
    "joined" merges by str.replace on the symbols joined by "|" (a catalogued mistake)."""
    merge_pair = _merging(lambda word, a, b: _replaced(word, a, b, "|")) if merge == "joined" else ref.merge_pair

    def train_bpe(text, num_merges):
        words_of = _learner_words(text, words, specials)
        return _learner_merges(words_of, tuple, num_merges, tie, recount, weights, stop, merge_pair)[1]
    return train_bpe


def _learner_merges(words_of: list[str], symbols: Callable[[str], tuple], num_merges: int, tie: str, recount: bool,
                    weights: bool, stop: bool, merge_pair: Callable = ref.merge_pair) -> tuple[dict, list]:
    """The training loop of a learner's train_bpe and train_byte_bpe, one choice per argument:
    the words (each made a tuple of symbols by ``symbols``) after the merges, and the merges."""
    counts: dict = {}
    for word in words_of:
        counts[symbols(word)] = (counts.get(symbols(word), 0) + 1) if weights else 1
    merges, pairs = [], ref.count_pairs(counts)
    for _ in range(num_merges):
        if recount:
            pairs = ref.count_pairs(counts)
        if not pairs and stop:
            break
        best = TIES[tie](pairs)
        if not recount:
            del pairs[best]
        counts = merge_pair(counts, best)
        merges.append(best)
    return counts, merges


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
                   ("split", "the words lose their spaces (str.split(), or strip()), and the line breaks are dropped: "
                             "the words keep their leading space (use pretokenize as it is), or decoding cannot put "
                             "the text back"))),
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


def _chained(rng: np.random.Generator) -> str:
    """Lines xy, xyz and yz of three syllables: (x, y) is merged first, then (y, z), which must
    not merge inside the word (xy, z), where y is only the end of a symbol; then (xy, z)."""
    x, y, z = rng.choice(sorted(set("".join(_sentences(rng, 2, 0))) - {" "}), size=3, replace=False)
    lines = [x + y] * 5 + [x + y + z] + [y + z] * 4
    rng.shuffle(lines)
    return "\n".join(lines)


def _train_inputs(rng: np.random.Generator) -> list[Call]:
    """A text of seven lines, each ending in <eos>, and a tiny text that runs out of pairs;
    drawn again until the catalogued ways of training are told apart (``_told_apart``)."""
    for _ in range(50):
        lines = _sentences(rng, 4, 3)
        text = "".join(line + "<eos>\n" for line in lines)
        tiny = " ".join(_sentences(rng, 1, 0)[0].split()[:2])
        calls = [Call((text, 12), what=f"train_bpe(text, 12) on {len(lines)} lines of Korean and English, each "
                                        "ending in <eos>"),
                 Call((tiny, 40), what="train_bpe(text, 40) on a text of two words, fewer pairs than merges"),
                 Call((_chained(rng), 4), what="train_bpe(text, 4) on a text of short lines")]
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
    apart = next((k for k, (mine, right) in enumerate(zip(got, want)) if mine != right), None)
    spaced = [any(" " in left + right for left, right in merges[apart or 0:]) for merges in (got, want)]
    if apart is not None and spaced == [False, True] and all(all(m) for m in got):  # ('' has its own diagnosis)
        case.fail(f"from merge {apart + 1} on, no merge holds a space where BPE's do: the words lose their spaces; "
                  "each word of pretokenize(text) keeps the space before it (' the'), and so must its symbols (does "
                  "a split(), a strip() or a split of joined symbols drop it?)")
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


def _knob_rule(name: str, **wrong) -> Rule:
    """A rule whose right answer differs, on the call, from train_bpe with ``wrong`` knob settings."""
    return Rule(name, lambda call: _train_variant(**wrong)(*call.args) != ref.train_bpe(*call.args))


TRAIN_RULES = (
    _knob_rule("ties go to the smallest (left, right), not to the pair seen first", tie="first_seen"),
    _knob_rule("ties go to the smallest (left, right), not to the largest", tie="largest"),
    _knob_rule("the pairs are counted again after every merge", recount=False),
    _knob_rule("merges never cross from one word to the next", words="whole"),
    _knob_rule("a word keeps the space before it (no str.split())", words="split"),
    _knob_rule("special tokens are left out of the counts", specials="keep"),
    _knob_rule("each word is weighted by how often it occurs", weights=False),
    Rule("training stops early when no pair is left", lambda call: len(ref.train_bpe(*call.args)) < call.args[1]),
    _knob_rule("a merge joins whole symbols, never one that only ends with left", merge="joined"),
)


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
    mistakes=(
        Mistake("merged_across_symbols", "a merge also joins symbols that only end with left (or start with right): "
                "str.replace on a word's symbols joined by a separator matches 'y|z' inside 'xy|z'; merge whole "
                "symbols, pair by pair (merge_pair)", _train_variant(merge="joined")),
    ),
    rules=TRAIN_RULES,
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


def _longest_from_the_right(word: str, tokens) -> tuple[str, ...]:
    """The greedy segmentation from the end: the longest token that ends the word, else one character."""
    return tuple(s[::-1] for s in reversed(_longest_match(word[::-1], [t[::-1] for t in tokens])))


def _longest_first(word: str, tokens) -> tuple[str, ...]:
    """The longest token anywhere in the word (the leftmost of equals), then each side the same way."""
    if not word:
        return ()
    found = max(((len(t), -word.find(t), t) for t in set(tokens) if t in word), default=None)
    if found is None:
        return tuple(word)
    start = -found[1]
    return _longest_first(word[:start], tokens) + (found[2],) + _longest_first(word[start + found[0]:], tokens)


# The greedy segmentations a learner may write for BPE's: each must differ from BPE on some word
# of every seed's text (the hidden inputs draw such words: ``_greedy_words``).
GREEDY = {"from the left": _longest_match, "from the right": _longest_from_the_right,
          "the longest token first": _longest_first}


def _greedy_words(tokens, merges) -> list[str] | None:
    """Words (with their leading space, or none) on which each greedy segmentation leaves BPE's,
    and each leaves each other one, as few as will do; None if the candidates cannot tell some
    two apart.

    The candidates are chains x + y + z of two merges that share y: where (y, z) comes before
    (x, y), BPE makes (x, yz) and a longest match from the left (xy, z); where (x, y) comes
    first, BPE makes (xy, z) and a longest match from the right (x, yz)."""
    chains = [x + y + z for (x, y), (y2, z) in itertools.permutations(merges, 2) if y == y2]
    candidates = list(dict.fromkeys(w for chain in chains
                                    for w in ([chain] if chain.startswith(" ") else [chain, " " + chain])))
    ways = {"BPE": lambda word, _: ref.segment(word, merges), **GREEDY}
    apart = {word: {(a, b) for a, b in itertools.combinations(ways, 2) if ways[a](word, tokens) != ways[b](word, tokens)}
             for word in candidates}
    chosen: list[str] = []
    for pair in itertools.combinations(ways, 2):
        if not any(pair in apart[w] for w in chosen):
            telling = [w for w in candidates if pair in apart[w]]
            if not telling:
                return None
            chosen.append(max(telling, key=lambda w: len(apart[w])))
    return chosen


def _merged_twice(tokens, merges) -> str | None:
    """A word that holds a merged token twice, on which merging only at a merge's first place
    leaves BPE's segmentation (the longest such token), or None."""
    merged = sorted((t for t in tokens if len(t) > 1 and not t.startswith(" ")), key=lambda t: (-len(t), t))
    return next((" " + t * 2 for t in merged
                 if _segment(" " + t * 2, tokens, merges, "first_only") != ref.segment(" " + t * 2, merges)), None)


def _encode_inputs(rng: np.random.Generator) -> list[Call]:
    """Four texts for one tokenizer: a sentence with words that tell BPE from a merge at its
    first place only and from each greedy match; special tokens; characters no token covers,
    with byte fallback and without (``ENCODE_RULES``)."""
    for _ in range(50):  # (a corpus whose merges hold no telling words is drawn again)
        _, tokens, merges = _tokenizer(rng)
        greedy, twice = _greedy_words(tokens, merges), _merged_twice(tokens, merges)
        if greedy and twice:
            break
    else:
        raise RuntimeError("no corpus tells BPE from a greedy longest match")  # (never seen: a course bug)
    # a word with no leading space goes after a line break, where pretokenize starts a word without one
    telling = twice + "".join(w if w.startswith(" ") else "\n" + w for w in greedy)
    first, second = _sentences(rng, 1, 1)
    odd = f"{first}\t🙂 café  語\n{second}"  # characters no token covers, a tab, two spaces, a line break
    lefts, rights = tuple(a for a, _ in merges), tuple(b for _, b in merges)
    texts = [(f"{first}{telling}", True, "a sentence and more words"),
             (f"<bos>{second}<eos><pad><pad> x<unk>y", True, "special tokens"),
             (odd, True, "characters no token covers"),
             (odd, False, "characters no token covers")]
    return [Call((text, tokens, lefts, rights, fallback),
                 what=f"bpe_encode(text, tokens, merges, byte_fallback={fallback}) for a text with {kind}")
            for text, fallback, kind in texts]


def _segment(word: str, tokens, merges, segmenting: str = "merges") -> tuple[str, ...]:
    """A word's symbols as a learner's bpe_encode makes them: the merges in order, each at every
    place ("merges") or at its first place only ("first_only"), or a greedy match (``GREEDY``)."""
    if segmenting in GREEDY:
        return GREEDY[segmenting](word, tokens)
    symbols = tuple(word)
    for left, right in merges:
        symbols = _first_only(symbols, left, right) if segmenting == "first_only" else \
            ref.merge_word(symbols, left, right)
    return symbols


def _encode_variant(specials: bool = True, words: str = "pretokenize", segmenting: str = "merges",
                    unknown: str = "fallback", byte_offset: int = ref.BYTE_OFFSET,
                    token_offset: int = ref.FIRST_TOKEN_ID):
    """bpe_encode as a learner writes it (the defaults are right)."""
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
            for symbol in _segment(word, tokens, merges, segmenting):
                if symbol in ids_of:
                    ids.append(ids_of[symbol])
                elif unknown == "bytes" or unknown == "fallback" and byte_fallback:
                    ids += [byte_offset + b for b in symbol.encode("utf-8")]
                else:
                    ids.append(UNK_ID)
        return ids
    return bpe_encode


def _not_bytes(ids: list[int]) -> list[int]:
    """The ids that are no byte id: special tokens and learned tokens."""
    return [i for i in ids if not ref.BYTE_OFFSET <= i < ref.FIRST_TOKEN_ID]


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
        if fallback and _not_bytes(got) == _not_bytes(want):
            case.fail("its ids do not decode back to the text: the tokens are right, but not the bytes of the "
                      "characters no token covers; a character is 2-4 UTF-8 bytes (ch.encode('utf-8')), each byte b "
                      "one id, 4 + b")
        if back.replace(" ", "") == right.replace(" ", "") and len(back) < len(right):
            case.fail("its ids do not decode back to the text: the space where a word starts is lost; each word of "
                      "pretokenize(text) keeps the space before it, and so do its tokens (' the'): do not strip or "
                      "split() the words")
        if back.split() == right.split():
            case.fail("its ids do not decode back to the text: spaces, tabs or line breaks are lost or changed")
        case.fail(f"its ids do not decode back to the text: from character {_first_difference(back, right) + 1} of "
                  f"{len(right)} on")
    mine, bpe = _pieces_by_word(got, tokens, text), _pieces_by_word(want, tokens, text)
    differ = [(m, b) for m, b in zip(mine or (), bpe) if m != b]
    if differ and (_longer_where_apart(*differ[0]) or _longer_where_apart(differ[0][0][::-1], differ[0][1][::-1])):
        case.fail("in a word it makes a longer token than the merges, in the order learned, make there: a greedy "
                  "longest match does (the longest token that fits, WordPiece's way), and so do merges applied in "
                  "another order; BPE applies merge 1 everywhere in the word, then merge 2, and so on")
    if len(got) == len(want):
        case.fail(f"its ids decode back to the text, as many tokens as BPE makes, but other ones: in each word apply "
                  "every merge, in the order learned, at every place it fits")
    more = "more" if len(got) > len(want) else "fewer"
    case.fail(f"its ids decode back to the text, but as {len(got)} tokens where BPE makes {len(want)} ({more}): "
              "in each word apply every merge, in the order learned, at every place it fits")


def _longer_where_apart(mine: list[bytes], bpe: list[bytes]) -> bool:
    """Where two segmentations of a word first part (from its start), the first's token is the longer."""
    return next((len(m) > len(b) for m, b in zip(mine, bpe) if m != b), False)


def _pieces_by_word(ids: list, tokens, text: str) -> list[list[bytes]] | None:
    """The bytes of each id, grouped by the words of ``text`` (pretokenize); None if an id's
    bytes cross from one word to the next (ids that decode back to ``text``)."""
    words, pieces, at = [], [], 0
    ends = list(itertools.accumulate(len(w.encode("utf-8")) for w in ref.pretokenize(text)))
    for i in ids:
        piece = ref.id_bytes(i, list(tokens))
        pieces.append(piece)
        at += len(piece)
        if at in ends:
            words.append(pieces)
            pieces = []
        elif at > ends[len(words)]:
            return None
    return words


def _encoded_words(call: Call) -> list[str]:
    return [w for w in ref.pretokenize(call.args[0]) if w not in SPECIALS]


def _greedy_rule(name: str) -> Rule:
    def exercised(call: Call) -> bool:
        _, tokens, lefts, rights, _ = call.args
        merges = list(zip(lefts, rights))
        return any(GREEDY[name](w, tokens) != ref.segment(w, merges) for w in _encoded_words(call))
    return Rule(f"a word where the longest match ({name}) and the merges in the order learned disagree", exercised)


def _uncovered(call: Call) -> list[str]:
    """The characters of the call's words that no token covers."""
    return [ch for w in _encoded_words(call) for ch in w if ch not in call.args[1]]


ENCODE_RULES = tuple(_greedy_rule(name) for name in GREEDY) + (
    Rule("a merge applied at every place in a word",
         lambda call: any(_segment(w, (), list(zip(*call.args[2:4])), "first_only")
                          != ref.segment(w, list(zip(*call.args[2:4]))) for w in _encoded_words(call))),
    Rule("special-token strings in the text, one id each", lambda call: any(s in call.args[0] for s in SPECIALS)),
    Rule("byte fallback: a character no token covers, of several UTF-8 bytes, becomes its bytes",
         lambda call: call.args[4] and any(len(ch.encode("utf-8")) > 1 for ch in _uncovered(call))),
    Rule("without byte fallback a character no token covers becomes <unk>",
         lambda call: not call.args[4] and bool(_uncovered(call))),
    Rule("whitespace that is a word of its own (two spaces, a tab, a line break)",
         lambda call: any(w.isspace() for w in ref.pretokenize(call.args[0]))),
)


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
        Mistake("str_split", "the words lose their spaces (str.split(), or strip()): spaces and line breaks are "
                "lost, and the words miss the leading space their tokens start with; use the words of "
                "pretokenize(text) as they are",
                _encode_variant(words="split")),
        Mistake("first_place_only", "a merge is applied only at its first place in a word: merge every "
                "occurrence, from the left", _encode_variant(segmenting="first_only")),
        Mistake("longest_match", "it takes the longest token that fits from the left (WordPiece's greedy match); "
                "BPE applies the learned merges, in the order learned", _encode_variant(segmenting="from the left")),
        Mistake("longest_from_the_right", "it takes the longest token that ends the word, from the right (a greedy "
                "match); BPE applies the learned merges, in the order learned",
                _encode_variant(segmenting="from the right")),
        Mistake("longest_token_first", "it takes the longest token found anywhere in the word first (a greedy "
                "match); BPE applies the learned merges, in the order learned",
                _encode_variant(segmenting="the longest token first")),
        Mistake("unk_with_fallback", "a character no token covers becomes <unk> although byte_fallback is True: "
                "with byte fallback it becomes its UTF-8 bytes, ids 4 + byte", _encode_variant(unknown="unk")),
        Mistake("fallback_ignored", "byte_fallback=False is ignored: without byte fallback a character no token "
                "covers becomes <unk> (id 3)", _encode_variant(unknown="bytes")),
        Mistake("byte_ids", "byte b gets id b: the bytes come after the four special tokens, id 4 + b",
                _encode_variant(byte_offset=0)),
        Mistake("token_ids", "tokens[i] gets id i: the learned tokens come after the 4 special tokens and the 256 "
                "bytes, id 260 + i", _encode_variant(token_offset=0)),
    ),
    rules=ENCODE_RULES,
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
    text = f"<bos>{first}\t🙂 語\x00  {second}\n<eos><pad>"  # (NUL: byte 0, the first byte id)
    unseen = next(ch for ch in "힣흫핳릏콯" if ch not in tokens)  # a syllable no token covers: 3 bytes
    cut = [ref.BYTE_OFFSET + b for b in unseen.encode("utf-8")[:2]]  # half a character, as a model may emit
    cut.append(ref.BYTE_OFFSET + 255)  # the last byte id: 0xFF, in no UTF-8 text
    ids = ref.bpe_encode(text, list(tokens), merges)
    return [Call((np.array(ids, dtype=np.int64), tokens),
                 what="bpe_decode(ids, tokens) for a text with special tokens and characters no token covers"),
            Call((np.array(ref.bpe_encode(f" {first}", list(tokens), merges) + cut
                           + ref.bpe_encode(f" {second}\n", list(tokens), merges), dtype=np.int64), tokens),
                 what="bpe_decode(ids, tokens) for ids with bytes that are no UTF-8, as a model may emit"),
            Call((np.array(ids[:3] + [ref.FIRST_TOKEN_ID + len(tokens)], dtype=np.int64), tokens), raises="ValueError",
                 what="bpe_decode(ids, tokens) for an id just past the vocabulary"),
            Call((np.array(ids[:3] + [-1], dtype=np.int64), tokens), raises="ValueError",
                 what="bpe_decode(ids, tokens) for a negative id")]


def _decode_variant(together: bool = True, separator: bytes = b"", specials: bool = True,
                    byte_offset: int = ref.BYTE_OFFSET, checked: str = "both", errors: str = "replace",
                    byte_ids: str = "bytes"):
    """bpe_decode as a learner writes it (the defaults are right): ``checked`` which ends of
    the vocabulary it checks ("both", "above" or "none"); ``byte_ids`` "bytes", "dropped", or
    "characters" (a byte id as the character chr(b))."""
    def bpe_decode(ids, tokens):
        pieces = []
        for i in ids:
            if i >= ref.FIRST_TOKEN_ID + len(tokens) and checked != "none" or i < 0 and checked == "both":
                raise ValueError(f"id {i} is not in the vocabulary")
            if i < ref.BYTE_OFFSET:
                if specials:
                    pieces.append(SPECIALS[i].encode("utf-8"))
            elif i < ref.FIRST_TOKEN_ID:
                if byte_ids == "bytes":
                    pieces.append(bytes([i - byte_offset]))
                elif byte_ids == "characters":
                    pieces.append(chr(i - byte_offset).encode("utf-8"))
            else:
                pieces.append(tokens[i - ref.FIRST_TOKEN_ID].encode("utf-8"))
        if together:
            return separator.join(pieces).decode("utf-8", errors=errors)
        return separator.decode().join(piece.decode("utf-8", errors=errors) for piece in pieces)
    return bpe_decode


_DROPPED = ("bytes that are not valid UTF-8 are dropped (errors='ignore'); the docstring asks for U+FFFD, the "
            "replacement character, there: decode with errors='replace'")


def _subsequence(short: str, long: str) -> bool:
    rest = iter(long)
    return all(ch in rest for ch in short)


def _describe_decoding(case: Case) -> None:
    got, want = case.answer, case.expected
    if got.count("\ufffd") > want.count("\ufffd"):
        case.fail("it gives U+FFFD (the replacement character) where the bytes are valid UTF-8: collect the bytes "
                  "of all ids, then decode once")
    if got == want.replace("\ufffd", ""):
        case.fail(_DROPPED)
    if got.split() == want.split():
        case.fail("spaces, tabs or line breaks are added or lost: the tokens already hold them; join with nothing")
    missing = len(want) - len(got)
    if missing > 0 and _subsequence(got, want):
        case.fail(f"{_plural(missing, 'character')} of the text {'is' if missing == 1 else 'are'} missing, the "
                  "others right and in order: the bytes of every id count (a byte id 4 + b is the byte b), joined, "
                  "then decoded once with errors='replace'")
    if got == b"".join(ref.id_bytes(i, list(case.call.args[1])) for i in case.call.args[0].tolist()).decode("latin-1"):
        case.fail("it decodes the bytes as Latin-1, one character per byte; they are UTF-8: "
                  ".decode('utf-8', errors='replace')")
    case.fail(f"the text differs from the one encoded, from character {_first_difference(got, want) + 1} of "
              f"{len(want)} on")


def _decoded_apart(call: Call) -> bool:
    """Some character's UTF-8 bytes are spread over several byte ids: decoded id by id, they are U+FFFD."""
    ids, tokens = call.args[0].tolist(), list(call.args[1])
    return (not call.raises and _decode_variant(together=False)(ids, tokens).count("\ufffd")
            > ref.bpe_decode(ids, tokens).count("\ufffd"))


def _outside(call: Call, below: bool) -> bool:
    limit = ref.FIRST_TOKEN_ID + len(call.args[1])
    return bool(call.raises) and any(i < 0 if below else i >= limit for i in call.args[0].tolist())


DECODE_RULES = (
    Rule("a character whose UTF-8 bytes are spread over several byte ids", _decoded_apart),
    Rule("bytes that are not valid UTF-8 become U+FFFD",
         lambda call: not call.raises and "\ufffd" in ref.bpe_decode(call.args[0].tolist(), call.args[1])),
    Rule("byte 0 is id 4, the first byte id", lambda call: not call.raises and ref.BYTE_OFFSET in call.args[0]),
    Rule("byte 255 is id 259, the last byte id",
         lambda call: not call.raises and ref.FIRST_TOKEN_ID - 1 in call.args[0]),
    Rule("special-token ids come back as their strings",
         lambda call: not call.raises and any(0 <= i < ref.BYTE_OFFSET for i in call.args[0].tolist())),
    Rule("an id past the vocabulary raises ValueError", lambda call: _outside(call, below=False)),
    Rule("a negative id raises ValueError", lambda call: _outside(call, below=True)),
)


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
        Mistake("invalid_bytes_dropped", _DROPPED, _decode_variant(errors="ignore")),
        Mistake("byte_ids_dropped", "the byte ids (4-259) are left out: a byte id 4 + b is the byte b, one of the "
                "2-4 UTF-8 bytes of a character no token covers; join it with the others and decode once",
                _decode_variant(byte_ids="dropped")),
        Mistake("bytes_as_characters", "a byte id becomes the character chr(b): a byte is no character, and a "
                "character no token covers is 2-4 UTF-8 bytes; collect the bytes of all ids, then decode once as "
                "UTF-8", _decode_variant(byte_ids="characters")),
    ),
    rules=DECODE_RULES,
    errors=(
        Raises("{what} raised {error}: a model can emit byte tokens that are no valid UTF-8 (half a character); "
               "decode with errors='replace', which puts U+FFFD there",
               example=_decode_variant(errors="strict"), match="UnicodeDecodeError"),
        Raises("{what} raised {error}: an id outside the vocabulary should raise ValueError, as the docstring says; "
               "check 0 <= id < 260 + len(tokens) first",
               example=_decode_variant(checked="none"), match="IndexError", when=lambda call: bool(call.raises)),
    ),
    figures=("tokenization-bpe_decode-figure",),
)



# ---------------------------------------------------------------- to_jamo

# Characters of real Korean text that are no Hangul syllable and that a normalization of the
# whole text changes: é and a CJK compatibility ideograph (KS X 1001's Hanja, U+F900) under NFD;
# a keyboard's compatibility jamo (ㅋ, U+314B), a circled digit, a unit and a full-width letter
# under NFKD.
_NFD_CHANGES = ("café", "\uf900")
_NFKD_CHANGES = ("ㅋㅋ", "\u2460", "\u338f", "\uff21")
_FIRST, _LAST = "\uac00", "\ud7a3"  # the first and last Hangul syllables


def _syllable(ch: str) -> bool:
    return _FIRST <= ch <= _LAST


def _jamo_texts(rng: np.random.Generator) -> tuple[str, str]:
    """Sentences with other scripts, spaces, tabs and line breaks; random syllables over the
    whole block (its first and last among them) between digits, Latin letters and the code
    points just outside it."""
    first, second, third = _sentences(rng, 2, 1)
    odd = [*_NFD_CHANGES, *_NFKD_CHANGES, "2024", "🙂", "e\u0301"]  # (an accent already apart: NFC joins it)
    rng.shuffle(odd)
    mixed = f"{first} {' '.join(odd[:4])}\t{second}\n{third}  {' '.join(odd[4:])}\n"
    codes = rng.integers(0xAC00, 0xD7A4, size=36)
    codes[:6] = (0xAC00, 0xD7A3, 0xAC00 + 28 * int(rng.integers(1, 399)),   # no final consonant
                 0xAC00 + 28 * int(rng.integers(1, 399)) + 27, 0xAC01, 0xD7A2)  # the last final, the first
    rng.shuffle(codes)
    gaps = [" ", "  ", "\n", "A", "7", "\uabff", "\ud7a4", ""]
    spread = "".join(chr(int(c)) + (gaps[int(rng.integers(len(gaps)))] if k % 3 == 2 else "")
                     for k, c in enumerate(codes))
    return mixed, spread


def _jamo_inputs(rng: np.random.Generator) -> list[Call]:
    """The texts of ``_jamo_texts`` and a decomposed text, which must raise."""
    mixed, spread = _jamo_texts(rng)
    decomposed = unicodedata.normalize("NFD", _sentences(rng, 1, 0)[0])
    return [Call((mixed,), what="to_jamo(text) for sentences with other scripts, tabs and line breaks"),
            Call((spread,), what="to_jamo(text) for syllables from all over U+AC00..U+D7A3 among other characters"),
            Call((decomposed,), raises="ValueError", what="to_jamo(text) for a text already decomposed (NFD)")]


def _refusing(convert: Callable[[str], str], refused: Callable[[str], bool] = lambda ch: "\u1100" <= ch <= "\u11ff"):
    """A learner's to_jamo: refuse text with a character ``refused`` says, then ``convert``."""
    def to_jamo(text):
        if any(refused(ch) for ch in text):
            raise ValueError("the text is decomposed already")
        return convert(text)
    return to_jamo


def _each_syllable(split: Callable[[str], str]) -> Callable[[str], str]:
    return lambda text: "".join(split(ch) if _syllable(ch) else ch for ch in text)


_COMPATIBILITY = ("ㄱㄲㄴㄷㄸㄹㅁㅂㅃㅅㅆㅇㅈㅉㅊㅋㅌㅍㅎ", "ㅏㅐㅑㅒㅓㅔㅕㅖㅗㅘㅙㅚㅛㅜㅝㅞㅟㅠㅡㅢㅣ",
                  ("", *"ㄱㄲㄳㄴㄵㄶㄷㄹㄺㄻㄼㄽㄾㄿㅀㅁㅂㅄㅅㅆㅇㅈㅊㅋㅌㅍㅎ"))


def _arithmetic(final: int = 0x11A7, empty_final: bool = False, compatibility: bool = False) -> Callable[[str], str]:
    """A syllable by the Unicode Standard's arithmetic (s = code - 0xAC00: L = s // 588,
    V = s % 588 // 28, T = s % 28), the final consonant as U+``final`` + T, with a letter for
    T = 0 too (``empty_final``), or as the compatibility jamo of a keyboard's table."""
    def split(ch: str) -> str:
        s = ord(ch) - 0xAC00
        lead, vowel, tail = s // 588, s % 588 // 28, s % 28
        if compatibility:
            return _COMPATIBILITY[0][lead] + _COMPATIBILITY[1][vowel] + _COMPATIBILITY[2][tail]
        return chr(0x1100 + lead) + chr(0x1161 + vowel) + (chr(final + tail) if tail or empty_final else "")
    return split


def _kind_of(ch: str) -> str:
    if "\u1100" <= ch <= "\u1112":
        return "leading consonant"
    if "\u1161" <= ch <= "\u1175":
        return "vowel"
    return "final consonant" if "\u11a8" <= ch <= "\u11c2" else "other"


def _describe_jamo(case: Case) -> None:
    """What a wrong to_jamo did: syllables left whole, letters of a keyboard, other characters
    changed, whitespace lost, or which kind of jamo (leading, vowel, final) differs."""
    got, want = case.answer, case.expected
    left = sum(map(_syllable, got))
    if left:
        case.fail(f"{_plural(left, 'Hangul syllable')} of the text {'is' if left == 1 else 'are'} not split "
                  "into jamo (a list of the characters keeps them whole): each syllable U+AC00..U+D7A3 becomes "
                  "its 2 or 3 conjoining jamo, unicodedata.normalize('NFD', syllable)")
    if sum("\u3131" <= ch <= "\u318e" for ch in got) > sum("\u3131" <= ch <= "\u318e" for ch in want):
        case.fail("it writes compatibility jamo (U+3131..U+318E, the letters of a keyboard), which do not tell a "
                  "leading consonant from a final one: a syllable's letters are the conjoining jamo NFD gives, "
                  "leading U+1100.., vowel U+1161.., final U+11A8..")
    if [ch for ch in got if ch.isspace()] != [ch for ch in want if ch.isspace()]:
        case.fail("spaces, tabs or line breaks are lost or added: every character that is no Hangul syllable "
                  "stays as it is, whitespace too")
    others = [ch for ch in got if _kind_of(ch) == "other"], [ch for ch in want if _kind_of(ch) == "other"]
    if not _subsequence(others[1], others[0]):  # (a wrong jamo outside the block adds, it changes nothing)
        case.fail("characters that are no Hangul syllable are changed (normalizing the whole text does that to "
                  "some); split the syllables U+AC00..U+D7A3 only, and keep every other character as it is")
    if len(got) != len(want):
        case.fail(f"its syllables give {len(got) - len(others[0])} jamo where NFD gives {len(want) - len(others[1])}: "
                  "a syllable is 2 jamo, or 3 when it has a final consonant (T = s % 28 >= 1)")
    wrong = Counter(_kind_of(w) for g, w in zip(got, want) if g != w)
    case.fail(f"its jamo differ from NFD's: {', '.join(f'{_plural(n, kind)}' for kind, n in sorted(wrong.items()))} "
              "are wrong; with s = code - 0xAC00, the leading consonant is U+1100 + s // 588, the vowel "
              "U+1161 + s % 588 // 28, the final consonant U+11A7 + s % 28 when s % 28 >= 1")


JAMO_RULES = (
    Rule("a syllable without a final consonant: two jamo",
         lambda call: any(_syllable(ch) and (ord(ch) - 0xAC00) % 28 == 0 for ch in call.args[0])),
    Rule("the last final consonant, U+11C2", lambda call: any(
        _syllable(ch) and (ord(ch) - 0xAC00) % 28 == 27 for ch in call.args[0])),
    Rule("the first and the last Hangul syllable, U+AC00 and U+D7A3",
         lambda call: _FIRST in call.args[0] and _LAST in call.args[0]),
    Rule("characters NFD changes that are no Hangul syllable",
         lambda call: any(unicodedata.normalize("NFD", ch) != ch and not _syllable(ch) for ch in call.args[0])),
    Rule("compatibility jamo and other characters NFKD changes", lambda call: any(
        unicodedata.normalize("NFKD", ch) != unicodedata.normalize("NFD", ch) for ch in call.args[0])),
    Rule("spaces, tabs and line breaks", lambda call: not call.raises and {" ", "\t", "\n"} <= set(call.args[0])),
    Rule("a decomposed text raises ValueError", lambda call: call.raises == "ValueError"),
)


TO_JAMO = Spec(
    id="tokenization-to_jamo",
    function="to_jamo",
    inputs=_jamo_inputs,
    reference=ref.to_jamo,
    driver="tokenization.drive_to_jamo",
    prepare=_text,
    judge=_judged(_describe_jamo),
    rtol=0.0, atol=0.0,
    rules=JAMO_RULES,
    mistakes=(
        Mistake("nfd_whole_text", "it decomposes characters that are no Hangul syllable too (NFD of the whole text "
                "splits an accented letter and changes some Hanja): split only the syllables U+AC00..U+D7A3, "
                "each with unicodedata.normalize('NFD', syllable), and keep every other character as it is",
                _refusing(lambda text: unicodedata.normalize("NFD", text))),
        Mistake("nfkd_whole_text", "NFKD on the whole text: it also replaces compatibility characters (a keyboard's "
                "jamo, a circled digit, a full-width letter) by others, which no inverse can undo; use NFD, on "
                "the Hangul syllables U+AC00..U+D7A3 only", _refusing(lambda text: unicodedata.normalize("NFKD", text))),
        Mistake("compatibility_jamo", "it writes a syllable's letters as compatibility jamo (U+3131..U+318E, a "
                "keyboard's letters, as tables of choseong, jungseong and jongseong often do), which do not tell a "
                "leading consonant from a final one: use the conjoining jamo NFD gives, leading U+1100 + L, vowel "
                "U+1161 + V, final U+11A7 + T", _refusing(_each_syllable(_arithmetic(compatibility=True)))),
        Mistake("final_off_by_one", "the final consonant is one letter off: with T = s % 28, the final is "
                "U+11A7 + T (T = 1 is U+11A8), not U+11A8 + T",
                _refusing(_each_syllable(_arithmetic(final=0x11A8)))),
        Mistake("empty_final", "a syllable without a final consonant (T = s % 28 = 0) gets a third letter: only "
                "T >= 1 adds a final consonant, U+11A7 + T", _refusing(_each_syllable(_arithmetic(empty_final=True)))),
        Mistake("whitespace_dropped", "spaces, tabs and line breaks are lost (the words of text.split(), joined): "
                "every character that is no Hangul syllable stays as it is, whitespace too",
                lambda text: "".join(ref.to_jamo(word) for word in text.split())),
        Mistake("syllables_kept", "the Hangul syllables are not split (a list of the text's characters keeps "
                "each syllable whole): each becomes its 2 or 3 jamo, unicodedata.normalize('NFD', syllable)",
                _refusing(lambda text: "".join(list(text)))),
    ),
    errors=(
        Raises("{what} raised {error}: only conjoining jamo (U+1100..U+11FF) are refused; a keyboard's "
               "compatibility jamo (U+3131..U+318E) and every other character are kept as they are",
               example=_refusing(_each_syllable(lambda ch: unicodedata.normalize("NFD", ch)),
                                 refused=lambda ch: "\u1100" <= ch <= "\u11ff" or "\u3131" <= ch <= "\u318e"),
               match=r"ValueError(?!: invalid normalization form)", when=lambda call: not call.raises),
    ),
    figures=("tokenization-to_jamo-figure",),
)

# ---------------------------------------------------------------- from_jamo


def _from_jamo_inputs(rng: np.random.Generator) -> list[Call]:
    """to_jamo's texts as jamo, and a sentence's jamo cut anywhere into pieces (as BPE's tokens
    are), shown with " | " between them: letters that make no syllable there stay letters."""
    mixed, spread = _jamo_texts(rng)
    letters = ref.to_jamo(" ".join(_sentences(rng, 3, 0)))
    cuts = sorted(rng.choice(np.arange(1, len(letters)), size=len(letters) // 3, replace=False).tolist())
    pieces = " | ".join(letters[a:b] for a, b in zip([0, *cuts], [*cuts, len(letters)])) + " | " + letters[0]
    return [Call((ref.to_jamo(mixed),), what="from_jamo(text) for sentences with other scripts, tabs and line breaks"),
            Call((ref.to_jamo(spread),), what="from_jamo(text) for syllables from all over U+AC00..U+D7A3"),
            Call((pieces,), what="from_jamo(text) for letters cut into pieces, as tokens are")]


def _composing(final: int = 0x11A7, finals: bool = True, checked: bool = True) -> Callable[[str], str]:
    """A learner's from_jamo by the Unicode Standard's arithmetic: a leading consonant and a
    vowel (and a final after them, ``finals``) make the syllable 0xAC00 + (L * 21 + V) * 28 + T,
    with T = code - ``final``; any other letter stays. ``checked=False`` reads the letter after
    a leading consonant without asking whether there is one."""
    def from_jamo(text):
        out, i = [], 0
        while i < len(text):
            lead = ord(text[i]) - 0x1100
            vowel = ord(text[i + 1]) - 0x1161 if i + 1 < len(text) or not checked and 0 <= lead < 19 else -1
            if 0 <= lead < 19 and 0 <= vowel < 21:
                has_final = finals and i + 2 < len(text) and "\u11a8" <= text[i + 2] <= "\u11c2"
                out.append(chr(0xAC00 + (lead * 21 + vowel) * 28 + (ord(text[i + 2]) - final if has_final else 0)))
                i += 3 if has_final else 2
            else:
                out.append(text[i])
                i += 1
        return "".join(out)
    return from_jamo


def _describe_composed(case: Case) -> None:
    """What a wrong from_jamo did: whitespace lost, letters left apart (finals or whole
    syllables), characters that are no jamo changed, or syllables composed wrong."""
    got, want = case.answer, case.expected
    conjoining = lambda text: sum("\u1100" <= ch <= "\u11ff" for ch in text)
    if [ch for ch in got if ch.isspace()] != [ch for ch in want if ch.isspace()]:
        case.fail("spaces, tabs or line breaks are lost or added: only the runs of jamo change, every other "
                  "character stays as it is, whitespace too")
    if conjoining(got) > conjoining(want):
        finals = sum("\u11a8" <= ch <= "\u11c2" for ch in got) - sum("\u11a8" <= ch <= "\u11c2" for ch in want)
        if finals == conjoining(got) - conjoining(want):
            case.fail(f"{_plural(finals, 'final consonant')} {'is' if finals == 1 else 'are'} left apart: a leading "
                      "consonant, a vowel and the final after them make one syllable (T = final - 0x11A7)")
        case.fail(f"{_plural(conjoining(got) - conjoining(want), 'letter')} that make syllables with their neighbours "
                  "are left as letters: compose each run of jamo, unicodedata.normalize('NFC', run)")
    others = ([ch for ch in got if not _syllable(ch) and not "\u1100" <= ch <= "\u11ff"],
              [ch for ch in want if not _syllable(ch) and not "\u1100" <= ch <= "\u11ff"])
    if others[0] != others[1]:
        case.fail("characters that are no jamo are changed (normalizing the whole text does that to some, a "
                  "compatibility Hanja or an accent already apart): compose only the runs of U+1100..U+11FF")
    wrong = sum(g != w for g, w in zip(got, want)) if len(got) == len(want) else None
    case.fail(f"{'its text is not as long as the one encoded' if wrong is None else _plural(wrong, 'syllable') + ' differ'}"
              ": with L, V and T the letters' numbers (leading - 0x1100, vowel - 0x1161, final - 0x11A7, T = 0 "
              "without a final), the syllable is 0xAC00 + (L * 21 + V) * 28 + T")


FROM_JAMO_RULES = (
    Rule("a syllable without a final consonant", lambda call: any(
        "\u1161" <= a <= "\u1175" and not "\u11a8" <= b <= "\u11c2" for a, b in zip(call.args[0], call.args[0][1:]))),
    Rule("the last final consonant, U+11C2", lambda call: "\u11c2" in call.args[0]),
    Rule("the first and the last Hangul syllable, U+AC00 and U+D7A3", lambda call:
         "\u1100\u1161" in call.args[0] and "\u1112\u1175\u11c2" in call.args[0]),
    Rule("characters NFC changes that are no jamo (an accent written apart, a compatibility Hanja)",
         lambda call: "e\u0301" in call.args[0] and "\uf900" in call.args[0]),
    Rule("characters NFKC changes (a keyboard's jamo, a circled digit)", lambda call: any(
        unicodedata.normalize("NFKC", ch) != unicodedata.normalize("NFC", ch) for ch in call.args[0])),
    Rule("letters that make no syllable with their neighbours stay",
         lambda call: any("\u1100" <= ch <= "\u11ff" for ch in ref.from_jamo(call.args[0]))),
    Rule("spaces, tabs and line breaks", lambda call: {" ", "\t", "\n"} <= set(call.args[0])),
)


FROM_JAMO = Spec(
    id="tokenization-from_jamo",
    function="from_jamo",
    inputs=_from_jamo_inputs,
    reference=ref.from_jamo,
    driver="tokenization.drive_from_jamo",
    prepare=_text,
    judge=_judged(_describe_composed),
    rtol=0.0, atol=0.0,
    rules=FROM_JAMO_RULES,
    mistakes=(
        Mistake("nfc_whole_text", "NFC on the whole text also changes characters that are no jamo (it joins an "
                "accent written apart to its letter and replaces a compatibility Hanja, U+F900..): compose only "
                "the runs of conjoining jamo, U+1100..U+11FF, each with unicodedata.normalize('NFC', run)",
                lambda text: unicodedata.normalize("NFC", text)),
        Mistake("nfkc_whole_text", "NFKC on the whole text: it also replaces compatibility characters (a keyboard's "
                "jamo, a circled digit, a full-width letter) by others; use NFC, on the runs of conjoining jamo only",
                lambda text: unicodedata.normalize("NFKC", text)),
        Mistake("not_composed", "the letters are not composed (NFC not applied): each run of conjoining jamo "
                "becomes its syllables, unicodedata.normalize('NFC', run)", lambda text: "".join(list(text))),
        Mistake("finals_left_apart", "final consonants are left apart: a leading consonant, a vowel and the final "
                "after them make one syllable, 0xAC00 + (L * 21 + V) * 28 + T with T = final - 0x11A7",
                _composing(finals=False)),
        Mistake("final_off_by_one", "the final consonant is one off: T = final - 0x11A7 (U+11A8 is T = 1; T = 0 "
                "means no final)", _composing(final=0x11A8)),
        Mistake("whitespace_dropped", "spaces, tabs and line breaks are lost (the words of text.split(), joined): "
                "only the runs of jamo change, every other character stays as it is",
                lambda text: "".join(ref.from_jamo(word) for word in text.split())),
    ),
    errors=(
        Raises("{what} raised {error}: a letter can stand alone at the end of a text or a piece (a token cut "
               "anywhere): ask whether a vowel follows a leading consonant before composing them",
               example=_composing(checked=False), match="IndexError"),
    ),
    figures=("tokenization-from_jamo-figure",),
)

# ---------------------------------------------------------------- gpt2_pretokenize

_CONTRACTIONS = r"'(?:s|t|re|ve|m|ll|d)|"


def _splitter(pattern: str) -> Callable[[str], list[str]]:
    """A learner's pre-tokenizer: ``re.findall`` with ``pattern``."""
    compiled = re.compile(pattern)
    return lambda text: compiled.findall(text)


_ODD = ("don't", "I'm", "we'll", "it's", "they've", "you're", "she'd", "cat's", "3 cats", "2024년", "abc123",
        "12,000", "(고기)", "...!", "e-mail", "x_y", "🙂🙂", "a+b=c", "고양이가!")


def _gpt2_texts(rng: np.random.Generator) -> tuple[str, str]:
    """Korean and English sentences of the toy grammar with contractions, numbers, digits next to
    letters, punctuation and emoji between them, runs of spaces, tabs and line breaks; and a text
    whose words stand after runs of whitespace and which ends in one."""
    first, second, third, fourth = _sentences(rng, 2, 2)
    odd = list(_ODD)
    rng.shuffle(odd)
    digits = str(int(rng.integers(10, 10_000)))
    mixed = (f"{first} {' '.join(odd[:7])}, {second}.\n{third} {digits}{odd[7]}  {' '.join(odd[8:13])}!\t"
             f"{fourth}: {' '.join(odd[13:])}")
    gaps = ["  ", "   ", "\t", " \t ", "\n", "\n\n ", " "]
    words = " ".join(_sentences(rng, 2, 1)).split(" ")
    spaced = "".join(word + gaps[int(rng.integers(len(gaps)))] for word in words) + "  "
    return mixed, "  " + spaced


def _gpt2_inputs(rng: np.random.Generator) -> list[Call]:
    mixed, spaced = _gpt2_texts(rng)
    return [Call((mixed,), what="gpt2_pretokenize(text) for sentences with contractions, digits and punctuation"),
            Call((spaced,), what="gpt2_pretokenize(text) for words after runs of spaces, tabs and line breaks")]


def _kind_of_piece(piece: str) -> str:
    core = piece[1:] if piece[:1] == " " and len(piece) > 1 else piece
    if re.fullmatch(r"[^\W\d_]+", core):
        return "letters"
    if re.fullmatch(r"\d+", core):
        return "digits"
    return "whitespace" if core.isspace() else "other"


def _describe_pieces(case: Case) -> None:
    """What a wrong pre-tokenizer did: text lost or added, spaces after words, letters with
    digits, Hangul with punctuation, whitespace runs, contractions; or where it first differs."""
    got, want, text = case.answer, case.expected, case.call.args[0]
    if "".join(got) != text:
        lost = set(Counter(text) - Counter("".join(got)))
        if lost and lost <= {"_"}:
            case.fail("underscores are lost: \\w takes _, so [^\\s\\w] misses it and findall skips it; the "
                      "punctuation class is everything but whitespace, letters and digits, (?:[^\\s\\w]|_)")
        if any(_syllable(ch) for ch in lost):
            case.fail("Hangul syllables are lost: [a-zA-Z] knows only Latin letters, and [^\\s\\w] leaves out "
                      "every \\w character; a letter is any Unicode letter, [^\\W\\d_] with re (\\p{L} with "
                      "the regex module)")
        case.fail("its pieces put back together are not the text: every character, spaces, tabs and line breaks "
                  "too, belongs to exactly one piece (\"\".join(pieces) == text)")
    if any(p[-1] == " " and p.strip() for p in got):
        case.fail("a piece ends with a space: the space goes with the word after it (' world'), ' ?' before the "
                  "letters, digits or punctuation, not after them")
    if any(re.search(r"[^\W\d_]", p) and re.search(r"\d", p) for p in got):
        case.fail("letters and digits are in one piece (\\w+ takes both): a run of letters and a run of digits are "
                  "two pieces, [^\\W\\d_]+ and \\d+")
    if any(re.search("[\uac00-\ud7a3]", p) and re.search(r"[^\s\w]", p) for p in got):
        case.fail("Hangul syllables and punctuation are in one piece: [a-zA-Z] knows only Latin letters; a letter "
                  "is any Unicode letter, [^\\W\\d_] with re (\\p{L} with the regex module)")
    if any(p.isspace() and len(p) > 1 for p in got) and not any(p.isspace() and len(p) > 1 for p in want) or \
            sum(p[:1] == " " and not p.isspace() for p in got) < sum(p[:1] == " " and not p.isspace() for p in want):
        case.fail("after a run of whitespace the next word has no space: the run keeps its last space for the "
                  "word after it, \\s+(?!\\S) before \\s+")
    if sum(p[:1] == "'" for p in got) < sum(p[:1] == "'" for p in want):
        case.fail("English contractions are not pieces of their own: 's 't 're 've 'm 'll 'd come first in the "
                  "pattern, so don't is don + 't")
    k = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    kind = _kind_of_piece(want[k]) if k < len(want) else "the end of the text"
    case.fail(f"{_plural(len(got), 'piece')} where the rule gives {len(want)}; the first that differs is piece "
              f"{k + 1}, which should be a piece of {kind}")


GPT2_RULES = (
    Rule("English contractions", lambda call: bool(re.search(r"\w'(s|t|re|ve|m|ll|d)\b", call.args[0]))),
    Rule("digits next to letters", lambda call: bool(re.search(r"[^\W\d_]\d|\d[^\W\d_]", call.args[0]))),
    Rule("Hangul next to punctuation", lambda call: bool(re.search("[\uac00-\ud7a3][^\\s\\w]", call.args[0]))),
    Rule("runs of whitespace before a word",
         lambda call: bool(re.search(r"\s\s\S", call.args[0]))),
    Rule("whitespace at the end of the text", lambda call: call.args[0][-1:].isspace()),
)

_LETTER, _DIGIT, _OTHER = r"[^\W\d_]", r"\d", r"(?:[^\s\w]|_)"

GPT2_PRETOKENIZE = Spec(
    id="tokenization-gpt2_pretokenize",
    function="gpt2_pretokenize",
    inputs=_gpt2_inputs,
    reference=ref.gpt2_pretokenize,
    driver="tokenization.drive_gpt2_pretokenize",
    prepare=lambda answer, call, what: _strings(answer, what),
    judge=_judged(_describe_pieces),
    rtol=0.0, atol=0.0,
    rules=GPT2_RULES,
    mistakes=(
        Mistake("space_after", "the space goes with the word before it ('hello ' + 'world'): GPT-2 keeps it with "
                "the word after it (' world'), ' ?' before the letters, digits or punctuation",
                _splitter(_CONTRACTIONS + rf"{_LETTER}+ ?|{_DIGIT}+ ?|{_OTHER}+ ?|\s+")),
        Mistake("digits_with_letters", "letters and digits are in one piece (\\w+ takes both, so 2024년 is one "
                "piece): a run of letters and a run of digits are two pieces, [^\\W\\d_]+ and \\d+",
                _splitter(_CONTRACTIONS + rf" ?[^\W_]+| ?{_OTHER}+|\s+(?!\S)|\s+")),
        Mistake("ascii_letters", "Korean is not read as letters: [a-zA-Z] knows only Latin letters, so Hangul falls "
                "into the punctuation class and joins the punctuation next to it; a letter is any Unicode "
                "letter, [^\\W\\d_] with re (\\p{L} with the regex module)",
                _splitter(_CONTRACTIONS + r" ?[a-zA-Z]+| ?[0-9]+| ?[^\sa-zA-Z0-9]+|\s+(?!\S)|\s+")),
        Mistake("whitespace_run", "a run of whitespace takes the space of the word after it ('  ' + 'world'): the "
                "run keeps its last space for that word ('  world' is ' ' + ' world'), \\s+(?!\\S) before \\s+",
                _splitter(_CONTRACTIONS + rf" ?{_LETTER}+| ?{_DIGIT}+| ?{_OTHER}+|\s+")),
        Mistake("no_contractions", "English contractions are not pieces of their own ('don', \"'\", 't'): 's 't "
                "'re 've 'm 'll 'd come first in the pattern, so don't is 'don' + \"'t\"",
                _splitter(rf" ?{_LETTER}+| ?{_DIGIT}+| ?{_OTHER}+|\s+(?!\S)|\s+")),
        Mistake("space_separated", "punctuation and digits stay glued to the word (the notebook's pretokenize, "
                "' ?\\S+'): a run of letters, of digits and of punctuation are each a piece of their own",
                _splitter(r" ?\S+|\s")),
        Mistake("split", "spaces, tabs and line breaks are lost (text.split()): the pieces put back together "
                "must be the text, every space kept with the word after it", lambda text: text.split()),
    ),
    figures=("tokenization-gpt2_pretokenize-figure",),
)

# ---------------------------------------------------------------- encode_user_text


def _user_text_inputs(rng: np.random.Generator) -> list[Call]:
    """A user's text that types every special-token string (inside a word, after a space, one
    in another's brackets, at the end), for one tokenizer: nothing allowed, one allowed, "all",
    and a string that is no special token among the allowed, which must raise."""
    _, tokens, merges = _tokenizer(rng)
    first, second = _sentences(rng, 1, 1)
    specials = list(SPECIALS)
    rng.shuffle(specials)
    typed = (f"{first}{specials[0]}{second} {specials[1]}x<{specials[2]}> {specials[3]}\n"
             f"<eo s> {specials[0]}")
    lefts, rights = tuple(a for a, _ in merges), tuple(b for _, b in merges)
    asked = [("", "nothing allowed"), (specials[0], f"{specials[0]} allowed"), ("all", '"all" allowed'),
             (f"{specials[1]} <end>", "a string that is no special token among the allowed")]
    return [Call((typed, tokens, lefts, rights, allowed), raises="ValueError" if "<end>" in allowed else None,
                 what=f"encode_user_text(text, tokens, merges, allowed_special) for a user's text, {kind}")
            for allowed, kind in asked]


def _allowed(allowed) -> set:
    """What a learner's function reads from allowed_special: "all", or a collection of strings."""
    return set(SPECIALS) if allowed == "all" else set(allowed)


def _user_encoder(specials: str = "allowed", all_means: str = "all"):
    """A learner's encode_user_text: the allowed strings split off; the others typed in the text
    encoded as text ("allowed"), always as their ids ("always"), never ("never"), as <unk>
    ("unk") or dropped ("dropped"); "all" read as every special token or as none."""
    def encode(text, tokens, merges, allowed_special=()):
        if allowed_special == "all":
            allowed_special = SPECIALS if all_means == "all" else ()
        for special in allowed_special:
            if special not in SPECIALS:
                raise ValueError(f"{special!r} is no special token")
        allowed = set(allowed_special)
        if specials == "always":
            return ref.bpe_encode(text, tokens, merges)
        if specials == "never":
            return ref.encode_ordinary(text, tokens, merges)
        ids = []
        for piece in re.split("(" + "|".join(map(re.escape, SPECIALS)) + ")", text):
            if piece in allowed:
                ids.append(SPECIALS.index(piece))
            elif piece in SPECIALS and specials == "unk":
                ids.append(UNK_ID)
            elif piece in SPECIALS and specials == "dropped":
                continue
            else:
                ids += ref.encode_ordinary(piece, tokens, merges)
        return ids
    return encode


def _describe_user_text(case: Case) -> None:
    """What a wrong encode_user_text did: special ids for text not allowed, allowed strings not
    made special, text lost, or where the ids first differ."""
    got, want = [int(i) for i in case.answer], [int(i) for i in case.expected]
    text, tokens = case.call.args[0], case.call.args[1]
    specials_got = [i for i in got if i < ref.BYTE_OFFSET]
    specials_want = [i for i in want if i < ref.BYTE_OFFSET]
    if len(specials_got) > len(specials_want):
        case.fail(f"{_plural(len(specials_got) - len(specials_want), 'special id')} too many: a special-token string "
                  "typed in the text that allowed_special does not allow is ordinary text, encoded like any other "
                  "characters (its letters and bytes), never its id 0-3")
    if len(specials_got) < len(specials_want):
        case.fail(f"{_plural(len(specials_want) - len(specials_got), 'allowed special-token string')} of the text "
                  "did not become its id (0-3): each string of allowed_special is one id, SPECIALS.index(string); "
                  "allowed_special='all' allows the four")
    try:
        decoded = ref.bpe_decode(got, list(tokens))
    except ValueError:
        case.fail("an id is not in the vocabulary (0 .. 259 + len(tokens))")
    if decoded != text:
        case.fail("its ids do not decode back to the text: every character is kept, a special-token string that is "
                  "not allowed too (as text, not dropped)")
    k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    case.fail(f"{_plural(len(got), 'id')} where the rule gives {len(want)}, first different at position {k}: the "
              "ordinary text between the allowed strings is encoded with encode_ordinary, piece by piece")


_AS_TEXT = "it is ordinary text, encoded like any other characters, so that decoding gives the text back"

USER_TEXT_RULES = (
    Rule("special-token strings typed in the text, none allowed", lambda call: call.args[4] == ""
         and any(s in call.args[0] for s in SPECIALS)),
    Rule("one special token allowed, the others typed as text",
         lambda call: call.args[4] in SPECIALS and any(s in call.args[0] for s in set(SPECIALS) - {call.args[4]})),
    Rule('allowed_special="all" allows the four', lambda call: call.args[4] == "all"),
    Rule("a special-token string inside a word, and one in another's brackets",
         lambda call: bool(re.search(r"\S(<pad>|<bos>|<eos>|<unk>)\S", call.args[0]))
         and any(f"<{s}>" in call.args[0] for s in SPECIALS)),
    Rule("a string that is no special token among the allowed raises ValueError",
         lambda call: call.raises == "ValueError"),
)


ENCODE_USER_TEXT = Spec(
    id="tokenization-encode_user_text",
    function="encode_user_text",
    inputs=_user_text_inputs,
    reference=ref.encode_user_text,
    driver="tokenization.drive_encode_user_text",
    prepare=lambda answer, call, what: _ints(answer, what),
    judge=_judged(_describe_user_text),
    rtol=0.0, atol=0.0,
    rules=USER_TEXT_RULES,
    mistakes=(
        Mistake("always_special", "a special-token string that a user typed became its special id (bpe_encode's "
                "pretokenize makes every one special): only the strings of allowed_special become ids 0-3; any "
                "other is ordinary text, so that a user who types <eos> cannot end the model's sequence",
                _user_encoder(specials="always")),
        Mistake("never_special", "the allowed special-token strings are encoded as ordinary text: each string of "
                "allowed_special in the text is one id, SPECIALS.index(string)", _user_encoder(specials="never")),
        Mistake("unk_for_text", "a special-token string that is not allowed becomes <unk> (id 3): " + _AS_TEXT,
                _user_encoder(specials="unk")),
        Mistake("dropped", "a special-token string that is not allowed is dropped from the text: " + _AS_TEXT,
                _user_encoder(specials="dropped")),
        Mistake("all_ignored", "allowed_special='all' allows no special token here: 'all' means the four, "
                "<pad> <bos> <eos> <unk> (as in tiktoken)", _user_encoder(all_means="none")),
    ),
    errors=(
        Raises("{what} raised a ValueError: a special-token string that is not allowed is ordinary text here, not an "
               "error (tiktoken's encode raises by default, disallowed_special='all'; this function is its "
               "encode(text, allowed_special=..., disallowed_special=())); and allowed_special='all' allows the four",
               example=lambda text, tokens, merges, allowed_special=(): (_ for _ in ()).throw(
                   ValueError("the text holds a special token that is not allowed")),
               match="ValueError", when=lambda call: not call.raises),
    ),
    figures=("tokenization-encode_user_text-figure",),
)

# ---------------------------------------------------------------- train_byte_bpe


def _byte_variant(encoding: str = "utf-8", symbols: str = "bytes", base: str = "all", words: str = "pretokenize",
                  specials: str = "skip", tie: str = "smallest", recount: bool = True, weights: bool = True,
                  stop: bool = True, vocabulary: str = "merges"):
    """train_byte_bpe as a learner writes it, one choice per argument (the defaults are right):
    ``encoding`` of the words; ``symbols`` "characters" starts from each character's bytes as
    one symbol, "codepoints" from bytes([ord(ch)]); ``base`` "seen" puts only the bytes of the
    text first; ``words`` "whole" trains on the whole text as one sequence of bytes;
    ``vocabulary`` "bytes" returns the 256 byte values alone."""
    def as_symbols(word: str) -> tuple[bytes, ...]:
        if symbols == "characters":
            return tuple(ch.encode(encoding) for ch in word)
        if symbols == "codepoints":
            return tuple(bytes([ord(ch)]) for ch in word)
        return tuple(bytes([b]) for b in word.encode(encoding))

    def train_byte_bpe(text, num_merges):
        counts, merges = _learner_merges(_learner_words(text, words, specials), as_symbols, num_merges, tie, recount,
                                         weights, stop)
        seen = sorted({b for word in counts for symbol in word for b in symbol} | {b for m in merges for b in m[0] + m[1]})
        tokens = [bytes([i]) for i in (seen if base == "seen" else range(256))]
        return tokens + ([] if vocabulary == "bytes" else [left + right for left, right in merges]), merges
    return train_byte_bpe


def _byte_inputs(rng: np.random.Generator) -> list[Call]:
    """Lines of Korean and English with emoji, each ending in <eos>; a text of two words that runs
    out of pairs; a text and no merge at all."""
    emoji = ["🙂", "🍣", "🐱", "👍"]
    for _ in range(50):
        lines = _sentences(rng, 4, 3)
        marks = [emoji[int(i)] for i in rng.integers(len(emoji), size=len(lines))]
        text = "".join(f"{line} {mark}{mark}<eos>\n" for line, mark in zip(lines, marks))
        tiny = " ".join(_sentences(rng, 1, 0)[0].split()[:2])
        calls = [Call((text, 14), what=f"train_byte_bpe(text, 14) on {len(lines)} lines of Korean, English and emoji, "
                                       "each ending in <eos>"),
                 Call((tiny, 40), what="train_byte_bpe(text, 40) on a text of two Korean words, fewer pairs than merges"),
                 Call((_chained(rng) + "\n🙂 " + lines[0], 0), what="train_byte_bpe(text, 0): no merge")]
        if _bytes_told_apart(calls):
            return calls
    raise RuntimeError("no hidden text tells the ways of training apart")  # (never seen: a course bug)


def _bytes_told_apart(calls: list[Call]) -> bool:
    """Every catalogued mistake that returns an answer gives one of its own on these calls."""
    told = [tuple(repr(fn(*c.args)) for c in calls) for fn in [ref.train_byte_bpe, *(m.implementation for m in _BYTE_TOLD)]]
    return len(set(told)) == len(told)


def _hex(prepared: tuple) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    tokens, lefts, rights = prepared
    return [bytes.fromhex(t) for t in tokens], [(bytes.fromhex(a), bytes.fromhex(b)) for a, b in zip(lefts, rights)]


def _byte_inside_words(left: bytes, right: bytes) -> bool:
    """(left, right) can stand side by side inside a word: whitespace only as its first byte, a space."""
    joined = left + right
    return not (any(b in b" \t\n\r" for b in joined[1:]) or joined[:1] in (b"\t", b"\n", b"\r"))


def _describe_byte_training(case: Case) -> None:
    """What a wrong byte-level training did: the 256 bytes not first, a token that is not its
    merge's two halves joined, or the first merge that leaves the rule, and why."""
    text, _ = case.call.args
    (tokens, got), (_, want) = (_hex(case.spec.prepare(a, case.call, case.what)) for a in (case.answer, case.expected))
    if tokens[:256] != [bytes([i]) for i in range(256)]:
        case.fail("tokens[0 .. 255] are not the 256 byte values in order, tokens[i] == bytes([i]), every one whether "
                  "the text holds it or not: with only the bytes seen (or in another order) every id shifts")
    if len(tokens) != 256 + len(got):
        case.fail(f"{_plural(len(tokens) - 256, 'token')} after the 256 bytes, for {_plural(len(got), 'merge')}: each "
                  "merge adds one token, tokens[256 + k] == left + right of merge k")
    k = next((k for k, (token, (a, b)) in enumerate(zip(tokens[256:], got)) if token != a + b), None)
    if k is not None:
        case.fail(f"tokens[{256 + k}] is not left + right of merge {k + 1}: each merge's new token is its two halves "
                  "joined, in the order learned")
    words = ref.byte_word_counts(text)
    for k, (mine, right) in enumerate(zip(got, want)):
        if mine != right:
            n, pairs = k + 1, ref.count_pairs(words)
            first = "the first merge" if k == 0 else f"the first {k} merges are right; merge {n}"
            if b"\x00" in mine[0] + mine[1] and b"\x00" not in text.encode("utf-8"):
                case.fail(f"{first} holds a zero byte the text's UTF-8 has not: the words are written in UTF-16 (two "
                          "or four bytes a character, a byte-order mark); write them as word.encode('utf-8')")
            if mine not in pairs:
                if not _byte_inside_words(*mine):
                    case.fail(f"{first} joins two words (a space or line break inside the pair): write each word of "
                              "pretokenize(text) as its bytes and merge inside each word, never the whole text's bytes")
                if any(mine[0] + mine[1] in special.encode() for special in SPECIALS):
                    case.fail(f"{first} joins bytes of a special token: <eos> and the others are left out of the "
                              "counts, as in train_bpe")
                if len(mine[0]) + len(mine[1]) <= 4 and any(len(s) > 1 for s in mine) and k == 0:
                    case.fail(f"{first} joins symbols of several bytes before any merge: start from single bytes, "
                              "bytes([b]) for each byte b of word.encode('utf-8'), not from each character's bytes")
                case.fail(f"{first} is a pair of bytes that stands side by side nowhere in the words' bytes"
                          f"{' after the merges before it' if k else ''}: count the pairs again after every merge")
            if pairs[mine] == pairs[right]:
                case.fail(f"{first} has the top count, but so has another pair that comes first in Python's order of "
                          "(left, right) bytes: ties go to the smallest, min(pairs, key=lambda p: (-pairs[p], p))")
            unweighted = ref.count_pairs(dict.fromkeys(words, 1))
            if unweighted.get(mine) == max(unweighted.values()):
                case.fail(f"{first} is the most frequent pair if every word counts once: weight each word by its count")
            case.fail(f"{first} is not the most frequent pair: count the pairs again after every merge, each word "
                      "weighted by how often it occurs")
        words = ref.merge_pair(words, mine)
    if len(got) < len(want):
        case.fail(f"its {len(got)} merges are right, but it stops there; expected {len(want)}: merge num_merges "
                  "times, stopping earlier only when no pair is left")
    case.fail(f"its first {len(want)} merges are right, but it goes on to {len(got)}: stop after num_merges, or as "
              "soon as no pair is left")


_BYTE_MISTAKES = (
    Mistake("utf16", "the words are written in UTF-16 (word.encode('utf-16'): a byte-order mark, then two bytes per "
            "character, zero bytes for ASCII): byte-level BPE starts from UTF-8, word.encode('utf-8'), where ASCII is "
            "one byte and a Hangul syllable three", _byte_variant(encoding="utf-16")),
    Mistake("character_bytes", "each character's bytes start as one symbol (ch.encode('utf-8') per character): "
            "a Hangul syllable or an emoji is then one symbol before any merge; start from single bytes, bytes([b]) "
            "for each byte b of word.encode('utf-8'), and let the merges rebuild the characters",
            _byte_variant(symbols="characters")),
    Mistake("seen_bytes_only", "tokens[0 .. 255] are only the bytes the text holds (sorted): the base vocabulary is "
            "all 256 byte values, tokens[i] == bytes([i]), so that any text can be encoded and byte b is always "
            "id b; with only the bytes seen every id shifts", _byte_variant(base="seen")),
    Mistake("whole_text", "it merges across word boundaries: the bytes of the whole text are one sequence, so a pair "
            "can join the end of one word to the space of the next; write each word of pretokenize(text) as its "
            "bytes and merge inside each word", _byte_variant(words="whole")),
    Mistake("specials_merged", "special tokens are merged: a special token such as <eos> is left out of the counts, "
            "never written as bytes and merged", _byte_variant(specials="keep")),
    Mistake("ties_first_seen", "ties are broken by the pair seen first (max(pairs, key=pairs.get)); the stated rule is "
            "the smallest (left, right) in Python's order of bytes, min(pairs, key=lambda p: (-pairs[p], p))",
            _byte_variant(tie="first_seen")),
    Mistake("ties_largest", "ties are broken towards the largest (left, right); the stated rule is the smallest, "
            "min(pairs, key=lambda p: (-pairs[p], p))", _byte_variant(tie="largest")),
    Mistake("stale_counts", "the pair counts are not updated after a merge: merging (a, b) removes pairs and makes "
            "new ones with the merged token, so count the pairs again before every merge",
            _byte_variant(recount=False)),
    Mistake("unweighted", "each distinct word counts once: weight every word by how often it occurs in the text",
            _byte_variant(weights=False)),
    Mistake("bytes_only", "tokens holds the 256 byte values only: each merge adds a token, tokens[256 + k] == "
            "left + right of merge k (the vocabulary grows with the merges)", _byte_variant(vocabulary="bytes")),
)
_BYTE_TOLD = _BYTE_MISTAKES

BYTE_RULES = (
    Rule("the 256 byte values come first, whether the text holds them or not", lambda call: True),
    Rule("Hangul, English and emoji: three, one and four bytes a character",
         lambda call: any(_syllable(ch) for ch in call.args[0]) and any("a" <= ch <= "z" for ch in call.args[0])
         and any(ord(ch) > 0xFFFF for ch in call.args[0])),
    Rule("special tokens are left out of the counts", lambda call: "<eos>" in call.args[0] and call.args[1] > 0),
    Rule("merges never cross from one word to the next",
         lambda call: _byte_variant(words="whole")(*call.args)[1] != ref.train_byte_bpe(*call.args)[1]),
    Rule("ties go to the smallest (left, right)", lambda call: _byte_variant(tie="largest")(*call.args)[1]
         != ref.train_byte_bpe(*call.args)[1] and _byte_variant(tie="first_seen")(*call.args)[1]
         != ref.train_byte_bpe(*call.args)[1]),
    Rule("training stops early when no pair is left",
         lambda call: len(ref.train_byte_bpe(*call.args)[1]) < call.args[1]),
    Rule("num_merges 0: the 256 bytes and no merge", lambda call: call.args[1] == 0),
)


TRAIN_BYTE_BPE = Spec(
    id="tokenization-train_byte_bpe",
    function="train_byte_bpe",
    depends=("tokenization-count_pairs", "tokenization-merge_pair"),  # its solution calls them
    inputs=_byte_inputs,
    reference=ref.train_byte_bpe,
    driver="tokenization.drive_train_byte_bpe",
    prepare=_table("strings", "strings", "strings"),
    judge=_judged(_describe_byte_training),
    rtol=0.0, atol=0.0,
    mistakes=_BYTE_MISTAKES,
    rules=BYTE_RULES,
    errors=(
        Raises("{what} raised {error}: bytes([ord(ch)]) takes a character's code point, which is above 255 for "
               "Hangul and emoji; the symbols are the UTF-8 bytes, bytes([b]) for each b of word.encode('utf-8')",
               example=_byte_variant(symbols="codepoints"), match=r"bytes must be in range\(0, 256\)"),
        Raises("{what} raised {error}: Latin-1 (and ASCII) have no Hangul or emoji; UTF-8 writes every character, "
               "word.encode('utf-8')", example=_byte_variant(encoding="latin-1"), match="UnicodeEncodeError"),
        Raises("{what} raised {error}: no pair is left before num_merges merges (every word is one token); stop "
               "when count_pairs finds none", example=_byte_variant(stop=False),
               match=r"(min|max)\(\) (arg is an empty sequence|iterable argument is empty)"),
    ),
    figures=("tokenization-train_byte_bpe-figure",),
)

# ---------------------------------------------------------------- byte_decode


def _byte_tokenizer(rng: np.random.Generator) -> tuple[str, list[bytes], list]:
    """A byte-level vocabulary trained on a few lines of Korean, English and emoji: the text, tokens, merges."""
    text = "\n".join(line + " 🙂" for line in _sentences(rng, 3, 2))
    return (text, *ref.train_byte_bpe(text, int(rng.integers(25, 40))))


def _split_inside(ids: list[int], tokens: list[bytes]) -> bool:
    """Some id stands for bytes that are not whole UTF-8 characters by themselves."""
    def whole(token: bytes) -> bool:
        try:
            token.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False
    return not all(whole(tokens[i]) for i in ids)


def _decode_byte_inputs(rng: np.random.Generator) -> list[Call]:
    """Ids of Korean, English and emoji lines (syllables split across tokens); the same ids cut
    inside a character (a partial decode); ids a model might sample, with bytes that are no
    UTF-8; an id past the vocabulary and a negative one, which must raise."""
    for _ in range(50):
        text, tokens, merges = _byte_tokenizer(rng)
        ids = ref.byte_encode(_sentences(rng, 1, 0)[0] + " 🐱 " + text.split("\n")[0], tokens, merges)
        cut = next((k for k in range(len(ids) - 1, 0, -1)
                    if ref.byte_decode(ids[:k], tokens).endswith("\ufffd")), None)
        if cut is None or not _split_inside(ids, tokens):
            continue
        sampled = [int(i) for i in rng.integers(len(tokens), size=12)] + [0x80, 0, 0xEA, 0x41]
        wire = tuple(t.hex() for t in tokens)
        as_ids = lambda values: np.array(values, dtype=np.int64)
        return [Call((as_ids(ids), wire), what="byte_decode(ids, tokens) for a line of Korean, English and emoji"),
                Call((as_ids(ids[:cut]), wire), what="byte_decode(ids, tokens) for the first ids of a line, cut "
                                                     "inside a character"),
                Call((as_ids(sampled), wire), what="byte_decode(ids, tokens) for ids a model sampled"),
                Call((as_ids(ids[:3] + [len(tokens)]), wire), raises="ValueError",
                     what="byte_decode(ids, tokens) with an id past the vocabulary"),
                Call((as_ids([-1] + ids[:3]), wire), raises="ValueError",
                     what="byte_decode(ids, tokens) with a negative id")]
    raise RuntimeError("no hidden line splits a character across tokens")  # (never seen: a course bug)


def _decoding_bytes(per_token: bool = False, errors: str = "replace", encoding: str = "utf-8",
                    negative: bool = False):
    """byte_decode as a learner writes it: each token decoded alone (``per_token``), other
    ``errors`` or ``encoding``, negative ids let through to Python's indexing (``negative``)."""
    def byte_decode(ids, tokens):
        for i in ids:
            if i >= len(tokens) or (i < 0 and not negative):
                raise ValueError(f"id {i} is outside the vocabulary")
        if per_token:
            return "".join(tokens[i].decode(encoding, errors=errors) for i in ids)
        return b"".join(tokens[i] for i in ids).decode(encoding, errors=errors)
    return byte_decode


def _describe_byte_decoding(case: Case) -> None:
    """What a wrong byte_decode did: more or fewer U+FFFD than the rule, characters lost, or
    where the texts first differ."""
    got, want = case.answer, case.expected
    if got.count("\ufffd") > want.count("\ufffd"):
        case.fail(f"{_plural(got.count(chr(0xFFFD)) - want.count(chr(0xFFFD)), 'replacement character')} (U+FFFD) too "
                  "many: bytes of one character that stand in two tokens are whole once joined; join all the bytes "
                  "first, then decode once")
    if got.count("\ufffd") < want.count("\ufffd"):
        case.fail("bytes that are no UTF-8 are dropped or kept as other characters: each invalid sequence becomes "
                  "one U+FFFD, .decode('utf-8', errors='replace')")
    k = _first_difference(got, want)
    case.fail(f"its text differs from the rule's at character {k} of {len(want)}: join the tokens' bytes in the "
              "order of the ids, then decode once as UTF-8 with errors='replace'")


BYTE_DECODE_RULES = (
    Rule("a character split across two tokens",
         lambda call: not call.raises and _split_inside([int(i) for i in call.args[0]],
                                                        [bytes.fromhex(t) for t in call.args[1]])
         and "\ufffd" not in _wire_decode(call)),
    Rule("ids that end inside a character (a partial decode)", lambda call: _wire_decode(call).endswith("\ufffd")),
    Rule("bytes that are no UTF-8 in the middle", lambda call: "\ufffd" in _wire_decode(call)[:-1]),
    Rule("id 0, the byte 0x00, is in the vocabulary", lambda call: not call.raises and 0 in call.args[0]),
    Rule("an id outside the vocabulary raises ValueError, a negative one too",
         lambda call: call.raises == "ValueError" and int(min(call.args[0])) < 0),
)


def _wire_decode(call: Call) -> str:
    """The reference's text for a call (an id outside the vocabulary: '')."""
    ids, tokens = [int(i) for i in call.args[0]], [bytes.fromhex(t) for t in call.args[1]]
    return "" if call.raises else ref.byte_decode(ids, tokens)


BYTE_DECODE = Spec(
    id="tokenization-byte_decode",
    function="byte_decode",
    inputs=_decode_byte_inputs,
    reference=ref.byte_decode,
    driver="tokenization.drive_byte_decode",
    prepare=_text,
    judge=_judged(_describe_byte_decoding),
    rtol=0.0, atol=0.0,
    rules=BYTE_DECODE_RULES,
    mistakes=(
        Mistake("token_by_token", "each token is decoded by itself: a token that holds part of a character (the "
                "first bytes of a Hangul syllable) becomes U+FFFD, though its bytes and the next token's make one "
                "character; join all the bytes first, b''.join(...), then decode once", _decoding_bytes(per_token=True)),
        Mistake("errors_ignore", "bytes that are no UTF-8 are dropped (errors='ignore'): a partial character at the "
                "end or a sampled byte vanishes silently; errors='replace' shows each as U+FFFD",
                _decoding_bytes(errors="ignore")),
        Mistake("latin_1", "the bytes are decoded as Latin-1, one character per byte: UTF-8 writes a Hangul syllable "
                "as three bytes, .decode('utf-8', errors='replace')", _decoding_bytes(encoding="latin-1")),
    ),
    errors=(
        Raises("{what} raised {error}: ids can end inside a character (a partial decode) or come from a model as any "
               "bytes; decode with errors='replace', so that each invalid sequence becomes U+FFFD",
               example=_decoding_bytes(errors="strict"), match="UnicodeDecodeError", when=lambda call: not call.raises),
        Raises("{what} raised {error}: check every id first, and raise ValueError for one outside 0 .. len(tokens) - 1",
               example=lambda ids, tokens: b"".join(tokens[i] for i in ids).decode("utf-8", errors="replace"),
               match="IndexError"),
    ),
    figures=("tokenization-byte_decode-figure",),
)

SPECS = (COUNT_PAIRS, MERGE_PAIR, TRAINING, BPE_ENCODE, BPE_DECODE, TO_JAMO, FROM_JAMO, GPT2_PRETOKENIZE,
         ENCODE_USER_TEXT, TRAIN_BYTE_BPE, BYTE_DECODE)
