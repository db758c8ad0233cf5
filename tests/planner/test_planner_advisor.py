"""The advisor on the 7B layout: a fitting, rule-abiding recommendation and a reason for pure DP."""
from __future__ import annotations

import json

import pytest
import yaml

from pipeline_lib.config import apply_overrides, check, config_from_dict
from pipeline_lib.planner import PlanRequest, plan
from pipeline_lib.planner.advisor import enumerate_layouts
from pipeline_lib.planner.memory import GB
from pipeline_lib.planner.report import config_patch, plan_dict, render, yaml_text

REQ = PlanRequest(devices=4, devices_per_node=4, device_memory_gb=64)


@pytest.fixture
def plan7b(cfg7b):
    return plan(cfg7b, REQ)


def test_recommends_a_layout_that_fits_and_passes_the_rules(plan7b, cfg7b):
    best = plan7b.best
    assert best is not None and best.fits and not best.issues
    # the budget is the card minus the default 5 GB headroom (max_device_memory "59GB" as mindformers sets it)
    assert REQ.usable_gb == 59 and best.capacity_bytes == 59 * GB and best.memory.total <= 59 * GB
    assert check(best.layout.apply(plan7b.config), for_run=False) == []
    # every ranked layout fits, passes the rules and uses all 4 devices
    for c in plan7b.ranked:
        lay = c.layout
        assert c.memory.total <= 59 * GB and not c.issues
        assert lay.data_parallel * lay.model_parallel * lay.pipeline_stage == 4
        assert lay.micro_batch_size * lay.gradient_accumulation_steps * lay.data_parallel == 4
    # those leaving 10% of memory free come first, each group ordered by step time
    roomy = [c.memory.total <= 0.9 * 59 * GB for c in plan7b.ranked]
    assert roomy == sorted(roomy, reverse=True) and any(roomy)
    for group in (True, False):
        costs = [round(c.cost.relative, 3) for c, r in zip(plan7b.ranked, roomy) if r is group]
        assert costs == sorted(costs)


def test_pure_data_parallel_is_rejected_with_the_numbers(plan7b):
    rej = {r.family: r for r in plan7b.rejected}
    pure = rej["pure data parallel (dp=4)"]
    # 16 bytes/param of weights, gradients and AdamW states: 107.8 GB before any activation
    assert pure.closest.memory.model_states == pytest.approx(16 * 6_738_415_616)
    assert "> 59 GB" in pure.reason and "model states alone are 107.8 GB" in pure.reason
    assert pure.closest.memory.total > 64 * GB
    text = render(plan7b)
    assert "Why not pure data parallel: pure data parallel (dp=4) does not fit: needs" in text


def test_full_recompute_costs_a_third(plan7b):
    full = [c for c in plan7b.ranked if c.layout.recompute == "full"]
    assert full and all(c.cost.recompute == pytest.approx(1 / 3) for c in full)
    best = plan7b.best
    # the winner is cheaper than the same family with full recompute
    same = [c for c in full if c.layout.family == best.layout.family]
    assert all(c.cost.relative > best.cost.relative for c in same)


def test_pipeline_bubble_is_pp_minus_1_over_m_plus_pp_minus_1(plan7b):
    piped = [c for c in plan7b.ranked if c.layout.pipeline_stage > 1]
    assert piped
    for c in piped:
        pp, m = c.layout.pipeline_stage, c.layout.micro_batch_num
        assert c.cost.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))


def test_layouts_breaking_rules_are_dropped_with_the_rule(cfg7b_raw):
    cfg7b_raw["model"]["n_kv_heads"] = 2  # model_parallel 4 cannot split 2 KV heads
    p = plan(config_from_dict(cfg7b_raw), REQ)
    assert all(c.layout.model_parallel != 4 for c in p.ranked)
    rej = {r.family: r.reason for r in p.rejected}
    assert "breaks the config rules" in rej["dp1 x mp4 x pp1"] and "n_kv_heads" in rej["dp1 x mp4 x pp1"]


def test_no_tensor_parallel_across_nodes(cfg7b):
    p = plan(cfg7b, PlanRequest(devices=8, devices_per_node=4, device_memory_gb=64))
    assert p.ranked and all(c.layout.model_parallel <= 4 for c in p.ranked)
    assert any("tensor parallel across nodes" in r.reason for r in p.rejected)


def test_enumeration_keeps_micro_batches_a_multiple_of_pp():
    for lay in enumerate_layouts(4, 16):
        pp, m, ga = lay.pipeline_stage, lay.micro_batch_num, lay.gradient_accumulation_steps
        if pp > 1:
            assert ga % m == 0
            # a count that is not a multiple of pp only appears when no valid one exists, so that
            # the config rule can say why the family is out
            if m % pp:
                assert m == ga and not any(ga % k == 0 for k in range(pp, ga + 1, pp))
        else:
            assert lay.micro_batch_num == 1
        assert lay.optimizer_shard is False or lay.data_parallel > 1


def test_config_patch_pasted_over_the_config_validates(plan7b, cfg7b_raw):
    patch = yaml.safe_load(yaml_text(config_patch(plan7b, plan7b.best)))
    assert set(patch) == {"parallel", "model", "training"}
    overrides = [f"{sec}.{k}={json.dumps(v)}" for sec, body in patch.items() for k, v in body.items()]
    cfg = config_from_dict(apply_overrides(cfg7b_raw, overrides))
    assert check(cfg, for_run=False) == []
    assert cfg.parallel.data_parallel == plan7b.best.layout.data_parallel


def test_json_dict_is_serialisable_and_complete(plan7b):
    d = json.loads(json.dumps(plan_dict(plan7b)))
    assert d["params"]["total"] == 6_738_415_616
    assert d["recommended"]["fits"] is True
    assert set(d["recommended"]["memory_gb"]) >= {"weights", "gradients", "optimizer_states", "activations", "total"}
    assert d["config_patch"]["parallel"]["devices"] == 4
    assert any(r["family"] == "pure data parallel (dp=4)" for r in d["rejected"])


def test_nothing_fits_is_reported(cfg7b):
    p = plan(cfg7b, PlanRequest(devices=4, devices_per_node=4, device_memory_gb=8))
    assert p.best is None
    assert "No layout fits 4 x 7.36 GB usable" in render(p)  # 8 GB card minus 8% headroom
