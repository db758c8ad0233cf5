"""Launch the trainer (msrun or python) through the one launcher, follow msrun's worker logs, classify its end.

What:
- `build_command(parallel, yaml_path, ...)` is the command for one node: `msrun --worker_num=dp*mp*pp
  --local_worker_num=<devices on this node> ... python -m pipeline_lib.train.entry --yaml RUN.yaml`, or for a
  single device `python -m pipeline_lib.train.entry --yaml RUN.yaml` directly (`use_msrun=True` forces msrun).
- `launch(command, log=..., cwd=..., timeout_s=...)` runs it with runtime.launcher.launch (own session, the
  subprocess environment, timeout tree kill, `log(line)` in the caller's thread, `on_tick()` every `tick_s`),
  adds every line msrun's workers write to `log_dir/worker_N.log` (prefixed `[worker_N]`), and returns its
  `LaunchResult` (exit code, duration, peak tree RSS, the log tail).

Why the kill is a tree kill: msrun starts each worker with `setsid`, so killing msrun's process group
leaves the workers running; the launcher kills every process it has seen in the tree. The parent-death
signal is SIGINT for msrun (its handler kills the workers), SIGTERM otherwise.

Raises `TrainingLaunchError` (exit code != 0), `TrainingTimeout` (timeout), `TrainingHang` (the hang watchdog,
train.hang, stopped it; carries its report) or `GuardTripped` (the loss guard stopped training; carries its
diagnosis) when `check=True`, each with the last log lines; `ValueError` for a
parallel layout that does not match the device count.
"""
from __future__ import annotations

import glob
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from ..config.schema import ParallelConfig
from ..runtime.launcher import LaunchResult, launch as launch_process
from .metrics import read_guard_diagnoses

ENTRY_MODULE = "pipeline_lib.train.entry"


class TrainingLaunchError(RuntimeError):
    """The trainer exited with a non-zero code; `.result` holds the exit code and the log tail."""

    def __init__(self, message: str, result: "LaunchResult"):
        super().__init__(message)
        self.result = result


class TrainingTimeout(TrainingLaunchError):
    """The launcher-side timeout expired and the whole process tree was killed."""


class TrainingHang(TrainingLaunchError):
    """The hang watchdog saw no finished step for too long and the tree was killed; `.report` is train.hang's."""

    def __init__(self, message: str, result: "LaunchResult", report: dict | None):
        super().__init__(message, result)
        self.report = report or {}


class GuardTripped(TrainingLaunchError):
    """The NaN/spike guard stopped training; `.diagnoses` are its per-rank diagnosis dicts."""

    def __init__(self, message: str, result: "LaunchResult", diagnoses: list[dict]):
        super().__init__(message, result)
        self.diagnoses = diagnoses


def build_command(parallel: ParallelConfig, yaml_path: str | Path, *, node_rank: int = 0,
                  log_dir: str | Path | None = None, use_msrun: bool | None = None,
                  cluster_time_out: int = 600, extra_args: Sequence[str] = (),
                  entry_module: str = ENTRY_MODULE) -> list[str]:
    """The command line for this node; msrun when more than one worker (or `use_msrun=True`)."""
    p = parallel
    world = p.data_parallel * p.model_parallel * p.pipeline_stage
    if world != p.devices:
        raise ValueError(f"parallel.devices={p.devices} but data_parallel x model_parallel x pipeline_stage = "
                         f"{p.data_parallel} x {p.model_parallel} x {p.pipeline_stage} = {world}; make them equal")
    if not 0 <= node_rank < p.num_nodes:
        raise ValueError(f"node_rank={node_rank}: must be in [0, {p.num_nodes}) for {p.devices} devices "
                         f"at parallel.devices_per_node={p.devices_per_node}")
    # absolute: the trainer runs in its own scratch cwd
    entry = ["-m", entry_module, "--yaml", str(Path(yaml_path).resolve()), *extra_args]
    if use_msrun is False and world > 1:
        raise ValueError(f"use_msrun=False needs a single worker, but the layout has {world}")
    if not (use_msrun or world > 1):
        return [sys.executable, *entry]
    if log_dir is None:
        raise ValueError("log_dir is required with msrun: it writes worker_N.log files there")
    if p.rank_table_file:  # HCCL's rank-table route: one process per device, ranks from the table
        return [sys.executable, "-m", "pipeline_lib.train.rank_table_launch", f"--rank-table={p.rank_table_file}",
                f"--node={node_rank}", f"--log-dir={Path(log_dir).resolve()}", "--", *entry]
    local = min(p.devices_per_node, world - node_rank * p.devices_per_node)
    # msrun runs `python <args>` for each worker, resolving `python` on PATH; subprocess_env puts this
    # interpreter's folder first. tail_worker_log names a rank no worker has, which turns off msrun's own
    # `tail -f` echo: launch() follows the files itself and labels each line with its rank.
    python = "python" if Path(sys.executable).with_name("python").exists() else "python3"
    return [sys.executable, "-m", "mindspore.parallel.cluster.run", f"--worker_num={world}",
            f"--local_worker_num={local}", f"--master_addr={p.master_addr}", f"--master_port={p.master_port}",
            f"--node_rank={node_rank}", f"--log_dir={Path(log_dir).resolve()}", "--join=True",
            f"--cluster_time_out={cluster_time_out}", f"--tail_worker_log={world}", python, *entry]


class _LogTailer:
    """Follows msrun's log_dir/worker_*.log and scheduler.log as they grow; ignores files left from before."""

    def __init__(self, log_dir: str | Path):
        self.log_dir = str(log_dir)
        self.stale = {p: os.stat(p).st_mtime_ns for p in self._files()}
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}

    def _files(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.log_dir, "worker_*.log"))
                      + glob.glob(os.path.join(self.log_dir, "scheduler.log")))

    def poll(self, final: bool = False) -> list[tuple[str, str]]:
        """New complete lines as (file stem, "[stem] line"); `final` also returns an unterminated last line."""
        out = []
        for path in self._files():
            try:
                st = os.stat(path)
                if self.stale.get(path) == st.st_mtime_ns:
                    continue  # an earlier attempt's log; msrun truncates it when it starts that worker
                self.stale.pop(path, None)
                offset = self.offsets.get(path, 0)
                if st.st_size < offset:  # truncated: a new writer started from 0
                    offset, self.partial[path] = 0, b""
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except OSError:
                continue
            self.offsets[path] = offset + len(data)
            *lines, rest = (self.partial.get(path, b"") + data).split(b"\n")
            if final and rest:
                lines, rest = [*lines, rest], b""
            self.partial[path] = rest
            label = Path(path).stem
            out += [(label, f"[{label}] {ln.decode('utf-8', 'replace').rstrip()}") for ln in lines]
        return out


def launch(command: Sequence[str], *, log: Callable[[str], None], cwd: str | Path, timeout_s: float,
           log_dir: str | Path | None = None, env: dict[str, str] | None = None, grace_s: float = 10.0,
           tail_lines: int = 60, on_tick: Callable[[], None] | None = None, tick_s: float = 5.0,
           guard_dir: str | Path | None = None, check: bool = True, watchdog=None, on_start=None) -> LaunchResult:
    """Run the trainer `command` to completion or timeout (see the module docstring); returns a LaunchResult.

    `env`: variables over runtime.env.subprocess_env's. `log_dir` is msrun's log folder to follow; `guard_dir`
    is where the loss guard writes its diagnosis (the run's output_dir): when training fails and one exists,
    `GuardTripped` is raised with it. With `check=False` failures are returned instead of raised.
    `watchdog`: a train.hang.HangWatchdog (or any callable the launcher polls, see runtime.launcher); `on_start`:
    as runtime.launcher's (the trainer's process tree sampler).
    If `log` or `on_tick` raises, the tree is killed and the exception propagates.
    """
    command = [str(c) for c in command]
    follow = None
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        follow = _LogTailer(log_dir).poll
    is_msrun = "mindspore.parallel.cluster.run" in command or Path(command[0]).name == "msrun"
    wall_start = time.time()
    result = launch_process(command, cwd=cwd, timeout_s=timeout_s, on_line=log, env=env, follow=follow,
                            on_tick=on_tick, tick_s=tick_s, grace_s=grace_s, tail_lines=tail_lines,
                            parent_death_signal=signal.SIGINT if is_msrun else signal.SIGTERM,
                            output_name="trainer output", watchdog=watchdog, on_start=on_start)
    if check and not result.ok:
        message = result.describe("trainer", "training.timeout_seconds")
        # only this launch's diagnoses: an earlier attempt may have left one in the same folder
        diagnoses = read_guard_diagnoses(guard_dir, since=wall_start) if guard_dir is not None else []
        if diagnoses:
            raise GuardTripped(diagnoses[0]["message"] + "\n" + message, result, diagnoses)
        if result.stopped is not None:
            raise TrainingHang(result.stopped + "\n" + message, result, getattr(watchdog, "report", None))
        raise (TrainingTimeout if result.timed_out else TrainingLaunchError)(message, result)
    return result
