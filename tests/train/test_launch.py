"""launch.py: command building, streaming, timeout tree-kill, failure tails, real msrun (1 and 2 workers)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pipeline_lib.config.schema import ParallelConfig
from pipeline_lib.train.launch import (ENTRY_MODULE, GuardTripped, TrainingLaunchError, TrainingTimeout,
                                       build_command, launch)
from pipeline_lib.runtime.env import subprocess_env
from pipeline_lib.train.metrics import guard_diagnosis_path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_dead(pids, timeout=5.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline and not all(_dead(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not _dead(p)]


def test_single_device_runs_the_entry_directly():
    cmd = build_command(ParallelConfig(), "run/pretrain.yaml")
    assert cmd == [sys.executable, "-m", ENTRY_MODULE, "--yaml", str(Path("run/pretrain.yaml").resolve())]


def test_msrun_command_for_one_node_of_two():
    p = ParallelConfig(devices=8, data_parallel=4, model_parallel=2, devices_per_node=4,
                       master_addr="10.0.0.1", master_port=9123)
    cmd = build_command(p, "/r.yaml", node_rank=1, log_dir="/logs", cluster_time_out=300)
    assert cmd[:3] == [sys.executable, "-m", "mindspore.parallel.cluster.run"]
    for flag in ("--worker_num=8", "--local_worker_num=4", "--master_addr=10.0.0.1", "--master_port=9123",
                 "--node_rank=1", "--log_dir=/logs", "--join=True", "--cluster_time_out=300"):
        assert flag in cmd
    assert cmd[-4:] == ["-m", ENTRY_MODULE, "--yaml", "/r.yaml"] and cmd[-5] in ("python", "python3")


def test_layout_that_does_not_match_devices_is_refused():
    with pytest.raises(ValueError, match=r"parallel.devices=4 .* = 2"):
        build_command(ParallelConfig(devices=4, data_parallel=2, devices_per_node=4), "r.yaml", log_dir="l")
    with pytest.raises(ValueError, match="node_rank=2"):
        build_command(ParallelConfig(devices=4, data_parallel=4, devices_per_node=2), "r.yaml", node_rank=2,
                      log_dir="l")


def test_lines_stream_in_order_while_the_child_runs(tmp_path):
    # The child blocks until the launcher has handed it "ready": with buffered or end-of-run delivery the
    # test would hit the timeout instead.
    gate = tmp_path / "gate"
    child = _script(tmp_path, "child.py", f"""
        import os, sys, time
        for i in range(50):
            print(f"out {{i}}") if i % 2 == 0 else print(f"err {{i}}", file=sys.stderr)
        print("ready", flush=True)
        while not os.path.exists({str(gate)!r}):
            time.sleep(0.02)
        print("done")
    """)
    seen = []

    def log(line):
        seen.append(line)
        if line == "ready":
            gate.touch()

    result = launch([sys.executable, str(child)], log=log, cwd=tmp_path, timeout_s=20)
    expected = [f"out {i}" if i % 2 == 0 else f"err {i}" for i in range(50)] + ["ready", "done"]
    assert seen == expected
    assert result.ok and result.returncode == 0 and not result.timed_out
    assert result.tail[-1] == "done" and result.peak_rss_bytes > 0


def test_timeout_kills_the_whole_tree_including_setsid_grandchildren(tmp_path):
    # Like msrun: one grandchild in the child's group, one in its own session that also ignores SIGTERM.
    pids = tmp_path / "pids"
    child = _script(tmp_path, "child.py", f"""
        import os, subprocess, sys, time
        same = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        stubborn = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('armed', flush=True); "
            "time.sleep(600)"], start_new_session=True, stdout=subprocess.PIPE)
        stubborn.stdout.readline()
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{same.pid}} {{stubborn.pid}}")
        print("spawned", flush=True)
        time.sleep(600)
    """)
    lines = []
    t0 = time.monotonic()
    with pytest.raises(TrainingTimeout) as err:
        launch([sys.executable, str(child)], log=lines.append, cwd=tmp_path, timeout_s=5, grace_s=1)
    elapsed = time.monotonic() - t0
    all_pids = [int(p) for p in pids.read_text().split()]
    assert _wait_dead(all_pids) == []
    assert elapsed < 15
    assert err.value.result.timed_out and "timed out after 5s" in str(err.value)
    assert "spawned" in str(err.value)  # the tail is in the message
    assert any("timeout 5s reached" in line for line in lines)


def test_a_child_flooding_its_output_still_times_out(tmp_path):
    child = _script(tmp_path, "child.py", """
        while True:
            print("x" * 200)
    """)
    count = [0]

    def log(line):
        count[0] += 1

    t0 = time.monotonic()
    with pytest.raises(TrainingTimeout):
        launch([sys.executable, str(child)], log=log, cwd=tmp_path, timeout_s=1.5, grace_s=1)
    assert time.monotonic() - t0 < 10 and count[0] > 1000


def test_nonzero_exit_raises_with_the_last_lines(tmp_path):
    child = _script(tmp_path, "child.py", """
        import sys
        for i in range(100):
            print(f"line {i}")
        sys.exit(3)
    """)
    with pytest.raises(TrainingLaunchError) as err:
        launch([sys.executable, str(child)], log=lambda line: None, cwd=tmp_path, timeout_s=20, tail_lines=10)
    assert not isinstance(err.value, TrainingTimeout)
    assert err.value.result.returncode == 3
    assert err.value.result.tail == [f"line {i}" for i in range(90, 100)]
    assert "exited with code 3" in str(err.value) and "line 99" in str(err.value) and "line 89" not in str(err.value)
    result = launch([sys.executable, str(child)], log=lambda line: None, cwd=tmp_path, timeout_s=20, check=False)
    assert result.returncode == 3 and not result.ok


def test_worker_logs_are_followed_and_the_failing_workers_lines_survive_noise(tmp_path):
    # msrun's layout without msrun: the child writes worker_N.log / scheduler.log like msrun's workers do.
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker_0.log").write_text("old attempt\n")  # left over from an earlier launch
    os.utime(logs / "worker_0.log", (time.time() - 600, time.time() - 600))
    child = _script(tmp_path, "child.py", f"""
        import sys, time
        w0, w1 = open({str(logs / 'worker_0.log')!r}, "w"), open({str(logs / 'worker_1.log')!r}, "w")
        w0.write("step 1 ok\\n"); w0.flush()
        w1.write("Traceback (most recent call last):\\nLossGuardError: loss is nan\\n"); w1.flush()
        time.sleep(0.5)
        with open({str(logs / 'scheduler.log')!r}, "w") as sched:
            for i in range(300):
                sched.write(f"heartbeat {{i}}\\n")
        w0.write("no newline at the end"); w0.flush()
        print("Distributed job exited with exception")
        sys.exit(1)
    """)
    lines = []
    with pytest.raises(TrainingLaunchError) as err:
        launch([sys.executable, str(child)], log=lines.append, cwd=tmp_path, timeout_s=20, log_dir=logs,
               tail_lines=30)
    assert "[worker_0] old attempt" not in lines
    assert lines.index("[worker_0] step 1 ok") < lines.index("[worker_0] no newline at the end")
    assert "[worker_1] LossGuardError: loss is nan" in lines and "[scheduler] heartbeat 299" in lines
    msg = str(err.value)
    assert "[worker_1] LossGuardError: loss is nan" in msg and "--- last 2 lines of worker_1 ---" in msg
    assert "[scheduler] heartbeat 299" in msg and "[scheduler] heartbeat 250" not in msg
    assert "Distributed job exited with exception" in msg


def test_failure_with_a_fresh_guard_diagnosis_raises_guard_tripped(tmp_path):
    out = tmp_path / "out"
    stale = guard_diagnosis_path(out, 1)
    stale.parent.mkdir(parents=True)
    stale.write_text('{"step": 1, "rank": 1, "message": "stale"}')
    os.utime(stale, (time.time() - 3600, time.time() - 3600))  # left by an earlier attempt
    child = _script(tmp_path, "child.py", f"""
        import json, sys
        open({str(guard_diagnosis_path(out, 0))!r}, "w").write(json.dumps(
            {{"step": 7, "rank": 0, "message": "loss guard stopped training at step 7"}}))
        sys.exit(1)
    """)
    with pytest.raises(GuardTripped) as err:
        launch([sys.executable, str(child)], log=lambda line: None, cwd=tmp_path, timeout_s=20, guard_dir=out)
    assert [d["step"] for d in err.value.diagnoses] == [7]
    assert str(err.value).startswith("loss guard stopped training at step 7")


def test_launcher_killed_with_sigkill_does_not_orphan_the_trainer(tmp_path):
    child = _script(tmp_path, "child.py", f"""
        import os, time
        open({str(tmp_path / 'child.pid')!r}, "w").write(str(os.getpid()))
        time.sleep(600)
    """)
    launcher = _script(tmp_path, "launcher.py", f"""
        import sys
        from pipeline_lib.train.launch import launch
        launch([sys.executable, {str(child)!r}], log=print, cwd={str(tmp_path)!r}, timeout_s=600)
    """)
    proc = subprocess.Popen([sys.executable, str(launcher)], env=subprocess_env())
    pid_file = tmp_path / "child.pid"
    deadline = time.time() + 20
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _wait_dead([int(pid_file.read_text())]) == []


def _fake_entry(tmp_path: Path, body: str) -> dict:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fake_entry.py").write_text(textwrap.dedent(body), encoding="utf-8")
    return {"PYTHONPATH": f"{mods}{os.pathsep}{subprocess_env()['PYTHONPATH']}"}


def test_msrun_single_worker_runs_and_its_log_is_followed(tmp_path):
    env = _fake_entry(tmp_path, """
        import os, sys
        if os.environ.get("MS_ROLE") == "MS_WORKER":
            print("rank", os.environ["RANK_ID"], "of", os.environ["RANK_SIZE"], "args", sys.argv[1:])
    """)
    cmd = build_command(ParallelConfig(master_port=_port()), tmp_path / "r.yaml", log_dir=tmp_path / "msrun",
                        use_msrun=True, entry_module="fake_entry")
    lines = []
    result = launch(cmd, log=lines.append, cwd=tmp_path, timeout_s=120, log_dir=tmp_path / "msrun", env=env)
    assert result.ok
    assert f"[worker_0] rank 0 of 1 args ['--yaml', '{tmp_path / 'r.yaml'}']" in lines


def test_msrun_two_workers_are_followed_per_rank_and_killed_when_the_caller_stops(tmp_path):
    # msrun setsid()s its workers: only a tree kill reaches them. The log callback raising is the
    # same path as a Prefect cancellation arriving as an exception.
    env = _fake_entry(tmp_path, """
        import os, time
        if os.environ.get("MS_ROLE") == "MS_WORKER":
            print("ready rank", os.environ["RANK_ID"], "pid", os.getpid(), flush=True)
            time.sleep(600)
    """)
    p = ParallelConfig(devices=2, data_parallel=2, devices_per_node=2, master_port=_port())
    cmd = build_command(p, "r.yaml", log_dir=tmp_path / "msrun", entry_module="fake_entry")
    ready: dict[str, int] = {}

    class Enough(Exception):
        pass

    def log(line):
        for rank in ("0", "1"):
            if line.startswith(f"[worker_{rank}] ready rank {rank} pid "):
                ready[rank] = int(line.rsplit(" ", 1)[1])
        if len(ready) == 2:
            snapshot()  # both workers are up now: record the tree before stopping (ticks may not have seen it)
            raise Enough

    tree = set()

    def snapshot():  # msrun, its scheduler and workers as seen from this test process
        for proc in psutil.Process().children(recursive=True):
            try:
                if any(part in ("fake_entry", "mindspore.parallel.cluster.run") for part in proc.cmdline()):
                    tree.add(proc.pid)
            except psutil.Error:
                pass

    with pytest.raises(Enough):
        launch(cmd, log=log, cwd=tmp_path, timeout_s=120, log_dir=tmp_path / "msrun", env=env, grace_s=2,
               on_tick=snapshot, tick_s=0.3)
    assert len(tree) >= 3  # msrun + 2 workers (+ scheduler)
    assert set(ready) == {"0", "1"}
    assert _wait_dead(list(ready.values()) + sorted(tree)) == []
