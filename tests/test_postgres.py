"""The session's PostgreSQL (tests/postgres.py): a session killed before stopping its cluster does not leave it
running for the next one."""
import subprocess
import sys
from pathlib import Path

import postgres
from suite_rules import machine_skip

OWNER = ("import sys, time; sys.path.insert(0, sys.argv[1]); from postgres import PostgresCluster; "
         "print(PostgresCluster.start().folder, flush=True); time.sleep(600)")


def test_the_cluster_of_a_killed_session_is_stopped_by_the_next_and_a_live_ones_is_not():
    if postgres.available():
        machine_skip(postgres.available())
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(Path(__file__).parent)], stdout=subprocess.PIPE,
                             text=True)
    try:
        folder = Path(owner.stdout.readline().strip())
        assert (folder / "data" / "postmaster.pid").exists()
        assert folder not in postgres.stop_orphans()  # its session is alive
        assert (folder / "data" / "postmaster.pid").exists()
    finally:
        owner.kill()
        owner.wait()
    assert folder in postgres.stop_orphans()
    assert not folder.exists()
