"""The profile summary of a pretraining run: where the time of a step goes, over the `training.profile` window.

`profile_summary(records, window, profile_dir)` returns per-step medians over the profiled steps:
- compute_ms and data_wait_ms come from our own callback (metrics.jsonl, `callbacks.PipelineMetrics`): compute is a
  step's begin to its loss being ready, data wait is the previous step's end to this step's begin (the dataset
  fetch plus the callbacks after ours, e.g. checkpoint saving on save steps: the median leaves those out). Why
  measured here: MindSpore 2.9's profiler on CPU (measured, docs/mindformers-facts.md) writes op times
  (FRAMEWORK/cpu_op_type_info_*.csv), tensor memory (FRAMEWORK/cpu_ms_memory_record_*.txt) and a trace of the ops,
  but no step boundaries, dataset waits or collectives of its own, so it cannot split a step by itself.
- communication: on Ascend the profiler's own `step_trace_time.csv` (Computing, Communication(Not Overlapped),
  Free per step, in µs) is read and reported next to ours; on CPU the collective ops (AllReduce, AllGather, ...)
  in the op table, when `communication` is in training.profile.record, else "not recorded".
- profiler_ops_ms (op time per step the profiler recorded) and profiler_peak_memory_bytes (peak tensor memory
  allocated) where the profiler wrote them: a cross-check of compute, and the tensor memory of the step.
The profiler's raw output stays in `<stage>/profile/rank_N/` (open it in MindStudio Insight on Ascend).

Profiled steps run slower (the profiler records every op): `unprofiled_compute_ms` is the median of the same
run's other steps (compile step left out) and `profiler_overhead` their ratio; the planner check compares those.

Which rows: mindformers counts the window's steps from 1 in each trainer launch, so the window is taken in the last
attempt (metrics `attempt`) that reached its first step. Pure Python: no MindSpore import.
"""
from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

COLLECTIVE_OPS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AllToAll", "AlltoAll", "Send", "Receive",
                  "Reduce", "Barrier")
"""Op types (MindSpore primitive names) counted as communication in the CPU op table."""


@dataclass(frozen=True)
class ProfileWindow:
    start_step: int
    stop_step: int
    record: tuple[str, ...] = ("memory",)

    @classmethod
    def from_config(cls, profile) -> "ProfileWindow":
        return cls(profile.start_step, profile.stop_step, tuple(profile.record))


def window_rows(records: list[dict], window: ProfileWindow) -> list[dict]:
    """The metrics rows of the profiled steps (see the module docstring: per launch, the last one reaching it)."""
    by_attempt: dict[int, list[dict]] = {}
    for r in records:
        by_attempt.setdefault(int(r.get("attempt") or 1), []).append(r)
    for attempt in sorted(by_attempt, reverse=True):
        rows = sorted(by_attempt[attempt], key=lambda r: r["step"])
        first = rows[0]["step"]
        picked = [r for r in rows if window.start_step <= r["step"] - first + 1 <= window.stop_step]
        if picked:
            return picked
    return []


def unprofiled_rows(records: list[dict], window: ProfileWindow) -> list[dict]:
    """The rows outside the profiled window, without each attempt's first step (graph compilation)."""
    inside = {id(r) for r in window_rows(records, window)}
    firsts = {}
    for r in records:
        a = int(r.get("attempt") or 1)
        firsts[a] = min(firsts.get(a, r["step"]), r["step"])
    return [r for r in records if id(r) not in inside and r["step"] != firsts[int(r.get("attempt") or 1)]]


def _median(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(values), 3) if values else None


def _rank_dir(profile_dir: Path | None) -> Path | None:
    """The newest profiler session folder (`*_ascend_ms`) under profile/rank_0 (or the first rank present)."""
    if profile_dir is None or not profile_dir.is_dir():
        return None
    ranks = sorted(profile_dir.glob("rank_*"), key=lambda p: int(p.name.split("_")[1]) if p.name[5:].isdigit() else 0)
    sessions = sorted((s for r in ranks[:1] for s in r.iterdir() if s.is_dir()), key=lambda s: s.stat().st_mtime)
    return sessions[-1] if sessions else None


def _cpu_op_table(session: Path) -> list[dict]:
    rows = []
    for path in sorted((session / "FRAMEWORK").glob("cpu_op_type_info_*.csv")):
        with open(path, newline="", encoding="utf-8") as fh:
            rows += list(csv.DictReader(fh))
    return rows


def _peak_memory(session: Path) -> int | None:
    peak = None
    for path in (session / "FRAMEWORK").glob("cpu_ms_memory_record_*.txt"):
        with open(path, newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                try:
                    value = int(row["Total Allocated(Byte)"])
                except (KeyError, ValueError):
                    continue
                peak = value if peak is None else max(peak, value)
    return peak


def _step_trace(session: Path) -> dict | None:
    """Medians (ms) of the profiler's own step split on Ascend (ASCEND_PROFILER_OUTPUT/step_trace_time.csv, µs)."""
    path = session / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    if not path.exists():
        return None
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))

    def col(name):
        return _median(float(r[name]) / 1000 for r in rows if r.get(name) not in (None, ""))

    return {"computing_ms": col("Computing"), "communication_not_overlapped_ms": col("Communication(Not Overlapped)"),
            "free_ms": col("Free"), "steps": len(rows)}


def profile_summary(records: list[dict], window: ProfileWindow, profile_dir: Path | None) -> dict:
    """The summary described in the module docstring (a dict for metrics, the report and the artifact)."""
    rows = window_rows(records, window)
    compute = _median(r.get("step_time_ms") for r in rows)
    wait = _median(r.get("data_wait_ms") for r in rows)
    total = round(compute + wait, 3) if compute is not None and wait is not None else compute
    out = {"start_step": window.start_step, "stop_step": window.stop_step, "steps_profiled": len(rows),
           "step_ms": total, "compute_ms": compute, "data_wait_ms": wait,
           "compute_share": round(compute / total, 3) if compute is not None and total else None,
           "data_wait_share": round(wait / total, 3) if wait is not None and total else None,
           "communication_ms": None, "communication": "not recorded (add communication to training.profile.record)",
           "profiler_ops_ms": None, "profiler_peak_memory_bytes": None, "profiler_step_trace": None,
           "profiler_output": None, "measured_by": "PipelineMetrics callback (step begin/end clocks)"}
    # the same run's steps outside the window (compile step left out): what profiling costs per step
    outside = unprofiled_rows(records, window)
    out["unprofiled_compute_ms"] = _median(r.get("step_time_ms") for r in outside)
    out["unprofiled_steps"] = len(outside)
    out["profiler_overhead"] = (round(compute / out["unprofiled_compute_ms"], 3)
                                if compute is not None and out["unprofiled_compute_ms"] else None)
    session = _rank_dir(profile_dir)
    if session is None:
        out["profiler_output"] = "none found (the profiler wrote nothing under the stage's profile/ folder)"
        return out
    out["profiler_output"] = session.relative_to(profile_dir.parent).as_posix()  # relative to the stage folder
    table = _cpu_op_table(session)
    if table and rows:
        ops_ms = sum(float(r.get("total_compute_time") or 0) for r in table)
        out["profiler_ops_ms"] = round(ops_ms / len(rows), 3)
        if "communication" in window.record:
            comm = sum(float(r.get("total_compute_time") or 0) for r in table if r.get("op_type") in COLLECTIVE_OPS)
            out["communication_ms"] = round(comm / len(rows), 3)
            out["communication"] = ("collective ops in the profiler's op table" if comm else
                                    "recorded: no collective op ran (one rank)")
    if "memory" in window.record:
        out["profiler_peak_memory_bytes"] = _peak_memory(session)
    trace = _step_trace(session)
    if trace:
        out["profiler_step_trace"] = trace
        if "communication" in window.record:
            out["communication_ms"] = trace["communication_not_overlapped_ms"]
            out["communication"] = "not overlapped with compute (profiler step_trace_time.csv)"
    return out


def profile_markdown(summary: dict) -> str:
    """The report / Prefect artifact section of the summary."""
    def ms(v):
        return "-" if v is None else f"{v:,.1f} ms"

    def share(v):
        return "" if v is None else f" ({v:.0%})"

    lines = [f"**Profile** of steps {summary['start_step']}..{summary['stop_step']} "
             f"({summary['steps_profiled']} steps, medians per step)", "", "| | |", "|---|---|",
             f"| step | {ms(summary['step_ms'])} |",
             f"| compute (step begin -> loss ready) | {ms(summary['compute_ms'])}{share(summary['compute_share'])} |",
             f"| data wait (previous step end -> begin) | {ms(summary['data_wait_ms'])}"
             f"{share(summary['data_wait_share'])} |",
             f"| communication | {ms(summary['communication_ms']) if summary['communication_ms'] is not None else '-'}"
             f": {summary['communication']} |"]
    if summary.get("unprofiled_compute_ms") is not None:
        lines.append(f"| compute outside the window (profiler overhead) | {ms(summary['unprofiled_compute_ms'])} "
                     f"(profiled steps x{summary['profiler_overhead']:.2f}; {summary['unprofiled_steps']} steps) |")
    if summary.get("profiler_ops_ms") is not None:
        lines.append(f"| op time the profiler recorded | {ms(summary['profiler_ops_ms'])} |")
    if summary.get("profiler_peak_memory_bytes") is not None:
        lines.append(f"| peak tensor memory (profiler) | {summary['profiler_peak_memory_bytes'] / 1e6:,.1f} MB |")
    trace = summary.get("profiler_step_trace")
    if trace:
        lines.append(f"| profiler step trace | computing {ms(trace['computing_ms'])}, communication not overlapped "
                     f"{ms(trace['communication_not_overlapped_ms'])}, free {ms(trace['free_ms'])} |")
    lines.append(f"| profiler output | `{summary['profiler_output']}` |")
    return "\n".join(lines)
