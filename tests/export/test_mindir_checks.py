"""The numbers the export stage gates on, without MindSpore: fixed inputs, the logits comparison
(that fails the stage), and the serving json."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.config.load import config_from_dict
from pipeline_lib.export.mindir import LogitsMismatch, compare_logits, fixed_inputs, serving_spec


def test_fixed_inputs_are_deterministic_right_padded_real_tokens():
    a = fixed_inputs(4, 16, vocab_size=50, pad_id=0, seed=3)
    assert a.dtype == np.int32 and a.shape == (4, 16) and np.array_equal(a, fixed_inputs(4, 16, 50, 0, seed=3))
    assert (a[0] != 0).all() and a.max() < 50
    for row in a:
        n = int((row != 0).sum())
        assert (row[:n] != 0).all() and (row[n:] == 0).all() and n >= 4


def test_compare_logits_passes_within_tolerance_and_fails_beyond():
    x = np.random.default_rng(0).standard_normal((2, 8, 10)).astype(np.float32)
    ok = compare_logits(x, x + 5e-5, rtol=1e-4, atol=1e-4, what="t")
    assert ok.ok and ok.same_argmax == 1.0 and ok.max_abs == pytest.approx(5e-5, rel=0.05)  # float32 rounding
    bad = x.copy()
    bad[1, 3, 2] += 0.01
    with pytest.raises(LogitsMismatch, match=r"MindIR.*beyond rtol=0.0001.*export.rtol"):
        compare_logits(x, bad, rtol=1e-4, atol=1e-4, what="MindIR reload vs checkpoint model")
    assert not compare_logits(x, bad, rtol=1e-4, atol=1e-4, what="t", raise_on_mismatch=False).ok
    with pytest.raises(LogitsMismatch, match="shapes differ"):
        compare_logits(x, x[:1], rtol=1e-4, atol=1e-4, what="t")
    nan = x.copy()
    nan[0, 0, 0] = np.nan
    assert not compare_logits(x, nan, rtol=1, atol=1, what="t", raise_on_mismatch=False).ok


def test_serving_spec_has_what_a_server_needs():
    cfg = config_from_dict({"model": {"vocab_size": 640, "seq_length": 32}})
    spec = serving_spec(cfg, batch_size=2, seq_length=32, tokenizer_file="tokenizer.model", checks={}, sources={})
    assert spec["inputs"] == [{"name": "input_ids", "dtype": "int32", "shape": [2, 32], "padding": "right",
                               "pad_id": 0}]
    assert spec["outputs"][0]["shape"] == [2, 32, 640] and spec["file"] == "model.mindir"
    assert spec["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
