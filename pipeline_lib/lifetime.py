"""Processes we start do not outlive the process that started them, also when that one is killed with SIGKILL.

Nothing runs in a SIGKILLed process, so the children must notice on their own:
- `die_with_parent(sig)`: a `subprocess.Popen(preexec_fn=...)` that asks Linux to send `sig` to the child when
  the thread that started it exits (PR_SET_PDEATHSIG). Start long-lived children from a thread that lives as
  long as they should (the main thread, or the one that waits for them). If the parent died between the fork
  and the call, the child signals itself. None (no preexec_fn) off Linux.
- `exit_when_gone(pid)`: for processes whose parent is not the one to watch (multiprocessing forkserver workers
  are children of the fork server, which itself only exits when they do): a daemon thread that ends this
  process with `os._exit` as soon as process `pid` has exited (pidfd where the kernel has it, else polling).
"""
from __future__ import annotations

import ctypes
import os
import select
import sys
import threading
import time
from typing import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """preexec_fn: the child gets `sig` when the launching thread (or the whole parent) dies; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork: the child only makes the call
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before the request was in place
            os.kill(os.getpid(), sig)

    return preexec


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _wait_for_exit(pid: int, poll_s: float) -> None:
    try:
        fd = os.pidfd_open(pid)  # readable once the process has exited; immune to pid reuse
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        select.select([fd], [], [])
        return
    while not _gone(pid):
        time.sleep(poll_s)


def exit_when_gone(pid: int, code: int = 1, poll_s: float = 1.0) -> threading.Thread:
    """End this process (os._exit(code)) once process `pid` has exited (at once when it already has)."""
    if _gone(pid):
        os._exit(code)

    def watch() -> None:
        _wait_for_exit(pid, poll_s)
        os._exit(code)

    thread = threading.Thread(target=watch, name=f"exit-when-{pid}-exits", daemon=True)
    thread.start()
    return thread
