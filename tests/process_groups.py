"""Ending the server and worker processes a fixture started in their own session (start_new_session=True)."""
import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM the process's group, SIGKILL it if still there after `grace` seconds."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
