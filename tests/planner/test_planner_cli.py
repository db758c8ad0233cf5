"""`llm-pipeline plan` as a user runs it: arguments, overrides, text and JSON output, exit codes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline_lib.planner.cli import plan_main, predicted_vs_measured

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_7B = ROOT / "configs/pipelines/llama2-7b-4x64gb.yaml"
ARGS = ["--devices", "4", "--devices-per-node", "4", "--device-memory-gb", "64"]


@pytest.fixture
def cfg7b_file(tmp_path, cfg7b_raw):
    path = tmp_path / "llama2-7b.yaml"
    path.write_text(yaml.safe_dump(cfg7b_raw))
    return str(path)


def test_plan_text(cfg7b_file, capsys):
    assert plan_main(["--model", cfg7b_file, *ARGS]) == 0
    out = capsys.readouterr().out
    assert "6,738,415,616 parameters" in out
    assert "Recommended: " in out and "parallel:\n  devices: 4" in out
    assert "pure data parallel (dp=4) does not fit: needs" in out
    for term in ("weights", "gradients", "optimizer_states", "activations", "framework_reserve"):
        assert term in out
    # both checkpoint sizes of the config's layout: the training checkpoints of a node and the weights-only file
    assert "disk, pretrain checkpoints on node 0: 4 x 80.9 GB" in out
    assert "disk, weights only (model parameters, no optimizer state): 27.0 GB" in out


def test_plan_json_with_overrides(cfg7b_file, capsys):
    assert plan_main(["--model", cfg7b_file, *ARGS, "--json", "--seq-length", "2048", "--global-batch", "8",
                      "model.use_flash_attention=false"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["request"]["seq_length"] == 2048 and d["request"]["global_batch"] == 8
    assert d["config_patch"]["model"]["seq_length"] == 2048
    assert d["config_patch"]["training"]["global_batch_size"] == 8


def test_exit_codes(cfg7b_file, tmp_path, capsys):
    assert plan_main(["--model", str(tmp_path / "missing.yaml"), *ARGS]) == 2
    assert "file not found" in capsys.readouterr().err
    assert plan_main(["--model", cfg7b_file, "--devices", "4", "--devices-per-node", "4",
                      "--device-memory-gb", "8"]) == 1
    assert plan_main(["--model", cfg7b_file, *ARGS, "model.no_such_field=1"]) == 2


def test_preflight_line(cfg7b):
    line = predicted_vs_measured(cfg7b, 30.0)
    assert line.startswith("memory per device: predicted ") and "measured 30.00 GB" in line


@pytest.mark.skipif(not SHIPPED_7B.exists(), reason="shipped 7B config not written yet")
def test_shipped_7b_config_through_the_main_cli():
    res = subprocess.run([sys.executable, "-m", "pipeline_lib.cli", "plan", "--model", str(SHIPPED_7B), *ARGS],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Recommended: " in res.stdout and "pure data parallel (dp=4) does not fit" in res.stdout


def test_plan_prints_recompute_choices_and_oom_remedies_for_the_config(cfg7b_file, capsys):
    assert plan_main(["--model", cfg7b_file, *ARGS, "model.recompute=none", "parallel.optimizer_shard=false"]) == 0
    out = capsys.readouterr().out
    assert "Recompute choices at this layout" in out
    for mode in ("none", "selective", "ffn", "attention", "full"):
        assert f"\n  {mode:<10} activations" in out
    assert "none       activations  11.81 GB" in out and "<- this config" in out
    assert "Out of memory? Remedies by phase" in out and "in the forward pass (activations): recompute" in out
    assert "recompute selective" in out and "model.recompute=selective" in out  # cheapest that fits first
    assert plan_main(["--model", cfg7b_file, *ARGS, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["oom_remedies"]) == {"initialization", "forward", "backward"}
    assert plan_main(["--model", cfg7b_file, *ARGS, "parallel.mode=auto"]) == 0
    assert "cannot predict" in capsys.readouterr().out
