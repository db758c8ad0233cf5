"""runtime/lean_process.py: a tool started through it runs exactly as `python -m tool` would (its name, argv,
exit code, traceback, a collector that works during the run), and leaves the interpreter with everything frozen."""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

from pipeline_lib.runtime import lean_process
from pipeline_lib.runtime.launcher import launch_module

PROBE = textwrap.dedent('''
    import atexit, gc, sys
    atexit.register(lambda: print("ATEXIT ran", flush=True))
    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle only the collector frees: it must still run while the tool works
    del a, b
    print("RUN", __name__, sys.argv[1:], "collected", gc.collect() >= 2, flush=True)
    if sys.argv[1:] == ["fail"]:
        raise RuntimeError("probe failed")
    raise SystemExit(int(sys.argv[1]) if sys.argv[1:] else 0)
''')


@pytest.fixture
def probe(tmp_path, monkeypatch):
    (tmp_path / "probe_tool.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def _lean(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline_lib.runtime.lean_process", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_tool_runs_as_main_with_its_arguments_and_exit_code(probe):
    done = _lean("probe_tool", "3", "x")
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["RUN __main__ ['3', 'x'] collected True", "ATEXIT ran"]


def test_a_failing_tool_exits_non_zero_with_its_traceback(probe):
    done = _lean("probe_tool", "fail")
    assert done.returncode == 1 and "RuntimeError: probe failed" in done.stderr


def test_no_module_named_is_an_error():
    done = _lean()
    assert done.returncode != 0 and "usage: python -m pipeline_lib.runtime.lean_process MODULE" in done.stderr


def test_launch_module_starts_tools_through_it(probe):
    result = launch_module("probe_tool", ["5"], cwd=None, timeout_s=60)
    assert result.command[1:4] == ["-m", "pipeline_lib.runtime.lean_process", "probe_tool"]
    assert (result.returncode, result.tail[0]) == (5, "RUN __main__ ['5'] collected True")


def test_imports_done_freezes_and_turns_the_collector_back_on_and_exiting_leaves_it_off():
    frozen, enabled = gc.get_freeze_count(), gc.isenabled()
    try:
        lean_process.importing()
        assert not gc.isenabled()
        lean_process.imports_done()
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        lean_process.exiting()
        assert not gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable() if enabled else gc.disable()
