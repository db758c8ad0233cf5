"""The one launcher (runtime/launcher.py): a tool module's timeout kills its whole tree, the report names
how it ended, and nothing else in the engine or the tasks starts a process."""
from __future__ import annotations

import ast
import textwrap
import time
from pathlib import Path

import pytest

from pipeline_lib.runtime.launcher import launch_module

ROOT = Path(__file__).resolve().parents[2]

HANGS = textwrap.dedent('''
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    open(sys.argv[1], "w").write(f"{child.pid}")
    print("LOG_MF_PATH=" + os.environ["LOG_MF_PATH"], flush=True)
    time.sleep(60)
''')


@pytest.fixture
def tool(tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "hanging_tool.py").write_text(HANGS)
    (tmp_path / "mods" / "failing_tool.py").write_text("import sys\nprint('bad input', flush=True)\nsys.exit(4)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mods"))
    return tmp_path


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (killed; with a subreaper in this process, e.g. the kill-point
    harness's, an orphan's zombie waits here until reaped)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_tool_timeout_kills_its_tree_even_a_grandchild_in_its_own_session(tool):
    lines: list[str] = []
    started = time.monotonic()
    result = launch_module("hanging_tool", [str(tool / "pid")], cwd=tool / "cwd", timeout_s=3, grace_s=2,
                           log_dir=tool / "logs", on_line=lines.append)
    assert result.timed_out and not result.ok and time.monotonic() - started < 20
    assert lines[0] == f"LOG_MF_PATH={tool / 'logs' / 'mindformers'}"  # the one subprocess environment
    deadline = time.monotonic() + 5
    while not _gone(int((tool / "pid").read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(int((tool / "pid").read_text()))
    assert "timed out after 3s (timeout_s); the whole process tree was killed" in result.describe("hanging_tool")


def test_a_failed_tool_is_reported_with_its_exit_code_and_last_lines(tool):
    result = launch_module("failing_tool", cwd=None, timeout_s=60)
    assert (result.ok, result.returncode, result.tail) == (False, 4, ["bad input"])
    text = result.describe("failing tool")
    assert text.startswith("failing tool exited with code 4 after") and "bad input" in text


def test_only_the_launcher_starts_processes():
    """Workers, trainers and MindSpore tools all go through runtime/launcher.py (its timeout, tree kill,
    environment); a subprocess call anywhere else in pipeline_lib/ or tasks/ would bypass them."""
    offenders = []
    for path in [*ROOT.joinpath("pipeline_lib").rglob("*.py"), *ROOT.joinpath("tasks").rglob("*.py")]:
        # the rank-table route's per-device starter is what msrun is on the default route: started by the launcher
        # as the trainer command, its timeout and tree kill cover the processes it starts
        if path.relative_to(ROOT).as_posix() in ("pipeline_lib/runtime/launcher.py",
                                                 "pipeline_lib/train/rank_table_launch.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "subprocess":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} subprocess.{func.attr}")
    assert offenders == []
