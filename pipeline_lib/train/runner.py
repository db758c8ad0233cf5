"""The launcher's surroundings for the training stages: ranks, launch, resume fields, ticks, guard text, rollback copies
(session.py composes them into the runner both stages use).

- `local_ranks(cfg, rank)`: the global ranks node `rank` runs (its rank: runtime.nodes.node_rank).
- `launch_trainer(cfg, yaml, out, ...)`: build_command + launch in its own process group with timeout
  training.timeout_seconds, logs/dumps of the trainer under `out` (GLOG_v=3, LOG_MF_PATH, MS_OM_PATH), msrun logs
  followed in `out/msrun`, the guard's diagnosis read from `out`, the hang watchdog (train.hang, limit
  training.hang_timeout_s) watching this node's ranks' heartbeats. A trainer killed by a signal raises
  `TrainerKilled`, which is also a `stages.TransientError`: the retry resumes from the last checkpoint; a hang
  raises `TrainingHang` (the session decides whether to resume).
- `resume_fields(ckpt)`: mindformers 1.9 resumes only from a checkpoint FOLDER (`load_checkpoint: <dir>`; a file path
  fails in `is_hf_checkpoint` with "checkpoint_path is not a directory") and picks the file by
  `resume_training: <name>` (each rank its own, rank id replaced), so the run resumes from exactly the verified
  checkpoint rather than meta.json's newest file.
- `CheckpointTicker`: the launcher's on_tick: `CheckpointManager.sync()` within a CPU budget (verification loads the
  whole checkpoint in a fresh MindSpore process; while the trainer runs it may take at most VERIFY_DUTY of the
  wall time), the metrics file's upload, `progress("train", step, total)` from metrics.jsonl read incrementally.
  Callers sync unconditionally after each attempt.
- `describe_guard(diag, latest, stage)`: the loss guard's diagnosis as one actionable paragraph naming the knobs
  of `stage` (pretrain: training.* and the rollback policy; sft: sft.*).
- `rollback_checkpoint(latest, dir, step_num, steps_per_epoch)`: copies of a checkpoint's per-rank files with the
  data position moved to `step_num` (written by `python -m pipeline_lib.train.runner set-position`), to resume past
  a bad data window.
Imports no MindSpore in the calling process. Raises TrainerKilled, the launcher's errors, ValueError for a bad rank.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from ..runtime.contract import TransientError
from ..runtime.launcher import LaunchResult, launch_module
from ..storage import store_for
from ..model.checkpoint_format import resume_fields as checkpoint_2_resume_fields
from ..model.checkpoint_format import rollback_copy as checkpoint_2_rollback
from .checkpoints import CheckpointManager, list_checkpoints
from .hang import HangWatchdog
from .launch import ENTRY_MODULE, GuardTripped, TrainingHang, TrainingLaunchError, build_command, launch
from .metrics import METRICS_FILE

VERIFY_DUTY = 0.05      # share of wall time checkpoint verification may take while the trainer runs
VERIFY_FIRST_S = 100.0  # ~ one verifier run (MindSpore import + load, ~5 s on 2 cores) / VERIFY_DUTY
VERIFY_MIN_GAP_S = 30.0


class TrainerKilled(TrainingLaunchError, TransientError):
    """The trainer was killed by a signal (node lost, OOM killer): transient unless the doctor says otherwise; a
    retry or a rerun of the run id resumes from the last verified checkpoint."""


def local_ranks(cfg, rank: int) -> list[int]:
    """Global ranks that node `rank` runs (parallel.devices_per_node per node): planner.disk.node_ranks."""
    from ..planner.disk import node_ranks

    return node_ranks(cfg, rank)


class _Watchers:
    """The hang watchdog, then the preflight riding on this launch: the first that speaks stops the trainer.
    `report` is the hang watchdog's (what launch() puts in a TrainingHang)."""

    def __init__(self, hang: HangWatchdog, preflight):
        self.hang, self.preflight = hang, preflight

    @property
    def report(self) -> dict | None:
        return self.hang.report

    def __call__(self) -> list[str] | None:
        return self.hang() or self.preflight()


def launch_trainer(cfg, yaml_path: Path, out: Path, rank: int, log, on_tick=None, env: dict[str, str] | None = None,
                   entry_module: str = ENTRY_MODULE, attempt: int = 1, preflight=None) -> LaunchResult:
    """Run the trainer on `yaml_path` (output_dir `out`) to completion; see the module docstring. `attempt` numbers
    the hang watchdog's stacks file; `preflight` (a train.preflight.PreflightWatch) judges the launch's first steps
    and stops the trainer on a bad verdict (raised as a TrainingHang whose report is None: the caller asks the
    watch)."""
    command = build_command(cfg.parallel, yaml_path, node_rank=rank, log_dir=out / "msrun", entry_module=entry_module)
    env = {"GLOG_v": "3", "LOG_MF_PATH": str(out / "log"), "MS_OM_PATH": str(out / "om"), **(env or {})}
    from ..runtime.rank_table import visible_devices
    if visible_devices(cfg, rank):  # parallel.node_devices: this node's own device list
        env["ASCEND_RT_VISIBLE_DEVICES"] = visible_devices(cfg, rank)
    watchdog = HangWatchdog(out, local_ranks(cfg, rank), cfg.training.hang_timeout_s, attempt=attempt, log=log)

    def bind(sampler) -> None:  # the trainer's tree: what the watchdog may signal, what the preflight measures
        watchdog.bind(sampler)
        if preflight is not None:
            preflight.bind(sampler)

    try:
        return launch(command, log=log, cwd=out / "cwd", timeout_s=cfg.training.timeout_seconds,
                      log_dir=out / "msrun", env=env, on_tick=on_tick, guard_dir=out,
                      watchdog=watchdog if preflight is None else _Watchers(watchdog, preflight), on_start=bind)
    except (GuardTripped, TrainingHang):
        raise
    except TrainingLaunchError as err:
        rc = err.result.returncode
        if rc is not None and rc < 0 and not err.result.timed_out:
            # what happens next (a retry, or not) is the caller's to say: it knows the retry policy and what is left
            raise TrainerKilled(f"the trainer was killed by signal {-rc}\n{err}", err.result) from None
        raise


def resume_fields(checkpoint: str | Path) -> dict:
    """yaml fields that resume from the checkpoint file `<dir>/rank_N/<name>.ckpt` (see the module docstring)."""
    checkpoint = Path(checkpoint)
    if checkpoint.suffix == ".safetensors":  # Checkpoint 2.0: the folder's tracker names the step
        return checkpoint_2_resume_fields(checkpoint)
    return {"load_checkpoint": str(checkpoint.parent.parent), "resume_training": checkpoint.name}


def sync_checkpoints(manager: CheckpointManager, log) -> None:
    """manager.sync() while the trainer runs: mindformers' own keep_checkpoint_max may delete a file between its
    verification and its hashing (FileNotFoundError from checkpoints.verify_checkpoints); the next sync lists the
    folder again, so that is logged and skipped rather than killing the run."""
    try:
        manager.sync()
    except FileNotFoundError as err:
        log(f"[checkpoints] {Path(err.filename or '?').name} was rotated away while it was verified; next sync retries")


class CheckpointTicker:
    """The launcher's on_tick for a training output_dir `out` (see the module docstring)."""

    def __init__(self, manager: CheckpointManager, out: Path, steps: int, progress=None, log=print,
                 metrics_uri: str | None = None, endpoint: str | None = None):
        self.manager, self.out, self.steps, self.progress, self.log = manager, Path(out), steps, progress, log
        self.metrics_uri, self.endpoint = metrics_uri, endpoint
        self.next_verify = time.monotonic() + VERIFY_FIRST_S
        self.offset, self.step, self.reported = 0, 0, None
        self.uploaded_size = 0

    def _pending(self) -> bool:
        return any(not c.sidecar.exists() for c in list_checkpoints(self.out) if c.rank in self.manager.ranks)

    def __call__(self) -> None:
        if time.monotonic() >= self.next_verify and self._pending():
            t0 = time.monotonic()
            sync_checkpoints(self.manager, self.log)
            self.upload_metrics()
            self.next_verify = time.monotonic() + max(VERIFY_MIN_GAP_S, (time.monotonic() - t0) / VERIFY_DUTY)
        self._report()

    def upload_metrics(self) -> None:
        """Copy metrics.jsonl to `metrics_uri` when it grew (the loss history travels with uploaded checkpoints)."""
        path = self.out / METRICS_FILE
        if self.metrics_uri and path.exists() and path.stat().st_size != self.uploaded_size:
            self.uploaded_size = path.stat().st_size
            store_for(self.metrics_uri, self.endpoint).put_file(path, self.metrics_uri)

    def _report(self) -> None:
        path = self.out / METRICS_FILE
        if self.progress is None or not path.exists():
            return
        with open(path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read on the next tick
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                self.step = max(self.step, int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                continue
        done = min(self.step, self.steps)
        if done != self.reported:
            self.reported = done
            self.progress("train", done, self.steps)


def describe_guard(diag: dict, latest: dict | None, stage: str = "pretrain") -> str:
    """One paragraph naming what the guard saw (step, loss, lr, loss scale, global norm, rows) and what to do."""
    def num(key):
        v = diag.get(key)
        return "n/a" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)

    where = (f"last good checkpoint: step {latest['step']} ({latest['path']})" if latest
             else "no checkpoint was verified before it")
    return (f"{stage}: loss guard stopped training at step {diag.get('step')} (rank {diag.get('rank')}, "
            f"{diag.get('reason')}): loss={num('loss')} running_mean={num('running_mean')} lr={num('lr')} "
            f"loss_scale={num('loss_scale')} global_norm={num('global_norm')} overflow={diag.get('overflow')}; "
            f"batch {diag.get('batch_where') or 'dataset rows ' + str(diag.get('batch_rows'))}; {where}. "
            + ("Fix: lower training.learning_rate or training.grad_clip, remove those rows, or set "
               "training.guard.on_failure=rollback to skip the window" if stage == "pretrain" else
               f"Fix: lower {stage}.learning_rate or training.grad_clip, or remove those samples (the {stage} guard "
               "stops; it does not roll back), then rerun: it resumes from the last good checkpoint"))


def rollback_checkpoint(latest: dict, dest_dir: Path, step_num: int, steps_per_epoch: int) -> Path:
    """Copies of `latest`'s per-rank files (a latest_checkpoint.json record) under dest_dir/rank_N/ with their data
    position (`step_num`, `epoch_num`) set to `step_num`, written in a MindSpore process; returns rank 0's file."""
    epoch = max(1, math.ceil(step_num / steps_per_epoch))
    files = [Path(info["path"]) for _, info in sorted(latest["ranks"].items(), key=lambda kv: int(kv[0]))]
    if files[0].suffix == ".safetensors":  # Checkpoint 2.0: the data position lives in common.json
        return checkpoint_2_rollback(files, Path(dest_dir), step_num, epoch)
    pairs = []
    for rank, info in sorted(latest["ranks"].items(), key=lambda kv: int(kv[0])):
        src = Path(info["path"])
        dst = Path(dest_dir) / f"rank_{rank}" / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        pairs += [str(src), str(dst)]
    env = {"GLOG_v": "3", "LOG_MF_PATH": str(Path(dest_dir) / "log"), "MS_OM_PATH": str(Path(dest_dir) / "om")}
    result = launch_module("pipeline_lib.train.runner", ["set-position", str(step_num), str(epoch), *pairs],
                           cwd=None, timeout_s=900, env=env)
    if not result.ok:
        raise RuntimeError(f"writing the rollback checkpoint under {dest_dir} failed: "
                           + result.describe("set-position"))
    return Path(pairs[1])


def _set_position_main(step_num: int, epoch_num: int, pairs: list[str]) -> None:
    """In a MindSpore process: copy checkpoints (src, dest pairs) with their data position set."""
    import numpy as np
    import mindspore as ms

    for src, dest in zip(pairs[::2], pairs[1::2]):
        items = []
        for name, param in ms.load_checkpoint(src).items():
            if name in ("step_num", "epoch_num"):
                old = param.asnumpy()
                value = np.full(old.shape, step_num if name == "step_num" else epoch_num, old.dtype)
                param = ms.Parameter(ms.Tensor(value), name=name)
            items.append({"name": name, "data": param})
        tmp = dest + ".tmp.ckpt"
        ms.save_checkpoint(items, tmp)
        os.replace(tmp, dest)


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "set-position" and len(sys.argv) % 2 == 0:
        _set_position_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
    else:
        sys.exit("usage: python -m pipeline_lib.train.runner set-position STEP_NUM EPOCH_NUM SRC.ckpt DEST.ckpt [...]")
