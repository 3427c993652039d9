"""The topic detector's sparse rows against their references: ``hashed_counts`` against
scikit-learn's ``HashingVectorizer`` (the shipped background IDF was fitted through it), and
every ``SparseRow`` operation against scipy's, to the last bit."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.feature_extraction.text import HashingVectorizer

from suffixmem.conversation.topic import default_detector
from suffixmem.conversation.topic_text import char_ngrams, word_tokens
from suffixmem.conversation.topic_vector import EMPTY, N_FEATURES, SparseRow, hashed_counts

TEXTS = [
    "How do I bake bread at home?", "Wie lange backe ich es? Etwa 40 Minuten bei 220 Grad.",
    "面包需要烤多久？", "パンはどのくらい焼きますか", "¿Y la levadura seca?", "আমি তোমাকে ভালোবাসি",
    "שָׁלוֹם עוֹלָם", "Привет, как дела?", "ok", "", "   ", "!!! ???", "a a a a a b b",
    "emoji 🍞🍞 and tabs\tand\nnewlines", "x" * 500, "naïve café résumé",
]


def _scipy(row: SparseRow) -> sp.csr_matrix:
    return sp.csr_matrix((row.data, row.indices, [0, row.nnz]), shape=(1, N_FEATURES))


def _reference(analyzer, text: str) -> sp.csr_matrix:
    return HashingVectorizer(analyzer=analyzer, n_features=N_FEATURES, alternate_sign=False,
                             norm=None).transform([text])


def _same_as_reference(analyzer, text: str) -> None:
    ref = _reference(analyzer, text)
    got = hashed_counts(analyzer(text), N_FEATURES)
    assert got.indices.tolist() == ref.indices.tolist()
    assert got.data.tolist() == ref.data.tolist()
    assert got.data.dtype == np.float64


@pytest.mark.parametrize("text", TEXTS)
def test_hashed_counts_equal_scikit_learns_hashing_vectorizer(text: str) -> None:
    for analyzer in (char_ngrams, word_tokens):
        _same_as_reference(analyzer, text)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_hashed_counts_equal_the_reference_on_any_text(text: str) -> None:
    for analyzer in (char_ngrams, word_tokens):
        _same_as_reference(analyzer, text)


def test_the_hash_at_minus_two_to_the_31_maps_as_scikit_learn_maps_it() -> None:
    """scikit-learn special-cases h == -2**31 (whose absolute value overflows int32); taking
    |h| in 64 bits must give the same index for any n_features."""
    h = np.array([-(2**31)], dtype=np.int64)
    for n in (2**18, 1000, 7, 2**31 - 1):
        assert int(np.abs(h)[0] % n) == (2147483647 - (n - 1)) % n


def _rows(seed: int, count: int) -> list[SparseRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        k = int(rng.integers(0, 60))
        idx = np.unique(rng.integers(0, 400, size=k)).astype(np.int64)  # overlapping supports
        rows.append(SparseRow(idx, rng.standard_normal(len(idx)) * 3))
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_row_operations_equal_scipys_bit_for_bit(seed: int) -> None:
    rows = _rows(seed, 12)
    for a in rows:
        ref_a = _scipy(a)
        for b in rows:
            ref_b = _scipy(b)
            for d in (0.8, 0.3, 1.0):
                # the detector's centroid update: d * old + (1 - d) * new
                got = a.scaled(d).plus(b.scaled(1 - d))
                ref = (d * ref_a + (1 - d) * ref_b).tocsr()
                ref.sort_indices()
                dense_got = np.zeros(N_FEATURES)
                dense_got[got.indices] = got.data
                assert np.array_equal(dense_got, ref.toarray()[0])
                assert np.all(np.diff(got.indices) > 0)
            assert a.dot(b) == float(np.dot(ref_a.toarray()[0][np.intersect1d(
                a.indices, b.indices)], ref_b.toarray()[0][np.intersect1d(a.indices, b.indices)]))
            assert a.dot(b) == pytest.approx(float(ref_a.multiply(ref_b).sum()), abs=1e-12)
        n = np.sqrt(np.dot(a.data, a.data))
        if a.nnz and n:
            ref_unit = (ref_a / n).tocsr()
            assert a.unit().data.tolist() == ref_unit.data.tolist()
            assert a.unit().norm() == pytest.approx(1.0)


def test_values_at() -> None:
    row = SparseRow(np.array([3, 9, 40], dtype=np.int64), np.array([1.0, 2.0, 5.0]))
    at = np.array([0, 3, 4, 40, 41], dtype=np.int64)
    assert row.values_at(at).tolist() == [0.0, 1.0, 0.0, 5.0, 0.0]
    assert EMPTY.values_at(at).tolist() == [0.0] * 5
    assert row.values_at(np.zeros(0, dtype=np.int64)).tolist() == []


def test_empty_rows() -> None:
    row = SparseRow(np.array([3, 9], dtype=np.int64), np.array([1.0, 2.0]))
    assert EMPTY.nnz == 0 and EMPTY.dot(row) == 0.0 and row.dot(EMPTY) == 0.0
    assert row.plus(EMPTY) is row and EMPTY.plus(row) is row
    assert EMPTY.unit() is EMPTY
    assert hashed_counts([], N_FEATURES) is EMPTY


def test_the_detectors_cosines_equal_scipys() -> None:
    """On a replayed session: each turn's counts are scikit-learn's, and a message's cosine
    with the decayed centroid is scipy's."""
    d = default_detector()
    turns = [("How do I bake bread at home?", "Mix flour, water, yeast and salt."),
             ("How long should the dough rise?", "About an hour, until doubled."),
             ("Wie lange backe ich es?", "Etwa 40 Minuten bei 220 Grad.")]
    for user, reply in turns:
        raw, _ = d.featurizer.counts(f"{user}\n{reply}")
        assert raw.indices.tolist() == _reference(char_ngrams, f"{user}\n{reply}").indices.tolist()
    state = d.replay(turns)
    centroid = _scipy(state.char)
    centroid = centroid / np.sqrt(centroid.multiply(centroid).sum())
    for text in ["And the oven temperature?", "面包需要烤多久？", "Unrelated: who won the cup?"]:
        c, _ = d._vectors(state, text)
        assert c.dot(state.char.unit()) == pytest.approx(
            float(_scipy(c).multiply(centroid).sum()), abs=1e-12)
