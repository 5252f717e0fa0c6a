"""Small hand-made data sets that the notebooks use as worked examples.

Every number here is chosen by hand so that a learner can follow it on paper; none
of it is learned or downloaded.
"""
from __future__ import annotations

import numpy as np

# "The animal didn't cross the street because it was too tired": what does "it" mean?
ANIMAL_SENTENCE = ["The", "animal", "didn't", "cross", "the", "street",
                   "because", "it", "was", "too", "tired"]

# The four features of the toy embeddings below, one per column.
EMBEDDING_FEATURES = ["living thing", "place", "action", "grammar word"]

_EMBEDDINGS = {
    "The":     [0.2, 0.2, 0.0, 2.0],
    "animal":  [2.5, 0.3, 0.3, 0.2],
    "didn't":  [0.0, 0.0, 1.2, 1.6],
    "cross":   [0.2, 0.6, 2.0, 0.0],
    "the":     [0.2, 0.3, 0.0, 1.9],
    "street":  [0.0, 2.5, 0.4, 0.2],
    "because": [0.0, 0.0, 0.2, 1.8],
    "it":      [2.0, 0.5, 0.0, 1.0],
    "was":     [0.0, 0.0, 0.6, 1.6],
    "too":     [0.0, 0.0, 0.0, 1.8],
    "tired":   [1.4, 0.0, 0.8, 0.4],
}


def animal_sentence_embeddings() -> tuple[list[str], np.ndarray]:
    """The seed sentence's tokens and their toy embeddings, shape (11, 4), float64.

    Column j (0 to 2.5) scores how much a word is an ``EMBEDDING_FEATURES[j]``.
    """
    return list(ANIMAL_SENTENCE), np.array([_EMBEDDINGS[t] for t in ANIMAL_SENTENCE])


def video_search() -> dict:
    """The search analogy: a query typed into a search box, video titles as keys,
    what each video contains as values.

    Returns a dict with
      ``query_text`` (str) and ``query`` (2,): the search, in the key space;
      ``titles`` (4 str) and ``keys`` (4, 2): each title's (cats, cooking) features;
      ``value_features`` (3 str) and ``values`` (4, 3): minutes of cats, cooking and
      dogs in each video.
    """
    return {
        "query_text": "funny cat videos",
        "query": np.array([2.7, 0.9]),
        "titles": ["Cats vs. cucumbers", "Kitten bakes a cake", "Pasta in 10 minutes", "Dog park tour"],
        "keys": np.array([[1.0, 0.1],
                          [0.6, 0.8],
                          [0.0, 1.0],
                          [0.3, -0.4]]),
        "value_features": ["cats", "cooking", "dogs"],
        "values": np.array([[9.0, 0.0, 1.0],
                            [4.0, 5.0, 0.0],
                            [0.0, 10.0, 0.0],
                            [1.0, 0.0, 8.0]]),
    }


# "나는 고기를 먹었다" (I ate the meat) and "고기는 나를 먹었다" (the meat ate me): the same
# words, 나 (I) and 고기 (meat) swapped. The four features of their toy embeddings:
WORD_ORDER_FEATURES = ["person", "food", "action", "particle"]

_WORD_ORDER_EMBEDDINGS = {
    "나":     [2.0, 0.0, 0.3, 0.1],
    "는":     [0.2, 0.0, 0.0, 1.5],
    "고기":   [0.0, 2.2, 0.4, 0.0],
    "를":     [0.0, 0.3, 0.0, 1.8],
    "먹었다": [0.5, 1.0, 2.0, 0.0],
}


def word_order_pair() -> dict:
    """The seed pair "나는 고기를 먹었다" / "고기는 나를 먹었다", split into words and particles.

    Returns a dict with
      ``tokens`` (5 str): 나, 는, 고기, 를, 먹었다 (I, topic particle, meat, object particle, ate);
      ``swapped`` (5 str): 고기, 는, 나, 를, 먹었다, the same tokens with 나 and 고기 swapped;
      ``order`` (5,) int: ``swapped[i] == tokens[order[i]]``;
      ``embeddings`` (5, 4) float64: the rows of ``tokens``; column j scores how much a
      token is a ``WORD_ORDER_FEATURES[j]``.
    """
    tokens = ["나", "는", "고기", "를", "먹었다"]
    order = np.array([2, 1, 0, 3, 4])
    return {"tokens": tokens, "swapped": [tokens[i] for i in order], "order": order,
            "embeddings": np.array([_WORD_ORDER_EMBEDDINGS[t] for t in tokens])}


# "I love you but not love him": one word, "love", at two positions (1 and 5).
LOVE_SENTENCE = ["I", "love", "you", "but", "not", "love", "him"]
LOVE_VOCABULARY = ["I", "love", "you", "but", "not", "him"]

# The same four features as the Korean pair, one row per vocabulary word.
_LOVE_TABLE = [
    [2.0, 0.0, 0.1, 0.2],   # I
    [0.3, 0.0, 1.8, 0.0],   # love
    [1.9, 0.0, 0.1, 0.3],   # you
    [0.0, 0.0, 0.2, 1.7],   # but
    [0.0, 0.0, 0.6, 1.5],   # not
    [1.8, 0.0, 0.0, 0.4],   # him
]


def love_sentence() -> dict:
    """The seed sentence "I love you but not love him" as token ids into a small table.

    Returns a dict with
      ``tokens`` (7 str) and ``vocabulary`` (6 str);
      ``token_ids`` (1, 7) int64: a batch of one sentence, ``vocabulary[token_ids[0, t]] == tokens[t]``;
      ``table`` (6, 4) float64: one embedding row per vocabulary word (features as
      ``WORD_ORDER_FEATURES``).
    """
    ids = [LOVE_VOCABULARY.index(t) for t in LOVE_SENTENCE]
    return {"tokens": list(LOVE_SENTENCE), "vocabulary": list(LOVE_VOCABULARY),
            "token_ids": np.array([ids]), "table": np.array(_LOVE_TABLE)}
