"""The profile summary's arithmetic on metrics rows and profiler files (pipeline_lib/train/profile.py); the real
profiled CPU run is tests/train/test_pretrain_profile.py."""
from __future__ import annotations

import csv

from pipeline_lib.train.profile import ProfileWindow, profile_markdown, profile_summary, unprofiled_rows, window_rows


def _rows(steps, attempt=1, compute=10.0, wait=2.0):
    return [{"step": s, "attempt": attempt, "step_time_ms": compute, "data_wait_ms": None if i == 0 else wait}
            for i, s in enumerate(steps)]


def test_window_counts_steps_from_one_in_the_last_launch_that_reached_it():
    window = ProfileWindow(2, 3)
    assert [r["step"] for r in window_rows(_rows(range(1, 9)), window)] == [2, 3]
    resumed = _rows(range(1, 6)) + _rows(range(5, 9), attempt=2)  # the second launch starts at data step 5
    assert [(r["step"], r["attempt"]) for r in window_rows(resumed, window)] == [(6, 2), (7, 2)]
    # outside the window, without each launch's first (compile) step
    assert [r["step"] for r in unprofiled_rows(_rows(range(1, 7)), window)] == [4, 5, 6]


def test_split_and_overhead_without_profiler_output(tmp_path):
    rows = (_rows([1], compute=4000.0) + [{"step": s, "attempt": 1, "step_time_ms": 30.0, "data_wait_ms": 5.0}
                                          for s in (2, 3)]
            + [{"step": s, "attempt": 1, "step_time_ms": 20.0, "data_wait_ms": 1.0} for s in (4, 5, 6)])
    s = profile_summary(rows, ProfileWindow(2, 3), tmp_path / "profile")
    assert (s["compute_ms"], s["data_wait_ms"], s["step_ms"]) == (30.0, 5.0, 35.0)
    assert s["compute_share"] == round(30 / 35, 3) and s["unprofiled_compute_ms"] == 20.0
    assert s["profiler_overhead"] == 1.5 and s["communication_ms"] is None
    assert "none found" in s["profiler_output"]
    assert "not recorded" in profile_markdown(s)


def test_ascend_step_trace_supplies_communication(tmp_path):
    # MindSpore 2.9's own header of step_trace_time.csv (its Ascend viewer), values in µs
    from mindspore.profiler.analysis.viewer.ascend_step_trace_time_viewer import AscendStepTraceTimeViewer

    session = tmp_path / "profile" / "rank_0" / "host_1_ascend_ms" / "ASCEND_PROFILER_OUTPUT"
    session.mkdir(parents=True)
    header = AscendStepTraceTimeViewer.STEP_TRACE_TIME_HEADERS
    with open(session / "step_trace_time.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, header)
        w.writeheader()
        for step in (2, 3):
            w.writerow({**{h: "" for h in header}, "Step": step, "Computing": 800000, "Free": 50000,
                        "Communication(Not Overlapped)": 150000})
    rows = [{"step": s, "attempt": 1, "step_time_ms": 1000.0, "data_wait_ms": 40.0} for s in range(1, 5)]
    s = profile_summary(rows, ProfileWindow(2, 3, ("communication",)), tmp_path / "profile")
    assert s["profiler_step_trace"] == {"computing_ms": 800.0, "communication_not_overlapped_ms": 150.0,
                                        "free_ms": 50.0, "steps": 2}
    assert s["communication_ms"] == 150.0 and "step_trace_time.csv" in s["communication"]
