"""The planner on the parallel / recompute knobs: offsets, per-stage recompute lists, interleave, sequence
parallel, optimizer sharding and tensor parallel priced on the link they use, and OOM remedies by phase."""
from __future__ import annotations

import copy

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.config.validate import check
from pipeline_lib.planner.activations import activation_bytes_per_layer, interleave_factor
from pipeline_lib.planner.cost import Hardware, step_cost
from pipeline_lib.planner.memory import GB, estimate, stage_breakdown
from pipeline_lib.planner.oom import oom_remedies, remedy_lines
from pipeline_lib.planner.params import default_offset, stage_layer_counts


def cfg(raw, **sections):
    raw = copy.deepcopy(raw)
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw)


def test_offset_moves_layers_and_their_memory(llama7b):
    assert stage_layer_counts(32, 2, [2, -2]) == [18, 14]
    assert stage_layer_counts(30, 4, default_offset(30, 4)) == [8, 8, 7, 7]
    assert stage_layer_counts(32, 2, [[1, -1], [0, 0]], interleave=2) == [17, 15]
    even = stage_breakdown(llama7b, stage=0, seq_length=4096, micro_batch_size=1, pipeline_stage=2, micro_batch_num=4)
    moved = stage_breakdown(llama7b, stage=0, seq_length=4096, micro_batch_size=1, pipeline_stage=2,
                            micro_batch_num=4, offset=[2, -2])
    per_layer = activation_bytes_per_layer(4096, 1, 4096, 32)
    assert moved.layers_on_stage == 18 and moved.activations - even.activations == pytest.approx(2 * 2 * per_layer)


def test_per_stage_recompute_lists_recompute_only_those_layers(llama7b):
    kw = dict(stage=0, seq_length=4096, micro_batch_size=1, pipeline_stage=2, micro_batch_num=4, recompute="full")
    full, none = (activation_bytes_per_layer(4096, 1, 4096, 32, recompute=r) for r in ("full", "none"))
    part = stage_breakdown(llama7b, recompute_layers=[10, 16], **kw)
    assert part.activations == pytest.approx(2 * (10 * full + 6 * none))  # 2 micro batches in flight on stage 0


def test_interleave_holds_more_in_flight_and_shrinks_the_bubble(llama7b):
    assert interleave_factor(4, 2) == pytest.approx(1 + 3 / 8)
    kw = dict(stage=0, seq_length=4096, micro_batch_size=1, pipeline_stage=4, micro_batch_num=8)
    assert stage_breakdown(llama7b, interleave=2, **kw).activations == \
        pytest.approx(stage_breakdown(llama7b, **kw).activations * (1 + 3 / 8))
    c1, c2 = (step_cost(llama7b, seq_length=4096, global_batch=8, micro_batch_size=1, data_parallel=1,
                        model_parallel=1, pipeline_stage=4, micro_batch_num=8, recompute="none",
                        flash_attention=True, gradient_bytes=0, devices_per_node=4, interleave=v) for v in (1, 2))
    assert c2.bubble == pytest.approx(c1.bubble / 2) and c2.pipeline_p2p == pytest.approx(2 * c1.pipeline_p2p)


def test_sequence_parallel_at_the_7b_layout(cfg7b_raw):
    base = cfg(cfg7b_raw, model={"recompute": "none"})
    sp = cfg(base.model_dump(), parallel={"use_seq_parallel": True})
    assert estimate(sp).activations < estimate(base).activations


def test_optimizer_sharding_across_nodes_can_cost_more_than_it_saves(llama7b):
    """dp 8 over 8 nodes: the weight all-gather per micro batch on a 25 GB/s link vs one all-reduce."""
    kw = dict(seq_length=4096, global_batch=64, micro_batch_size=1, data_parallel=8, model_parallel=1,
              pipeline_stage=1, micro_batch_num=1, recompute="full", flash_attention=True,
              gradient_bytes=13.5e9, devices_per_node=1, weight_bytes=13.5e9)
    plain = step_cost(llama7b, **kw)
    shard = step_cost(llama7b, optimizer_shard=True, **kw)
    assert shard.data_parallel > 3 * plain.data_parallel  # 8 micro batches each re-gather the weights
    assert shard.optimizer_shard_comm > 0 and "weight all-gathers" in " ".join(shard.reasons())
    fast = step_cost(llama7b, optimizer_shard=True, **{**kw, "devices_per_node": 8})
    assert fast.data_parallel == pytest.approx(shard.data_parallel * Hardware().inter_node_gbps
                                               / Hardware().intra_node_gbps)


def test_tensor_parallel_across_nodes_is_priced_on_the_slow_link(llama7b):
    kw = dict(seq_length=4096, global_batch=4, micro_batch_size=1, data_parallel=1, model_parallel=8,
              pipeline_stage=1, micro_batch_num=1, recompute="full", flash_attention=True, gradient_bytes=0)
    inside = step_cost(llama7b, devices_per_node=8, **kw)
    across = step_cost(llama7b, devices_per_node=8, fast_group_size=4, **kw)
    assert across.tensor_parallel == pytest.approx(inside.tensor_parallel * 150 / 25)


def test_oom_remedies_by_phase_with_the_planners_figures(cfg7b_raw):
    # the 7B layout without recompute and micro batch 2: every phase has a remedy, each smaller than now
    c = cfg(cfg7b_raw, model={"recompute": "none"}, training={"micro_batch_size": 2, "global_batch_size": 8})
    assert not check(c, for_run=False)
    now = estimate(c).total / GB
    found = oom_remedies(c)
    assert [r.change for r in found["forward"]][:1] and all(r.peak_gb < now for rs in found.values() for r in rs)
    back = found["backward"][0]
    assert back.overrides == ("training.micro_batch_size=1", "training.gradient_accumulation_steps=8",
                              "parallel.micro_batch_num=8")
    assert back.peak_gb == pytest.approx(estimate(cfg(c.model_dump(), training={
        "micro_batch_size": 1, "gradient_accumulation_steps": 8}, parallel={"micro_batch_num": 8})).total / GB)
    full = next(r for r in found["forward"] if r.change == "recompute full") if any(
        r.change == "recompute full" for r in found["forward"]) else None
    assert full is None or full.step_x > back.step_x
    # 8 devices dp2 x mp2 x pp2: initialization offers more model sharding (mp4 / pp4 ...)
    eight = cfg(cfg7b_raw, parallel={"devices": 8, "data_parallel": 2, "devices_per_node": 8, "micro_batch_num": 2,
                                     "optimizer_shard": False}, training={"gradient_accumulation_steps": 2})
    assert not check(eight, for_run=False)
    init = oom_remedies(eight)["initialization"]
    assert init and all("model_parallel" in " ".join(r.overrides) or "pipeline_stage" in " ".join(r.overrides)
                        or "optimizer_shard" in " ".join(r.overrides) for r in init)
    text = "\n".join(remedy_lines(c))
    assert "in the forward pass (activations): recompute" in text and "GB" in text
