"""The nightly lock against a reused pid: a holder on this host is its pid and its start time, not the pid alone."""
import datetime as dt
import json
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly import NightBusy, lock_uri, night_lock


@pytest.fixture
def stranger():
    """A live process that is not a night: what a dead holder's pid belongs to once the system reused it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _write_lock(cfg, holder: dict) -> None:
    Path(lock_uri(cfg)).parent.mkdir(parents=True, exist_ok=True)
    Path(lock_uri(cfg)).write_text(json.dumps(holder))


def test_a_lock_whose_pid_now_belongs_to_another_process_is_taken_over_with_the_reason(tmp_path, stranger):
    cfg = config_from_dict({"run": {"output_root": str(tmp_path)}})
    now = dt.datetime.now(dt.timezone.utc)
    started = psutil.Process(stranger.pid).create_time()
    hour_ago = (now - dt.timedelta(hours=1)).isoformat()
    for holder in ({"run_id": "n0", "host": socket.gethostname(), "pid": stranger.pid, "pid_started": started - 3600,
                    "started_at": hour_ago, "heartbeat_at": now.isoformat()},
                   # a lock of an earlier version (no pid_started): its pid's process started after the lock was taken
                   {"run_id": "n0", "host": socket.gethostname(), "pid": stranger.pid, "started_at": hour_ago,
                    "heartbeat_at": now.isoformat()}):
        _write_lock(cfg, holder)
        said = []
        with night_lock(cfg, "n1", said.append) as mine:
            assert json.loads(Path(lock_uri(cfg)).read_text())["run_id"] == "n1"
            assert mine["pid_started"] == psutil.Process().create_time()
        assert said and said[0].startswith(f"n1: taking over the nightly lock of n0: its pid {stranger.pid} on this "
                                           "host now belongs to another process"), said


def test_the_live_holder_with_its_own_start_time_keeps_the_lock(tmp_path, stranger):
    cfg = config_from_dict({"run": {"output_root": str(tmp_path)}})
    _write_lock(cfg, {"run_id": "n0", "host": socket.gethostname(), "pid": stranger.pid,
                      "pid_started": psutil.Process(stranger.pid).create_time(),
                      "started_at": "2026-12-01T02:00:00+00:00", "heartbeat_at": "2026-12-01T02:00:00+00:00"})
    with pytest.raises(NightBusy, match=f"pid {stranger.pid} on {socket.gethostname()}"):
        with night_lock(cfg, "n0"):
            pass
    # a night holding the lock sees it as its own (what it refreshes and gives back)
    Path(lock_uri(cfg)).unlink()
    with night_lock(cfg, "n2") as mine:
        with pytest.raises(NightBusy):
            with night_lock(cfg, "n3"):
                pass
        assert json.loads(Path(lock_uri(cfg)).read_text())["pid_started"] == mine["pid_started"]
    assert not Path(lock_uri(cfg)).exists()


def test_a_garbage_pid_in_the_lock_is_stale_not_a_crash(tmp_path):
    cfg = config_from_dict({"run": {"output_root": str(tmp_path)}})
    _write_lock(cfg, {"run_id": "n0", "host": socket.gethostname(), "pid": "12x", "started_at": "2026-12-01"})
    said = []
    with night_lock(cfg, "n1", said.append):
        pass
    assert "its pid '12x' is not a process id" in said[0]
