"""The embedded Prefect API server's boot (flows/embedded_server.py), as the CLI starts it: from launch to its
ready byte, wall and CPU of the server process, checkouts interleaved (issue 31; not a product module).

    python bench/bench_server_boot.py [--rounds 5] [--vs-tree OTHER_CHECKOUT]

Each start uses the default Prefect home (the user's database, as `llm-pipeline run` does) and is stopped
once it said it serves. CPU seconds are the server process's own (psutil): steadier than wall on a shared
machine, and on 2 cores the server's boot competes with the CLI's imports and the data pool's warm-up.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def boot(tree: Path) -> tuple[float, float]:
    """(wall to the ready byte, CPU seconds of the server by then) for one start from checkout `tree`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready, ready_w = os.pipe()
    # the environment flows/cli.py gives it (its auth string aside)
    env = {**os.environ, "PYTHONPATH": str(tree), "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flows.embedded_server", str(port), str(os.getpid()), str(ready_w)],
                            env=env, pass_fds=(ready_w,), cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(ready_w)
    try:
        if os.read(ready, 1) != b"1":
            raise RuntimeError(f"the server of {tree} exited with code {proc.wait()} while starting")
        wall = time.perf_counter() - t0
        cpu = psutil.Process(proc.pid).cpu_times()
        return wall, cpu.user + cpu.system
    finally:
        os.close(ready)
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--vs-tree", help="also the server of this checkout, in the same rounds")
    args = ap.parse_args()
    trees = [ROOT] + ([Path(args.vs_tree).resolve()] if args.vs_tree else [])
    runs: dict[Path, list[tuple[float, float, float]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            wall, cpu = boot(tree)
            runs[tree].append((wall, cpu, os.getloadavg()[0]))
            print(f"  round {r + 1}, {tree}: {wall:.2f} s wall, {cpu:.2f} s CPU (load {os.getloadavg()[0]:.1f})", flush=True)
    for tree, rs in runs.items():
        print(f"{tree}: median of {len(rs)}: {statistics.median(x[0] for x in rs):.2f} s wall to ready, "
              f"{statistics.median(x[1] for x in rs):.2f} s CPU; load {', '.join(f'{x[2]:.1f}' for x in rs)}")


if __name__ == "__main__":
    main()
