"""metrics.py: the MFLossMonitor parser on lines captured from real mindformers 1.9 runs, jsonl I/O, plot."""
from __future__ import annotations

import json
import math
import os
import time

import pytest

from pipeline_lib.train.metrics import (MetricsFile, batch_rows, guard_diagnosis_path,
                                        metrics_path, parse_loss_line, plot_loss, read_guard_diagnoses,
                                        read_metrics, training_callbacks)

# Verbatim from `python -m pipeline_lib.train.entry` on CPU (tiny_llama, seq 64, batch 4; CPUTrainOneStepCell
# returns the learning rate, so `lr:` is printed) and, the NaN one, from rank 0 of an msrun data-parallel run.
REAL = [
    "2026-11-29 13:37:08,601 - mindformers/tmp/exp/out1/log[mindformers/core/callback/callback.py:747] - INFO - "
    "{ Epoch:[  1/  1], step:[    1/   16], loss:[7.623380/7.623380], per_step_time: 8764ms, lr: 0.0, "
    "overflow cond: False, loss_scale: 1.0, global_norm: [0.7098687], train_throughput_per_npu: 0.000T",
    "2026-11-29 13:37:08,683 - mindformers/tmp/exp/out1/log[mindformers/core/callback/callback.py:747] - INFO - "
    "{ Epoch:[  1/  1], step:[    2/   16], loss:[7.625090/7.624235], per_step_time: 78ms, lr: 0.003, "
    "overflow cond: False, loss_scale: 1.0, global_norm: [0.7118227], train_throughput_per_npu: 0.005T",
    "2026-11-29 13:37:08,602 - mindformers/tmp/exp/out1/log[mindformers/core/callback/callback.py:764] - INFO - "
    "   6.2% |███                                               | 0.45638 samples/s/p  0:02:11 }",
    "[worker_0] 2026-11-29 13:56:38,180 - mindformers/tmp/exp/e2e/out2/log[mindformers/core/callback/callback.py:747]"
    " - INFO - { Epoch:[  1/  1], step:[    5/    8], loss:[  nan/  nan], per_step_time: 337ms, lr: 0.0010430192, "
    "overflow cond: True, loss_scale: 1.0, global_norm: [nan], train_throughput_per_npu: 0.001T",
]
# The same format strings (callback.py:747/753) in sink mode, without an lr, in a later epoch.
SINK_NO_LR = ("{ Epoch:[  2/  3], step:[    4/   10], loss: 3.250000, per_step_time: 120ms, overflow cond: False, "
              "loss_scale: unavailable, global_norm: None")


def test_real_loss_lines_parse_to_exact_values():
    first = parse_loss_line(REAL[0], tokens_per_step=256)
    assert {k: first[k] for k in ("step", "epoch", "step_in_epoch", "loss", "lr", "global_norm", "loss_scale",
                                   "overflow", "step_time_ms")} == {
        "step": 1, "epoch": 1, "step_in_epoch": 1, "loss": 7.62338, "lr": 0.0, "global_norm": 0.7098687,
        "loss_scale": 1.0, "overflow": False, "step_time_ms": 8764.0}
    assert first["tokens_per_s"] == pytest.approx(256 / 8.764) and first["source"] == "log"
    assert parse_loss_line(REAL[1])["lr"] == 0.003 and parse_loss_line(REAL[1])["tokens_per_s"] is None
    assert parse_loss_line(REAL[2]) is None  # the progress-bar line
    nan = parse_loss_line(REAL[3])
    assert nan["step"] == 5 and math.isnan(nan["loss"]) and math.isnan(nan["global_norm"]) and nan["overflow"]
    sink = parse_loss_line(SINK_NO_LR)
    assert (sink["step"], sink["loss"], sink["lr"], sink["loss_scale"], sink["global_norm"]) == (14, 3.25, None,
                                                                                                 None, None)


def test_metrics_file_appends_each_parsed_step_as_it_comes_and_reads_back(tmp_path):
    path = metrics_path(tmp_path)
    out = MetricsFile(path)
    out.write(parse_loss_line(REAL[0], tokens_per_step=256))
    assert [r["step"] for r in read_metrics(path)] == [1]  # flushed per line, readable mid-run
    for record in filter(None, map(parse_loss_line, REAL[1:])):
        out.write(record)
    rows = read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2, 5] and math.isnan(rows[-1]["loss"])
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"step": 6, "loss"')  # the writer was killed mid-line
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 5]
    assert read_metrics(tmp_path / "absent.jsonl") == []


def test_metrics_file_survives_reopen(tmp_path):
    path = metrics_path(tmp_path, rank=3)
    assert path.name == "metrics_rank_3.jsonl"
    for step in (1, 2):
        f = MetricsFile(path)
        f.write({"step": step, "loss": 1.0 / step})
        f.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_plot_loss_writes_a_png_with_nan_steps(tmp_path):
    rows = [parse_loss_line(line) for line in REAL if parse_loss_line(line)]
    png = plot_loss(rows, tmp_path / "plots" / "loss.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert not list(png.parent.glob("*.tmp*"))
    with pytest.raises(ValueError, match="no metrics"):
        plot_loss([], tmp_path / "empty.png")


def test_batch_rows_single_and_data_parallel():
    assert batch_rows(1, steps_per_epoch=16, batch_size=4) == [0, 1, 2, 3]
    assert batch_rows(17, steps_per_epoch=16, batch_size=4) == [0, 1, 2, 3]  # next epoch starts over
    assert batch_rows(5, steps_per_epoch=8, batch_size=4, data_parallel=2, rank=1) == [33, 35, 37, 39]
    assert batch_rows(2, steps_per_epoch=2, batch_size=2, data_parallel=3, rank=2, num_rows=11) == [8, 0]


def test_guard_diagnoses_are_read_in_step_order_and_filtered_by_time(tmp_path):
    for rank, step in ((1, 9), (0, 7)):
        path = guard_diagnosis_path(tmp_path, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": step, "rank": rank}))
    old = guard_diagnosis_path(tmp_path, 2)
    old.write_text(json.dumps({"step": 1, "rank": 2}))
    os.utime(old, (time.time() - 600, time.time() - 600))
    (tmp_path / "guard" / "rank_3.json").write_text("{torn")
    assert [d["rank"] for d in read_guard_diagnoses(tmp_path)] == [2, 0, 1]
    assert [d["rank"] for d in read_guard_diagnoses(tmp_path, since=time.time() - 60)] == [0, 1]
    assert read_guard_diagnoses(tmp_path / "none") == []


def test_training_callbacks_spec():
    specs = training_callbacks("out", tokens_per_step=512, batch_size=4, data_parallel=2, num_rows=100,
                               spike_factor=4.0, window=10)
    assert [s["type"] for s in specs] == ["PipelineMetrics", "LossGuard"]
    assert specs[1] == {"type": "LossGuard", "output_dir": "out", "spike_factor": 4.0, "window": 10,
                        "batch_size": 4, "data_parallel": 2, "num_rows": 100, "shuffle_seed": None,
                        "dataset_dir": None}
    shuffled = training_callbacks("out", tokens_per_step=512, batch_size=4, data_parallel=2, shuffle_seed=7)
    assert shuffled[1]["shuffle_seed"] == 7


def _raw_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_resumed_attempt_supersedes_the_steps_after_its_checkpoint(tmp_path):
    """Attempt 1 trains steps 1..12 and is killed mid-line; the checkpoint was at step 8, so attempt 2 writes 9..16."""
    path = metrics_path(tmp_path)
    first = MetricsFile(path)
    for step in range(1, 13):
        first.write({"step": step, "loss": 10.0 - step / 10})
    first._fh.write('{"step": 13, "lo')  # SIGKILL mid-line
    first._fh.flush()
    second = MetricsFile(path)
    for step in range(9, 17):
        second.write({"step": step, "loss": 5.0 - step / 10})
    second.close()
    raw = _raw_lines(path)  # the file itself, not a reader that could hide repeats
    assert [r["step"] for r in raw] == list(range(1, 17))
    assert [r["attempt"] for r in raw] == [1] * 8 + [2] * 8
    assert [r["loss"] for r in raw[8:]] == [5.0 - s / 10 for s in range(9, 17)]  # the retrained steps' losses
    assert not list(tmp_path.glob(".tmp-*"))
    # a third attempt resuming from step 16 (nothing after it) appends, numbered 3
    third = MetricsFile(path)
    third.write({"step": 17, "loss": 3.0})
    third.close()
    raw = _raw_lines(path)
    assert [r["step"] for r in raw] == list(range(1, 18)) and raw[-1]["attempt"] == 3


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path):
    path = metrics_path(tmp_path)
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo', encoding="utf-8")
    f = MetricsFile(path)
    f.write({"step": 2, "loss": 1.5})  # a checkpoint at step 1: step 2 is trained again
    f.write({"step": 3, "loss": 1.0})
    f.close()
    # the hand-written first line (an older writer: no attempt column) counts as attempt 1
    assert [(r["step"], r.get("attempt")) for r in read_metrics(path)] == [(1, None), (2, 2), (3, 2)]


def test_read_metrics_gives_each_step_once_from_a_file_with_repeats(tmp_path):
    """A metrics.jsonl from a writer that appended a resumed attempt's steps again (401..412 twice)."""
    path = metrics_path(tmp_path)
    rows = [{"step": s, "loss": 1.0} for s in range(395, 413)] + [{"step": s, "loss": 2.0} for s in range(401, 420)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    got = read_metrics(path)
    assert [r["step"] for r in got] == list(range(395, 420))
    assert {r["loss"] for r in got if r["step"] >= 401} == {2.0}  # the later attempt's record wins
