"""tokenhash.token_arrays_of_forms: the top_ngram filter's token arrays reused for the dedup forms equal the
forms' own token arrays, whatever the batch holds."""
from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline_lib.data import tokenhash
from pipeline_lib.data.text import dedup_form_keeping_tokens
from pipeline_lib.data.tokenhash import token_arrays, token_arrays_of_forms, top_ngram_shares

PIECES = ["变压器", "油温", "，", "。", "（注）", "：", "１２３", "42", "GIS", "ﬁne", "①", " ", "\u3000", "正常", "ΑΣ", "Σα",
          "", "！", "abc", "设备编号"]


def _texts(rng, n):
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30))) for _ in range(n)]


def _same(a, b):
    return all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("n", [20, 1000])
def test_reused_arrays_equal_the_forms_own(n):
    rng = random.Random(n)
    for _ in range(10):
        seen = _texts(rng, n)
        top_ngram_shares(seen, 2, 4, 5)  # the filter tokenizes its batch
        kept = [t for t in seen if rng.random() < 0.8]  # later filters drop some
        forms, same = zip(*map(dedup_form_keeping_tokens, kept)) if kept else ((), ())
        assert _same(token_arrays_of_forms(kept, list(forms), list(same)), token_arrays(list(forms)))
    assert 0 < sum(same) < len(same)  # both kinds occur: reused and tokenized again


def test_texts_the_filter_did_not_see_or_saw_in_another_order_are_tokenized_here():
    rng = random.Random(3)
    seen = _texts(rng, 200)
    top_ngram_shares(seen, 2, 4, 5)
    for kept in ([t + "" for t in seen[:50]] + ["油温，正常" * 3],  # equal strings, not the filter's objects
                 seen[::-1], [], seen[:1]):
        forms, same = zip(*map(dedup_form_keeping_tokens, kept)) if kept else ((), ())
        assert _same(token_arrays_of_forms(kept, list(forms), list(same)), token_arrays(list(forms)))


def test_a_form_marked_different_is_never_taken_from_the_filters_arrays():
    """Fails if `same` were ignored: the text's tokens differ from the form's here."""
    texts = ["油温１２３度，正常", "设备编号①号"]
    top_ngram_shares(texts, 2, 4, 1)
    forms, same = zip(*map(dedup_form_keeping_tokens, texts))
    assert same == (False, False)
    assert not _same(token_arrays(texts), token_arrays(list(forms)))
    assert _same(token_arrays_of_forms(texts, list(forms), list(same)), token_arrays(list(forms)))
    assert not _same(token_arrays_of_forms(texts, list(forms), [True, True]), token_arrays(list(forms)))
    tokenhash._FILTERED.clear()
