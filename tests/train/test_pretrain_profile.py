"""One tiny profiled pretraining run (real mindformers + MindSpore profiler on CPU): the profile summary
(compute / data wait / communication per step) in profile_summary.json, the manifest metrics and the report
markdown the Prefect artifact shows; and the measured-vs-planner check, made far off for step time through the
config (training.planner_tflops = 100 TFLOP/s, which a CPU does not reach) while memory stays near its
prediction."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_fixtures import new_run  # noqa: E402

from pipeline_lib.stages import run_stage  # noqa: E402
from pipeline_lib.train.metrics import read_metrics  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def profiled(pretrain_data):
    cfg, paths = new_run(pretrain_data, "profiled", training={
        "steps": 10, "save_steps": 5, "planner_tflops": 100.0,
        "profile": {"enabled": True, "start_step": 3, "stop_step": 6, "record": ["memory", "communication"]}})
    lines: list[str] = []
    manifest, _ = run_stage(cfg, paths, "pretrain", log=lines.append)
    return cfg, Path(paths.stage_uri("pretrain")), manifest, lines


def test_profile_summary_splits_the_step_and_reaches_the_report(profiled):
    cfg, out, manifest, lines = profiled
    run_yaml = (out / "run.yaml").read_text(encoding="utf-8")
    assert "profile_start_step: 3" in run_yaml and "profile_communication: true" in run_yaml
    summary = json.loads((out / "profile_summary.json").read_text(encoding="utf-8"))
    assert summary["steps_profiled"] == 4  # steps 3..6 of the launch
    assert summary["compute_ms"] > 0 and summary["data_wait_ms"] >= 0
    assert summary["step_ms"] == pytest.approx(summary["compute_ms"] + summary["data_wait_ms"], abs=0.01)
    # the MindSpore profiler wrote its CPU output under the stage folder and we read its op table and memory
    assert summary["profiler_output"].startswith("profile/rank_0/") and (out / summary["profiler_output"]).is_dir()
    assert summary["profiler_ops_ms"] > 0 and summary["profiler_peak_memory_bytes"] > 0
    assert summary["communication_ms"] == 0 and "no collective op" in summary["communication"]  # one rank
    assert summary["unprofiled_steps"] == 5 and summary["unprofiled_compute_ms"] > 0  # steps 2, 7..10
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[0]["data_wait_ms"] is None and all(r["data_wait_ms"] >= 0 for r in rows[1:])
    assert manifest.metrics["profile"] == summary
    report = manifest.metrics["markdown"]["profile"]
    assert "compute" in report and "data wait" in report and "communication" in report
    assert any("pretrain: profile of steps 3..6" in line for line in lines)
    listed = {o["path"] for o in manifest.outputs}
    assert listed >= {"profile_summary.json", "planner_check.json"}
    # the profiler's own files are outputs too (an s3:// run store keeps them), e.g. its trace
    assert any(p.startswith(summary["profiler_output"]) and p.endswith("trace_view.json") for p in listed)


def test_step_time_far_from_the_planner_warns_and_memory_near_it_does_not(profiled):
    cfg, out, manifest, lines = profiled
    check = manifest.metrics["planner_check"]
    step, memory = check["rows"]
    assert step["figure"] == "step time" and step["alert"] and step["ratio"] > cfg.training.planner_alert_factor
    assert step["measured"] == pytest.approx(manifest.metrics["profile"]["unprofiled_compute_ms"])
    assert check["tflops"] == 100.0 and check["tflops_source"] == "training.planner_tflops"
    assert memory["figure"] == "memory per device" and not memory["alert"]
    assert 1 / 2 < memory["ratio"] < 2 and memory["measured"] == pytest.approx(
        manifest.metrics["peak_rss_bytes"] / 1e9)
    warnings = [line for line in lines if line.startswith("pretrain: WARNING")]
    assert len(warnings) == 1 and "step time" in warnings[0] and "training.planner_tflops" in warnings[0]
    assert manifest.metrics["warnings"] == [step["warning"]]
    table = manifest.metrics["markdown"]["planner"]
    assert f"{step['predicted']:,.3g} ms" in table and f"{step['measured']:,.3g} ms" in table and "**off**" in table
