"""Ascend readings on recorded outputs (needs Ascend to run for real): npu-smi's table, MindSpore's memory
statistics, MFU against a cited peak, and their place in planner_check.json."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.planner.check import planner_check, planner_markdown
from pipeline_lib.planner.cost import train_flops_per_token
from pipeline_lib.planner.memory import GB, estimate
from pipeline_lib.planner.params import ModelShape
from pipeline_lib.planner.readings import (MB, mfu, ms_peak_bytes, npu_smi_peak_bytes, parse_npu_smi,
                                           peak_tflops)

FIXTURE = Path(__file__).parent / "fixtures" / "npu_smi_info_910b4.txt"


def test_npu_smi_table_is_read_per_npu():
    rows = parse_npu_smi(FIXTURE.read_text())
    assert [(r.npu, r.name, r.health, r.hbm_used_mb, r.hbm_total_mb) for r in rows] == [
        (0, "910B4-1", "OK", 41872, 65536), (1, "910B4-1", "OK", 43120, 65536), (2, "910B4-1", "OK", 3197, 65536)]
    assert rows[0].aicore_pct == 87
    assert npu_smi_peak_bytes(FIXTURE.read_text(), [0, 1]) == 43120 * MB
    assert npu_smi_peak_bytes(FIXTURE.read_text(), [2]) == 3197 * MB
    assert parse_npu_smi("npu-smi: command not found") == [] and npu_smi_peak_bytes("") is None


def test_mindspore_statistics_and_peak_table():
    assert ms_peak_bytes({"max_reserved_memory": 51_539_607_552, "max_allocated_memory": 1}) == 51_539_607_552
    assert ms_peak_bytes({}) is None  # what MindSpore returns on CPU
    assert peak_tflops("910A")[0] == 256 and "Hot Chips" in peak_tflops("910A")[1]
    value, why = peak_tflops("910B4-1")
    assert value is None and "training.peak_tflops" in why  # no Huawei-published figure listed: no MFU
    assert peak_tflops("910B4-1", 280.0) == (280.0, "training.peak_tflops")


def test_mfu_is_model_flops_over_peak():
    # 1e15 FLOPs per step on 4 devices of 250 TFLOP/s in 2 s: 1e15 / (2 * 4 * 250e12) = 50%
    assert mfu(1e15 / 1000, 1000, 2.0, 4, 250.0) == pytest.approx(0.5)


def test_planner_check_compares_device_memory_and_reports_mfu(cfg7b_raw):
    raw = copy.deepcopy(cfg7b_raw)
    raw["training"]["peak_tflops"] = 280.0
    cfg = config_from_dict(raw)
    predicted = estimate(cfg).total / GB
    device = npu_smi_peak_bytes(FIXTURE.read_text(), [0, 1])
    check = planner_check(cfg, step_time_ms=4000.0, peak_rss_bytes=None, ranks=4, device_peak_bytes=device,
                          device_source="npu-smi info HBM-Usage", device_name="910B4-1")
    mem = next(r for r in check["rows"] if r["figure"] == "memory per device")
    assert mem["measured"] == pytest.approx(device / GB) and mem["ratio"] == pytest.approx(device / GB / predicted,
                                                                                             abs=1e-3)
    assert mem["measured_by"] == "npu-smi info HBM-Usage"
    flops = train_flops_per_token(ModelShape.from_config(cfg.model), 4096) * 4 * 4096
    assert check["mfu"]["measured"] == pytest.approx(flops / (4.0 * 4 * 280e12), abs=1e-4)
    assert "MFU (peak 280 TFLOP/s: training.peak_tflops)" in planner_markdown(check)
    # no reading, unknown card: said so, no numbers made up
    bare = planner_check(config_from_dict(cfg7b_raw), step_time_ms=4000.0, peak_rss_bytes=None,
                         device_name="910B4-1")
    assert "not measured" in next(r for r in bare["rows"] if r["figure"] == "memory per device")["measured_by"]
    assert bare["mfu"]["measured"] is None and "training.peak_tflops" in bare["mfu"]["source"]
