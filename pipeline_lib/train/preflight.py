"""The preflight: a verdict over the first training.preflight_steps steps of a fresh start (the trainer's peak memory
is sampled by runtime.process_tree.ProcessTreeSampler while it runs).

What:
- `summarize_steps(metrics)` turns per-step metric dicts (metrics.jsonl) into step time, tokens/s and loss
  sanity; `evaluate_preflight(...)` turns that into a `PreflightResult` whose message says what to change.
- `PreflightWatch`: the preflight rides on the fresh start's first training launch instead of a launch of its own,
  which would import mindformers and compile the graph once more (~16 s of a tiny CPU stage; a full graph compile,
  minutes at 7B, on Ascend). The launcher polls it beside the hang watchdog: once metrics.jsonl holds its steps it
  judges them with the process tree's peak RSS so far; a bad verdict stops the trainer. `conclude(...)` judges what
  there is when the launch ended first (a crash, a tripped guard, a run shorter than the preflight).

Limits: "Loss falling" means the mean of the last third of the steps is below the mean of the first third
(robust to one noisy step; needs >= 3 steps). A loss that did not fall is told apart by how it moved: up by more
than ROSE_BY (the learning rate is too high: the tiny default at training.learning_rate=5 went 7.6 -> 116.6 over
its 5 warm-up steps, tests/doctor/logs/preflight_loss_rose_tiny_cpu.log) or about flat (too low, or too few steps):
the two fixes are opposite. The fixes name the stage's own keys (training.* for pretrain, sft.* for sft).
A step whose gradients overflowed at a loss scale of 1 is a problem however the loss moved: its update was skipped,
so the weights did not move and the loss trend means nothing (the tiny default at training.learning_rate=1e5: the
loss sat at ln(2048) = 7.6246, "falling" by 0.001 through the preflight, and every update from step 5 on
overflowed, tests/doctor/logs/nan_overflow_skipped_tiny_cpu.metrics.jsonl). Overflows at a larger scale are not
counted: fp16 dynamic loss scaling (Ascend) overflows by design while it lowers the scale, down to 1.
A pretraining start from trained weights (`from_trained`: continued pretraining from a base or the promoted night) is
judged without "falling": such a model is near its floor on in-domain text, so a few steps at a
held rate leave the loss flat within noise (a month of tiny nights, 6 steps each: a good night's preflight read
4.96 -> 5.01 from the promoted night's weights and failed a night that would have learned), and a rise counts only
past ROSE_BY_FROM_TRAINED (batch-to-batch noise there is larger than the trend). Every other problem still fails it.
"""
from __future__ import annotations

import re

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..config.validate import MIN_PREFLIGHT_STEPS
from .metrics import read_metrics

GB = 1e9
PREFLIGHT_FILE = "preflight.json"  # the verdict, in the stage folder (the doctor reads its message)
ROSE_BY = 0.10  # last-third mean over first-third mean: a loss up this much is climbing, not noise
# From trained weights the loss starts near its floor and moves with the batch: a good night of the month (4 rows a
# batch, preflight 3) read 3.22, 3.13, 3.65 (+13%), then 3.35, 2.94, 2.73. A too-high rate on trained weights climbs by
# multiples (towards ln(vocab)), so a rise counts only past this.
ROSE_BY_FROM_TRAINED = 0.5


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
    overflow_steps: list[int] = field(default_factory=list)  # overflowed at loss scale <= 1: updates skipped


def summarize_steps(metrics: list[dict], skip_first: int = 1) -> StepSummary:
    """Summary of per-step dicts with keys step, loss and optionally step_time_ms, tokens_per_s."""
    rows = sorted(metrics, key=lambda m: m["step"])
    losses = [m.get("loss") for m in rows]
    bad = [m["step"] for m, loss in zip(rows, losses) if loss is None or not math.isfinite(loss)]
    timed = rows[skip_first:] if len(rows) > skip_first else rows
    times = [m["step_time_ms"] for m in timed if m.get("step_time_ms") is not None]
    tps = [m["tokens_per_s"] for m in timed if m.get("tokens_per_s") is not None]
    finite = [loss for loss in losses if loss is not None and math.isfinite(loss)]
    overflowed = [m["step"] for m in rows if m.get("overflow") and (m.get("loss_scale") or 1) <= 1]
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
        first_third_mean=first_mean, last_third_mean=last_mean, overflow_steps=overflowed)


@dataclass
class PreflightResult:
    ok: bool
    message: str
    summary: StepSummary
    peak_rss_bytes: int | None = None
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# A line of a trainer's output that names what was missing: the reason, where the first line only says it exited.
_MISSING = re.compile(r"does not exist|no such file|not found|cannot find|FileNotFoundError", re.IGNORECASE)


def crash_reason(crash: str) -> str:
    """The line of a crash's text that says why (a missing file: mindformers' "config.load_checkpoint `...` does not
    exist."), else its first line."""
    lines = [ln.strip() for ln in crash.splitlines() if ln.strip()]
    found = next((ln for ln in reversed(lines) if _MISSING.search(ln)), None)
    first = lines[0] if lines else crash
    if found is None or found == first:
        return first
    return f"{first}: {found[-300:]}"


def evaluate_preflight(metrics: list[dict], *, expected_steps: int | None = None,
                       peak_rss_bytes: int | None = None, memory_limit_bytes: int | None = None,
                       skip_first: int = 1, section: str = "training", from_trained: bool = False) -> PreflightResult:
    """Verdict over the preflight's step metrics; `message` lists each problem with its fix, naming the keys of
    `section` (the stage's: "training" or "sft")."""
    s = summarize_steps(metrics, skip_first=skip_first)
    lr, warmup, batch = (f"{section}.{k}" for k in ("learning_rate", "warmup_steps", "micro_batch_size"))
    problems: list[str] = []
    if s.steps == 0:
        problems.append("no step metrics were recorded: check that the run yaml lists the PipelineMetrics "
                        "callback and that the trainer reached its first step (see the log tail)")
    elif expected_steps is not None and s.steps < expected_steps:
        problems.append(f"only {s.steps} of {expected_steps} preflight steps ran: read the log tail for the error")
    if s.first_nonfinite_step is not None:
        problems.append(f"loss is not finite at step {s.first_nonfinite_step}: lower {lr}, "
                        "use training.precision fp32/bf16 or a loss_scale for fp16, and check the batch rows "
                        "named in the guard diagnosis")
    elif s.overflow_steps:
        problems.append(f"gradients not finite in {len(s.overflow_steps)} of {s.steps} steps (from step "
                        f"{s.overflow_steps[0]}, at loss scale 1): their updates were skipped, so the model did not "
                        f"train: lower {lr} (a tenth is a first try), lengthen {warmup}, or clip harder "
                        "(training.grad_clip)")
    elif s.steps and s.loss_falling is None:
        problems.append(f"{s.steps} step(s) are too few to judge the loss trend: set training.preflight_steps >= "
                        f"{MIN_PREFLIGHT_STEPS}")
    elif s.loss_falling is False and s.last_third_mean > s.first_third_mean * (
            1 + (ROSE_BY_FROM_TRAINED if from_trained else ROSE_BY)):
        problems.append(f"loss rose over {s.steps} steps (first-third mean {s.first_third_mean:.4f}, "
                        f"last-third mean {s.last_third_mean:.4f}): the learning rate is too high for this start: "
                        f"lower {lr} (a tenth is a first try), lengthen {warmup}, or clip harder "
                        "(training.grad_clip)")
    elif s.loss_falling is False and not from_trained:
        problems.append(f"loss did not fall over {s.steps} steps (first-third mean {s.first_third_mean:.4f}, "
                        f"last-third mean {s.last_third_mean:.4f}): raise {lr} or training.preflight_steps, "
                        f"shorten {warmup}, and check that rows are not mostly pad tokens")
    if peak_rss_bytes is not None and memory_limit_bytes is not None and peak_rss_bytes > memory_limit_bytes:
        problems.append(f"peak host memory {peak_rss_bytes / GB:.2f} GB exceeds the limit "
                        f"{memory_limit_bytes / GB:.2f} GB: lower {batch}, set model.recompute, "
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


STOP_LINE = "[preflight] "


class PreflightWatch:
    """The preflight over the first `steps` steps of a launch writing `metrics_path` (see the module docstring).

    `memory_limit_bytes`: the bound of the tree's peak RSS (None: not checked); `devices`: the ranks the tree runs,
    for the per-device figure; `planner_line(measured_gb)` -> (predicted GB per device or None, the comparison line)
    when the memory is checked; `section`: the stage's config section, whose keys the fixes name;
    `on_verdict(report)` runs once, at the verdict (while the trainer still runs when the watch judged). `report` is None until the verdict, then preflight.json's dict.
    """

    def __init__(self, metrics_path: str | Path, steps: int, *, memory_limit_bytes: int | None = None,
                 devices: int = 1, planner_line: Callable[[float], tuple[float | None, str]] | None = None,
                 on_verdict: Callable[[dict], None] | None = None, section: str = "training",
                 from_trained: bool = False):
        self.metrics_path, self.steps, self.section = Path(metrics_path), steps, section
        self.from_trained = from_trained
        self.memory_limit_bytes, self.devices, self.planner_line = memory_limit_bytes, max(1, devices), planner_line
        self.on_verdict = on_verdict
        self.sampler = None
        self.started = time.monotonic()
        self.report: dict | None = None

    def bind(self, sampler) -> None:
        """The launcher's process tree sampler of the trainer (its peak RSS is read at the verdict)."""
        self.sampler, self.started = sampler, time.monotonic()

    @property
    def passed(self) -> bool:
        return bool(self.report and self.report["ok"])

    def __call__(self) -> list[str] | None:
        """Polled while the trainer runs: None, or the line that stops it after a bad verdict."""
        if self.report is not None:
            return None
        records = self._first_steps()
        if len(records) < self.steps:
            return None
        self._judge(records, peak_rss=self.sampler.peak_rss_bytes if self.sampler else 0, crash=None)
        if self.passed:
            return None
        return [STOP_LINE + self.report["message"].replace("\n", " ") + ": stopping the trainer"]

    def conclude(self, peak_rss: int, crash: str | None) -> dict:
        """The verdict over what the launch left when it ended before the watch judged (`crash`: its error)."""
        if self.report is None:
            self._judge(self._first_steps(), peak_rss=peak_rss, crash=crash)
        return self.report

    def _first_steps(self) -> list[dict]:
        return [r for r in read_metrics(self.metrics_path) if (r.get("step") or 0) <= self.steps]

    def _judge(self, records: list[dict], *, peak_rss: int, crash: str | None) -> None:
        verdict = evaluate_preflight(records, expected_steps=self.steps, peak_rss_bytes=peak_rss or None,
                                     memory_limit_bytes=self.memory_limit_bytes, section=self.section,
                                     from_trained=self.from_trained)
        measured_gb = (peak_rss or 0) / GB / self.devices
        predicted, memory_line = self.planner_line(measured_gb) if self.planner_line else (None, None)
        s = verdict.summary
        report = {"ok": verdict.ok and crash is None, "message": verdict.message, "problems": verdict.problems,
                  "crash": crash and crash.splitlines()[0], "steps": s.steps, "expected_steps": self.steps,
                  "step_time_ms": s.step_time_ms, "tokens_per_s": s.tokens_per_s, "loss_first": s.loss_first,
                  "loss_last": s.loss_last, "loss_finite": s.first_nonfinite_step is None,
                  "loss_falling": s.loss_falling, "peak_rss_bytes": peak_rss,
                  "measured_gb_per_device": round(measured_gb, 3),
                  "predicted_gb_per_device": None if predicted is None else round(predicted, 3),
                  "memory": memory_line, "memory_limit_bytes": self.memory_limit_bytes,
                  "seconds": round(time.monotonic() - self.started, 1)}
        if crash:
            report["crash"] = crash_reason(crash)
            # before its first step the crash is the whole story: "no step metrics ... PipelineMetrics" misled
            rest = [p for p in report["problems"] if not (s.steps == 0 and p.startswith("no step metrics"))]
            when = "before its first step" if s.steps == 0 else "within the preflight's steps"
            report["problems"] = [f"the trainer failed {when}: {report['crash']}", *rest]
            report["message"] = "preflight failed:\n- " + "\n- ".join(report["problems"])
        self.report = report
        if self.on_verdict is not None:
            self.on_verdict(report)
