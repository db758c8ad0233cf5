"""The screen worker's windows: every target of a document scored once, however many windows it takes
(nightly/screen_worker.py; the real model path is in test_screen.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline_lib.nightly.screen_worker import score_rows, windows


@pytest.mark.parametrize("length", [2, 5, 9, 10, 17, 40])
def test_windows_cover_each_target_once(length):
    ids = list(range(1, length + 1))  # no 0: 0 is the pad id here
    rows = windows(ids, seq_length=8, pad_id=0)
    assert all(r.shape == (9,) for r in rows)
    targets = [int(t) for r in rows for t in r[1:] if t != 0]
    assert targets == ids[1:]  # the first token is only an input (BOS)


def test_uniform_logits_give_ln_vocab_per_target_per_document_across_batches():
    vocab, seq = 50, 8
    docs = [list(range(1, n + 1)) for n in (3, 20, 9)]
    rows, owner = [], []
    for d, ids in enumerate(docs):
        for r in windows(ids, seq, 0):
            rows.append(r)
            owner.append(d)
    fn = lambda batch: np.zeros((len(batch), seq, vocab), np.float32)  # every token equally likely
    nll, count = score_rows(fn, rows, owner, len(docs), batch_size=2, pad_id=0, seq_length=seq)
    assert count.tolist() == [2, 19, 8]
    assert nll == pytest.approx(count * math.log(vocab))
