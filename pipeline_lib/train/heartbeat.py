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
import math
import os
import re
import signal
import socket
import stat
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


MAX_HEARTBEAT_BYTES = 64 * 1024  # a real one is ~250 bytes; anything larger is not one, and is not read whole
_RANK_FILE = re.compile(r"rank_(\d{1,6})\.json")


def _count(value, name: str, *, none: bool = True) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 62:
        raise ValueError(f"{name}={value!r} is not a count")
    return value


def _seconds(value, name: str, *, none: bool = True) -> float | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a Unix time")
    return float(value)


def parse_heartbeat(record, rank: int, output_dir: str | Path) -> dict:
    """A heartbeat file's record as the watchdog may use it: every field of the module docstring checked and typed,
    ValueError naming the first that is not. Its `stack_file` is never taken from the file: it is where this run's
    trainer process `pid` writes its stacks (stack_path), so a heartbeat cannot make the watchdog read another
    path."""
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object but {type(record).__name__}")
    if _count(record.get("rank"), "rank", none=False) != rank:
        raise ValueError(f"rank={record.get('rank')!r} is not the rank of its file name ({rank})")
    pid = _count(record.get("pid"), "pid")
    host = record.get("host")
    if host is not None and (not isinstance(host, str) or len(host) > 255):
        raise ValueError("host is not a host name")
    ended = record.get("ended", False)
    if not isinstance(ended, bool):
        raise ValueError(f"ended={ended!r} is not true/false")
    return {"rank": rank, "pid": pid, "host": host, "step": _count(record.get("step"), "step") or 0,
            "step_end": _seconds(record.get("step_end"), "step_end"), "running": _count(record.get("running"), "running"),
            "ended": ended, "time": _seconds(record.get("time"), "time", none=False),
            "stack_file": str(stack_path(output_dir, pid)) if pid else None}


def _read_small(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_HEARTBEAT_BYTES, never through a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_HEARTBEAT_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_HEARTBEAT_BYTES:
        raise ValueError(f"larger than {MAX_HEARTBEAT_BYTES} bytes")
    return data


def read_heartbeats(output_dir: str | Path, since: float | None = None,
                    problems: list[str] | None = None) -> dict[int, dict]:
    """{rank: heartbeat} of the files written at or after `since` (Unix time; an earlier launch's are left out),
    each checked by parse_heartbeat. A file that is not a heartbeat (malformed, a link, too large) is left out and
    why is appended to `problems`: a bad file never stops the reader, so it never stops training."""
    folder = Path(output_dir) / HEARTBEAT_DIR
    out = {}
    if folder.is_symlink():
        if problems is not None:
            problems.append(f"{folder} is a link: its heartbeats are not read")
        return out
    for path in sorted(folder.glob("rank_*.json")):
        name = _RANK_FILE.fullmatch(path.name)
        try:
            if name is None:
                raise ValueError("not named rank_<N>.json")
            raw = _read_small(path)
        except FileNotFoundError:
            continue  # replaced while read: the next poll reads it
        except (OSError, ValueError) as err:
            if problems is not None:
                problems.append(f"{path}: {'a link, not followed' if path.is_symlink() else err}")
            continue
        try:
            record = parse_heartbeat(json.loads(raw), int(name.group(1)), output_dir)
        except (ValueError, RecursionError) as err:  # json's errors are ValueErrors (the writes are atomic)
            if problems is not None:
                problems.append(f"{path}: not a heartbeat ({str(err)[:200]})")
            continue
        if since is None or record["time"] >= since:
            out[record["rank"]] = record
    return out


def progress(beat: dict) -> tuple[int, int]:
    """How far a rank got: finished step, then 1 if it has begun the next one."""
    return int(beat.get("step") or 0), 0 if beat.get("running") is None else 1
