"""The embedded Prefect API server process that `flows/cli.py` starts
(`python -m flows.embedded_server PORT [PARENT_PID [READY_FD]]`).

uvicorn serving Prefect's app as `prefect server start` does, with one difference that matters to a CLI:
after SIGTERM (the CLI stopping it, or the CLI's death through PR_SET_PDEATHSIG) the process is gone
within GRACE_S seconds even when the graceful shutdown hangs (and it stops by itself once orphaned): a server left running would keep its
port, ~200 MB, and whatever output pipe the CLI was started with (a caller reading the CLI's output
to its end would wait forever). Exit code 3 when it could not start (e.g. the port was taken), as
uvicorn's own command. READY_FD: a pipe's write end that gets one byte once the app has started and the port
listens, so the CLI waits without polling /health (every poll is a request the booting server must serve,
on the cores it boots on).

Its boot is the CLI's wait (~3.5 s of CPU, on the cores the data stage's pool warms on; bench/data.md, issue 31),
so two things it does not redo on every start:
- the garbage collector's passes over the ~1M objects the import of prefect.server creates (~0.4 s): off until
  the app serves, then those objects are frozen out of later passes (gc.freeze);
- block auto-registration, when the database already holds this Prefect's blocks: Prefect's own memo of it
  still imports every collection (prefect_dask, i.e. dask and distributed: ~0.25 s) to hash the block registry.
  BOOT_STAMP, beside the SQLite file, records after a start that registered them: Prefect's version, the
  versions of the installed collections, the schema revision and the block types in the database. A start that
  finds all of them unchanged skips the registration; a new or reset database, a Prefect or collection upgrade
  or a migration registers as before. Migrations are left to Prefect: at the head revision alembic's check costs
  ~0.01 s here.
"""
from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time

import uvicorn

GRACE_S = 10.0
STARTUP_FAILURE = 3
BOOT_STAMP = ".llm-pipeline-boot.json"  # suffix to the SQLite file's path


def _sqlite_path() -> str | None:
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url.get_secret_value()
    prefix = "sqlite+aiosqlite:///"
    return url[len(prefix):] if url.startswith(prefix) and ":memory:" not in url else None


def _blocks_state(db: str) -> dict | None:
    """What decides whether the database holds this install's blocks; None when it cannot tell (no file yet,
    no schema, locked)."""
    import sqlite3
    from importlib.metadata import entry_points, version

    if not os.path.exists(db):
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            revision = con.execute("SELECT version_num FROM alembic_version").fetchall()
            block_types = con.execute("SELECT count(*) FROM block_type").fetchone()[0]
    except sqlite3.Error:
        return None
    collections = sorted([ep.dist.name, ep.dist.version] for ep in entry_points(group="prefect.collections") if ep.dist)
    return {"prefect": version("prefect"), "collections": collections, "revision": sorted(r[0] for r in revision),
            "block_types": block_types}


def blocks_registered(db: str | None) -> bool:
    """The database at `db` holds the blocks a start of this install would register (BOOT_STAMP matches)."""
    if db is None:
        return False
    try:
        with open(db + BOOT_STAMP, encoding="utf-8") as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return False
    state = _blocks_state(db)
    return state is not None and stamp == state


def stamp_blocks_registered(db: str | None) -> None:
    """After a start that ran block registration: record the state it left (LocalStore.put_bytes: temp file + rename)."""
    from pipeline_lib.storage.store import LocalStore

    state = _blocks_state(db) if db else None
    if state is None:
        return
    try:
        LocalStore().put_bytes(db + BOOT_STAMP, json.dumps(state).encode())
    except OSError:  # a read-only Prefect home: registration is simply not skipped next time
        pass


class _Server(uvicorn.Server):
    ready_fd: int | None = None
    stamp_db: str | None = None  # the SQLite file whose blocks this start registered

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        gc.freeze()  # the boot's objects live as long as the server: out of every later pass
        gc.enable()
        if self.started and self.ready_fd is not None:
            os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)
            self.ready_fd = None
        if self.started and self.stamp_db is not None:  # after the byte: not the CLI's wait
            stamp_blocks_registered(self.stamp_db)

    def handle_exit(self, sig, frame) -> None:
        timer = threading.Timer(GRACE_S, os._exit, args=(0,))
        timer.daemon = True
        timer.start()
        super().handle_exit(sig, frame)


def _exit_when_orphaned(server: _Server, parent: int) -> None:
    """Belt and braces for the parent-death signal (seen not to arrive): poll the parent pid."""
    while not server.should_exit:
        if os.getppid() != parent:
            server.handle_exit(signal.SIGTERM, None)
            return
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    args = argv or sys.argv[1:]
    port, parent = int(args[0]), int(args[1]) if len(args) > 1 else os.getppid()
    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                            log_level="error", lifespan="on", timeout_graceful_shutdown=5)
    server = _Server(config)
    server.ready_fd = int(args[2]) if len(args) > 2 else None
    threading.Thread(target=_exit_when_orphaned, args=(server, parent), daemon=True).start()
    gc.disable()
    from prefect.settings import (PREFECT_API_BLOCKS_REGISTER_ON_START, PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION,
                                  temporary_settings)

    db = _sqlite_path()
    if not blocks_registered(db):
        server.stamp_db = db
        server.run()
    else:  # the settings context reaches the app's lifespan: asyncio.run copies this thread's context
        with temporary_settings({PREFECT_API_BLOCKS_REGISTER_ON_START: False, PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION: False}):
            server.run()
    return 0 if server.started else STARTUP_FAILURE


if __name__ == "__main__":
    sys.exit(main())
