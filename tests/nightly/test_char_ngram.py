"""The lineage's character n-gram model (nightly/char_ngram.py) on the bundled corpus: good text in, garbage out."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from garbage import boilerplate, bundled, fresh, random_cjk, shuffled, word_salad
from pipeline_lib.config.schema import ScreenConfig
from pipeline_lib.nightly.char_ngram import ALPHABET, CharNgram
from pipeline_lib.nightly.screen_stats import auc, outside, robust_threshold


def test_probabilities_of_a_tiny_model_by_hand():
    model = CharNgram.build(["abab"], order=2)
    # order 0 (no context): a 2/4, b 2/4, 2 kinds; order 1 after "a": b 2/2, 1 kind
    p0_a = (2 + 2 / ALPHABET) / (4 + 2)
    p1_b_after_a = (2 + 1 * ((2 + 2 / ALPHABET) / 6)) / (2 + 1)
    assert model.nll_per_char("ab") == pytest.approx(-(math.log(p0_a) + math.log(p1_b_after_a)) / 2)
    # an unseen character after an unseen context: the order-0 share of the uniform floor
    assert model.nll_per_char("z") == pytest.approx(-math.log(2 / ALPHABET / 6))
    assert math.isnan(model.nll_per_char(""))
    with pytest.raises(ValueError, match="nightly.screen.ngram_order=0"):
        CharNgram(0)


def test_the_corpus_model_keeps_good_documents_and_catches_four_kinds_of_garbage():
    docs = bundled()
    train, calibration = docs[:-40], docs[-40:]
    started = time.perf_counter()
    model = CharNgram.build(train, ScreenConfig().ngram_order)
    good = model.score(fresh(200, seed=7))
    knobs = ScreenConfig()
    thr = robust_threshold(model.score(calibration), knobs.k, knobs.min_spread)
    assert outside(good, thr).mean() <= 0.01
    for name, texts in {"shuffled": shuffled(docs[:100], 1), "word salad": word_salad(docs, 100, 2),
                        "random CJK": random_cjk(100, 3), "boilerplate": boilerplate(100, 4)}.items():
        bad = model.score(texts)
        assert auc(good, bad) == 1.0, name
        assert outside(bad, thr).all(), name
    assert time.perf_counter() - started < 10
