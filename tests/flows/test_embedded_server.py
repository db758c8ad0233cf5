"""flows/embedded_server.py: a start on a database that holds this install's blocks skips block registration;
any change to what decides that (the database's block types, its schema revision, Prefect's or a collection's
version) registers again. Real server starts on a fresh SQLite database."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from flows import embedded_server as es

pytestmark = pytest.mark.e2e  # starts the real Prefect API server twice

ROOT = Path(__file__).resolve().parents[2]


def _start_and_stop(home: Path) -> None:
    """One start of the embedded server with PREFECT_HOME=home, until it says it serves; then SIGTERM."""
    ready, ready_w = os.pipe()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}
    for key in ("PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL"):
        env.pop(key, None)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "flows.embedded_server", str(port), str(os.getpid()), str(ready_w)],
                            env=env, pass_fds=(ready_w,), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(ready_w)
    try:
        got = os.read(ready, 1)
        assert got == b"1", proc.stderr.read().decode()[-3000:] if proc.poll() is not None else "no ready byte"
    finally:
        os.close(ready)
        proc.terminate()
        proc.wait(timeout=30)


def test_block_registration_is_skipped_only_while_the_database_holds_this_installs_blocks(tmp_path):
    home = tmp_path / "prefect"
    db = str(home / "prefect.db")
    stamp = Path(db + es.BOOT_STAMP)
    memo = home / "memo_store.toml"  # Prefect's memo of block registration: written whenever its check runs

    _start_and_stop(home)  # a new database: migrated, blocks registered, then stamped
    with sqlite3.connect(db) as con:
        block_types = con.execute("SELECT count(*) FROM block_type").fetchone()[0]
        revision = con.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    assert block_types > 10  # Prefect's own block types and prefect-dask's are in it
    recorded = json.loads(stamp.read_text())
    assert recorded["block_types"] == block_types and recorded["revision"] == [revision]
    assert recorded["prefect"] == __import__("prefect").__version__
    assert memo.exists()
    assert es.blocks_registered(db)

    memo.unlink()
    _start_and_stop(home)  # nothing changed: registration (and Prefect's memo check with it) skipped
    assert not memo.exists()
    assert json.loads(stamp.read_text()) == recorded

    # what makes a start register again
    for key, value in (("prefect", "0.0.1"), ("collections", [["prefect-dask", "0.0.1"]]), ("revision", ["other"]),
                       ("block_types", block_types - 1)):
        stamp.write_text(json.dumps({**recorded, key: value}))
        assert not es.blocks_registered(db), key
    stamp.write_text("{not json")
    assert not es.blocks_registered(db)
    stamp.unlink()
    assert not es.blocks_registered(db)
    assert not es.blocks_registered(None)  # not SQLite (e.g. PostgreSQL): Prefect decides, as before
    assert not es.blocks_registered(str(tmp_path / "missing.db"))


def test_only_a_sqlite_file_is_stamped(monkeypatch, tmp_path):
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{tmp_path}/p.db"}):
        assert es._sqlite_path() == f"{tmp_path}/p.db"
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: "postgresql+asyncpg://u:p@h/db"}):
        assert es._sqlite_path() is None
    es.stamp_blocks_registered(None)
    es.stamp_blocks_registered(str(tmp_path / "missing.db"))  # no database yet: nothing written
    assert list(tmp_path.iterdir()) == []
