"""Start a child process the one way: workers, trainers and MindSpore tools all go through `launch`.

What `launch(command, cwd=..., timeout_s=...)` owns:
- the environment: runtime.env.subprocess_env (`log_dir`: where mindformers/MindSpore log files go) plus `env`;
- its own session and process group, and a parent-death signal (Linux), so a launcher killed with SIGKILL
  does not orphan it;
- the timeout: when `timeout_s` passes, every process ever seen in the tree is killed
  (process_tree.kill_tree: SIGTERM, SIGKILL after `grace_s`); a Prefect task timeout would not do it, it
  does not kill Popen children. Processes still alive after the child exited are killed as well;
- the watchdog: `watchdog()` runs every `watch_s`; when it returns lines (e.g. train.hang: no rank finished a step
  for too long) they are logged as the launcher's and the tree is killed as for the timeout; `stopped` holds the
  first line;
- log streaming: every stdout/stderr line, and every line of the extra sources `follow` returns (e.g.
  msrun's per-worker log files), goes to `on_line` in the caller's thread (Prefect's run logger works
  there) and into the result's tails; `on_tick()` runs every `tick_s` between reads;
- the report: a `LaunchResult` (exit code, timed out, duration, peak tree RSS, last lines per source, the memory
  evidence: runtime.memory_evidence) whose `describe()` is the failure text every caller raises with. A child
  that failed by SIGKILL our timeout did not send, or failed while its cgroup's OOM-kill count rose (an msrun
  whose worker was killed exits 1), gets a `[launcher]` line saying whether the memory evidence shows an OOM
  kill: the doctor classifies on it, also from a saved log.
`launch_module(module, args, ...)` runs `python -m module args` this way.

Does not raise for a failed child: the caller classifies (train.launch: TrainingTimeout/TrainingLaunchError,
runtime.worker: WorkerTimeout/WorkerFailed). If `on_line`, `follow` or `on_tick` raises, the tree is killed
and the exception propagates.
"""
from __future__ import annotations

import collections
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

from ..lifetime import die_with_parent
from .env import subprocess_env
from .memory_evidence import MemoryEvidence
from .process_tree import ProcessTreeSampler, alive, kill_tree

SIGKILL_CODES = (-9, 137)  # Popen's -signal, and a shell's 128 + 9
OOM_LINE = "[launcher] memory evidence of an OOM kill: "
NO_OOM_LINE = "[launcher] no memory evidence of an OOM kill: "


@dataclass
class LaunchResult:
    command: list[str]
    returncode: int | None
    timed_out: bool
    duration_s: float
    timeout_s: float | None = None
    tail: list[str] = field(default_factory=list)  # last lines of all sources, in arrival order
    tails: dict[str, list[str]] = field(default_factory=dict)  # last lines per source: output, launcher, worker_N
    peak_rss_bytes: int = 0
    leftover_killed: int = 0  # processes still alive after the main child exited (then killed)
    stopped: str | None = None  # the watchdog's first line when it stopped the child
    memory: MemoryEvidence | None = None  # OOM-kill count before/after, last tree RSS, limit

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.stopped is None

    def how(self, what: str = "timeout_s") -> str:
        """'timed out after Ns (<what>); the whole process tree was killed' or 'exited with code N after Ts'."""
        if self.stopped is not None:
            return f"was stopped by the watchdog after {self.duration_s:.1f}s; the whole process tree was killed"
        if self.timed_out:
            return f"timed out after {self.timeout_s:g}s ({what}); the whole process tree was killed"
        return f"exited with code {self.returncode} after {self.duration_s:.1f}s"

    def describe(self, name: str, what: str = "timeout_s") -> str:
        """The failure text: how it ended, the command, and the last lines of each source (a share each, so
        a failing msrun worker's traceback is not pushed out by scheduler noise)."""
        share = max(10, len(self.tail) // max(1, len(self.tails)))
        parts = [f"--- last {len(lines[-share:])} lines of {source} ---\n" + "\n".join(lines[-share:])
                 for source, lines in self.tails.items() if lines]
        return f"{name} {self.how(what)}\ncommand: {shlex.join(self.command)}\n" + ("\n".join(parts) or "(no output)")


def launch(command: Sequence[str], *, cwd: str | Path | None, timeout_s: float | None,
           on_line: Callable[[str], None] | None = None, env: dict[str, str] | None = None,
           log_dir: str | Path | None = None, follow: Callable[[bool], list[tuple[str, str]]] | None = None,
           on_tick: Callable[[], None] | None = None, tick_s: float = 5.0, grace_s: float = 10.0,
           watchdog: Callable[[], list[str] | None] | None = None, watch_s: float = 1.0,
           tail_lines: int = 60, parent_death_signal: int = signal.SIGTERM,
           output_name: str = "output", on_start: Callable[[ProcessTreeSampler], None] | None = None) -> LaunchResult:
    """Run `command` to completion or timeout (see the module docstring); returns a LaunchResult.

    cwd: created if missing (None: this process's). timeout_s: None waits as long as it takes. env: variables
    over subprocess_env's (they win). follow(final) -> [(source, line)]: polled every 0.25 s and once more at
    the end with final=True. on_tick runs in the caller's thread: lines wait (in order) while it runs.
    output_name: the source name of the child's own stdout/stderr lines in the tails. on_start(sampler) gets the
    child's tree sampler once it runs (its peak_rss_bytes is live), e.g. for a watchdog that judges memory.
    """
    command = [str(c) for c in command]
    if cwd is not None:
        Path(cwd).mkdir(parents=True, exist_ok=True)
    emit_line = on_line or (lambda line: None)
    start = time.monotonic()
    memory = MemoryEvidence.start()  # before the child: its OOM-kill count must be the one from before it ran
    proc = subprocess.Popen(command, cwd=None if cwd is None else str(cwd),
                            env=subprocess_env(log_dir=log_dir, extra=env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=die_with_parent(parent_death_signal))
    sampler = ProcessTreeSampler(proc.pid).start()
    if on_start is not None:
        on_start(sampler)
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    tails: dict[str, collections.deque[str]] = {}
    lines: queue.Queue = queue.Queue(maxsize=10_000)  # full queue blocks the reader: a flood cannot eat memory

    def read_stdout() -> None:
        for raw in iter(proc.stdout.readline, b""):
            lines.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
        lines.put(None)

    reader = threading.Thread(target=read_stdout, name=f"launch-stdout-{proc.pid}", daemon=True)
    reader.start()

    def emit(line: str, source: str = output_name) -> None:
        tail.append(line)
        tails.setdefault(source, collections.deque(maxlen=tail_lines)).append(line)
        emit_line(line)

    timed_out, stdout_done, exited_at, leftover, stopped = False, False, None, 0, None
    next_follow = next_tick = next_watch = start
    try:
        while True:
            try:
                item = lines.get(timeout=0.1)
                for _ in range(1000):  # a bounded burst: a chatty child must not starve the checks below
                    if item is None:
                        stdout_done = True
                        break
                    emit(item)
                    item = lines.get_nowait()
            except queue.Empty:
                pass
            now = time.monotonic()
            if follow is not None and now >= next_follow:
                for source, line in follow(False):
                    emit(line, source)
                next_follow = now + 0.25
            if on_tick is not None and now >= next_tick:
                on_tick()
                next_tick = now + tick_s
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # A leftover grandchild can hold stdout open after the child exits: stop waiting after 2 s.
            if exited_at is not None and (stdout_done or now - exited_at > 2.0):
                break
            if watchdog is not None and exited_at is None and now >= next_watch:
                said = watchdog()
                next_watch = now + watch_s
                if said:
                    for line in said:
                        emit(line, "launcher")
                    stopped = said[0]
                    kill_tree(proc, sampler, grace_s)
                    break
            if timeout_s is not None and now - start > timeout_s:
                timed_out = True
                emit(f"[launcher] timeout {timeout_s:g}s reached: terminating the process tree of pid {proc.pid}",
                     "launcher")
                kill_tree(proc, sampler, grace_s)
                break
        if not (timed_out or stopped):
            leftover = sum(1 for p in sampler.seen_processes() if p.pid != proc.pid and alive(p))
            if leftover:
                emit(f"[launcher] {leftover} process(es) outlived pid {proc.pid}: killing them", "launcher")
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
    if follow is not None:
        for source, line in follow(True):
            emit(line, source)
    memory.finish(sampler.last_rss_bytes)
    if proc.returncode != 0 and not timed_out and stopped is None:  # our own kill is not evidence of anything
        killed = proc.returncode in SIGKILL_CODES
        oom, why = memory.verdict(rss=killed)  # high RSS says OOM only of a kill, not of any failure
        if killed or oom:
            emit((OOM_LINE if oom else NO_OOM_LINE) + why, "launcher")
    if on_tick is not None:
        on_tick()
    return LaunchResult(command=command, returncode=proc.returncode, timed_out=timed_out,
                        duration_s=time.monotonic() - start, timeout_s=timeout_s, tail=list(tail),
                        tails={k: list(v) for k, v in tails.items()}, peak_rss_bytes=sampler.peak_rss_bytes,
                        leftover_killed=leftover, memory=memory, stopped=stopped)


def launch_module(module: str, args: Sequence[str] = (), **options) -> LaunchResult:
    """`python -m module *args` with this interpreter, through `launch` (same options), by way of
    runtime.lean_process: the interpreter's exit skips the collector's last passes over MindSpore's objects."""
    return launch([sys.executable, "-m", "pipeline_lib.runtime.lean_process", module, *args], **options)
