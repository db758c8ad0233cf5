"""The forward decoding path on a real tiny mindformers Llama (CPU): batched, right-padded greedy
decoding equals a per-prompt reference greedy; perplexity equals a per-token loop.
(forward_path_check.py runs in its own process, started by the `forward_path_run` fixture.)"""
from __future__ import annotations

import pytest


@pytest.mark.slow
def test_forward_path_greedy_and_perplexity_on_tiny_llama(forward_path_run):
    out = forward_path_run.result()
    assert out["decoded"] == out["reference"]
    assert all(len(t) >= 1 for t in out["decoded"])
    assert out["ppl_tokens"] == out["ref_tokens"] == 4 * 32 + 19  # padded targets are not scored
    assert out["ppl"] == pytest.approx(out["ref_ppl"], rel=1e-9)
