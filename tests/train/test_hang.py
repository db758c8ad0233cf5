"""The hang watchdog through the real launcher: two real rank processes writing the trainer's heartbeats (hang_ranks.py,
with the SIGUSR1 stack dump train.entry registers), one stopped with SIGSTOP mid-run. The mindformers 2-rank run with
the same stop is in test_pretrain_stage.py (dp2)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from pipeline_lib.doctor.classify import diagnose
from pipeline_lib.runtime.launcher import launch
from pipeline_lib.train.hang import HANG_COMPILE_FLOOR_S, HANG_MIN_S, HangWatchdog, first_stopped
from pipeline_lib.train.heartbeat import read_heartbeats

RANKS = Path(__file__).with_name("hang_ranks.py")
ROOT = Path(__file__).resolve().parents[2]


def _stop_rank_after(out: Path, rank: int, step: int, record: dict, done: threading.Event) -> None:
    """SIGSTOP `rank` between two steps once it has finished `step`. The heartbeat read before the signal can be
    stale by the time it lands (the rank may have begun its next step, and its peer gone one step further: seen
    once in a clean-clone run): read again once the process is stopped, and when it is not where it was read, let
    it go on (SIGCONT) and stop it at a later gap."""
    while not done.is_set():
        beat = read_heartbeats(out).get(rank)
        if beat and beat["step"] >= step and beat.get("running") is None:
            os.kill(beat["pid"], signal.SIGSTOP)
            proc, deadline = psutil.Process(beat["pid"]), time.time() + 5
            while proc.status() != psutil.STATUS_STOPPED and time.time() < deadline:
                time.sleep(0.001)
            now = read_heartbeats(out).get(rank)
            if now["step"] == beat["step"] and now.get("running") is None:
                record.update(pid=beat["pid"], step=beat["step"], at=time.time())
                return
            os.kill(beat["pid"], signal.SIGCONT)
        time.sleep(0.005)


def test_a_stopped_rank_is_named_its_peer_stack_dumped_and_the_tree_killed(tmp_path):
    out = tmp_path / "out"
    dog = HangWatchdog(out, [0, 1], timeout_s=1.5)
    record, done = {}, threading.Event()
    threading.Thread(target=_stop_rank_after, args=(out, 1, 5, record, done), daemon=True).start()
    seen = []
    try:
        result = launch([sys.executable, str(RANKS), str(out), "2"], cwd=tmp_path, timeout_s=60, watchdog=dog,
                        watch_s=0.2, grace_s=1, env={"PYTHONPATH": str(ROOT)}, on_line=seen.append, on_start=dog.bind)
    finally:
        done.set()
    assert record, "rank 1 was never stopped"
    assert result.stopped and not result.ok and not result.timed_out
    noticed = dog.report["time"] - record["at"]
    assert 1.5 <= noticed < 1.5 + 2.5, noticed  # the limit, plus polling and the stack dump
    assert dog.report["first_ranks"] == [1] and dog.report["step"] == record["step"]
    assert dog.report["ranks"]["1"]["state"] == psutil.STATUS_STOPPED
    # rank 0 waits for rank 1 at the next step's begin: its Python stack shows where
    assert dog.report["ranks"]["0"]["running"] == record["step"] + 1
    stacks = Path(dog.report["stacks"]).read_text()
    rank0 = stacks.split("=== rank 1")[0]
    assert "=== rank 0" in rank0 and "in wait_for_peers" in rank0 and "in rank_main" in rank0
    assert "no stack: the process is stopped" in stacks.split("=== rank 1")[1]
    # every process of the tree is gone, the stopped one included
    assert not psutil.pid_exists(record["pid"]) or psutil.Process(record["pid"]).status() == psutil.STATUS_ZOMBIE
    # the doctor reads the launcher's lines (the stage's error text, or hang/hang_1.log from the run folder)
    for text in ("\n".join(seen), Path(dog.report["log"]).read_text()):
        diag = diagnose(text)
        assert diag.category == "hang" and diag.retry is True
        assert f"stopped first: rank(s) 1 on host {os.uname().nodename} after step {record['step']}" in diag.evidence[0]
        assert str(dog.report["stacks"]) in diag.remedies[0]["why"]
    assert result.memory is not None and not any("memory evidence" in ln for ln in seen)  # our kill, not an OOM


def test_the_limit_is_derived_from_the_median_step_time_with_floors(tmp_path):
    dog = HangWatchdog(tmp_path, [0], timeout_s=None)
    assert dog.limit_for(started=False)[0] == HANG_COMPILE_FLOOR_S
    dog.step_times = [2.0, 2.0]
    assert dog.limit_for(started=True)[0] == HANG_COMPILE_FLOOR_S  # not enough timed steps yet
    dog.step_times = [2.0, 90.0, 100.0, 80.0]  # a slow 7B step: 10 x the median
    assert dog.limit_for(started=True) == (850.0, "derived: 10 x the median step time 85.00s, at least 600s")
    dog.step_times = [0.1] * 5
    assert dog.limit_for(started=True)[0] == HANG_MIN_S
    set_ = HangWatchdog(tmp_path, [0], timeout_s=30)
    assert set_.limit_for(started=True)[0] == 30 and set_.limit_for(started=False)[0] == HANG_COMPILE_FLOOR_S
    assert HangWatchdog(tmp_path, [0], timeout_s=0)() is None  # off


def test_first_stopped_orders_by_progress_then_process_state():
    beats = {0: {"step": 4, "running": 5}, 1: {"step": 4, "running": None}, 2: {"step": 4, "running": 5}}
    assert first_stopped(beats, [0, 1, 2], {0: "sleeping", 1: "running", 2: "sleeping"}) == [1]
    same = {0: {"step": 4, "running": 5}, 1: {"step": 4, "running": 5}}
    assert first_stopped(same, [0, 1], {0: "sleeping", 1: "stopped"}) == [1]
    assert first_stopped(same, [0, 1], {0: "sleeping", 1: "sleeping"}) == [0, 1]
    assert first_stopped({0: {"step": 9, "running": None}}, [0, 1], {0: "sleeping"}) == [1]  # never beat


def test_a_rank_whose_training_ended_is_not_a_hang(tmp_path):
    from pipeline_lib.train.heartbeat import Heartbeat

    beat = Heartbeat(tmp_path, 0)
    dog = HangWatchdog(tmp_path, [0], timeout_s=0.2)
    beat.begin(0)
    beat.step_begins(1)
    beat.step_ends(1)
    beat.train_ends()  # the final save and the teardown follow: no step, no hang
    time.sleep(0.4)
    assert dog() is None
    beat.ended = False
    beat.step_begins(2)
    path = tmp_path / "heartbeat" / "rank_0.json"  # a gone pid: no SIGUSR1 to this test's own process
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": 2 ** 22 + 17}))
    time.sleep(0.4)
    said = dog()
    assert said[0].startswith("[watchdog] hang: no training step finished for") and "state gone" in said[1]


# A trainer stand-in that registers the SIGUSR1 stack dump as train.entry does, then sleeps (no heartbeat of its own)
DUMPING_CHILD = ("import sys, time; from pipeline_lib.train.heartbeat import register_stack_dump; "
                 "register_stack_dump(sys.argv[1]); print('ready', flush=True); time.sleep(30)")


def _forge(out: Path, rank: int, **fields) -> None:
    """A heartbeat as anyone who can write the run folder can write one: a step finished 10 s ago (a hang)."""
    path = out / "heartbeat" / f"rank_{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "pid": None, "host": "h", "step": 3, "step_end": time.time() - 10,
                                "running": None, "ended": False, "time": time.time(), **fields}))


def test_the_watchdog_signals_only_its_own_tree_and_reads_stacks_only_from_the_run_folder(tmp_path):
    """A heartbeat naming another process made the watchdog send it SIGUSR1 (whose default action kills: a test
    victim died); its stack_file made the watchdog copy any readable file into the stacks report."""
    out = tmp_path / "out"
    secret = tmp_path / "elsewhere.txt"
    secret.write_text("SECRET-CONTENT\n")
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # SIGUSR1 kills it
    dog, warned = HangWatchdog(out, [0, 1], timeout_s=0.5, log=None), []
    dog.log = warned.append

    def said(line: str) -> None:  # once the child's handler is registered: the hang is seen at the next poll
        if line == "ready":
            _forge(out, 0, pid=dog.sampler.pid, stack_file=str(secret))  # the trainer's pid, a stack file outside
            _forge(out, 1, pid=victim.pid, stack_file=str(secret))  # a process the launcher did not start

    try:
        result = launch([sys.executable, "-c", DUMPING_CHILD, str(out)], cwd=tmp_path, timeout_s=60, watchdog=dog,
                        watch_s=0.5, grace_s=1, env={"PYTHONPATH": str(ROOT)}, on_line=said, on_start=dog.bind)
        assert result.stopped and victim.poll() is None, "the victim was signalled"
        stacks = Path(dog.report["stacks"]).read_text()
        assert "SECRET-CONTENT" not in stacks
        assert "in <module>" in stacks.split("=== rank 1")[0]  # rank 0: its own stack file, in the run folder
        assert f"pid {victim.pid} is not in the trainer's process tree (never signalled nor read)" in stacks
        assert dog.report["ranks"]["1"]["state"] == "not in the trainer's process tree"
        assert any(f"names pid {victim.pid}, which is not a process of the trainer's tree" in w for w in warned)
    finally:
        victim.kill()
        victim.wait()
    # a stack file that is a link is not followed, whatever it points at
    from pipeline_lib.train.hang import _grew

    link = out / "stacks" / "pid_4242.txt"
    link.symlink_to(secret)
    assert _grew(out, {"pid": 4242}, 0) is None
    unbound = HangWatchdog(out, [0], timeout_s=0.5)  # not bound to a launch: it signals nothing
    assert unbound._tree_process(os.getpid()) is None


def test_a_malformed_heartbeat_is_ignored_with_a_warning_and_never_stops_training(tmp_path):
    """`"time": "soon"` made read_heartbeats raise TypeError inside the launcher's poll, which killed the trainer."""
    out = tmp_path / "out"
    beats = out / "heartbeat"
    dog, warned = HangWatchdog(out, [0, 1, 2, 3, 4, 5], timeout_s=0.5, log=None), []
    dog.log = warned.append
    beats.mkdir(parents=True)
    (beats / "rank_0.json").write_text(json.dumps({"rank": 0, "pid": 1, "time": "soon", "step": "x"}))
    (beats / "rank_1.json").write_text("[1, 2]")
    (beats / "rank_2.json").write_text("not json {")
    (beats / "rank_3.json").write_text(json.dumps({"rank": 7, "time": time.time(), "step": 1, "step_end": 1.0}))
    (beats / "rank_4.json").symlink_to("/etc/hostname")
    (beats / "rank_5.json").write_text(json.dumps({"rank": 5, "pid": 1, "time": time.time(), "step": 2 ** 80,
                                                   "step_end": float("nan")}).replace("NaN", "1e999"))
    (beats / "rank_x.json").write_text("{}")
    result = launch([sys.executable, "-c", "import time; time.sleep(2.5)"], cwd=tmp_path, timeout_s=60,
                    watchdog=dog, watch_s=0.2, grace_s=1, on_start=dog.bind)
    assert result.ok and result.stopped is None and dog.report is None
    assert len(warned) == len(set(warned)) == 7, warned  # once each, though polled a dozen times
    said = "\n".join(warned)
    for what in ("rank_0.json: not a heartbeat (step='x' is not a count)", "rank_1.json: not a heartbeat (not a "
                 "JSON object but list)", "rank_2.json: not a heartbeat", "rank_3.json: not a heartbeat (rank=7 is "
                 "not the rank of its file name (3))", "rank_4.json: a link, not followed",
                 "rank_5.json: not a heartbeat (step=", "rank_x.json: not named rank_<N>.json"):
        assert f"[watchdog] WARNING: heartbeat ignored: {beats}/{what}" in said, (what, said)
