"""multiprocessing's fork server, started so that it imports only what this process would.

The data stage's pool workers (stage.py) and its local Dask cluster's workers (flows/data_flow.py) fork from
one fork server per process, which imports the stage once (its preload). Python 3.11 starts it as
`python -c ...` and ignores the sys.path it is handed, so its sys.path begins with the current folder: run
from a shared folder (/tmp, a team's scratch), it imports a `pipeline_lib`, `numpy` or `distributed` that any
other account left there, and every worker runs that code. `start` runs it with PYTHONSAFEPATH (no current
folder) and this process's own sys.path as PYTHONPATH: it imports what this process imported.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
from multiprocessing import forkserver

_LOCK = threading.Lock()


def start(preload: list[str]) -> None:
    """Set the fork server's preload and start it (no-op when it runs already: one per process)."""
    with _LOCK:
        mp.get_context("forkserver").set_forkserver_preload(preload)
        saved = {k: os.environ.get(k) for k in ("PYTHONSAFEPATH", "PYTHONPATH")}
        os.environ["PYTHONSAFEPATH"] = "1"
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
