"""Every rank's heartbeat: where it is in training, written by the trainer, read by the hang watchdog.

Layout under a run's output_dir:
    heartbeat/rank_N.json   {"rank", "pid", "host", "step", "step_end", "running", "ended", "time", "stack_file"}: `step`
                            is the last data step rank N finished (at `step_end`, Unix time; null before its first
                            step of this launch), `running` the step it has begun and not finished (null between
                            steps: the rank is fetching its next batch or in a callback), `ended` true once its
                            training loop ended (what follows, the final save and the process's teardown, is no
                            step), `time` its last write; rewritten atomically at train begin, at every step's begin
                            and end, and at train end by `callbacks.PipelineMetrics` on every rank
    stacks/pid_P.txt        what `faulthandler` writes there when the trainer process P gets SIGUSR1
                            (`register_stack_dump`, called by train.entry before MindSpore is imported)

Why begin and end: MindSpore's train loop fetches a batch, then calls step_begin, runs the step, then step_end; a
rank stuck in its data pipeline never begins the next step while its peers begin it and wait in the step's
collectives, so `(step, running)` orders the ranks by how far they got (`progress`). This module imports no
MindSpore.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import time
from pathlib import Path

from ..storage.store import LocalStore

HEARTBEAT_DIR = "heartbeat"
STACKS_DIR = "stacks"
STACK_SIGNAL = signal.SIGUSR1


def heartbeat_path(output_dir: str | Path, rank: int) -> Path:
    return Path(output_dir) / HEARTBEAT_DIR / f"rank_{rank}.json"


def stack_path(output_dir: str | Path, pid: int) -> Path:
    return Path(output_dir) / STACKS_DIR / f"pid_{pid}.txt"


def register_stack_dump(output_dir: str | Path) -> Path:
    """In the trainer: SIGUSR1 makes faulthandler write every thread's Python stack to stacks/pid_<pid>.txt. The
    handler is C code: it runs while the main thread is blocked inside a MindSpore kernel or collective."""
    path = stack_path(output_dir, os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a", encoding="utf-8")  # kept open for the process's life: faulthandler writes to its fd
    faulthandler.register(STACK_SIGNAL, file=fh, all_threads=True, chain=False)
    return path


class Heartbeat:
    """The trainer side: one rank's heartbeat file (see the module docstring)."""

    def __init__(self, output_dir: str | Path, rank: int):
        self.path = heartbeat_path(output_dir, rank)
        self.stack_file = str(stack_path(output_dir, os.getpid()))
        self.rank, self.host, self._store = rank, socket.gethostname(), LocalStore()
        self.step, self.step_end, self.ended = 0, None, False

    def begin(self, step: int) -> None:
        """Train begin: `step` data steps were done before this launch (a resume)."""
        self.step = int(step)
        self._write(None)

    def step_begins(self, step: int) -> None:
        self._write(step)

    def step_ends(self, step: int) -> None:
        self.step, self.step_end = int(step), time.time()
        self._write(None)

    def train_ends(self) -> None:
        self.ended = True
        self._write(None)

    def _write(self, running: int | None) -> None:
        record = {"rank": self.rank, "pid": os.getpid(), "host": self.host, "step": self.step,
                  "step_end": self.step_end, "running": None if running is None else int(running), "ended": self.ended,
                  "time": time.time(), "stack_file": self.stack_file}
        self._store.put_bytes(str(self.path), json.dumps(record).encode())


def read_heartbeats(output_dir: str | Path, since: float | None = None) -> dict[int, dict]:
    """{rank: heartbeat} of the files written at or after `since` (Unix time; an earlier launch's are left out)."""
    out = {}
    for path in sorted((Path(output_dir) / HEARTBEAT_DIR).glob("rank_*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # replaced while read: the next poll reads it
        if isinstance(record, dict) and (since is None or record.get("time", 0) >= since):
            out[int(record["rank"])] = record
    return out


def progress(beat: dict) -> tuple[int, int]:
    """How far a rank got: finished step, then 1 if it has begun the next one."""
    return int(beat.get("step") or 0), 0 if beat.get("running") is None else 1
