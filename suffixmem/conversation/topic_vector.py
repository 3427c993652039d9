"""Sparse rows for the topic detector: one message's hashed n-gram counts and their TF-IDF
weights, as a sorted index array and a value array; and ``Featurizer``, which hashes a text
into those counts and weighs them against the background and the session's document
frequencies.

The detector handles one message at a time and takes a few dozen products per turn. At that
size scipy's sparse matrices (a validated matrix object per operation) and scikit-learn's
``HashingVectorizer.transform`` (input checks and a CSR matrix per call) cost more than the
arithmetic: without them a turn's verdict and update take half the time (docs/profile.md round
12), and the verdict runs before the engine whenever the semantic temperature decides the
turn's sampling.
``SparseRow`` keeps only the two arrays, and ``hashed_counts`` hashes features exactly as
``HashingVectorizer(alternate_sign=False, norm=None)`` does (signed 32-bit MurmurHash3 of the
UTF-8 text with seed 0, then ``|h| mod n_features``), so the shipped background document
frequencies (``topic_idf.npz``, fitted through scikit-learn) index the same features.

Every operation does the arithmetic of its scipy counterpart in the same order (products over
shared indices in ascending index order, sums element by element), so similarities equal the
scipy ones to the last bit (tested against scipy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from suffixmem.conversation.topic_text import char_ngrams, word_tokens

N_FEATURES = 2**18  # hashed n-gram features (the shipped background IDF has this many)


@dataclass(slots=True, frozen=True)
class SparseRow:
    """A sparse row vector: ``indices`` ascending and unique (int64), ``data`` their values
    (float64). Treat both arrays as read-only: operations return new rows."""

    indices: np.ndarray
    data: np.ndarray

    @property
    def nnz(self) -> int:
        return len(self.indices)

    def scaled(self, factor: float) -> SparseRow:
        return SparseRow(self.indices, self.data * factor)

    def plus(self, other: SparseRow) -> SparseRow:
        """The element-wise sum (over the union of both rows' indices)."""
        if other.nnz == 0:
            return self
        if self.nnz == 0:
            return other
        # the union of two sorted index sets: np.union1d would hash them first, ~5x slower here
        both = np.concatenate((self.indices, other.indices))
        both.sort()
        keep = np.empty(len(both), dtype=bool)
        keep[0] = True
        np.not_equal(both[1:], both[:-1], out=keep[1:])
        idx = both[keep]
        data = np.zeros(len(idx))
        data[np.searchsorted(idx, self.indices)] = self.data
        data[np.searchsorted(idx, other.indices)] += other.data
        return SparseRow(idx, data)

    def dot(self, other: SparseRow) -> float:
        """The dot product, over the shared indices only (cosine when both are unit rows), in
        ascending index order."""
        if self.nnz == 0 or other.nnz == 0:
            return 0.0
        shared, at = self._match(other.indices)
        return float(np.dot(self.data[at[shared]], other.data[shared]))

    def values_at(self, indices: np.ndarray) -> np.ndarray:
        """This row's values at ``indices`` (ascending, unique), 0 where it has none."""
        out = np.zeros(len(indices))
        if self.nnz and len(indices):
            shared, at = self._match(indices)
            out[shared] = self.data[at[shared]]
        return out

    def _match(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask over ``indices`` of those this row has, their positions in this row where the
        mask is set): a binary search of sorted arrays, several times cheaper than
        ``np.intersect1d`` at a message's few hundred entries. Needs a non-empty row."""
        at = np.searchsorted(self.indices, indices)
        np.minimum(at, self.nnz - 1, out=at)
        return self.indices[at] == indices, at

    def norm(self) -> float:
        return math.sqrt(float(np.dot(self.data, self.data)))

    def unit(self) -> SparseRow:
        """This row scaled to length 1 (itself when empty or zero). It multiplies by the
        reciprocal, as scipy's division by a scalar does, so the rounding is scipy's."""
        n = self.norm()
        return SparseRow(self.indices, self.data * (1.0 / n)) if n else self


EMPTY = SparseRow(np.zeros(0, dtype=np.int64), np.zeros(0))


def hashed_counts(features: Sequence[str], n_features: int) -> SparseRow:
    """How often each hashed feature occurs in ``features``: scikit-learn's
    ``HashingVectorizer(analyzer=..., alternate_sign=False, norm=None)`` on one document (two
    features that hash alike add up). ``|h|`` is taken in 64 bits, where ``|-2**31|`` is
    ``2**31``, which is what scikit-learn's special case for it computes modulo n_features."""
    if not features:
        return EMPTY
    # imported here: scikit-learn takes most of a second to import, which every CLI start
    # (``--help``, a one-line error) would otherwise pay before it needs a single hash
    from sklearn.utils import murmurhash3_32

    hashes = np.fromiter((murmurhash3_32(f, 0) for f in features), np.int64, len(features))
    idx, counts = np.unique(np.abs(hashes) % n_features, return_counts=True)
    return SparseRow(idx, counts.astype(np.float64))


class Featurizer:
    """Hashed n-gram counts weighted by sublinear TF x IDF (background + session), l2-normed.

    ``char_df``/``word_df``: background document frequencies per hashed feature (dense arrays
    of ``N_FEATURES``), ``docs``: background documents. Without them every n-gram's IDF is that
    of a feature seen in no background document, so only the session's statistics count.
    """

    def __init__(self, char_df: np.ndarray | None = None, word_df: np.ndarray | None = None,
                 docs: int = 0) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        self.char = HashingVectorizer(analyzer=char_ngrams, n_features=N_FEATURES,
                                      alternate_sign=False, norm=None)
        self.word = HashingVectorizer(analyzer=word_tokens, n_features=N_FEATURES,
                                      alternate_sign=False, norm=None)
        zeros = np.zeros(N_FEATURES, dtype=np.float32)
        self.char_df = char_df if char_df is not None else zeros
        self.word_df = word_df if word_df is not None else zeros
        self.docs = docs

    def fit(self, texts: Sequence[str]) -> Featurizer:
        """Set the background document frequencies from ``texts`` (one document each)."""
        docs = [t for t in texts if t and t.strip()]
        if docs:
            self.char_df = _doc_freq(self.char.transform(docs))
            self.word_df = _doc_freq(self.word.transform(docs))
            self.docs = len(docs)
        return self

    def counts(self, text: str) -> tuple[SparseRow, SparseRow]:
        """Raw hashed counts of ``text``, (char, word): the same features and counts as
        ``self.char.transform([text])`` and ``self.word.transform([text])``, without their
        per-call cost (``topic_vector``)."""
        return (hashed_counts(char_ngrams(text), N_FEATURES),
                hashed_counts(word_tokens(text), N_FEATURES))

    def weigh(self, counts: SparseRow, background: np.ndarray, session: SparseRow,
              session_docs: int) -> SparseRow:
        """TF-IDF of a count row: (1 + log tf) * (log((1 + N) / (1 + df)) + 1), l2-normed, with
        N and df summed over the background and the session."""
        if counts.nnz == 0:
            return counts
        idx = counts.indices
        df = background[idx].astype(np.float64)
        if session.nnz:
            df += session.values_at(idx)
        idf = np.log((1.0 + self.docs + session_docs) / (1.0 + df)) + 1.0
        data = (1.0 + np.log(counts.data)) * idf
        data /= math.sqrt(float(np.dot(data, data)))
        return SparseRow(idx, data)


def _doc_freq(x: Any) -> np.ndarray:
    """Per feature, the number of rows of the sparse matrix ``x`` where it occurs."""
    return np.bincount(x.tocsr().indices, minlength=N_FEATURES).astype(np.float32)
