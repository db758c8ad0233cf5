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
        proc.wait()


def stop_worker(proc: subprocess.Popen) -> None:
    """End an idle `prefect worker start` at teardown. It answers SIGTERM and SIGINT by forwarding SIGINT to itself
    and then keeps polling: measured idle on Prefect 3, still alive 30 s later; the suite paid its 20 s grace per
    worker (60 s of teardowns a session). Its tests are over, no flow run is left on it: kill its group."""
    stop_group(proc, grace=1)
