"""The screen's statistics on constructed scores with known answers (nightly/screen_stats.py)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.nightly.screen_stats import (MAD_TO_SIGMA, auc, file_shares, outside, quarantined_files,
                                               robust_threshold)


def test_threshold_of_20_documents_is_median_plus_k_scaled_mads():
    scores = np.arange(1, 21) / 10  # median 1.05; |x - median| = 0.05, 0.15, ... each twice: their median 0.5
    thr = robust_threshold(scores, k=2, min_spread=0.01)
    assert thr.median == pytest.approx(1.05) and thr.spread == pytest.approx(MAD_TO_SIGMA * 0.5)
    assert thr.value == pytest.approx(1.05 + 2 * MAD_TO_SIGMA * 0.5) and thr.n == 20


def test_five_garbage_documents_among_20_do_not_move_the_threshold():
    clean = robust_threshold(np.arange(1, 21), k=3, min_spread=0.1)
    # 1..15 and five scores of 1000: the median is still 10.5 and the median deviation still 5
    dirty = robust_threshold(np.r_[np.arange(1, 16), [1000] * 5], k=3, min_spread=0.1)
    assert dirty.value == pytest.approx(clean.value) == pytest.approx(10.5 + 3 * MAD_TO_SIGMA * 5)


def test_identical_scores_get_the_minimum_spread_and_nan_is_ignored():
    thr = robust_threshold([2.0] * 19 + [np.nan], k=12, min_spread=0.1)
    assert thr.spread == 0.1 and thr.value == pytest.approx(3.2) and thr.n == 19
    with pytest.raises(ValueError, match="no calibration score"):
        robust_threshold([np.nan], k=1, min_spread=0.1)


def test_1000_normal_scores_estimate_sigma_and_keep_all_but_the_tail():
    rng = np.random.default_rng(44)
    good = rng.normal(2.0, 0.3, 1000)
    thr = robust_threshold(good, k=3, min_spread=0.01)
    assert thr.median == pytest.approx(2.0, abs=0.03) and thr.spread == pytest.approx(0.3, rel=0.08)
    # beyond 3 sigma: 0.135% of a normal sample
    assert outside(good, thr).mean() <= 0.006
    garbage = rng.normal(8.0, 1.0, 1000)
    assert outside(garbage, thr).all()
    assert auc(good, garbage) == 1.0


def test_outside_is_strictly_above_and_does_not_judge_nan():
    thr = robust_threshold([1.0] * 20, k=1, min_spread=1.0)  # threshold 2.0
    assert outside([2.0, 2.0001, np.nan, 1.0], thr).tolist() == [False, True, False, False]


def test_file_shares_and_quarantine_of_20_documents():
    files = ["a"] * 10 + ["b"] * 10
    excluded = [1] * 6 + [0] * 4 + [1] * 5 + [0] * 5
    shares = file_shares(files, excluded)
    assert shares == {"a": {"screened": 10, "excluded": 6, "share": 0.6},
                      "b": {"screened": 10, "excluded": 5, "share": 0.5}}
    assert quarantined_files(shares, 0.5) == ["a"]  # more than half: exactly half stays
    assert quarantined_files(shares, 0.4) == ["a", "b"]


def test_file_shares_of_1000_documents_in_three_files():
    rng = np.random.default_rng(1)
    files = ["good.jsonl"] * 600 + ["garbage.jsonl"] * 300 + ["mixed.jsonl"] * 100
    excluded = np.r_[np.zeros(600), np.ones(300), np.ones(30), np.zeros(70)].astype(bool)
    order = rng.permutation(1000)  # documents of the files interleaved: shares count per file all the same
    shares = file_shares([files[i] for i in order], excluded[order])
    assert {f: e["excluded"] for f, e in shares.items()} == {"good.jsonl": 0, "garbage.jsonl": 300,
                                                             "mixed.jsonl": 30}
    assert quarantined_files(shares, 0.5) == ["garbage.jsonl"]


def test_auc_counts_ties_half():
    assert auc([1, 2, 3], [2.5, 4]) == pytest.approx(5 / 6)
    assert auc([1, 2], [2, 2]) == pytest.approx(0.75)
    assert auc([5, 6], [1, 2]) == 0.0
