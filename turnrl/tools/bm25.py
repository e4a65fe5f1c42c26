"""A small BM25 (Okapi) index over short documents, pure Python + numpy.

Scoring, for a query ``q`` (its tokens, duplicates counted) and a document ``d``::

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5))

with ``tf(t, d)`` the count of ``t`` in ``d``, ``|d|`` the document's token count, ``avgdl``
the mean token count, ``N`` the number of documents and ``n(t)`` the number of documents
containing ``t``. This ``idf`` (Lucene's) is always positive, so a matching term never
lowers a score; a term in no document scores 0. Tokens are lowercase runs of letters and
digits (``tokenize``); there is no stemming and no stop-word list (idf discounts words
that are everywhere).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["BM25Index", "tokenize"]

TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lowercase ``text`` and split it into runs of ASCII letters and digits.

    Example: ``tokenize("The Orun-River, 1921!") == ["the", "orun", "river", "1921"]``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return TOKEN.findall(text.lower())


@dataclass(frozen=True)
class _Postings:
    """The documents holding one term and the term's count in each."""

    docs: np.ndarray  # int64 document indices, ascending
    counts: np.ndarray  # float64 term frequencies


class BM25Index:
    """An immutable BM25 index of ``documents`` (see the module docstring for the formula).

    Args:
        documents: The document texts; document ``i`` is referred to by index ``i``.
        k1: Term-frequency saturation, ``>= 0`` (0: a term counts once however often it occurs).
        b: Length normalisation in ``[0, 1]`` (0: none, 1: full).

    Raises:
        ValueError: If there are no documents, ``k1 < 0`` or ``b`` is outside ``[0, 1]``.
        TypeError: If a document is not a str.
    """

    def __init__(self, documents: Sequence[str], *, k1: float = 1.5, b: float = 0.75) -> None:
        if isinstance(documents, str) or len(documents) == 0:
            raise ValueError("documents must be a non-empty sequence of strings (one text per document)")
        if not (isinstance(k1, (int, float)) and k1 >= 0):
            raise ValueError(f"k1 must be a number >= 0 (typically 1.2-2.0), got {k1!r}")
        if not (isinstance(b, (int, float)) and 0 <= b <= 1):
            raise ValueError(f"b must be a number in [0, 1] (typically 0.75), got {b!r}")
        self.k1, self.b = float(k1), float(b)
        token_lists = [tokenize(d) for d in documents]
        self.doc_lengths = np.array([len(t) for t in token_lists], dtype=np.float64)
        self.avgdl = float(self.doc_lengths.mean()) or 1.0
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for i, tokens in enumerate(token_lists):
            for term, count in Counter(tokens).items():
                docs, counts = postings.setdefault(term, ([], []))
                docs.append(i)
                counts.append(count)
        self._postings = {
            term: _Postings(np.array(docs, dtype=np.int64), np.array(counts, dtype=np.float64))
            for term, (docs, counts) in postings.items()
        }

    def __len__(self) -> int:
        """The number of documents."""
        return len(self.doc_lengths)

    def document_frequency(self, term: str) -> int:
        """How many documents contain ``term`` (a single token, matched lowercase)."""
        postings = self._postings.get(term.lower())
        return 0 if postings is None else len(postings.docs)

    def idf(self, term: str) -> float:
        """``ln(1 + (N - n + 0.5) / (n + 0.5))`` for the term's document frequency ``n``."""
        n = self.document_frequency(term)
        return math.log(1.0 + (len(self) - n + 0.5) / (n + 0.5))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (shape ``(len(self),)``, float64)."""
        total = np.zeros(len(self), dtype=np.float64)
        norm = self.k1 * (1.0 - self.b + self.b * self.doc_lengths / self.avgdl)
        for term in tokenize(query):
            postings = self._postings.get(term)
            if postings is None:
                continue
            tf = postings.counts
            total[postings.docs] += self.idf(term) * tf * (self.k1 + 1.0) / (tf + norm[postings.docs])
        return total

    def score(self, query: str, doc: int) -> float:
        """The BM25 score of document ``doc`` for ``query``."""
        if not 0 <= doc < len(self):
            raise IndexError(f"doc must be in [0, {len(self) - 1}], got {doc}")
        return float(self.scores(query)[doc])

    def top_k(self, query: str, k: int = 3) -> list[tuple[int, float]]:
        """The ``k`` best documents as ``(index, score)``, best first.

        Only documents with a positive score are returned (so possibly fewer than ``k``);
        equal scores are ordered by document index.

        Raises:
            ValueError: If ``k`` is not a positive int.
        """
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        scores = self.scores(query)
        order = np.lexsort((np.arange(len(self)), -scores))  # by score descending, then index
        return [(int(i), float(scores[i])) for i in order[:k] if scores[i] > 0]
