"""preflight.py: tree RSS sampling on real processes, the verdict over step metrics, and the watch that judges a
running launch's first steps (a real child process through runtime.launcher)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_lib.runtime.launcher import launch
from pipeline_lib.runtime.process_tree import ProcessTreeSampler
from pipeline_lib.train.metrics import read_metrics
from pipeline_lib.train.preflight import STOP_LINE, PreflightWatch, evaluate_preflight, summarize_steps

MB = 1 << 20


def _steps(losses, ms=100.0, tokens=1000):
    return [{"step": i + 1, "loss": loss, "step_time_ms": (5000.0 if i == 0 else ms),
             "tokens_per_s": tokens / ((5000.0 if i == 0 else ms) / 1000)} for i, loss in enumerate(losses)]


def test_sampler_sees_grandchildren_memory_and_remembers_them(tmp_path):
    # The grandchild holds ~200 MB; the parent almost nothing: the peak must include the grandchild.
    code = ("import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', "
            "'b = bytearray(200 << 20); print(1, flush=True); import time; time.sleep(30)'], stdout=subprocess.PIPE)\n"
            "g.stdout.readline()\nprint(g.pid, flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(proc.stdout.readline())
        with ProcessTreeSampler(proc.pid, interval=0.05) as sampler:
            time.sleep(0.3)
        assert sampler.samples >= 2
        assert sampler.peak_rss_bytes > 200 * MB
        assert {proc.pid, grandchild} <= {p.pid for p in sampler.seen_processes()}
    finally:
        for p in ProcessTreeSampler(proc.pid)._tree()[::-1]:
            p.kill()
        proc.wait()
    assert ProcessTreeSampler(proc.pid).sample() == 0  # gone: no error, nothing counted
    with pytest.raises(ValueError, match="interval"):
        ProcessTreeSampler(proc.pid, interval=0)


def test_falling_finite_loss_passes_with_numbers():
    result = evaluate_preflight(_steps([7.6, 7.5, 7.6, 7.2, 7.0, 6.9, 6.5, 6.4, 6.3]), expected_steps=9,
                                peak_rss_bytes=int(0.9e9), memory_limit_bytes=int(4e9))
    assert result.ok and result.problems == []
    s = result.summary
    assert s.step_time_ms == 100.0 and s.tokens_per_s == 10_000.0  # the compile step is left out
    assert s.loss_falling and s.first_third_mean == pytest.approx(7.5667, abs=1e-3)
    assert result.message.startswith("preflight ok: 9 steps, loss 7.6000 -> 6.3000, step 100 ms, 10,000 tokens/s")


def test_flat_loss_fails_and_says_what_to_change():
    result = evaluate_preflight(_steps([7.0, 7.1, 7.0, 7.2, 7.1, 7.0]))
    assert not result.ok and result.summary.loss_falling is False
    assert "loss did not fall over 6 steps" in result.message and "training.learning_rate" in result.message


def test_a_flat_loss_from_trained_weights_passes_a_rising_one_does_not():
    """Continued pretraining starts near its floor: the preflight of a good night of a month of tiny nights (6 steps,
    preflight 3, from the promoted night's stable weights) read a first-third mean of 4.9606 and a last-third mean of
    5.0140 and failed as "did not fall"; from trained weights flat is expected, a climb is still a problem."""
    flat = [4.95, 4.96, 4.97, 5.01, 5.02, 5.01]
    assert not evaluate_preflight(_steps(flat)).ok
    assert evaluate_preflight(_steps(flat), from_trained=True).ok
    rose = evaluate_preflight(_steps([4.9, 5.0, 6.5, 8.0, 9.5, 11.0]), from_trained=True)  # diverging
    assert not rose.ok and "loss rose over 6 steps" in rose.message
    # a good night's first three steps (month of nights, 2026-11-15): +13% on one batch of 4 rows, then it fell
    noisy = [3.2168896198272705, 3.1321299076080322, 3.6455445289611816]
    assert not evaluate_preflight(_steps(noisy)).ok and evaluate_preflight(_steps(noisy), from_trained=True).ok


def test_a_rising_loss_says_lower_the_learning_rate_and_a_flat_one_says_raise_it():
    """The fix for a loss that climbs is the opposite of a flat one's. The rising losses are the first five of the
    tiny default at training.learning_rate=5 (tests/doctor/logs/preflight_loss_rose_tiny_cpu.log)."""
    rose = evaluate_preflight(_steps([7.625871, 7.615848, 24.065125, 55.775925, 116.643364]))
    assert not rose.ok and "loss rose over 5 steps" in rose.message
    assert "lower training.learning_rate" in rose.message and "raise" not in rose.message
    flat = evaluate_preflight(_steps([7.0, 7.1, 7.0, 7.2, 7.1, 7.3]))  # up 2.8 %: noise, not a climb
    assert "loss did not fall" in flat.message and "raise training.learning_rate" in flat.message


def test_an_sft_preflight_names_the_sft_keys():
    sft = evaluate_preflight(_steps([7.0, 7.1, 7.0, 7.2, 7.1, 7.0]), section="sft", peak_rss_bytes=int(5e9),
                             memory_limit_bytes=int(4e9))
    assert "raise sft.learning_rate" in sft.message and "shorten sft.warmup_steps" in sft.message
    assert "lower sft.micro_batch_size" in sft.message and "training.learning_rate" not in sft.message


RECORDED = Path(__file__).resolve().parents[1] / "doctor" / "logs"


def test_updates_skipped_at_loss_scale_1_fail_however_the_loss_moved():
    """The first 5 steps the tiny default recorded at training.learning_rate=1e5: the loss sits at ln(2048) and so
    "falls" by 0.001, while step 5's gradients overflowed (loss scale 1.0: the update was skipped) and so did every
    step after it; the preflight passed this run, which then trained nothing for 75 more steps."""
    rows = read_metrics(RECORDED / "nan_overflow_skipped_tiny_cpu.metrics.jsonl")
    assert [r["overflow"] for r in rows[:5]] == [False, False, False, False, True]
    result = evaluate_preflight(rows[:5])
    assert not result.ok and result.summary.overflow_steps == [5] and result.summary.loss_falling is True
    assert result.problems == [result.problems[0]] and result.problems[0].startswith(
        "gradients not finite in 1 of 5 steps (from step 5, at loss scale 1)")
    assert "lower training.learning_rate" in result.message and "raise" not in result.message
    assert evaluate_preflight(rows[:4]).ok  # the same start, judged before the first skipped update


def test_overflows_while_a_dynamic_loss_scale_comes_down_are_no_problem():
    """fp16 dynamic loss scaling (Ascend) overflows by design while it halves the scale from e.g. 65536; a skipped
    update counts only at scale 1, where no lower scale is left to try."""
    rows = _steps([7.6, 7.6, 7.6, 7.4, 7.1, 6.9])
    for row, (overflow, scale) in zip(rows, [(True, 65536.0), (True, 32768.0), (True, 16384.0), (False, 8192.0),
                                             (False, 8192.0), (False, 8192.0)]):
        row.update(overflow=overflow, loss_scale=scale)
    assert evaluate_preflight(rows).ok
    rows[-1].update(overflow=True, loss_scale=1.0)
    assert evaluate_preflight(rows).summary.overflow_steps == [6]


def test_nan_names_the_step_and_a_short_run_is_reported():
    result = evaluate_preflight(_steps([7.0, 6.5, float("nan"), 6.0]), expected_steps=10)
    assert not result.ok and result.summary.first_nonfinite_step == 3
    assert any("only 4 of 10 preflight steps ran" in p for p in result.problems)
    assert any("loss is not finite at step 3" in p for p in result.problems)


def test_memory_over_limit_and_empty_and_too_few():
    result = evaluate_preflight(_steps([3.0, 2.0, 1.0]), peak_rss_bytes=int(5e9), memory_limit_bytes=int(4e9))
    assert not result.ok and "peak host memory 5.00 GB exceeds the limit 4.00 GB" in result.message
    assert "no step metrics were recorded" in evaluate_preflight([]).message
    few = evaluate_preflight(_steps([3.0, 2.0]))
    assert not few.ok and "too few" in few.message and few.summary.loss_falling is None


def test_summary_sorts_steps_and_handles_missing_times():
    rows = [{"step": 2, "loss": 2.0}, {"step": 1, "loss": 3.0}, {"step": 3, "loss": 1.0}]
    s = summarize_steps(rows)
    assert (s.loss_first, s.loss_last, s.step_time_ms, s.tokens_per_s, s.loss_falling) == (3.0, 1.0, None, None,
                                                                                          True)
    assert math.isclose(s.last_third_mean, 1.0)
    assert evaluate_preflight(rows).to_dict()["summary"]["steps"] == 3


@pytest.mark.parametrize("stage", ["pretrain", "sft"])
def test_stages_refuse_too_few_preflight_steps_before_launching(stage, tmp_path):
    """The stages apply validate's own rule (training.preflight_steps >= 3) before anything starts."""
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.runtime.contract import StageRun
    from pipeline_lib.storage import RunPaths

    if stage == "pretrain":
        from pipeline_lib.train.stage import PretrainStageError as Refused, run_pretrain_stage as run
    else:
        from pipeline_lib.train.sft_stage import SFTStageError as Refused, run_sft_stage as run
    cfg = config_from_dict({"run": {"output_root": str(tmp_path / "runs")}, "training": {"preflight_steps": 2}})
    started = time.time()
    with pytest.raises(Refused, match=r"training.preflight_steps=2: .* Fix: set training.preflight_steps >= 3"):
        # directly, not through the registry (which first refuses the missing upstream stages)
        run(StageRun(stage, cfg, RunPaths(cfg.run.output_root, "r1"), log=lambda line: None))
    assert time.time() - started < 30 and not (tmp_path / "runs" / "r1" / stage / "preflight").exists()


# A stand-in trainer: holds `mb` MB, appends one falling-loss step to metrics.jsonl every 0.2 s, exits with `rc`.
TRAINER = """import json, sys, time
mb, steps, rc, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
hold = bytearray(mb << 20)
for s in range(1, steps + 1):
    time.sleep(0.2)
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": s, "loss": 8.0 - s, "step_time_ms": 200.0, "tokens_per_s": 1280.0}) + "\\n")
    print("step", s, flush=True)
sys.exit(rc)
"""


def _watched(tmp_path, *, mb=80, steps=6, rc=0, limit=None):
    metrics = tmp_path / "metrics.jsonl"
    verdicts = []
    watch = PreflightWatch(metrics, 3, memory_limit_bytes=limit, on_verdict=verdicts.append,
                           planner_line=lambda gb: (0.5, f"measured/predicted {gb:.2f}/0.50 GB"))
    result = launch([sys.executable, "-c", TRAINER, str(mb), str(steps), str(rc), str(metrics)], cwd=tmp_path,
                    timeout_s=60, watchdog=watch, on_start=watch.bind)
    return watch, result, verdicts, [json.loads(ln)["step"] for ln in metrics.read_text().splitlines()]


def test_the_watch_passes_the_first_steps_and_lets_the_launch_run_on(tmp_path):
    watch, result, verdicts, steps = _watched(tmp_path)
    assert result.ok and result.stopped is None and steps == [1, 2, 3, 4, 5, 6]
    assert verdicts == [watch.report] and watch.passed  # judged once, while it ran
    r = watch.report
    assert (r["steps"], r["expected_steps"], r["loss_first"], r["loss_last"]) == (3, 3, 7.0, 5.0)
    assert r["loss_falling"] and r["peak_rss_bytes"] > 80 * MB and r["memory"].startswith("measured/predicted")
    assert watch.conclude(0, "ignored: judged already") is r


def test_a_bad_verdict_stops_the_launch_at_the_watch(tmp_path):
    watch, result, verdicts, steps = _watched(tmp_path, steps=60, limit=40 * MB)
    assert result.stopped.startswith(STOP_LINE + "preflight failed: - peak host memory"), result.stopped
    assert 3 <= len(steps) < 20 and not result.ok  # 60 steps would take 12 s
    assert verdicts == [watch.report] and not watch.passed and "exceeds the limit 0.04 GB" in watch.report["message"]


def test_a_launch_that_ends_before_the_verdict_is_judged_on_what_it_left(tmp_path):
    watch, result, verdicts, steps = _watched(tmp_path, steps=2, rc=3)
    assert result.returncode == 3 and watch.report is None and verdicts == []
    report = watch.conclude(result.peak_rss_bytes, "the trainer exited with code 3")
    assert verdicts == [report] and not report["ok"] and report["crash"] == "the trainer exited with code 3"
    assert report["problems"][:2] == ["the trainer failed within the preflight's steps: the trainer exited with code 3",
                                      "only 2 of 3 preflight steps ran: read the log tail for the error"]


def test_a_trainer_that_dies_before_its_first_step_is_reported_by_its_reason_not_as_missing_metrics(tmp_path):
    from pipeline_lib.train.preflight import PreflightWatch

    metrics = tmp_path / "metrics.jsonl"  # never written: the trainer died loading its checkpoint
    watch = PreflightWatch(metrics, 3)
    crash = ("the trainer exited with code 1\ncommand: python run_mindformer.py\n--- last 3 lines of msrun ---\n"
             "Traceback (most recent call last):\nValueError: config.load_checkpoint "
             "`/runs/nightly-2026-12-01/pretrain/checkpoint/merged/m.ckpt` does not exist.\nexit")
    report = watch.conclude(0, crash)
    assert report["problems"] == ["the trainer failed before its first step: the trainer exited with code 1: "
                                  "ValueError: config.load_checkpoint `/runs/nightly-2026-12-01/pretrain/checkpoint/"
                                  "merged/m.ckpt` does not exist."]
    assert "PipelineMetrics" not in report["message"]
