"""A real PostgreSQL server for the test session's Prefect server (what a team's shared server runs on).

`PostgresCluster.start()` makes a throw-away cluster in its own temp folder with Debian's server binaries
(package `postgresql`, installed by `make setup` / `.ci/run`), listening on 127.0.0.1 only, on a free port, with
a random password (scram-sha-256: no other local account can use it), creates the `prefect` database with
`pg_trgm`, and gives the asyncpg URL Prefect takes as PREFECT_API_DATABASE_CONNECTION_URL. As root (CI) the
server runs as the `postgres` account (PostgreSQL refuses to run as root). Durability is off (fsync,
synchronous_commit, full_page_writes): a test database is thrown away. `stop()` stops it and removes the folder.
`available()` says why it cannot run here (None when it can).
A session killed before `stop()` (SIGKILL, a CI timeout) leaves its server running: each cluster records the
test process that owns it (`owner.pid`), and `start()` first stops and removes the clusters whose owner is gone.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psutil

PG_ROOT = Path("/usr/lib/postgresql")


def _bin_dir() -> Path | None:
    versions = sorted((p for p in PG_ROOT.glob("*/bin") if (p / "pg_ctl").exists()),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return versions[-1] if versions else None


def available() -> str | None:
    """None when a cluster can be started here, else the reason."""
    if _bin_dir() is None:
        return f"no PostgreSQL server binaries under {PG_ROOT} (Debian package postgresql: `make setup` as root)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: cannot start PostgreSQL as the postgres account"
    return None


PREFIX, OWNER = "llm-pipeline-pg-", "owner.pid"


def stop_orphans() -> list[Path]:
    """Stop and remove the clusters of test sessions that died without stopping them; returns their folders."""
    gone = []
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((folder / OWNER).read_text())
        except (OSError, ValueError):
            continue  # being made right now, or whose owner cannot be told: not ours to stop
        if psutil.pid_exists(owner):
            continue
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        PostgresCluster(folder, 0, "", as_user).stop()
        gone.append(folder)
    return gone


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresCluster:
    def __init__(self, folder: Path, port: int, password: str, as_user: list[str]):
        self.folder, self.port, self.password, self._as = folder, port, password, as_user
        self.url = f"postgresql+asyncpg://prefect:{password}@127.0.0.1:{port}/prefect"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "PGPASSWORD": self.password}
        return subprocess.run([*self._as, *args], env=env, capture_output=True, text=True, check=check,
                              timeout=120)

    @classmethod
    def start(cls) -> "PostgresCluster":
        why = available()
        if why:
            raise RuntimeError(why)
        bins = _bin_dir()
        stop_orphans()
        folder = Path(tempfile.mkdtemp(prefix=PREFIX))
        (folder / OWNER).write_text(str(os.getpid()))
        as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
            as_user = ["runuser", "-u", "postgres", "--"]
        cluster = cls(folder, _free_port(), secrets.token_urlsafe(24), as_user)
        pwfile = folder / "pw"
        pwfile.write_text(cluster.password)
        if as_user:
            shutil.chown(pwfile, "postgres", "postgres")
        pwfile.chmod(0o600)
        try:
            cluster._run(str(bins / "initdb"), "-D", str(folder / "data"), "-U", "prefect", "--auth=scram-sha-256",
                         f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
            pwfile.unlink()
            options = (f"-p {cluster.port} -c listen_addresses=127.0.0.1 -k {folder} -c fsync=off "
                       "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
            cluster._run(str(bins / "pg_ctl"), "-D", str(folder / "data"), "-o", options, "-l",
                         str(folder / "server.log"), "-w", "-t", "60", "start")
            psql = [str(bins / "psql"), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "prefect", "-v",
                    "ON_ERROR_STOP=1", "-q"]
            cluster._run(*psql, "-d", "postgres", "-c", "CREATE DATABASE prefect")
            cluster._run(*psql, "-d", "prefect", "-c", "CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except subprocess.CalledProcessError as err:
            log = folder / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            cluster.stop()
            raise RuntimeError(f"PostgreSQL did not start: {err.stderr or err.stdout}\n{tail}") from None
        return cluster

    def stop(self) -> None:
        bins = _bin_dir()
        if bins and (self.folder / "data" / "postmaster.pid").exists():
            self._run(str(bins / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop",
                      check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
