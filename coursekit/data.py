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
