"""Korthikanti et al. 2022 activation formulas, recompute modes, 1F1B micro batches in flight."""
from __future__ import annotations

import pytest

from pipeline_lib.planner.memory import stage_breakdown
from pipeline_lib.planner.activations import (activation_bytes_per_layer, micro_batches_in_flight,
                                              output_layer_bytes, recompute_workspace_bytes)

# GPT-3 175B as in the paper's tables: s 2048, h 12288, a 96, micro batch 1
S, B, H, A = 2048, 1, 12288, 96
SBH = S * B * H  # 25,165,824


def test_no_recompute_without_tensor_parallel():
    # s*b*h*(34 + 5*a*s/h) = sbh * (34 + 80)
    assert activation_bytes_per_layer(S, B, H, A) == SBH * (34 + 5 * A * S / H) == 2_868_903_936


def test_no_recompute_with_tensor_parallel():
    # s*b*h*(10 + 24/t + 5*a*s/(h*t)) with t = 8: sbh * (10 + 3 + 10)
    assert activation_bytes_per_layer(S, B, H, A, t=8) == SBH * (10 + 24 / 8 + 5 * A * S / (H * 8)) == 578_813_952


def test_selective_is_mindformers_default_the_ffn_activation():
    # mindformers' select_recompute default on Llama rebuilds feed_forward.mul and w1's silu: the paper's
    # activation-output term 8/t goes, the attention scores stay
    scores = 5 * A * S / H
    assert activation_bytes_per_layer(S, B, H, A, recompute="selective") == SBH * (34 - 8 + scores)
    assert activation_bytes_per_layer(S, B, H, A, t=8, recompute="selective") == SBH * (10 + 16 / 8 + scores / 8)


def test_attention_and_ffn_granularity_keep_each_block_input():
    scores = 5 * A * S / H  # 80
    # attention block 2 + 1 + 8 + scores -> its input 2; FFN 2 + 1 + 16 -> 2; norms 4 stay
    assert activation_bytes_per_layer(S, B, H, A, recompute="attention") == SBH * (34 + scores - 1 - 8 - scores)
    assert activation_bytes_per_layer(S, B, H, A, recompute="ffn") == SBH * (34 + scores - 17)
    assert activation_bytes_per_layer(S, B, H, A, t=8, recompute="ffn") == SBH * (10 + 24 / 8 + scores / 8 - 1 - 2)
    # the paper's selective (scores only) is between none and attention-only
    none = activation_bytes_per_layer(S, B, H, A)
    att = activation_bytes_per_layer(S, B, H, A, recompute="attention")
    assert att < none - SBH * scores < none


def test_sequence_parallel_is_the_papers_34_over_t():
    t, scores = 8, 5 * A * S / H
    sp = activation_bytes_per_layer(S, B, H, A, t=t, seq_parallel=True, comm_recompute=True)
    assert sp == pytest.approx(SBH * (34 / t + scores / t))  # Korthikanti 4.2.2
    # without communication recompute the two all-gathered block inputs stay at full size
    kept = activation_bytes_per_layer(S, B, H, A, t=t, seq_parallel=True)
    assert kept == pytest.approx(sp + SBH * 4 * (1 - 1 / t))
    assert activation_bytes_per_layer(S, B, H, A, t=1, seq_parallel=True) == activation_bytes_per_layer(S, B, H, A)


def test_full_recompute_input_is_sliced_by_sequence_parallel_or_slice_activation():
    assert activation_bytes_per_layer(S, B, H, A, t=8, recompute="full", slice_activation=True) == 2 * SBH / 8
    assert activation_bytes_per_layer(S, B, H, A, t=8, recompute="full", seq_parallel=True) == 2 * SBH / 8


def test_full_recompute_keeps_the_layer_input():
    assert activation_bytes_per_layer(S, B, H, A, recompute="full") == 2 * SBH == 50_331_648
    assert activation_bytes_per_layer(S, B, H, A, t=8, recompute="full") == 2 * SBH


def test_flash_attention_removes_the_s_squared_term():
    for t in (1, 2, 8):
        flash = activation_bytes_per_layer(S, B, H, A, t=t, flash_attention=True)
        assert flash == SBH * (10 + 24 / t)
    # and the s^2 term is what grows quadratically: doubling s more than doubles "none" only
    assert activation_bytes_per_layer(2 * S, B, H, A) > 2 * activation_bytes_per_layer(S, B, H, A)
    assert activation_bytes_per_layer(2 * S, B, H, A, flash_attention=True) == \
        2 * activation_bytes_per_layer(S, B, H, A, flash_attention=True)


def test_micro_batch_and_precision_scale_linearly():
    assert activation_bytes_per_layer(S, 4, H, A) == 4 * activation_bytes_per_layer(S, 1, H, A)
    assert activation_bytes_per_layer(S, B, H, A, scale=2.0) == 2 * activation_bytes_per_layer(S, B, H, A)
    with pytest.raises(ValueError, match="recompute"):
        activation_bytes_per_layer(S, B, H, A, recompute="partial")


def test_recompute_workspace_is_what_was_dropped():
    assert recompute_workspace_bytes(S, B, H, A) == 0
    assert recompute_workspace_bytes(S, B, H, A, t=8, recompute="selective") == SBH * 8 / 8
    assert recompute_workspace_bytes(S, B, H, A, recompute="full") == SBH * (34 + 80) - 2 * SBH


def test_output_layer_keeps_fp32_logits():
    v = 51200
    assert output_layer_bytes(S, B, H, v) == 4 * SBH + 4 * S * B * v
    assert output_layer_bytes(S, B, H, v, t=8) == 4 * SBH + 4 * S * B * v / 8


def test_1f1b_micro_batches_in_flight():
    assert [micro_batches_in_flight(4, 8, i) for i in range(4)] == [4, 3, 2, 1]
    assert [micro_batches_in_flight(4, 2, i) for i in range(4)] == [2, 2, 2, 1]  # capped by m
    assert micro_batches_in_flight(1, 16) == 1  # accumulation runs one micro batch at a time
    with pytest.raises(ValueError):
        micro_batches_in_flight(2, 4, stage=2)


@pytest.mark.parametrize("recompute", ["none", "selective", "attention", "ffn", "full"])
def test_first_stage_holds_all_layers_worth_whatever_pp(llama7b, recompute):
    # Korthikanti 4.2.3: p micro batches in flight x L/p layers = L layers of activations
    acts = {pp: stage_breakdown(llama7b, stage=0, seq_length=4096, micro_batch_size=1, pipeline_stage=pp,
                                micro_batch_num=8, recompute=recompute).activations
            for pp in (1, 2, 4, 8)}
    per_layer = activation_bytes_per_layer(4096, 1, 4096, 32, recompute=recompute)
    assert set(acts.values()) == {32 * per_layer}
