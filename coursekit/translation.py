"""Toy English -> Korean translation task, generated in code (nothing is downloaded).

Grammar (English side)
----------------------
    S      -> NP_subj VP_main NP_obj                 transitive main clause (SVO)
            | "there" EXIST NP_a                      existential clause
    NP     -> "the" [ADJ] N [REL]                     REL only on main-clause NPs (depth 1)
    NP_a   -> "a"/"an" [ADJ] N [REL]                  (existential NP; "no" if negated)
    REL    -> "that" V_rel NP_inner                   subject gap: "the cat that chased the dog"
            | "that" NP_inner V_rel                   object gap:  "the cat that the dog chased"
    NP_inner -> "the" [ADJ] N                         (no nested relative clauses)
    VP_main  -> past "ate" | present "eats" | future "will eat"   (the tense labels are English's)
              | negated, long form : "did not eat" | "does not eat" | "will not eat"
              | negated, short form: "didn't eat"  | "doesn't eat"  | "won't eat"
    V_rel  -> "ate" | "eats" | "will eat"             (tense only, never negated)
    EXIST  -> "was" | "is" | "will be"                with optional "no" for negation
              ("there was no cat", "there is a cat", "there will be no cat")

Translation rules (Korean side, morpheme tokens; particles are separate tokens)
------------------------------------------------------------------------------
* Word order is SOV; a relative clause and an adjective come *before* the noun,
  relative clause first:  "개가 본 큰 고양이".
* Particles depend on the noun's last syllable: it has a final consonant (받침) iff
  (ord(c) - 0xAC00) % 28 != 0.  With 받침 -> 은 / 이 / 을, without -> 는 / 가 / 를.
    - main-clause subject of a transitive sentence: topic 은/는
    - subject inside a relative clause and subject of an existential: 이/가
      (a topic marker is not allowed inside a relative clause)
    - every object (main or inside a relative clause): 을/를
* Finite endings: past 먹었다, present 먹는다, and for English "will" 먹을 것이다. The
  last is not a future tense: -(으)ㄹ 것이다 (the adnominal ending -(으)ㄹ, the bound noun
  것 and the copula 이다) expresses conjecture or prediction ("will", "is likely to").
  Relative (관형형) forms: past 먹은, present 먹는, and 먹을 (-(으)ㄹ, prospective: "the
  cat that will eat").
* Negation: the English long form ("did not") -> long Korean negation -지 않다
  (먹지 않았다 / 먹지 않는다 / 먹지 않을 것이다); the English contraction ("didn't")
  -> short negation 안 + verb (안 먹었다 / 안 먹는다 / 안 먹을 것이다).  With see, find
  and catch, where not doing it is a failure and not a choice, 못 and -지 못하다 instead
  (못 찾았다 / 찾지 못했다: "could not find"; 안 찾았다 would be "did not look for", 안
  보았다 "did not look at").
* "finds" is 찾아낸다 (찾는다 would read "is looking for"), and "will find" 찾아낼 것이다;
  only the past uses 찾다 (찾았다, 찾은: "found").  The past relative of like is 좋아했던.
* Existential: 있었다 / 있다 / 있을 것이다, negated 없었다 / 없다 / 없을 것이다.
* Adjectives are given in 관형형 form: 큰, 작은, 빨간, 하얀, 검은, 예쁜, 배고픈, and for
  "young" 어린 (a child, an animal) or 젊은 (an adult: 젊은 의사).  Colour words, big and
  small describe animals and things, never people; "young" and "hungry" only what is alive.
* Nouns: people (boy, girl, teacher, student, doctor, king), animals (cat, dog,
  fish, bird, bear, horse), things (apple, book, bread, flower).  Half of the Korean nouns
  end in a final consonant.  Sentences may still be absurd (the apple ate the bear): the
  grammar is the point, not the story.

Splits
------
Some combinations are *held out of training entirely* (``COMPOSITIONAL``):
  - two nouns (one with 받침, one without) never occur as an object (neither in the
    main clause nor inside a relative clause) -> the model never emits "말 을" or
    "새 를" in training, but does see 말/새 as subjects, topics, existentials;
  - a few adjective-noun pairs never occur together.
``make_splits`` returns train / held-out / compositional lists of (src, tgt) token
lists.  Held-out sentences contain no held-out combination and are not in training;
compositional sentences contain at least one held-out combination (so they cannot be
in training).  Both properties are asserted.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

# ---------------------------------------------------------------- lexicon
# English noun -> Korean noun. Half the nouns end in a final consonant (받침) and half do not,
# so each particle pair (은/는, 이/가, 을/를) is seen equally often: 8 and 8. The words are the
# plain nouns a Korean reader expects in plain-style sentences: 교사, not 선생님 (which would
# need honorific verbs: 만드셨다, 계시다); 물고기, a living fish (생선 is fish as food); 왕, one
# person (이웃, "neighbour", reads as people in general when it is a subject).
NOUNS = {
    "cat": "고양이", "dog": "개", "fish": "물고기", "apple": "사과", "boy": "소년",
    "girl": "소녀", "teacher": "교사", "student": "학생", "book": "책", "bird": "새",
    "bear": "곰", "horse": "말", "doctor": "의사", "bread": "빵", "flower": "꽃",
    "king": "왕",
}
# What each noun names, which decides the adjectives it takes (``ADJ_CLASSES``).
PEOPLE = ("boy", "girl", "teacher", "student", "doctor", "king")
ANIMALS = ("cat", "dog", "fish", "bird", "bear", "horse")
THINGS = ("apple", "book", "bread", "flower")
# "bread" is uncountable in English: an existential says "there was some bread", not "a bread".
MASS_NOUNS = ("bread",)
# English adjective -> Korean adnominal (관형형) form. "young" has two: 어린 for a child or an
# animal (어린 소녀, 어린 고양이) and 젊은 for an adult (젊은 의사, never 어린 의사).
ADJS = {
    "big": "큰", "small": "작은", "red": "빨간", "white": "하얀", "black": "검은",
    "pretty": "예쁜", "young": "어린", "hungry": "배고픈",
}
YOUNG_ADULT = "젊은"
ADULTS = ("teacher", "doctor", "king")
# Which nouns an adjective may describe: colour words never describe a person (검은 학생 and
# "the black student" read as race, in both languages); nor do big and small (큰 의사 reads "a
# great doctor"; a Korean writer says 키가 큰); "young" and "hungry" only something alive.
COLOURS = ("red", "white", "black")
ADJ_CLASSES = {
    "big": ANIMALS + THINGS, "small": ANIMALS + THINGS,
    "pretty": PEOPLE + ANIMALS + THINGS,
    "red": ANIMALS + THINGS, "white": ANIMALS + THINGS, "black": ANIMALS + THINGS,
    "young": PEOPLE + ANIMALS, "hungry": PEOPLE + ANIMALS,
}


def adj_ko(adj: str, noun: str) -> str:
    """The Korean adnominal form of English ``adj`` describing English ``noun``.

    Raises ValueError if the grammar never puts ``adj`` on ``noun`` (``ADJ_CLASSES``)."""
    if noun not in ADJ_CLASSES[adj]:
        raise ValueError(f"the grammar never says 'the {adj} {noun}': see ADJ_CLASSES")
    return YOUNG_ADULT if adj == "young" and noun in ADULTS else ADJS[adj]


# verb: English (base, 3sg present, past), Korean finite (past, present, -(으)ㄹ form),
# relative (past, present, -(으)ㄹ), -지 stem (past, present, -(으)ㄹ).  For English "will": the
# -(으)ㄹ form + "것이다" (conjecture or prediction, not a tense); "future" in the code names the
# English tense.  "finds" is 찾아낸다 (찾는다 reads "is looking for"), so find's forms other
# than the past (찾았다, 찾은: "found") are built on 찾아내다.
def _each_tense(stem: str) -> tuple[str, str, str]:
    return stem, stem, stem


VERBS = {
    "eat":   (("eat", "eats", "ate"),         ("먹었다", "먹는다", "먹을"),       ("먹은", "먹는", "먹을"),       _each_tense("먹지")),
    "see":   (("see", "sees", "saw"),         ("보았다", "본다", "볼"),           ("본", "보는", "볼"),           _each_tense("보지")),
    "like":  (("like", "likes", "liked"),     ("좋아했다", "좋아한다", "좋아할"), ("좋아했던", "좋아하는", "좋아할"), _each_tense("좋아하지")),
    "catch": (("catch", "catches", "caught"), ("잡았다", "잡는다", "잡을"),       ("잡은", "잡는", "잡을"),       _each_tense("잡지")),
    "chase": (("chase", "chases", "chased"),  ("쫓았다", "쫓는다", "쫓을"),       ("쫓은", "쫓는", "쫓을"),       _each_tense("쫓지")),
    "find":  (("find", "finds", "found"),     ("찾았다", "찾아낸다", "찾아낼"),   ("찾은", "찾아내는", "찾아낼"), ("찾지", "찾아내지", "찾아내지")),
    "help":  (("help", "helps", "helped"),    ("도왔다", "돕는다", "도울"),       ("도운", "돕는", "도울"),       _each_tense("돕지")),
    "make":  (("make", "makes", "made"),      ("만들었다", "만든다", "만들"),     ("만든", "만드는", "만들"),     _each_tense("만들지")),
}
TENSES = ("past", "present", "future")
# Negation, + 것이다 for English "will". 안 and -지 않다 say the subject did not do it; with see,
# find and catch that reads "chose not to" (책을 안 찾았다: "did not look for the book"), so
# their negation is 못 and -지 못하다, "could not": 책을 못 찾았다, 책을 찾지 못했다.
NEG_FINITE = {"past": "않았다", "present": "않는다", "future": "않을"}
CANNOT_FINITE = {"past": "못했다", "present": "못한다", "future": "못할"}
CANNOT_VERBS = ("see", "find", "catch")
EXIST_KO = {False: ("있었다", "있다", "있을"), True: ("없었다", "없다", "없을")}
PARTICLES = {"topic": ("은", "는"), "subj": ("이", "가"), "obj": ("을", "를")}

# held-out combinations (never in training)
HELDOUT_OBJECT_NOUNS = ("horse", "bird")          # 말 (받침) -> 을, 새 (no 받침) -> 를
HELDOUT_ADJ_NOUN = (("red", "cat"), ("big", "fish"), ("pretty", "teacher"),
                    ("white", "horse"), ("hungry", "bear"), ("pretty", "book"))

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]


def has_batchim(word: str) -> bool:
    """True if the last Hangul syllable of `word` has a final consonant (받침)."""
    c = word[-1]
    assert 0xAC00 <= ord(c) <= 0xD7A3, f"not a Hangul syllable: {c!r}"
    return (ord(c) - 0xAC00) % 28 != 0


def particle(noun_ko: str, role: str) -> str:
    with_b, without_b = PARTICLES[role]
    return with_b if has_batchim(noun_ko) else without_b


def english_words(ko_token: str) -> set[str]:
    """The English tokens that a Korean content token translates: a noun -> its noun, an
    adjective -> its adjective, a verb form (finite, relative or -지) -> the verb's English
    forms. Empty for particles, endings, negation and special tokens. (The lexicon read
    backwards: the source words a row of an alignment picture should look at.)"""
    found = {en for en, ko in [*NOUNS.items(), *ADJS.items()] if ko == ko_token}
    for en_forms, finite, relative, ji in VERBS.values():
        if ko_token in (*finite, *relative, *ji):
            found.update(en_forms)
    return found


# ---------------------------------------------------------------- sentence trees
@dataclass(frozen=True)
class NP:
    noun: str
    adj: str | None = None
    rel: "Rel | None" = None          # relative clause modifying this NP


@dataclass(frozen=True)
class Rel:
    verb: str
    tense: str
    gap: str                          # "subj": "that chased the dog"; "obj": "that the dog chased"
    other: NP                         # the NP inside the clause (object or subject)


@dataclass(frozen=True)
class Sentence:
    kind: str                         # "trans" or "exist"
    tense: str
    neg: str | None                   # None, "long", "short" ("short" only for trans)
    subj: NP                          # for "exist": the existing NP
    verb: str | None = None
    obj: NP | None = None


# ---------------------------------------------------------------- English rendering
def en_verb(verb: str, tense: str, neg: str | None = None) -> list[str]:
    base, s3, past = VERBS[verb][0]
    if neg is None:
        return {"past": [past], "present": [s3], "future": ["will", base]}[tense]
    if neg == "long":
        return {"past": ["did", "not"], "present": ["does", "not"], "future": ["will", "not"]}[tense] + [base]
    return {"past": ["didn't"], "present": ["doesn't"], "future": ["won't"]}[tense] + [base]


def en_np(np_: NP, det: str = "the") -> list[str]:
    words = ([np_.adj] if np_.adj else []) + [np_.noun]
    if det == "a" and np_.noun in MASS_NOUNS:
        det = "some"
    elif det == "a" and words[0][0] in "aeiou":
        det = "an"
    out = [det] + words
    if np_.rel is not None:
        r = np_.rel
        if r.gap == "subj":
            out += ["that"] + en_verb(r.verb, r.tense) + en_np(r.other)
        else:
            out += ["that"] + en_np(r.other) + en_verb(r.verb, r.tense)
    return out


def to_english(s: Sentence) -> list[str]:
    if s.kind == "exist":
        be = {"past": ["was"], "present": ["is"], "future": ["will", "be"]}[s.tense]
        det = ["no"] if s.neg else ["a"]
        np_tokens = en_np(s.subj, det=det[0])
        return ["there"] + be + np_tokens
    return en_np(s.subj) + en_verb(s.verb, s.tense, s.neg) + en_np(s.obj)


# ---------------------------------------------------------------- Korean rendering
def ko_np(np_: NP, role: str) -> list[str]:
    """Korean tokens of an NP followed by its particle (role: topic / subj / obj)."""
    out: list[str] = []
    if np_.rel is not None:
        r = np_.rel
        rel_form = VERBS[r.verb][2][TENSES.index(r.tense)]
        inner_role = "obj" if r.gap == "subj" else "subj"
        out += ko_np(r.other, inner_role) + [rel_form]
    if np_.adj:
        out.append(adj_ko(np_.adj, np_.noun))
    noun_ko = NOUNS[np_.noun]
    return out + [noun_ko, particle(noun_ko, role)]


def ko_verb(verb: str, tense: str, neg: str | None) -> list[str]:
    t = TENSES.index(tense)
    finite = VERBS[verb][1][t]
    fut = ["것이다"] if tense == "future" else []
    if neg is None:
        return [finite] + fut
    cannot = verb in CANNOT_VERBS
    if neg == "short":
        return ["못" if cannot else "안", finite] + fut
    return [VERBS[verb][3][t], (CANNOT_FINITE if cannot else NEG_FINITE)[tense]] + fut


def to_korean(s: Sentence) -> list[str]:
    if s.kind == "exist":
        fut = ["것이다"] if s.tense == "future" else []
        return ko_np(s.subj, "subj") + [EXIST_KO[bool(s.neg)][TENSES.index(s.tense)]] + fut
    return ko_np(s.subj, "topic") + ko_np(s.obj, "obj") + ko_verb(s.verb, s.tense, s.neg)


def detokenize_ko(tokens: list[str]) -> str:
    """Join particles to the preceding noun: ['개', '가', '본'] -> '개가 본'."""
    out: list[str] = []
    all_particles = {p for pair in PARTICLES.values() for p in pair}
    for i, tok in enumerate(tokens):
        # a particle always follows a noun; '이' can only be a particle here
        if tok in all_particles and out and tokens[i - 1] in NOUNS.values():
            out[-1] += tok
        else:
            out.append(tok)
    return " ".join(out)


# ---------------------------------------------------------------- sampling
@dataclass
class GrammarConfig:
    p_adj: float = 0.35        # probability that an NP has an adjective
    p_rel: float = 0.3         # probability that a main-clause NP has a relative clause
    max_rel: int = 2           # at most this many relative clauses per sentence
    p_exist: float = 0.15      # probability of an existential sentence
    p_neg: float = 0.4         # probability of negation (split evenly long/short)


def _sample_np(rng: random.Random, cfg: GrammarConfig, allow_rel: bool) -> NP:
    noun = rng.choice(list(NOUNS))
    adj = rng.choice([a for a in ADJS if noun in ADJ_CLASSES[a]]) if rng.random() < cfg.p_adj else None
    rel = None
    if allow_rel and rng.random() < cfg.p_rel:
        rel = Rel(verb=rng.choice(list(VERBS)), tense=rng.choice(TENSES),
                  gap=rng.choice(("subj", "obj")), other=_sample_np(rng, cfg, False))
    return NP(noun, adj, rel)


def sample_sentence(rng: random.Random, cfg: GrammarConfig = GrammarConfig()) -> Sentence:
    tense = rng.choice(TENSES)
    if rng.random() < cfg.p_exist:
        neg = "long" if rng.random() < cfg.p_neg else None
        return Sentence("exist", tense, neg, _sample_np(rng, cfg, cfg.max_rel > 0))
    neg = None
    if rng.random() < cfg.p_neg:
        neg = rng.choice(("long", "short"))
    subj = _sample_np(rng, cfg, cfg.max_rel > 0)
    obj = _sample_np(rng, cfg, cfg.max_rel > 1 or (cfg.max_rel == 1 and subj.rel is None))
    return Sentence("trans", tense, neg, subj, rng.choice(list(VERBS)), obj)


# ---------------------------------------------------------------- held-out combinations
def _nps(s: Sentence):
    """Yield (NP, role) for every NP, role in {topic, subj, obj}."""
    def walk(np_, role):
        yield np_, role
        if np_.rel is not None:
            yield from walk(np_.rel.other, "obj" if np_.rel.gap == "subj" else "subj")
    if s.kind == "exist":
        yield from walk(s.subj, "subj")
    else:
        yield from walk(s.subj, "topic")
        yield from walk(s.obj, "obj")


def heldout_combos(s: Sentence) -> set[str]:
    """Names of the held-out combinations this sentence contains (empty = trainable)."""
    found = set()
    for np_, role in _nps(s):
        if role == "obj" and np_.noun in HELDOUT_OBJECT_NOUNS:
            found.add(f"obj:{np_.noun}")
        if (np_.adj, np_.noun) in HELDOUT_ADJ_NOUN:
            found.add(f"adj:{np_.adj}+{np_.noun}")
    return found


# What each verb can sensibly be done to: the showcase sentences (``plausible``) keep to these;
# the training data does not (the apple ate the bear teaches the grammar just as well).
_ALIVE = PEOPLE + ANIMALS
SENSIBLE_OBJECTS = {
    "eat": ("fish", "apple", "bread"), "make": ("bread", "book", "flower"),
    "see": tuple(NOUNS), "like": tuple(NOUNS), "find": tuple(NOUNS),
    "chase": _ALIVE, "catch": _ALIVE, "help": _ALIVE,
}
_VERB_OF = {form: verb for verb, (forms, *_) in VERBS.items() for form in forms}


def events(en: list[str]) -> list[tuple[str, str, str]]:
    """Who does what to whom in sentence ``en`` (the tokens of ``to_english``): one
    (subject, verb, object) triple of English nouns and a verb's base form for the main clause
    and for each relative clause, main clause first.

    ``"the cat that the dog saw ate the fish".split()`` -> ``[("cat", "eat", "fish"),
    ("dog", "see", "cat")]``; an existential's noun only exists: ``"there was a cat".split()``
    -> ``[]``. Raises ValueError for tokens the grammar does not write."""
    found: list[tuple[str, str, str]] = []

    def verb(i: int) -> tuple[str, int]:                 # a verb group from i -> (base, next i)
        if en[i] in ("did", "does", "will"):
            i += 2 if en[i + 1] == "not" else 1
        elif en[i] in ("didn't", "doesn't", "won't"):
            i += 1
        if en[i] not in _VERB_OF:
            raise ValueError(f"not a sentence of the grammar: {' '.join(en)!r}")
        return _VERB_OF[en[i]], i + 1

    def noun_phrase(i: int) -> tuple[str, int]:          # "the [adj] noun [that ...]" from i
        i += 1 + (en[i + 1] in ADJS)
        noun, i = en[i], i + 1
        if noun not in NOUNS:
            raise ValueError(f"not a sentence of the grammar: {' '.join(en)!r}")
        if i < len(en) and en[i] == "that":
            if en[i + 1] == "the":                         # object gap: "that the dog saw"
                other, i = noun_phrase(i + 1)
                v, i = verb(i)
                found.append((other, v, noun))
            else:                                         # subject gap: "that chased the dog"
                v, i = verb(i + 1)
                other, i = noun_phrase(i)
                found.append((noun, v, other))
        return noun, i

    if en[0] == "there":
        noun_phrase(2 if en[1] != "will" else 3)
        return found
    subj, i = noun_phrase(0)
    v, i = verb(i)
    obj, _ = noun_phrase(i)
    return [(subj, v, obj)] + found


def plausible(en: list[str]) -> bool:
    """True if in sentence ``en`` every subject is a person or an animal and every object is
    something its verb can sensibly be done to (``SENSIBLE_OBJECTS``), other than the subject
    (not "the teacher that the teacher helped"): the sentences to show."""
    return all(s in _ALIVE and o in SENSIBLE_OBJECTS[v] and o != s for s, v, o in events(en))


def n_rel(s: Sentence) -> int:
    return sum(1 for np_, _ in _nps(s) if np_.rel is not None)


# ---------------------------------------------------------------- vocab / splits
class Vocab:
    def __init__(self, tokens):
        self.itos = SPECIALS + sorted(set(tokens) - set(SPECIALS))
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    def __len__(self):
        return len(self.itos)

    def encode(self, toks):
        return [self.stoi.get(t, self.stoi[UNK]) for t in toks]

    def decode(self, ids):
        out = []
        for i in ids:
            t = self.itos[i]
            if t == EOS:
                break
            if t not in (PAD, BOS):
                out.append(t)
        return out


def build_vocabs() -> tuple[Vocab, Vocab]:
    """Vocabularies from the lexicon (complete by construction, independent of data)."""
    en = {"the", "a", "an", "some", "no", "that", "there", "was", "is", "will", "be", "did", "does",
          "not", "didn't", "doesn't", "won't"} | set(NOUNS) | set(ADJS)
    ko = set(NOUNS.values()) | set(ADJS.values()) | {YOUNG_ADULT, "안", "못", "것이다"}
    ko |= set(NEG_FINITE.values()) | set(CANNOT_FINITE.values())
    ko |= {p for pair in PARTICLES.values() for p in pair}
    ko |= {w for forms in EXIST_KO.values() for w in forms}
    for v, (en_forms, fin, rel, ji) in VERBS.items():
        en |= set(en_forms)
        ko |= set(fin) | set(rel) | set(ji)
    return Vocab(en), Vocab(ko)


def make_splits(n_train: int = 20000, n_heldout: int = 1000, n_comp: int = 1000,
                seed: int = 0, cfg: GrammarConfig = GrammarConfig(),
                max_src_len: int | None = None):
    """Return dict with 'train', 'heldout', 'comp' lists of (en_tokens, ko_tokens).

    Training sentences are unique and contain no held-out combination; held-out
    sentences are unique, disjoint from training, and contain no held-out combination;
    compositional sentences are unique and contain >= 1 held-out combination.
    """
    rng = random.Random(seed)
    train, held, comp, comp_kind = {}, {}, {}, {}
    guard = 0
    while len(train) < n_train or len(held) < n_heldout or len(comp) < n_comp:
        guard += 1
        assert guard < 100 * (n_train + n_heldout + n_comp), "sampling did not converge"
        s = sample_sentence(rng, cfg)
        en = tuple(to_english(s))
        if max_src_len is not None and len(en) > max_src_len:
            continue
        combos = heldout_combos(s)
        if combos:
            # balance: half the compositional set has a held-out object noun,
            # half only held-out adjective-noun pairs
            kind = "obj" if any(c.startswith("obj:") for c in combos) else "adj"
            if en not in comp and sum(t == kind for t in comp_kind.values()) < (n_comp + (kind == "obj")) // 2:
                comp[en] = tuple(to_korean(s))
                comp_kind[en] = kind
            continue
        if en in train or en in held:
            continue
        # fill training first in proportion so held-out is an i.i.d. sample
        if len(held) < n_heldout and (len(train) >= n_train or rng.random() < n_heldout / (n_train + n_heldout)):
            held[en] = tuple(to_korean(s))
        elif len(train) < n_train:
            train[en] = tuple(to_korean(s))
    # checks: disjointness and no held-out combination in training
    assert not (set(train) & set(held)) and not (set(train) & set(comp)) and not (set(held) & set(comp))
    ko_train = " ".join(" ".join(k) for k in train.values())
    for n in HELDOUT_OBJECT_NOUNS:        # the Korean object "말 을" / "새 를" never emitted
        ko = NOUNS[n]
        assert f" {ko} {particle(ko, 'obj')} " not in f" {ko_train} "
    as_list = lambda d: [(list(k), list(v)) for k, v in d.items()]
    return {"train": as_list(train), "heldout": as_list(held), "comp": as_list(comp),
            "comp_kind": [comp_kind[k] for k in comp]}


# ---------------------------------------------------------------- tensors and batches
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3   # the same in both vocabularies (SPECIALS order)


def pad_batch(seqs, pad_id: int = PAD_ID):
    """Token-id lists -> (len(seqs), longest) int64 tensor, right-padded with ``pad_id``."""
    import torch

    longest = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), longest), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, :len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out


def encode_pairs(pairs, src_vocab: Vocab, tgt_vocab: Vocab):
    """(en_tokens, ko_tokens) pairs -> (src, tgt) int64 tensors, padded with PAD_ID.

    src: (n, S) English ids, no BOS/EOS.  tgt: (n, T) Korean ids as [BOS, y1..yk, EOS].
    """
    src = pad_batch([src_vocab.encode(e) for e, _ in pairs])
    tgt = pad_batch([[BOS_ID] + tgt_vocab.encode(k) + [EOS_ID] for _, k in pairs])
    return src, tgt


def trim(ids, pad_id: int = PAD_ID):
    """Drop trailing columns that are padding in every row."""
    keep = int((ids != pad_id).sum(1).max()) if ids.numel() else 0
    return ids[:, :keep]


def shift(tgt):
    """Teacher forcing: (tgt_in, tgt_out) = ([BOS, y1..yk] , [y1..yk, EOS]) = tgt[:, :-1], tgt[:, 1:]."""
    return tgt[:, :-1], tgt[:, 1:]


_shift = shift


def batches(src, tgt, batch_size: int = 128, seed: int = 0, epochs: int | None = None, shift: bool = True):
    """Endless (or ``epochs``-long) shuffled batches of (src, tgt_in, tgt_out), padding trimmed.

    With ``shift=False`` each batch is (src, tgt) instead, tgt = [BOS, y1..yk, EOS] unshifted.

    A fresh permutation per epoch from a torch.Generator seeded with ``seed``; a batch
    never spans two epochs (the last, shorter one is dropped unless it is the only one).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    n = len(src)
    epoch = 0
    while epochs is None or epoch < epochs:
        perm = torch.randperm(n, generator=g)
        stop = max(n - batch_size + 1, 1)
        for i in range(0, stop, batch_size):
            idx = perm[i:i + batch_size]
            if shift:
                tgt_in, tgt_out = _shift(trim(tgt[idx]))
                yield trim(src[idx]), tgt_in, tgt_out
            else:
                yield trim(src[idx]), trim(tgt[idx])
        epoch += 1


@dataclass
class Task:
    """The toy EN->KO task as tensors. ``load_task()`` builds it (about 1 s).

    src_vocab / tgt_vocab: Vocab (English / Korean); ids PAD_ID=0, BOS_ID=1, EOS_ID=2 in both.
    pairs[split]:  list of (en_tokens, ko_tokens), split in {"train", "heldout", "comp"}.
    src[split]:    (n, S) int64 English ids, padded.
    tgt[split]:    (n, T) int64 Korean ids [BOS, ..., EOS], padded.
    comp_kind:     for each compositional pair, "obj" (a held-out object noun) or "adj".
    """
    src_vocab: Vocab
    tgt_vocab: Vocab
    pairs: dict
    src: dict
    tgt: dict
    comp_kind: list

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def batches(self, batch_size: int = 128, seed: int = 0, split: str = "train", epochs=None, shift: bool = True):
        """Shuffled (src, tgt_in, tgt_out) batches of ``split`` ((src, tgt) if not shift); see ``batches``."""
        return batches(self.src[split], self.tgt[split], batch_size, seed, epochs, shift)

    def english(self, ids) -> str:
        """Source ids (a row of src) -> the English sentence."""
        return " ".join(self.src_vocab.decode(_as_list(ids)))

    def korean(self, ids) -> str:
        """Target ids (with or without BOS; stops at EOS) -> Korean text, particles joined."""
        return detokenize_ko(self.tgt_vocab.decode(_as_list(ids)))

    def korean_tokens(self, ids) -> list[str]:
        """Target ids -> Korean tokens (particles separate), stopping at EOS."""
        return self.tgt_vocab.decode(_as_list(ids))

    def english_tokens(self, ids) -> list[str]:
        return self.src_vocab.decode(_as_list(ids))


def _as_list(ids) -> list[int]:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def load_task(n_train: int = 20000, n_heldout: int = 1000, n_comp: int = 1000, seed: int = 0,
              cfg: GrammarConfig = GrammarConfig()) -> Task:
    """Generate the splits (``make_splits``) and encode them as padded int64 tensors."""
    sp = make_splits(n_train, n_heldout, n_comp, seed=seed, cfg=cfg)
    en, ko = build_vocabs()
    assert en.stoi[PAD] == ko.stoi[PAD] == PAD_ID and ko.stoi[BOS] == BOS_ID and ko.stoi[EOS] == EOS_ID
    pairs = {k: sp[k] for k in ("train", "heldout", "comp")}
    src, tgt = {}, {}
    for k, v in pairs.items():
        src[k], tgt[k] = encode_pairs(v, en, ko)
    return Task(en, ko, pairs, src, tgt, sp["comp_kind"])


def by_length(task: Task, split: str = "heldout", lengths=None, per_length: int | None = None):
    """Indices of ``split`` grouped by English length: {length: LongTensor of row indices}.

    ``per_length`` caps each group (the first ones, which are already in random order).
    """
    import torch

    n_tokens = (task.src[split] != PAD_ID).sum(1)
    lengths = sorted(set(n_tokens.tolist())) if lengths is None else lengths
    out = {}
    for L in lengths:
        idx = torch.nonzero(n_tokens == L).flatten()
        out[L] = idx[:per_length] if per_length else idx
    return out


# ---------------------------------------------------------------- demo
EXAMPLES = [
    # (description, Sentence)
    ("simple past", Sentence("trans", "past", None, NP("cat"), "eat", NP("fish"))),
    ("future", Sentence("trans", "future", None, NP("boy"), "make", NP("bread"))),
    ("long negation past (-지 않았다)", Sentence("trans", "past", "long", NP("dog"), "chase", NP("bear"))),
    ("short negation present (안)", Sentence("trans", "present", "short", NP("girl"), "like", NP("flower"))),
    ("short negation future, find: 못", Sentence("trans", "future", "short", NP("doctor", "young"), "find", NP("book"))),
    ("long negation past, catch: -지 못했다", Sentence("trans", "past", "long", NP("king"), "catch", NP("bird"))),
    ("present of find: 찾아낸다", Sentence("trans", "present", None, NP("dog"), "find", NP("apple"))),
    ("adjectives", Sentence("trans", "past", None, NP("cat", "big"), "see", NP("bird", "red"))),
    ("object-gap relative on subject (the brief's example)",
     Sentence("trans", "past", None, NP("cat", None, Rel("see", "past", "obj", NP("dog"))), "eat", NP("fish"))),
    ("subject-gap relative on object",
     Sentence("trans", "present", None, NP("boy"), "like", NP("dog", None, Rel("chase", "past", "subj", NP("cat", "black"))))),
    ("relative future + adjective",
     Sentence("trans", "past", "short", NP("girl", "young", Rel("help", "future", "obj", NP("teacher"))), "find", NP("apple", "red"))),
    ("two relative clauses",
     Sentence("trans", "future", None, NP("bear", "hungry", Rel("find", "present", "subj", NP("fish"))), "catch",
              NP("horse", None, Rel("eat", "past", "subj", NP("apple", "small"))))),
    ("existential present", Sentence("exist", "present", None, NP("bird", "white"))),
    ("existential negated past", Sentence("exist", "past", "long", NP("book"))),
    ("existential, 'an'", Sentence("exist", "past", None, NP("apple"))),
    ("existential future + relative",
     Sentence("exist", "future", None, NP("student", None, Rel("see", "present", "obj", NP("doctor", "pretty"))))),
]

if __name__ == "__main__":
    for i, (desc, s) in enumerate(EXAMPLES, 1):
        print(f"{i:2d}. [{desc}]")
        print("    EN:", " ".join(to_english(s)))
        print("    KO:", detokenize_ko(to_korean(s)), "   tokens:", " ".join(to_korean(s)))
    en_v, ko_v = build_vocabs()
    print(f"\nvocab sizes: en={len(en_v)} ko={len(ko_v)} (incl. {len(SPECIALS)} specials)")
    sp = make_splits(n_train=20000, seed=0)
    for k, v in sp.items():
        if k == "comp_kind":
            continue
        ls = [len(e) for e, _ in v]
        lk = [len(k_) for _, k_ in v]
        print(f"{k:8s}: {len(v):6d} pairs, en len {min(ls)}-{max(ls)} (mean {sum(ls)/len(ls):.1f}), "
              f"ko len {min(lk)}-{max(lk)} (mean {sum(lk)/len(lk):.1f})")
    print("compositional examples:")
    for e, k in sp["comp"][:3]:
        print("   ", " ".join(e), "->", detokenize_ko(k))
