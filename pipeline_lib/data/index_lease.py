"""Who is using a lineage's dedup index: a lease per data run, so `dedup-index clear` refuses while a run reads it.

A data run that deduplicates against the index (incremental dedup) writes `<index>/leases/<run_id>.json` ({run_id,
host, pid, started}) when its dedup step starts and removes it once the stage finished (finalize). `dedup-index
clear` lists the leases first and refuses, naming the run, its host and pid and the fix, while one is live: clearing
under a run made its dedup step fail with a FileNotFoundError traceback (a partition listed, then gone).
A lease is live when its process still runs (same host), or, from another host, for STALE_AFTER_S since it was
taken; the lease of a run that died is stale and ignored (and removed with the index).
"""
from __future__ import annotations

import json
import os
import socket
import time

from ..storage import join, store_for
from .errors import DataStageError

LEASES = "leases"
STALE_AFTER_S = 24 * 3600  # a lease from another host: no pid to ask; a data stage takes hours at most


def _uri(index: str, run_id: str) -> str:
    return join(index, LEASES, f"{run_id}.json")


def take_lease(index: str, run_id: str, endpoint: str | None) -> None:
    body = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    store_for(index, endpoint).put_bytes(_uri(index, run_id), json.dumps(body).encode())


def drop_lease(index: str, run_id: str, endpoint: str | None) -> None:
    store = store_for(index, endpoint)
    uri = _uri(index, run_id)
    if store.exists(uri):
        store.delete(uri)


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return isinstance(pid, int)  # another user's process: alive
    return True


def live_leases(index: str, endpoint: str | None) -> list[dict]:
    """The leases of runs still using the index (see the module docstring)."""
    store = store_for(index, endpoint)
    out = []
    for uri in store.list(join(index, LEASES) + "/"):
        if not uri.endswith(".json"):
            continue
        try:
            lease = json.loads(store.get_bytes(uri))
            mine = lease["host"] == socket.gethostname()
            if (mine and _pid_alive(lease["pid"])) or (not mine and time.time() - float(lease["started"]) < STALE_AFTER_S):
                out.append(lease)
        except (OSError, KeyError, ValueError, TypeError):  # gone meanwhile, or not a lease: not a holder
            continue
    return out


def refuse_while_used(index: str, lineage: str, endpoint: str | None) -> None:
    """DataStageError naming the runs that hold a live lease on the index."""
    held = live_leases(index, endpoint)
    if held:
        who = ", ".join(f"{h['run_id']} (host {h['host']}, pid {h['pid']}, since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(h['started'])))})" for h in held[:5])
        raise DataStageError("data.dedup.lineage", lineage, f"its dedup index is in use by {who}; nothing was deleted",
                             "wait until that run's data stage ends (or stop it), then clear; a run that died "
                             "holds nothing once its process is gone")
