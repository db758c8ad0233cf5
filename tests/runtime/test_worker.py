"""The worker launcher: result, failure, crash, timeout kill, death with the launching process.
No MindSpore here."""
from __future__ import annotations

import os
import textwrap
import time

import pytest

from pipeline_lib.runtime.worker import WorkerFailed, WorkerTimeout, run_worker

FAKE = textwrap.dedent('''
    import os, sys, time
    from pipeline_lib.runtime.worker import progress, worker_main

    def run(req):
        progress("hello " + req["mode"])
        if req["mode"] == "fail":
            raise KeyError("no such thing")
        if req["mode"] == "crash":
            os._exit(3)
        if req["mode"] == "hang":
            open(req["pidfile"], "w").write(str(os.getpid()))
            time.sleep(60)
        return {"value": 42}

    if __name__ == "__main__":
        raise SystemExit(worker_main(run))
''')


@pytest.fixture
def fake_worker(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fake_worker.py").write_text(FAKE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pkg"))
    return tmp_path


def test_worker_result_failure_and_crash(fake_worker):
    lines = []
    res = run_worker("fake_worker", {"mode": "ok"}, fake_worker / "w1", timeout_s=60, log=lines.append)
    assert res == {"ok": True, "value": 42} and lines == ["hello ok"]
    with pytest.raises(WorkerFailed, match="KeyError: 'no such thing'") as err:
        run_worker("fake_worker", {"mode": "fail"}, fake_worker / "w2", timeout_s=60)
    assert err.value.error_type == "KeyError"
    with pytest.raises(WorkerFailed, match="exited with code 3 .* without a result"):
        run_worker("fake_worker", {"mode": "crash"}, fake_worker / "w3", timeout_s=60)


def test_worker_timeout_kills_the_process(fake_worker):
    pidfile = fake_worker / "pid"
    started = time.time()
    with pytest.raises(WorkerTimeout, match="training.timeout_seconds"):
        run_worker("fake_worker", {"mode": "hang", "pidfile": str(pidfile)}, fake_worker / "w4", timeout_s=3)
    assert time.time() - started < 30
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_worker_ends_when_the_launching_process_is_sigkilled(fake_worker, sigkill_parent):
    pidfile = fake_worker / "pid_orphan"
    alive, _ = sigkill_parent(f"""
import os, threading, time
from pipeline_lib.runtime.worker import run_worker

def announce():
    while not os.path.exists({str(pidfile)!r}):
        time.sleep(0.05)
    time.sleep(0.1)
    print("READY", open({str(pidfile)!r}).read(), flush=True)

threading.Thread(target=announce, daemon=True).start()
run_worker("fake_worker", {{"mode": "hang", "pidfile": {str(pidfile)!r}}}, {str(fake_worker / "w5")!r}, timeout_s=120)
""", within=10)
    assert alive == []
