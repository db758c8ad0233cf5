"""Preflight report helpers: process-tree memory sampling and a verdict over a few training steps.

What:
- `ProcessTreeSampler(pid)` samples, in a background thread, the summed RSS of a process and all its
  descendants (msrun, its scheduler and workers) and keeps the peak. It also remembers every process it
  has seen, which the launcher uses to kill workers that left the process group (msrun `setsid`s them).
- `summarize_steps(metrics)` turns per-step metric dicts (metrics.jsonl) into step time, tokens/s and loss
  sanity; `evaluate_preflight(...)` turns that into a `PreflightResult` whose message says what to change.

Limits: RSS summed over processes counts shared pages once per process, so the peak is an upper bound;
a process that lives shorter than the sampling interval is missed. "Loss falling" means the mean of the last
third of the steps is below the mean of the first third (robust to one noisy step; needs >= 3 steps).
Raises nothing on vanished processes (they are skipped); ValueError for a non-positive interval.
"""
from __future__ import annotations

import math
import statistics
import threading
from dataclasses import asdict, dataclass, field

import psutil

from ..config.validate import MIN_PREFLIGHT_STEPS

GB = 1e9


class ProcessTreeSampler:
    """Peak summed RSS of `pid` and its descendants, sampled every `interval` seconds while running."""

    def __init__(self, pid: int, interval: float = 0.5):
        if interval <= 0:
            raise ValueError(f"interval={interval!r}: must be > 0 seconds")
        self.pid, self.interval = pid, interval
        try:  # kept, not looked up again: psutil checks its create time, so a reused pid is never walked
            self._root: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._root = None
        self.peak_rss_bytes = 0
        self.samples = 0
        self.seen: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tree(self) -> list[psutil.Process]:
        try:
            if self._root is None or not self._root.is_running():
                return []
            return [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> int:
        """Take one sample now; returns the tree's current RSS in bytes (0 when the root is gone)."""
        total = 0
        procs = self._tree()
        for proc in procs:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                total += proc.memory_info().rss
            except psutil.Error:
                continue  # exited between listing and reading
        with self._lock:
            for proc in procs:
                self.seen.setdefault(proc.pid, proc)
            self.peak_rss_bytes = max(self.peak_rss_bytes, total)
            self.samples += 1
        return total

    def seen_processes(self) -> list[psutil.Process]:
        """Every process seen in the tree so far (psutil objects guard against pid reuse)."""
        with self._lock:
            return list(self.seen.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self) -> "ProcessTreeSampler":
        self._thread = threading.Thread(target=self._run, name=f"rss-sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "ProcessTreeSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class StepSummary:
    steps: int
    step_time_ms: float | None  # median over steps after the first `skip_first` (graph compile)
    tokens_per_s: float | None  # median likewise
    loss_first: float | None
    loss_last: float | None
    first_nonfinite_step: int | None
    loss_falling: bool | None  # None: fewer than 3 finite losses
    first_third_mean: float | None = None
    last_third_mean: float | None = None


def summarize_steps(metrics: list[dict], skip_first: int = 1) -> StepSummary:
    """Summary of per-step dicts with keys step, loss and optionally step_time_ms, tokens_per_s."""
    rows = sorted(metrics, key=lambda m: m["step"])
    losses = [m.get("loss") for m in rows]
    bad = [m["step"] for m, loss in zip(rows, losses) if loss is None or not math.isfinite(loss)]
    timed = rows[skip_first:] if len(rows) > skip_first else rows
    times = [m["step_time_ms"] for m in timed if m.get("step_time_ms") is not None]
    tps = [m["tokens_per_s"] for m in timed if m.get("tokens_per_s") is not None]
    finite = [loss for loss in losses if loss is not None and math.isfinite(loss)]
    falling = first_mean = last_mean = None
    if not bad and len(finite) >= 3:
        third = len(finite) // 3
        first_mean = statistics.fmean(finite[:third])
        last_mean = statistics.fmean(finite[-third:])
        falling = last_mean < first_mean
    return StepSummary(
        steps=len(rows), step_time_ms=statistics.median(times) if times else None,
        tokens_per_s=statistics.median(tps) if tps else None,
        loss_first=losses[0] if rows else None, loss_last=losses[-1] if rows else None,
        first_nonfinite_step=bad[0] if bad else None, loss_falling=falling,
        first_third_mean=first_mean, last_third_mean=last_mean)


@dataclass
class PreflightResult:
    ok: bool
    message: str
    summary: StepSummary
    peak_rss_bytes: int | None = None
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def evaluate_preflight(metrics: list[dict], *, expected_steps: int | None = None,
                       peak_rss_bytes: int | None = None, memory_limit_bytes: int | None = None,
                       skip_first: int = 1) -> PreflightResult:
    """Verdict over the preflight's step metrics; `message` lists each problem with its fix."""
    s = summarize_steps(metrics, skip_first=skip_first)
    problems: list[str] = []
    if s.steps == 0:
        problems.append("no step metrics were recorded: check that the run yaml lists the PipelineMetrics "
                        "callback and that the trainer reached its first step (see the log tail)")
    elif expected_steps is not None and s.steps < expected_steps:
        problems.append(f"only {s.steps} of {expected_steps} preflight steps ran: read the log tail for the error")
    if s.first_nonfinite_step is not None:
        problems.append(f"loss is not finite at step {s.first_nonfinite_step}: lower training.learning_rate, "
                        "use training.precision fp32/bf16 or a loss_scale for fp16, and check the batch rows "
                        "named in the guard diagnosis")
    elif s.steps and s.loss_falling is None:
        problems.append(f"{s.steps} step(s) are too few to judge the loss trend: set training.preflight_steps >= "
                        f"{MIN_PREFLIGHT_STEPS}")
    elif s.loss_falling is False:
        problems.append(f"loss did not fall over {s.steps} steps (first-third mean {s.first_third_mean:.4f}, "
                        f"last-third mean {s.last_third_mean:.4f}): raise training.learning_rate or "
                        "training.preflight_steps, shorten training.warmup_steps, and check that rows are not "
                        "mostly pad tokens")
    if peak_rss_bytes is not None and memory_limit_bytes is not None and peak_rss_bytes > memory_limit_bytes:
        problems.append(f"peak host memory {peak_rss_bytes / GB:.2f} GB exceeds the limit "
                        f"{memory_limit_bytes / GB:.2f} GB: lower training.micro_batch_size, set model.recompute, "
                        "or use more devices")
    ok = not problems
    if ok:
        parts = [f"preflight ok: {s.steps} steps, loss {s.loss_first:.4f} -> {s.loss_last:.4f}"]
        if s.step_time_ms is not None:
            parts.append(f"step {s.step_time_ms:.0f} ms")
        if s.tokens_per_s is not None:
            parts.append(f"{s.tokens_per_s:,.0f} tokens/s")
        if peak_rss_bytes is not None:
            parts.append(f"peak RSS {peak_rss_bytes / GB:.2f} GB")
        message = ", ".join(parts)
    else:
        message = "preflight failed:\n- " + "\n- ".join(problems)
    return PreflightResult(ok=ok, message=message, summary=s, peak_rss_bytes=peak_rss_bytes, problems=problems)
