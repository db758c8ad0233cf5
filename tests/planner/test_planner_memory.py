"""Model states against published numbers (ZeRO paper, DeepSpeed) and the per-device breakdown."""
from __future__ import annotations

import pytest

from pipeline_lib.planner import estimate, estimate_numbers, memory_warning, predicted_peak_gb
from pipeline_lib.planner.memory import GB, TERMS, model_state_bytes
from pipeline_lib.planner.params import count_params, stage_params
from pipeline_lib.planner.zero import deepspeed_zero2_gpu_bytes, deepspeed_zero3_gpu_bytes, zero_paper_bytes

P = 7e9


def test_published_7b_fp16_model_states():
    weights, grads, adam = model_state_bytes(P, "fp16")
    assert (weights, grads, adam) == (14e9, 14e9, 84e9)  # 2P, 2P, 12P
    assert weights + grads + adam == 112e9


def test_optimizer_states_sharded_over_4_data_parallel_ranks():
    weights, grads, adam = model_state_bytes(P, "fp16", data_parallel=4, optimizer_shard=True)
    assert adam == 21e9 and weights == 14e9 and grads == 14e9
    # sharding is off: the data-parallel degree changes nothing
    assert model_state_bytes(P, "fp16", data_parallel=4)[2] == 84e9


def test_bf16_matches_fp16_and_fp32_keeps_no_master_copy():
    assert model_state_bytes(P, "bf16") == model_state_bytes(P, "fp16")
    assert model_state_bytes(P, "fp32") == (28e9, 28e9, 56e9)
    with pytest.raises(ValueError, match="precision"):
        model_state_bytes(P, "int8")


@pytest.mark.parametrize("n", [1, 4, 8, 64])
def test_sharded_states_are_zero_stage_1(n):
    assert sum(model_state_bytes(P, "fp16", data_parallel=n, optimizer_shard=True)) == zero_paper_bytes(P, n, 1)
    assert sum(model_state_bytes(P, "fp16", data_parallel=n)) == zero_paper_bytes(P, n, 0)


def test_zero_paper_figure_1():
    # Psi = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device
    got = [round(zero_paper_bytes(7.5e9, 64, stage) / GB, 1) for stage in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]
    with pytest.raises(ValueError):
        zero_paper_bytes(P, 4, 4)


def test_deepspeed_zero2_estimate():
    assert deepspeed_zero2_gpu_bytes(int(P), 4) == 2 * P + 18 * P / 4 == 45.5e9
    assert deepspeed_zero2_gpu_bytes(int(P), 4, cpu_offload=True) == 14e9
    # DeepSpeed keeps fp32 gradients too: 4P/N more than the paper's stage 2
    assert deepspeed_zero2_gpu_bytes(int(P), 8) - zero_paper_bytes(P, 8, 2) == pytest.approx(4 * P / 8)


def test_deepspeed_zero3_estimate(llama7b):
    params = count_params(llama7b).total
    largest = 131_072_000  # the embedding
    assert deepspeed_zero3_gpu_bytes(params, largest, 8) == 4 * largest + int(18 * params / 8) == 15_685_723_136
    assert deepspeed_zero3_gpu_bytes(params, largest, 8, cpu_offload=True) == 4 * largest + int(2 * params / 8)
    assert deepspeed_zero3_gpu_bytes(params, largest, 8, cpu_offload=True, cpu_offload_params=True) == 4 * largest
    # all three states sharded: 18 = 2 fp16 weights + 4 fp32 grads + 4 fp32 weights + 8 moments, the
    # paper's 16 with fp32 instead of fp16 gradients
    assert int(18 * params / 8) - zero_paper_bytes(params, 8, 3) == pytest.approx(2 * params / 8, abs=1)


def test_breakdown_total_is_the_sum_of_its_terms(cfg7b):
    mem = estimate(cfg7b)
    assert mem.total == pytest.approx(sum(getattr(mem, t) for t in TERMS))
    assert set(mem.gb()) == set(TERMS) | {"total"}
    assert predicted_peak_gb(cfg7b) == pytest.approx(mem.total / GB)


def test_7b_dp1_mp2_pp2_full_recompute_terms(cfg7b, llama7b):
    mem = estimate(cfg7b)
    sbh = 4096 * 1 * 4096  # seq x micro batch x hidden
    # the last stage also holds the output head + final norm, but the first holds 2 micro batches in
    # flight: stage 0 is the peak here
    assert mem.stage == 0 and mem.layers_on_stage == 16 and mem.micro_batches_in_flight == 2
    params = stage_params(llama7b, pipeline_stage=2, model_parallel=2, stage=0)
    assert mem.params_on_device == params
    assert (mem.weights, mem.gradients, mem.optimizer_states) == (2 * params, 2 * params, 12 * params)  # dp=1
    assert mem.activations == 2 * sbh * 16 * 2  # full recompute keeps 2sbh per layer
    assert mem.embedding_output == sbh * 2  # embedding dropout mask per micro batch in flight
    # recomputing one layer in backward needs its activations again: sbh(10 + 24/2), flash attention
    assert mem.recompute_workspace == sbh * (10 + 12) - 2 * sbh
    assert mem.comm_buffers == 2 * sbh + 2 * 2 * sbh  # TP all-reduce + PP send/recv, no DP
    assert mem.framework_reserve == 2e9


def test_pipeline_peak_can_be_the_last_stage(llama7b):
    # one micro batch in flight everywhere: the last stage (head + logits) outweighs the first
    mem = estimate_numbers(llama7b, seq_length=4096, micro_batch_size=1, pipeline_stage=4, micro_batch_num=1,
                           recompute="full")
    assert mem.stage == 3


def test_memory_warning(cfg7b):
    assert memory_warning(cfg7b) is None
    small = cfg7b.model_copy(update={"parallel": cfg7b.parallel.model_copy(update={"device_memory_gb": 16})})
    warning = memory_warning(small)
    assert warning and "exceeds the usable 14.72 GB (parallel.device_memory_gb=16 minus device_memory_headroom_gb=1.28)" \
        in warning
    # the headroom counts: a peak that fits the card but not the card minus the headroom is warned about
    peak = estimate(cfg7b).total / GB
    tight = cfg7b.model_copy(update={"parallel": cfg7b.parallel.model_copy(
        update={"device_memory_gb": peak + 1, "device_memory_headroom_gb": 2})})
    assert "exceeds the usable" in memory_warning(tight)
    roomy = cfg7b.model_copy(update={"parallel": cfg7b.parallel.model_copy(
        update={"device_memory_gb": peak + 1, "device_memory_headroom_gb": 0.5})})
    assert memory_warning(roomy) is None
