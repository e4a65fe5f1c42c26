import math

import numpy as np
import pytest

from turnrl.tools.bm25 import BM25Index, tokenize

DOCS = ["the cat sat", "the dog sat on the mat", "cat cat dog"]  # lengths 3, 6, 3: avgdl 4
IDF2 = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # a term in 2 of the 3 documents
IDF1 = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))  # a term in 1 of the 3 documents


def norm(length, k1=1.5, b=0.75, avgdl=4.0):
    return k1 * (1 - b + b * length / avgdl)


def test_tokenize_lowercases_and_splits_on_non_alphanumerics():
    assert tokenize("The Orun-River, 1921!") == ["the", "orun", "river", "1921"]
    assert tokenize("  ") == []
    with pytest.raises(TypeError, match="str"):
        tokenize(3)


def test_idf_and_document_frequency_by_hand():
    index = BM25Index(DOCS)
    assert len(index) == 3 and index.avgdl == 4.0
    assert index.document_frequency("cat") == 2 and index.document_frequency("MAT") == 1
    assert index.document_frequency("bird") == 0
    assert index.idf("cat") == pytest.approx(IDF2)
    assert index.idf("mat") == pytest.approx(IDF1)
    assert index.idf("bird") == pytest.approx(math.log(1 + 3.5 / 0.5))


def test_scores_match_hand_computation():
    index = BM25Index(DOCS)
    cat = index.scores("cat")
    assert cat[0] == pytest.approx(IDF2 * 1 * 2.5 / (1 + norm(3)))
    assert cat[1] == 0.0
    assert cat[2] == pytest.approx(IDF2 * 2 * 2.5 / (2 + norm(3)))
    expected = IDF1 * 2.5 / (1 + norm(6)) + IDF2 * 2.5 / (1 + norm(6))
    assert index.score("mat dog", 1) == pytest.approx(expected)
    # query terms are summed with repetition, matched case-insensitively
    assert index.score("CAT cat", 0) == pytest.approx(2 * cat[0])


def test_k1_and_b_parameters_by_hand():
    flat = BM25Index(DOCS, k1=1.5, b=0.0)  # no length normalisation
    assert flat.score("sat", 0) == pytest.approx(flat.score("sat", 1))
    assert flat.score("sat", 0) == pytest.approx(IDF2 * 2.5 / (1 + 1.5))
    binary = BM25Index(DOCS, k1=0.0)  # a term counts once, however often it occurs
    assert binary.score("cat", 2) == pytest.approx(binary.score("cat", 0)) == pytest.approx(IDF2)


def test_ranking_properties():
    index = BM25Index(DOCS)
    # more occurrences in a document of equal length rank higher
    assert index.top_k("cat", 3) == [(2, pytest.approx(index.score("cat", 2))),
                                     (0, pytest.approx(index.score("cat", 0)))]
    # at equal term frequency the shorter document ranks higher
    assert index.score("sat", 0) > index.score("sat", 1) > 0
    # a rare term outweighs a common one
    assert index.score("mat", 1) > index.score("sat", 1)
    # documents scoring 0 are left out; ties keep index order
    assert index.top_k("bird") == []
    assert [i for i, _ in BM25Index(["a b", "a b", "c"]).top_k("a", 3)] == [0, 1]
    assert len(index.top_k("the cat dog mat", 2)) == 2


def test_scores_vector_shape_and_dtype():
    scores = BM25Index(DOCS).scores("dog")
    assert scores.shape == (3,) and scores.dtype == np.float64
    assert (scores[[1, 2]] > 0).all() and scores[0] == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [({"documents": []}, "non-empty"), ({"documents": "one text"}, "non-empty"),
     ({"documents": DOCS, "k1": -1}, "k1"), ({"documents": DOCS, "b": 1.5}, "b must")],
)
def test_bad_parameters_raise(kwargs, message):
    documents = kwargs.pop("documents")
    with pytest.raises(ValueError, match=message):
        BM25Index(documents, **kwargs)


def test_bad_k_and_doc_raise():
    index = BM25Index(DOCS)
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k must be a positive int"):
            index.top_k("cat", k)
    with pytest.raises(IndexError, match=r"\[0, 2\]"):
        index.score("cat", 3)
