"""Launch the trainer in its own process tree, stream its logs, enforce a timeout, kill everything it started.

What:
- `build_command(parallel, yaml_path, ...)` is the command for one node: `msrun --worker_num=dp*mp*pp
  --local_worker_num=<devices on this node> ... python -m pipeline_lib.train.entry --yaml RUN.yaml`, or for a
  single device `python -m pipeline_lib.train.entry --yaml RUN.yaml` directly (`use_msrun=True` forces msrun).
- `launch(command, log=..., cwd=..., timeout_s=...)` runs it in a new session, calls `log(line)` (in the
  caller's thread, so Prefect's run logger works) for every stdout/stderr line and every line msrun's workers
  write to `log_dir/worker_N.log` (prefixed `[worker_N]`), calls `on_tick()` every `tick_s` (e.g. to sync
  checkpoints), and returns a `LaunchResult` with the exit code, duration, peak tree RSS and the log tail.

Why the kill is a tree kill: msrun starts each worker with `setsid`, so killing msrun's process group
leaves the workers running. At timeout (or when the caller raises) every process ever seen in the tree gets
SIGTERM on its own process group, then SIGKILL after `grace_s`. The child also gets a parent-death signal
(Linux), so a launcher killed with SIGKILL does not orphan a trainer: SIGINT for msrun (its handler kills the
workers), SIGTERM otherwise.

Limits: a process that double-forks away between two samples (0.5 s) escapes tracking unless it stays in a
tracked process group. Raises `TrainingLaunchError` (exit code != 0), `TrainingTimeout` (timeout) or
`GuardTripped` (the loss guard stopped training; carries its diagnosis) when `check=True`, each with the
last log lines; `ValueError` for a parallel layout that does not match the device count.
"""
from __future__ import annotations

import collections
import glob
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import psutil

from ..config.schema import ParallelConfig
from ..lifetime import die_with_parent
from ..runtime.env import subprocess_env
from .metrics import read_guard_diagnoses
from .preflight import ProcessTreeSampler

ENTRY_MODULE = "pipeline_lib.train.entry"


class TrainingLaunchError(RuntimeError):
    """The trainer exited with a non-zero code; `.result` holds the exit code and the log tail."""

    def __init__(self, message: str, result: "LaunchResult"):
        super().__init__(message)
        self.result = result


class TrainingTimeout(TrainingLaunchError):
    """The launcher-side timeout expired and the whole process tree was killed."""


class GuardTripped(TrainingLaunchError):
    """The NaN/spike guard stopped training; `.diagnoses` are its per-rank diagnosis dicts."""

    def __init__(self, message: str, result: "LaunchResult", diagnoses: list[dict]):
        super().__init__(message, result)
        self.diagnoses = diagnoses


@dataclass
class LaunchResult:
    command: list[str]
    returncode: int | None
    timed_out: bool
    duration_s: float
    tail: list[str] = field(default_factory=list)  # last lines of all sources, in arrival order
    tails: dict[str, list[str]] = field(default_factory=dict)  # last lines per source: launcher, worker_N, ...
    peak_rss_bytes: int = 0
    leftover_killed: int = 0  # processes still alive after the main child exited (then killed)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


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
    local = min(p.devices_per_node, world - node_rank * p.devices_per_node)
    # msrun runs `python <args>` for each worker, resolving `python` on PATH; child_env() puts this
    # interpreter's folder first. tail_worker_log names a rank no worker has, which turns off msrun's own
    # `tail -f` echo: launch() follows the files itself and labels each line with its rank.
    python = "python" if Path(sys.executable).with_name("python").exists() else "python3"
    return [sys.executable, "-m", "mindspore.parallel.cluster.run", f"--worker_num={world}",
            f"--local_worker_num={local}", f"--master_addr={p.master_addr}", f"--master_port={p.master_port}",
            f"--node_rank={node_rank}", f"--log_dir={Path(log_dir).resolve()}", "--join=True",
            f"--cluster_time_out={cluster_time_out}", f"--tail_worker_log={world}", python, *entry]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ + this interpreter first on PATH, pipeline_lib importable, unbuffered output, quiet glog
    (runtime.env.subprocess_env, the one builder), plus `extra`."""
    return subprocess_env(extra=extra)


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


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(root: subprocess.Popen, sampler: ProcessTreeSampler, grace_s: float = 10.0) -> int:
    """SIGTERM every tracked process and its process group, SIGKILL what is left after `grace_s`.

    Returns the number of processes that were alive when the kill started.
    """
    own_group = os.getpgrp()

    def signal_all(sig: int) -> list[psutil.Process]:
        sampler.sample()  # pick up children started since the last sample
        procs = [p for p in sampler.seen_processes() if _alive(p)]
        groups = set()
        for proc in procs:
            try:
                groups.add(os.getpgid(proc.pid))
            except OSError:
                pass
        for group in groups - {own_group}:
            try:
                os.killpg(group, sig)
            except OSError:
                pass
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        return procs

    first = signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in sampler.seen_processes()):
        root.poll()  # reap the direct child so it stops counting as alive
        time.sleep(0.05)
    if any(_alive(p) for p in sampler.seen_processes()):
        signal_all(signal.SIGKILL)
        psutil.wait_procs([p for p in sampler.seen_processes() if _alive(p)], timeout=5)
    root.wait()
    return len(first)


def _describe_failure(result: LaunchResult, timeout_s: float) -> str:
    how = (f"timed out after {timeout_s:g}s (training.timeout_seconds); the whole process tree was killed"
           if result.timed_out else f"exited with code {result.returncode} after {result.duration_s:.1f}s")
    # Per source: with msrun the failing worker's traceback must not be pushed out by scheduler noise.
    share = max(10, len(result.tail) // max(1, len(result.tails)))
    parts = [f"--- last {len(lines[-share:])} lines of {source} ---\n" + "\n".join(lines[-share:])
             for source, lines in result.tails.items() if lines]
    return f"trainer {how}\ncommand: {shlex.join(result.command)}\n" + ("\n".join(parts) or "(no output)")


def launch(command: Sequence[str], *, log: Callable[[str], None], cwd: str | Path, timeout_s: float,
           log_dir: str | Path | None = None, env: dict[str, str] | None = None, grace_s: float = 10.0,
           tail_lines: int = 60, on_tick: Callable[[], None] | None = None, tick_s: float = 5.0,
           guard_dir: str | Path | None = None, check: bool = True) -> LaunchResult:
    """Run `command` to completion or timeout (see the module docstring); returns a LaunchResult.

    `env` defaults to `child_env()`. `log_dir` is msrun's log folder to follow; `guard_dir` is where the
    loss guard writes its diagnosis (the run's output_dir): when training fails and one exists,
    `GuardTripped` is raised with it. With `check=False` failures are returned instead of raised.
    If `log` or `on_tick` raises, the tree is killed and the exception propagates. `on_tick` runs between
    reads in the caller's thread: lines wait (in order) while it runs, the timeout is checked after it.
    """
    command = [str(c) for c in command]
    Path(cwd).mkdir(parents=True, exist_ok=True)
    tailer = None
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        tailer = _LogTailer(log_dir)
    is_msrun = "mindspore.parallel.cluster.run" in command or Path(command[0]).name == "msrun"
    start, wall_start = time.monotonic(), time.time()
    proc = subprocess.Popen(command, cwd=str(cwd), env=env if env is not None else child_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True,
                            preexec_fn=die_with_parent(signal.SIGINT if is_msrun else signal.SIGTERM))
    sampler = ProcessTreeSampler(proc.pid).start()
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    tails: dict[str, collections.deque[str]] = {}
    lines: queue.Queue = queue.Queue(maxsize=10_000)  # full queue blocks the reader: a flood cannot eat memory

    def read_stdout() -> None:
        for raw in iter(proc.stdout.readline, b""):
            lines.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
        lines.put(None)

    reader = threading.Thread(target=read_stdout, name=f"launch-stdout-{proc.pid}", daemon=True)
    reader.start()

    def emit(line: str, source: str = "trainer output") -> None:
        tail.append(line)
        tails.setdefault(source, collections.deque(maxlen=tail_lines)).append(line)
        log(line)

    timed_out, stdout_done, exited_at, leftover = False, False, None, 0
    next_tail = next_tick = start
    try:
        while True:
            try:
                item = lines.get(timeout=0.1)
                for _ in range(1000):  # a bounded burst: a chatty trainer must not starve the checks below
                    if item is None:
                        stdout_done = True
                        break
                    emit(item)
                    item = lines.get_nowait()
            except queue.Empty:
                pass
            now = time.monotonic()
            if tailer is not None and now >= next_tail:
                for source, line in tailer.poll():
                    emit(line, source)
                next_tail = now + 0.25
            if on_tick is not None and now >= next_tick:
                on_tick()
                next_tick = now + tick_s
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # A leftover grandchild can hold stdout open after the child exits: stop waiting after 2 s.
            if exited_at is not None and (stdout_done or now - exited_at > 2.0):
                break
            if now - start > timeout_s:
                timed_out = True
                emit(f"[launcher] timeout {timeout_s:g}s reached: terminating the process tree of pid {proc.pid}",
                     "launcher")
                kill_tree(proc, sampler, grace_s)
                break
        if not timed_out:
            leftover = sum(1 for p in sampler.seen_processes() if p.pid != proc.pid and _alive(p))
            if leftover:
                emit(f"[launcher] {leftover} process(es) outlived the trainer: killing them", "launcher")
                kill_tree(proc, sampler, grace_s)
    except BaseException:
        kill_tree(proc, sampler, grace_s)
        raise
    finally:
        sampler.stop()
    drain_until = time.monotonic() + 5  # an escaped grandchild may hold stdout open: do not wait forever
    while not stdout_done and time.monotonic() < drain_until:
        try:
            item = lines.get(timeout=0.1)
        except queue.Empty:
            if not reader.is_alive():
                break
            continue
        if item is None:
            stdout_done = True
        else:
            emit(item)
    if tailer is not None:
        for source, line in tailer.poll(final=True):
            emit(line, source)
    if on_tick is not None:
        on_tick()
    result = LaunchResult(command=command, returncode=proc.returncode, timed_out=timed_out,
                          duration_s=time.monotonic() - start, tail=list(tail),
                          tails={k: list(v) for k, v in tails.items()},
                          peak_rss_bytes=sampler.peak_rss_bytes, leftover_killed=leftover)
    if check and not result.ok:
        message = _describe_failure(result, timeout_s)
        # only this launch's diagnoses: an earlier attempt may have left one in the same folder
        diagnoses = read_guard_diagnoses(guard_dir, since=wall_start) if guard_dir is not None else []
        if diagnoses:
            raise GuardTripped(diagnoses[0]["message"] + "\n" + message, result, diagnoses)
        raise (TrainingTimeout if timed_out else TrainingLaunchError)(message, result)
    return result
