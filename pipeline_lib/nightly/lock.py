"""One night at a time per output root.

A night takes <output_root>/_nightly/lock.json (created only if absent: `Store.put_new`, os.link locally,
If-None-Match on S3) before it lists new files and gives it back when it ends. A second night started meanwhile
(two dates at once, or tonight while last night is still training) would list the same new files and train on them
twice; instead it does nothing and says who holds the lock (`NightBusy`). The holder rewrites the lock every
LOCK_HEARTBEAT_SECONDS (`heartbeat_at`), so a night of any length keeps it. A lock is taken over when it is stale:
held by the same night on another machine (a rerun after a kill there), by a process on this host that is gone
(the lock records the holder's pid and its start time, `pid_started`: a live process with that pid that started at
another time got the pid of a dead holder), or not refreshed for LOCK_STALE_SECONDS (its night died on another machine).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
from contextlib import contextmanager

import psutil

from ..config.schema import PipelineConfig
from ..storage import join, store_for
from ..storage.errors import PicklableError

LOCK_HEARTBEAT_SECONDS = 60
LOCK_STALE_SECONDS = 15 * 60  # 15 missed heartbeats: the holder is gone (a store outage that long fails the night too)
START_TIME_SLACK_S = 1.0  # psutil's create_time of one process is stable to the clock tick; a reused pid starts later


class NightBusy(PicklableError, RuntimeError):
    """Another night holds the nightly lock of this output root; `holder` is what it wrote."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def lock_uri(cfg: PipelineConfig) -> str:
    return join(cfg.run.output_root, "_nightly", "lock.json")


def _started(pid: int) -> float | None:
    """The start time (Unix seconds) of process `pid`, None when there is none: with the pid, what names a process
    (a pid is reused once its process is gone; the pair is not)."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def _reused(holder: dict, started: float) -> str | None:
    """Why the live process with the holder's pid is not the holder (its pid was reused), else None. A lock written
    by an earlier version has no `pid_started`: a process started after the lock was taken cannot be its holder."""
    pid = holder["pid"]
    if isinstance(holder.get("pid_started"), (int, float)):
        if abs(started - holder["pid_started"]) <= START_TIME_SLACK_S:
            return None
        when = f"the holder started at {_iso(holder['pid_started'])}"
    else:
        try:
            taken = dt.datetime.fromisoformat(str(holder.get("started_at"))).timestamp()
        except ValueError:
            return None  # nothing to compare with: the live pid is taken at its word
        if started <= taken + START_TIME_SLACK_S:
            return None
        when = f"the lock was taken at {_iso(taken)}"
    return (f"its pid {pid} on this host now belongs to another process (started at {_iso(started)}; {when}): the "
            "holder is gone and its pid was reused")


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="seconds")


def _stale(holder: dict, run_id: str) -> str | None:
    """Why the lock `holder` wrote no longer holds, else None."""
    if holder.get("host") == socket.gethostname() and holder.get("pid"):  # this host: ask the process itself
        try:
            pid = int(holder["pid"])
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"its process {holder['pid']} on this host is gone"
        except PermissionError:  # another account's process: its start time is still readable
            pass
        except (ValueError, TypeError, OverflowError):
            return f"its pid {holder['pid']!r} is not a process id"
        started = _started(pid)
        if started is None:
            return f"its process {holder['pid']} on this host is gone"
        return _reused(holder, started)  # alive and the holder: also when it runs this same night (two runs at once)
    if holder.get("run_id") == run_id:
        return "held by this same night on another machine (a rerun after it was stopped)"
    beat = holder.get("heartbeat_at") or holder.get("started_at") or "1970-01-01T00:00:00+00:00"
    if (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(beat)).total_seconds() > LOCK_STALE_SECONDS:
        return f"not refreshed since {beat}, more than {LOCK_STALE_SECONDS // 60} min ago"
    return None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


@contextmanager
def night_lock(cfg: PipelineConfig, run_id: str, log=print):
    """Hold the nightly lock of cfg.run.output_root for the block; NightBusy when another night holds it."""
    store = store_for(cfg.run.output_root, cfg.run.s3_endpoint_url)
    uri = lock_uri(cfg)
    mine = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
            "pid_started": psutil.Process().create_time(), "started_at": _now()}
    body = json.dumps({**mine, "heartbeat_at": mine["started_at"]}, sort_keys=True).encode()
    for _ in range(3):
        if store.put_new(uri, body):
            break
        try:
            holder = json.loads(store.get_bytes(uri))
        except Exception:  # released between our attempt and this read: try again
            continue
        why = _stale(holder, run_id)
        if why is None:
            raise NightBusy(
                f"{run_id}: another night holds the nightly lock of {cfg.run.output_root}: {holder.get('run_id')} "
                f"(pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('started_at')}, alive at "
                f"{holder.get('heartbeat_at')}); this night "
                "did nothing, its new files stay new for the next night. Fix: nothing if that night is running; if "
                f"it died, rerun it with its --run-date (it takes the lock back) or delete {uri}", holder)
        log(f"{run_id}: taking over the nightly lock of {holder.get('run_id')}: {why}")
        store.delete(uri)  # best effort: two nights taking over the same stale lock at once both retry put_new
    else:
        raise NightBusy(f"{run_id}: could not take the nightly lock {uri} (it kept changing hands); "
                        "Fix: run this night again", {})
    def ours() -> bool:
        try:
            held = json.loads(store.get_bytes(uri))
        except Exception:
            return False
        return {k: held.get(k) for k in mine} == mine

    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(LOCK_HEARTBEAT_SECONDS):
            try:
                if ours():  # never refresh a lock someone took over
                    store.put_bytes(uri, json.dumps({**mine, "heartbeat_at": _now()}, sort_keys=True).encode())
            except Exception:  # a store hiccup: the next beat tries again (15 missed ones make the lock stale)
                pass

    beating = threading.Thread(target=heartbeat, name="nightly-lock-heartbeat", daemon=True)
    beating.start()
    try:
        yield mine
    finally:
        stop.set()
        beating.join()
        if ours():  # never release a lock someone took over
            store.delete(uri)
