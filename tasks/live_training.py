"""Live training view: the loss/lr curve and the last steps, updated while a training stage runs.

A progress callback in front of the stage's ProgressReporter: on the stage's "train" progress ticks
(which the trainer's on_tick sends as metrics.jsonl grows) it re-renders one markdown artifact
`<stage>-live` at most every `every_s` seconds, in place, and once more when the stage ends, also
when it fails: the curve up to the failure stays on the task run. The stage's own loss curve and
metrics table are still published when it succeeds (tasks/artifacts.py).
"""
from __future__ import annotations

import base64
import re
import tempfile
import time
from pathlib import Path

from pipeline_lib.key_figures import fmt

LIVE_EVERY_S = 30.0
TABLE_STEPS = 10
COLUMNS = ("step", "loss", "lr", "global_norm", "step_time_ms", "data_wait_ms", "tokens_per_s")


def work_dir_of(paths, stage: str) -> str:
    from pipeline_lib.train.session import work_dir  # the stage folder, or a local folder per s3:// stage

    return work_dir(paths.stage_uri(stage))


def live_metrics_file(paths, stage: str) -> Path | None:
    """The metrics.jsonl a training stage is writing now (the newest under its local work folder)."""
    work = work_dir_of(paths, stage)
    if not Path(work).exists():
        return None
    found = [p for p in Path(work).rglob("metrics.jsonl") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def phase(step, preflight_steps: int, verdict_written: bool) -> str:
    """What the trainer is doing at `step`: its first training.preflight_steps steps are the preflight (judged
    before training goes on) until the verdict is written; then it trains."""
    return "preflight" if preflight_steps and not verdict_written and (step or 0) <= preflight_steps else "training"


def progress_line(records: list[dict], total: int | None, state: str, tokens_per_step: int | None = None,
                  preflight_steps: int = 0) -> str:
    """`preflight, step 3 of 5 (of 1,200 steps), loss 7.1, 12,288 tokens seen, about 4 min left`: the live card's
    head and the overview's Running row."""
    last = records[-1] if records else {}
    step = last.get("step")
    if state == "preflight":
        where = f"preflight, step {fmt(step)} of {fmt(preflight_steps)}" + (f" (of {fmt(total)} steps)" if total else "")
    else:
        where = f"{state}, step {fmt(step)}" + (f" of {fmt(total)}" if total else "")
    parts = [where, f"loss {fmt(last.get('loss'))}"]
    if tokens_per_step and step:
        parts.append(f"{fmt(int(step) * tokens_per_step)} tokens seen")
    left = eta_seconds(records, total)
    if left is not None and state in ("training", "preflight"):
        parts.append(f"about {_duration(left)} left")
    return ", ".join(parts)


def eta_seconds(records: list[dict], total: int | None) -> float | None:
    """The steps left times the median time of the last steps (metrics.jsonl's step_time_ms); None unknown."""
    if not records or not total:
        return None
    times = sorted(r["step_time_ms"] for r in records[-TABLE_STEPS:] if r.get("step_time_ms"))
    if not times:
        return None
    return max(0, total - int(records[-1].get("step") or 0)) * times[len(times) // 2] / 1000


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render(stage: str, records: list[dict], total: int | None, png: bytes | None, state: str,
           tokens_per_step: int | None = None, preflight_steps: int = 0) -> str:
    line = progress_line(records, total, state, tokens_per_step, preflight_steps)
    head = f"**{stage}**: {line} (updated {time.strftime('%H:%M:%S UTC', time.gmtime())})\n"
    if state == "preflight":
        head += ("\nThe preflight: its first steps are judged (memory, the loss falls) before training goes on; "
                 "a bad verdict stops the trainer with the reason.\n")
    parts = [head]
    if png:
        parts.append(f"![{stage} loss](data:image/png;base64,{base64.b64encode(png).decode()})\n")
    rows = records[-TABLE_STEPS:]
    if rows:
        cols = [c for c in COLUMNS if any(r.get(c) is not None for r in rows)]
        parts.append("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        parts += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(parts) + "\n"


_HEAD = re.compile(r"^\*\*[^*]+\*\*: (?P<line>.+) \(updated [^()]*\)$")


def card_line(markdown: str | None) -> str | None:
    """The progress line a live card's head (render) shows: what a parent whose stage runs on a worker (dispatch)
    reads from the card to refresh its overview's Running row (flows/dispatch.py). None for anything else."""
    found = _HEAD.match((markdown or "").split("\n", 1)[0])
    return found.group("line") if found else None


class LiveTraining:
    """progress(step, done, total) -> the next reporter, plus the live artifact on "train" ticks."""

    def __init__(self, stage: str, paths, next_reporter=None, every_s: float | None = None, publish=None,
                 tokens_per_step: int | None = None, preflight_steps: int = 0, on_update=None):
        self.stage, self.paths, self.next = stage, paths, next_reporter
        self.tokens_per_step, self.preflight_steps = tokens_per_step, preflight_steps
        # on_update(stage, progress line, live card's UI link): the run overview's Running row (tasks/overview.py)
        self.on_update = on_update
        self.every_s = LIVE_EVERY_S if every_s is None else every_s
        self.last = 0.0
        self.total = None
        self.artifact_id = None
        self.seen_steps = 0
        self._publish = publish or _publish_artifact

    def __call__(self, step: str, done: int, total: int) -> None:
        if self.next is not None:
            self.next(step, done, total)
        if step != "train":
            return
        self.total = total
        if time.time() - self.last >= self.every_s:
            self.update("training")

    def update(self, state: str) -> None:
        try:
            path = live_metrics_file(self.paths, self.stage)
            if path is None:
                return
            from pipeline_lib.train.metrics import plot_loss, read_metrics

            records = [r for r in read_metrics(path) if r.get("step") is not None]
            if not records or (len(records) == self.seen_steps and state == "training"):
                return
            total = self.total
            if state == "training":
                from pipeline_lib.train.preflight import PREFLIGHT_FILE

                state = phase(records[-1]["step"], self.preflight_steps, (path.parent / PREFLIGHT_FILE).exists()
                              or (Path(work_dir_of(self.paths, self.stage)) / PREFLIGHT_FILE).exists())
            with tempfile.TemporaryDirectory() as tmp:
                png = Path(tmp) / "loss.png"
                plot_loss(records, png, title=f"{self.stage} loss ({state})")
                data = png.read_bytes()
            self.artifact_id = self._publish(self.artifact_id, render(self.stage, records, total, data, state,
                                                                      self.tokens_per_step, self.preflight_steps),
                                             self.stage)
            if self.on_update is not None:
                from tasks.overview import artifact_link

                self.on_update(self.stage, progress_line(records, total, state, self.tokens_per_step,
                                                         self.preflight_steps), artifact_link(self.artifact_id))
            self.seen_steps = len(records)
            self.last = time.time()
        except Exception:  # the UI is a view; never fail training because an artifact could not be written
            pass

    def finish(self, failed: bool) -> None:
        """The last picture: kept on the task run whether the stage succeeded or failed (nothing when
        no training step was reported, e.g. a Cached stage)."""
        if self.total is not None:
            self.update("failed" if failed else "finished")


def _publish_artifact(artifact_id, markdown: str, stage: str):
    from prefect.artifacts import create_markdown_artifact

    if artifact_id is None:
        return create_markdown_artifact(markdown, key=f"{stage}-live",
                                        description=f"{stage}: loss curve and last steps, updated while training")
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactUpdate

    with get_client(sync_client=True) as client:
        client.update_artifact(artifact_id, ArtifactUpdate(data=markdown))
    return artifact_id
