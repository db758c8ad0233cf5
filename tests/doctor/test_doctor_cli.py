"""`llm-pipeline doctor`: --log FILE and --run-id, human and --json output, exit codes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline_lib.cli import main

from doctor_cases import LOGS

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/pipelines/tiny-cpu.yaml")


def test_json_output_of_a_log_not_produced_by_us(capsys):
    assert main(["doctor", "--log", str(LOGS / "collective_timeout_hccl.log"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"category", "stage", "evidence", "remedies"}
    assert out["category"] == "collective_timeout" and out["stage"] is None
    assert any("EI0006" in line for line in out["evidence"])
    assert all(set(r) == {"why", "overrides"} for r in out["remedies"])


def test_human_output_quotes_evidence_and_lists_overrides(capsys, tmp_path):
    code = main(["doctor", "--log", str(LOGS / "disk_full_save_checkpoint.log"), TINY,
                 f"run.output_root={tmp_path}", "training.keep_checkpoint_max=5"])
    out = capsys.readouterr().out
    assert code == 0
    assert "category: disk_full" in out
    assert "  > OSError: [Errno 28] No space left on device" in out
    assert "overrides: training.keep_checkpoint_max=" in out
    assert "retry with the same config: will not help" in out


def test_unknown_exits_1_and_bad_arguments_2(capsys, tmp_path):
    assert main(["doctor", "--log", str(LOGS / "healthy_pretrain.log"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"category": "unknown", "stage": None, "evidence": [],
                                                   "remedies": []}
    assert main(["doctor", "--log", str(tmp_path / "missing.log")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_run_id_reads_the_failed_stage_logs(capsys, tmp_path):
    run = tmp_path / "r1"
    (run / "pretrain" / "msrun").mkdir(parents=True)
    shutil.copy(LOGS / "device_oom_step_ascend.log", run / "pretrain" / "msrun" / "worker_0.log")
    (run / "pretrain" / "log" / "rank_0").mkdir(parents=True)
    (run / "pretrain" / "log" / "rank_0" / "info.log").write_text("pretrain: training 20 steps\n")
    assert main(["doctor", "--run-id", "r1", TINY, f"run.output_root={tmp_path}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["category"] == "device_oom_step" and out["stage"] == "pretrain"
    assert out["remedies"][0]["why"].startswith("device memory ran out during a training step: predicted peak")


def test_run_id_reads_a_failed_preflights_verdict(capsys, tmp_path):
    """No trainer log holds the verdict of a preflight that stopped the trainer: preflight.json does (recorded from
    the tiny default at training.learning_rate=5; the trainer's own logs say only its steps)."""
    stage = tmp_path / "r1" / "pretrain"
    (stage / "log" / "rank_0").mkdir(parents=True)
    shutil.copy(LOGS / "preflight_loss_rose_tiny_cpu.json", stage / "preflight.json")
    steps = [ln for ln in (LOGS / "preflight_loss_rose_tiny_cpu.log").read_text().splitlines() if "step:[" in ln]
    (stage / "log" / "rank_0" / "info.log").write_text("\n".join(steps) + "\n")
    assert main(["doctor", "--run-id", "r1", TINY, f"run.output_root={tmp_path}", "training.learning_rate=5",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["category"] == "preflight" and out["stage"] == "pretrain"
    assert out["remedies"][0]["overrides"][0] == "training.learning_rate=0.5"


def test_run_id_without_a_run_folder_says_how_to_fix(capsys, tmp_path):
    assert main(["doctor", "--run-id", "nope", TINY, f"run.output_root={tmp_path}"]) == 2
    assert "Fix:" in capsys.readouterr().err


def test_the_llm_pipeline_command_has_doctor():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "doctor", "--log",
                           str(LOGS / "missing_kernel_cpu.log"), "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["category"] == "missing_kernel"


def test_troubleshooting_guide_covers_every_category():
    from pipeline_lib.doctor.classify import ALL_CATEGORIES, RETRY_CATEGORIES

    guide = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[-2].strip()
            for line in guide.splitlines() if line.startswith("| `")}
    assert set(rows) == set(ALL_CATEGORIES)
    for category, retried in rows.items():
        if category != "unknown":
            assert retried == ("yes" if category in RETRY_CATEGORIES else "no"), category
    assert "docs/troubleshooting.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_doctor_reads_a_bounded_total_of_sparse_logs_quickly(capsys, tmp_path):
    """Issue 45 item 8: 100 sparse logs (8 KB on disk) took 474 s and 841 MB."""
    import time
    import tracemalloc

    from pipeline_lib.doctor.logs import MAX_TOTAL_BYTES, read_logs, stage_log_files

    folder = tmp_path / "r1" / "pretrain" / "log" / "rank_0"
    folder.mkdir(parents=True)
    for i in range(100):
        with open(folder / f"part_{i:03d}.log", "wb") as fh:
            fh.truncate(1 << 30)  # 1 GB each, nothing on disk
            fh.seek(-40, 2)
            fh.write(b"pretrain: still running step 7\n")
    started = time.time()
    tracemalloc.start()
    text = read_logs(stage_log_files(tmp_path / "r1" / "pretrain"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(text.encode("utf-8", "replace")) < MAX_TOTAL_BYTES + 100 * 200 and peak < 4 * MAX_TOTAL_BYTES
    assert "still running step 7" in text and time.time() - started < 20
    assert main(["doctor", "--run-id", "r1", TINY, f"run.output_root={tmp_path}", "--stage", "pretrain", "--json"]) in (0, 1)
    assert time.time() - started < 60


def test_doctor_stage_is_a_stage_and_links_out_of_the_run_are_not_read(capsys, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(LOGS / "device_oom_step_ascend.log", outside / "secret.log")
    run = tmp_path / "runs" / "r1"
    (run / "pretrain" / "log").mkdir(parents=True)
    (run / "pretrain" / "log" / "info.log").write_text("pretrain: training 20 steps\n")
    os.symlink(outside / "secret.log", run / "pretrain" / "log" / "linked.log")
    os.symlink(outside, run / "pretrain" / "linked_folder")
    root = f"run.output_root={tmp_path / 'runs'}"
    assert main(["doctor", "--run-id", "r1", TINY, root, "--stage", "../../elsewhere"]) == 2
    assert "--stage='../../elsewhere': not a stage. Fix: name one of data, " in capsys.readouterr().err
    assert main(["doctor", "--run-id", "r1", TINY, root, "--stage", "pretrain", "--json"]) == 1  # nothing matched
    captured = capsys.readouterr()
    assert json.loads(captured.out)["category"] == "unknown"  # the linked OOM log was not read
    assert "not read" in captured.err and "linked.log" in captured.err
