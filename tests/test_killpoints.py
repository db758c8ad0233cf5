"""The kill-point hook itself: it takes down the whole process tree at the named pass, once, and every
point it knows is exposed by some code path."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pipeline_lib import killpoints
from pipeline_lib.stages import SPECS

SOURCE = Path(killpoints.__file__).parent

CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    from pipeline_lib import killpoints
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(grandchild.pid, flush=True)
    for i in range(3):
        killpoints.reached("data.after_tokenizer")
        print("passed", i, flush=True)
    grandchild.kill()
""")


def _run(tmp_path, kill: str | None) -> tuple[subprocess.CompletedProcess, Path]:
    report = tmp_path / "killed"
    env = {"PYTHONPATH": str(SOURCE.parent), "PATH": "/usr/bin:/bin"}
    if kill:
        env.update({killpoints.KILL_AT: kill, killpoints.KILL_REPORT: str(report)})
    cmd = ["sh", "-c", f'{killpoints.KILL_ROOT}=$$ exec "$0" "$@"', sys.executable, "-c", CHILD]
    return subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=60), report


def _gone(pid: int) -> bool:
    deadline = time.time() + 5
    while time.time() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def test_the_nth_pass_kills_the_whole_tree_and_reports_the_point(tmp_path):
    proc, report = _run(tmp_path, "data.after_tokenizer@2")
    lines = proc.stdout.split("\n")
    assert proc.returncode == -9, proc.stderr
    assert lines[1:] == ["passed 0", ""]  # killed on the second pass, before printing it
    assert _gone(int(lines[0])), "the grandchild outlived the kill"
    assert report.read_text().split()[0] == "data.after_tokenizer"


def test_without_the_variable_or_after_firing_once_nothing_happens(tmp_path):
    proc, _ = _run(tmp_path, None)
    assert proc.returncode == 0 and proc.stdout.count("passed") == 3
    first, report = _run(tmp_path, "data.after_tokenizer")
    assert first.returncode == -9
    again, _ = _run(tmp_path, "data.after_tokenizer")  # same report file: the rerun after the kill runs through
    assert again.returncode == 0 and again.stdout.count("passed") == 3


def test_every_point_is_exposed_by_the_code():
    text = "\n".join(p.read_text(encoding="utf-8") for p in SOURCE.rglob("*.py") if p.name != "killpoints.py")
    literal = set(re.findall(r'reached\("([^"]+)"\)', text)) | set(re.findall(r'arm_checkpoint_writes\("([^"]+)"\)', text))
    literal.add("checkpoint.mid_write")  # arm_checkpoint_writes()'s default point
    if 'reached(f"{stage}.before_manifest")' in text:  # stages.record_stage, for every row of the table
        literal |= {f"{stage}.before_manifest" for stage in SPECS}
    assert sorted(set(killpoints.POINTS) - literal) == []
    assert sorted(literal - set(killpoints.POINTS)) == []


def test_an_unknown_point_named_by_the_suite_is_an_error(monkeypatch):
    monkeypatch.setenv(killpoints.KILL_AT, "no.such.point")
    with pytest.raises(KeyError, match="no.such.point"):
        killpoints.reached("no.such.point")


def test_checkpoint_mid_write_leaves_a_half_tmp_file_and_no_checkpoint(tmp_path):
    """MindSpore's writer has no hook of ours: the armed writer must survive its lazy file-system setup."""
    code = textwrap.dedent(f"""
        import numpy as np, mindspore as ms
        from pipeline_lib.killpoints import arm_checkpoint_writes
        arm_checkpoint_writes()
        ms.save_checkpoint([{{"name": "w", "data": ms.Tensor(np.ones(1000, np.float32))}}], {str(tmp_path / "x.ckpt")!r})
        print("saved", flush=True)
    """)
    env = {"PYTHONPATH": str(SOURCE.parent), "PATH": "/usr/bin:/bin", "GLOG_v": "3",
           killpoints.KILL_AT: "checkpoint.mid_write", killpoints.KILL_REPORT: str(tmp_path / "killed")}
    cmd = ["sh", "-c", f'{killpoints.KILL_ROOT}=$$ exec "$0" "$@"', sys.executable, "-c", code]
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=120)
    assert proc.returncode == -9 and "saved" not in proc.stdout, proc.stderr[-2000:]
    assert not (tmp_path / "x.ckpt").exists() and (tmp_path / "x.tmp").stat().st_size > 0
