"""Preflight report helpers: a verdict over a few training steps (the trainer's peak memory is sampled by
runtime.process_tree.ProcessTreeSampler while it runs).

What:
- `summarize_steps(metrics)` turns per-step metric dicts (metrics.jsonl) into step time, tokens/s and loss
  sanity; `evaluate_preflight(...)` turns that into a `PreflightResult` whose message says what to change.

Limits: "Loss falling" means the mean of the last third of the steps is below the mean of the first third
(robust to one noisy step; needs >= 3 steps).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from ..config.validate import MIN_PREFLIGHT_STEPS

GB = 1e9


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
