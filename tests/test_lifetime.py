"""lifetime.py: children started with die_with_parent / exit_when_gone end when their starter is SIGKILLed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline_lib.lifetime import exit_when_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


def test_a_child_started_with_die_with_parent_ends_with_its_killed_parent(sigkill_parent):
    alive, fields = sigkill_parent(f"""
import signal, subprocess, time
from pipeline_lib.lifetime import die_with_parent
plain = subprocess.Popen({SLEEPER!r})
tied = subprocess.Popen({SLEEPER!r}, preexec_fn=die_with_parent(signal.SIGTERM), start_new_session=True)
print("READY", tied.pid, f"plain={{plain.pid}}", flush=True)
time.sleep(300)
""", within=5)
    assert alive == []
    # the control: a child started without it outlives the parent (so the check above can fail)
    plain = int(fields[1].removeprefix("plain="))
    assert os.path.exists(f"/proc/{plain}")
    os.kill(plain, 9)


def test_exit_when_gone_ends_a_process_that_is_not_the_child_of_the_one_it_watches(sigkill_parent):
    # a grandchild (as a forkserver worker is) watching the killed process, not its own parent
    alive, _ = sigkill_parent(f"""
import os, subprocess, sys, time
watcher = subprocess.Popen([sys.executable, "-c",
    "import sys, time; from pipeline_lib.lifetime import exit_when_gone; exit_when_gone(int(sys.argv[1])); "
    "print('watching', flush=True); time.sleep(300)", str(os.getpid())], stdout=subprocess.PIPE, text=True)
watcher.stdout.readline()
print("READY", watcher.pid, flush=True)
time.sleep(300)
""", within=5)
    assert alive == []


def test_exit_when_gone_exits_at_once_when_the_process_is_already_gone():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    code = subprocess.run([sys.executable, "-c", "import sys, time; from pipeline_lib.lifetime import "
                           f"exit_when_gone; exit_when_gone({dead.pid}, code=7); time.sleep(30)"],
                          env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=20).returncode
    assert code == 7
