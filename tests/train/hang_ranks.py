"""A stand-in for msrun and its workers in the hang watchdog's launcher tests: `python hang_ranks.py OUT N` starts N
rank processes (`python hang_ranks.py OUT N RANK`) and waits for them. Each rank writes the trainer's real heartbeat
(train.heartbeat, with the SIGUSR1 stack dump registered as train.entry does) around steps of 0.05 s, and before
inside each step waits until every rank has begun it (`wait_for_peers`, a file-based stand-in for the step's
collective). A rank stopped with SIGSTOP between steps therefore blocks its peers inside the next step, as a
stopped rank blocks an allreduce.
"""
from __future__ import annotations

import subprocess
import sys
import time

from pipeline_lib.train.heartbeat import Heartbeat, read_heartbeats, register_stack_dump


def wait_for_peers(out: str, world: int, step: int) -> None:
    while True:
        beats = read_heartbeats(out)
        if len(beats) == world and all(b["step"] >= step or b["running"] == step for b in beats.values()):
            return
        time.sleep(0.01)


def rank_main(out: str, world: int, rank: int, steps: int = 10_000) -> None:
    register_stack_dump(out)
    beat = Heartbeat(out, rank)
    beat.begin(0)
    for step in range(1, steps + 1):
        beat.step_begins(step)
        wait_for_peers(out, world, step)
        time.sleep(0.05)
        beat.step_ends(step)


if __name__ == "__main__":
    out, world = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:
        rank_main(out, world, int(sys.argv[3]))
    else:
        procs = [subprocess.Popen([sys.executable, __file__, out, str(world), str(r)]) for r in range(world)]
        sys.exit(max(p.wait() for p in procs))
