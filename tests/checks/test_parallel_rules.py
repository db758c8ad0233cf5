"""The parallel / recompute knobs' cross-field rules: each refusal names the field, the value and the fix."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.checks import problems

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planner"))
from llama2_configs import LLAMA2_7B_4X64GB  # noqa: E402


def cfg7b(**sections):
    raw = copy.deepcopy(LLAMA2_7B_4X64GB)
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw)


def issues(cfg, field):
    return [i for i in problems(cfg, for_run=False)[0] if i.field == field]


def test_the_7b_layout_has_no_issue():
    assert problems(cfg7b(), for_run=False)[0] == []


@pytest.mark.parametrize("offset, ok", [([1, -1], True), ([0, 0], True), ([1, 0], False), ([2], False),
                                        ([16, -16], True), ([17, -17], False)])
def test_pipeline_offset_must_sum_to_the_layer_count(offset, ok):
    found = issues(cfg7b(parallel={"pipeline_offset": offset}), "parallel.pipeline_offset")
    assert (found == []) is ok
    if not ok:
        assert "Fix: set parallel.pipeline_offset=0" in str(found[0])


def test_uneven_layers_need_the_offset_mindformers_wants():
    # 30 layers on 4 stages: 30 // 4 = 7 each, the offsets must add the remainder 2 (mindformers LayerSetting)
    cfg = cfg7b(model={"num_layers": 30}, parallel={"devices": 8, "data_parallel": 1, "model_parallel": 2,
                                                     "pipeline_stage": 4, "devices_per_node": 8})
    found = issues(cfg, "parallel.pipeline_offset")
    assert found and "[7, 7, 7, 7] layers = 28, not model.num_layers=30" in found[0].problem
    assert "pipeline_offset=[1, 1, 0, 0]" in found[0].fix
    fixed = cfg7b(model={"num_layers": 30}, parallel={"devices": 8, "data_parallel": 1, "model_parallel": 2,
                                                       "pipeline_stage": 4, "devices_per_node": 8,
                                                       "pipeline_offset": [1, 1, 0, 0]})
    assert issues(fixed, "parallel.pipeline_offset") == []


def test_interleave_offsets_are_one_row_per_chunk():
    base = {"pp_interleave_num": 2, "micro_batch_num": 4}
    assert issues(cfg7b(parallel={**base, "pipeline_offset": [[0, 0], [0, 0]]}), "parallel.pipeline_offset") == []
    bad = issues(cfg7b(parallel={**base, "pipeline_offset": [[1, 0], [0, 0]]}), "parallel.pipeline_offset")
    assert bad and "33" in bad[0].problem
    assert issues(cfg7b(parallel={"pp_interleave_num": 2, "pipeline_stage": 1, "model_parallel": 4,
                                  "micro_batch_num": 1}), "parallel.pp_interleave_num")


def test_recompute_layer_lists():
    assert issues(cfg7b(model={"recompute_layers": [16, 8]}), "model.recompute_layers") == []
    assert "one count per pipeline stage (2)" in issues(cfg7b(model={"recompute_layers": [16]}),
                                                         "model.recompute_layers")[0].problem
    assert "[16, 16]" in issues(cfg7b(model={"recompute_layers": [17, 0]}), "model.recompute_layers")[0].fix
    assert issues(cfg7b(model={"recompute": "none", "recompute_layers": [1, 1]}), "model.recompute_layers")


def test_slice_comm_and_sequence_parallel_are_refused_where_they_do_nothing():
    assert issues(cfg7b(model={"recompute_slice_activation": True}), "model.recompute_slice_activation") == []
    assert issues(cfg7b(model={"recompute": "selective", "recompute_slice_activation": True}),
                  "model.recompute_slice_activation")
    assert issues(cfg7b(model={"comm_recompute": True}), "model.comm_recompute")  # dp1, no sequence parallel
    assert issues(cfg7b(model={"comm_recompute": True}, parallel={"use_seq_parallel": True}),
                  "model.comm_recompute") == []
    assert issues(cfg7b(parallel={"use_seq_parallel": True, "model_parallel": 1, "data_parallel": 2}),
                  "parallel.use_seq_parallel")
    assert issues(cfg7b(model={"recompute": "attention", "use_flash_attention": False}), "model.recompute")
    assert issues(cfg7b(model={"recompute": "attention"}), "model.recompute") == []


def test_tensor_parallel_groups_stay_inside_a_fast_group():
    # Atlas 800 (model 9000): two HCCS groups of 4 per node; mp 8 would span both
    cfg = cfg7b(parallel={"devices": 8, "data_parallel": 1, "model_parallel": 8, "pipeline_stage": 1,
                          "micro_batch_num": 1, "devices_per_node": 8, "fast_group_size": 4},
                training={"gradient_accumulation_steps": 4})
    found = issues(cfg, "parallel.model_parallel")
    assert found and "fast interconnect groups of 4" in found[0].problem
    # node device lists: ranks 0,1 on devices 3 and 4 straddle the 0-3 / 4-7 groups
    bad = cfg7b(parallel={"fast_group_size": 2, "node_devices": [[0, 2, 4, 6]]})
    found = issues(bad, "parallel.model_parallel")
    assert found and "rank 0 -> node 0 device 0, rank 1 -> node 0 device 2" in found[0].problem
    assert issues(cfg7b(parallel={"fast_group_size": 2, "node_devices": [[0, 1, 4, 5]]}),
                  "parallel.model_parallel") == []
    assert issues(cfg7b(parallel={"node_devices": [[0, 1, 2]]}), "parallel.node_devices[0]")
    assert issues(cfg7b(parallel={"node_devices": [[0, 1, 2, 3], [4, 5, 6, 7]]}), "parallel.node_devices")
