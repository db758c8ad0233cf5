"""Training metrics on the launcher side: file layout, metrics.jsonl I/O, the MFLossMonitor log parser, plots.

Layout under a run's output_dir (written by `pipeline_lib.train.callbacks` inside the trainer):
    metrics.jsonl            one JSON object per training step from rank 0 (appended + flushed per step)
    metrics_rank_N.jsonl     other ranks, only when the writer is told `all_ranks=True`
    guard/rank_N.json        the loss guard's diagnosis when it stopped training on rank N
Each record: step (batches consumed, counted across resumes = mindformers' checkpoint `step_num`), epoch,
step_in_epoch, loss, lr, global_norm, loss_scale, overflow, step_time_ms (step begin -> loss ready),
data_wait_ms (previous step end -> this begin; callback rows only), tokens_per_s, rank, time, source
("callback" or "log"), attempt (1 for the first trainer that wrote the file, +1 for each later one). Missing
values are null; NaN/inf loss is written as the JSON tokens NaN/Infinity (Python's json reads them back).
Each step is in the file once: a resumed trainer repeats the steps between its checkpoint and the crash, and
its first record supersedes the earlier attempt's rows from that step on (they are dropped, atomically), so the
loss curve and every step count read from the file see the steps that led to the current weights.

The log parser is the fallback when the callback is not in the yaml: it reads mindformers' MFLossMonitor
line (mindformers 1.9.0, core/callback/callback.py), e.g.
    { Epoch:[  1/  1], step:[    2/   16], loss:[7.625090/7.624235], per_step_time: 78ms, lr: 0.003,
      overflow cond: False, loss_scale: 1.0, global_norm: [0.7118227], train_throughput_per_npu: 0.005T
(one line; `loss: 7.62, ` in sink mode; `lr:` absent when mindformers cannot evaluate it). Its step time is
whole milliseconds and the loss is rank 0's local loss, as the callback's.

`training_callbacks(...)` builds the yaml `callbacks` entries for the run config generator; this module
imports neither mindspore nor matplotlib at import time (plot_loss imports matplotlib with the Agg backend).
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Iterable

METRICS_FILE = "metrics.jsonl"
GUARD_DIR = "guard"


@dataclass(frozen=True)
class LossRule:
    """Which rank's loss is valid and how mindformers 1.9 normalises it (MFLossMonitor._fix_loss_for_parallel in
    core/callback/callback.py): under pipeline parallel only the last stage's ranks hold the loss ("the loss on
    the last card is valid"), and it is the sum over the micro batches, so it is divided by micro_batch_num
    (unless calculate_per_token_loss); then by micro_batch_interleave_num when > 1, and by
    gradient_accumulation_steps when > 1 (unless calculate_per_token_loss). Read from the run yaml
    (`from_run_yaml`), i.e. the same values mindformers uses."""

    pipeline_stages: int = 1
    micro_batch_num: int = 1
    micro_batch_interleave_num: int = 1
    gradient_accumulation_steps: int = 1
    calculate_per_token_loss: bool = False

    @classmethod
    def from_run_yaml(cls, run: dict) -> "LossRule":
        pc, rc = run.get("parallel_config") or {}, run.get("runner_config") or {}
        return cls(int(pc.get("pipeline_stage") or 1), int(pc.get("micro_batch_num") or 1),
                   int(run.get("micro_batch_interleave_num") or 1), int(rc.get("gradient_accumulation_steps") or 1),
                   bool(run.get("calculate_per_token_loss", False)))

    def to_json(self) -> dict:
        return asdict(self)

    def loss_rank(self, world_size: int) -> int:
        """The rank whose loss is recorded: rank 0, or under pipeline parallel the first rank of the last stage
        (stage s holds ranks s*world/pp .. (s+1)*world/pp - 1)."""
        if self.pipeline_stages <= 1:
            return 0
        if world_size % self.pipeline_stages:
            raise ValueError(f"world size {world_size} is not a multiple of pipeline_stage={self.pipeline_stages}")
        return world_size - world_size // self.pipeline_stages

    def normalise(self, loss: float | None) -> float | None:
        if loss is None:
            return None
        if self.pipeline_stages > 1 and not self.calculate_per_token_loss:
            loss = loss / self.micro_batch_num
        if self.micro_batch_interleave_num > 1:
            loss = loss / self.micro_batch_interleave_num
        if self.gradient_accumulation_steps > 1 and not self.calculate_per_token_loss:
            loss = loss / self.gradient_accumulation_steps
        return loss


def metrics_path(output_dir: str | Path, rank: int = 0) -> Path:
    name = METRICS_FILE if rank == 0 else f"metrics_rank_{rank}.jsonl"
    return Path(output_dir) / name


def guard_diagnosis_path(output_dir: str | Path, rank: int = 0) -> Path:
    return Path(output_dir) / GUARD_DIR / f"rank_{rank}.json"


def read_guard_diagnoses(output_dir: str | Path, since: float | None = None) -> list[dict]:
    """Diagnoses the guard wrote (newer than `since`, a Unix time, when given), earliest step first."""
    out = []
    for path in sorted((Path(output_dir) / GUARD_DIR).glob("rank_*.json")):
        try:
            if since is not None and path.stat().st_mtime < since:
                continue
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # a diagnosis being written right now is read on the next call
    return sorted(out, key=lambda d: (d.get("step", 0), d.get("rank", 0)))


class MetricsFile:
    """Append-only metrics.jsonl: one line per record, flushed at once so a crash loses at most one line.

    Opening it reads what earlier attempts wrote: its records carry the next `attempt` number, and the first
    record (step s) drops the earlier rows of steps >= s (file rewritten to a temp name and renamed: a reader
    sees the old or the new file, never half of it).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._earlier = _read_rows(self.path)  # (step, line) of earlier attempts, torn lines left out
        self.attempt = 1 + max((r.get("attempt", 1) for r, _ in self._earlier), default=0)
        self._fh: IO[str] | None = None

    def write(self, record: dict) -> None:
        if self._fh is None:
            self._open(record.get("step"))
        self._fh.write(json.dumps({**record, "attempt": self.attempt}, sort_keys=True) + "\n")
        self._fh.flush()

    def _open(self, first_step) -> None:
        stale = first_step is not None and any(r.get("step", 0) >= first_step for r, _ in self._earlier)
        if stale:  # the steps after the checkpoint this attempt resumed from: they are trained again now
            tmp = self.path.with_name(f".tmp-{self.path.name}")
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(line + "\n" for r, line in self._earlier if r.get("step", 0) < first_step)
            os.replace(tmp, self.path)
        elif self.path.exists() and self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n"):
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write("\n")  # end a torn last line so the next record starts on its own line
        self._earlier = []
        self._fh = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def _read_rows(path: Path) -> list[tuple[dict, str]]:
    """(record, line) per complete JSON line of `path`; a torn line (writer killed mid-line) is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append((record, line))
    return out


def read_metrics(path: str | Path) -> list[dict]:
    """Records of a metrics.jsonl in step order, each step once (the last record written for it: a file from an
    older writer may repeat the steps a resumed attempt trained again); torn lines are skipped. [] if absent."""
    by_step: dict = {}
    for record, _ in _read_rows(Path(path)):
        by_step[record.get("step")] = record
    return sorted(by_step.values(), key=lambda r: (r.get("step") is None, r.get("step") or 0))


_NUM = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)"
_LOSS_LINE = re.compile(
    r"Epoch:\[\s*(?P<epoch>\d+)/\s*(?P<epochs>\d+)\], step:\[\s*(?P<step>\d+)/\s*(?P<steps>\d+)\], "
    rf"loss:\s*\[?\s*(?P<loss>{_NUM})(?:/\s*{_NUM})?\]?, .*?per_step_time: (?P<ms>\d+)ms, "
    r"(?:lr: (?P<lr>[^,]+), )?overflow cond: (?P<overflow>\w+), loss_scale: (?P<scale>[^,]+), "
    r"global_norm: (?P<norm>[^,]+?)\s*(?:,|$)", re.IGNORECASE)


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    text = text.strip().strip("[]").strip()
    try:
        return float(text)
    except ValueError:
        return None  # "None", "unavailable", arrays of several values


def parse_loss_line(line: str, tokens_per_step: int | None = None) -> dict | None:
    """The metric record of one MFLossMonitor line, or None when the line is something else."""
    m = _LOSS_LINE.search(line)
    if not m:
        return None
    epoch, step, steps = int(m["epoch"]), int(m["step"]), int(m["steps"])
    ms = float(m["ms"])
    return {"step": (epoch - 1) * steps + step, "epoch": epoch, "step_in_epoch": step,
            "loss": float(m["loss"]), "lr": _number(m["lr"]), "global_norm": _number(m["norm"]),
            "loss_scale": _number(m["scale"]), "overflow": m["overflow"].lower() == "true",
            "step_time_ms": ms,
            "tokens_per_s": tokens_per_step / (ms / 1000) if tokens_per_step and ms > 0 else None,
            "rank": 0, "time": time.time(), "source": "log"}


def plot_loss(metrics: Iterable[dict], png_path: str | Path, title: str = "training loss") -> Path:
    """Loss (and learning rate on a second axis when present) against step, as a PNG. Non-finite losses
    are marked with a red x at the top of the plot. Raises ValueError when there is no step to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(metrics, key=lambda m: m["step"])
    if not rows:
        raise ValueError(f"no metrics to plot into {png_path}")
    finite = [(m["step"], m["loss"]) for m in rows if m.get("loss") is not None and math.isfinite(m["loss"])]
    bad = [m["step"] for m in rows if m.get("loss") is None or not math.isfinite(m["loss"])]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if finite:
        ax.plot(*zip(*finite), color="tab:blue", label="loss")
    if bad:
        top = max((v for _, v in finite), default=1.0)
        ax.scatter(bad, [top] * len(bad), color="red", marker="x", label="non-finite loss")
    handles, labels = ax.get_legend_handles_labels()
    lrs = [(m["step"], m["lr"]) for m in rows if m.get("lr") is not None]
    if lrs:
        ax2 = ax.twinx()
        ax2.plot(*zip(*lrs), color="tab:gray", linestyle="--", linewidth=1, label="learning rate")
        ax2.set_ylabel("learning rate")
        more = ax2.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend(handles, labels, loc="best")
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = png_path.with_name(png_path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, png_path)
    return png_path


def batch_rows(step: int, steps_per_epoch: int, batch_size: int, data_parallel: int = 1, rank: int = 0,
               num_rows: int | None = None) -> list[int]:
    """Dataset row indices of the batch rank `rank` trained on at global step `step` (1-based).

    Valid for MindDataset with shuffle off, as mindformers builds it: each of `data_parallel` shards takes
    every data_parallel-th row (rank r gets rows r, r+dp, ...; measured on MindSpore 2.9), wrapping around to
    pad the last shard when `num_rows` is not a multiple of data_parallel, and batches are consecutive.
    With resume the step keeps counting globally, so the rows stay right when the skip is whole batches.
    """
    i = (step - 1) % steps_per_epoch
    rows = [(i * batch_size + b) * data_parallel + rank for b in range(batch_size)]
    return [r % num_rows for r in rows] if num_rows else rows


def training_callbacks(output_dir: str | Path, *, tokens_per_step: int, batch_size: int, data_parallel: int,
                       num_rows: int | None = None, spike_factor: float = 5.0, window: int = 20,
                       shuffle_seed: int | None = None, dataset_dir: str | Path | None = None) -> list[dict]:
    """yaml `callbacks` entries for PipelineMetrics and LossGuard (append them to the run config's list).

    `batch_size` is the per-rank dataset batch (micro batch x accumulation on CPU); with `num_rows` the guard
    names the MindRecord rows of a bad batch by position (only with the dataset unshuffled: pass `shuffle_seed` when
    training.shuffle is on); with `dataset_dir` (the train MindRecord folder) it finds them by content, shuffled or
    not, and names the source documents packed in them (train.batch_docs). With `full_batch: True` (semi-auto parallel) every rank
    reads the whole global batch: pass data_parallel=1 and the dataset's batch size. The trainer process must import
    `pipeline_lib.train.callbacks` before building the Trainer (that registers both types with mindformers).
    """
    out = str(output_dir)
    return [{"type": "PipelineMetrics", "output_dir": out, "tokens_per_step": int(tokens_per_step)},
            {"type": "LossGuard", "output_dir": out, "spike_factor": float(spike_factor), "window": int(window),
             "batch_size": int(batch_size), "data_parallel": int(data_parallel),
             "num_rows": None if num_rows is None else int(num_rows),
             "shuffle_seed": None if shuffle_seed is None else int(shuffle_seed),
             "dataset_dir": None if dataset_dir is None else str(dataset_dir)}]
