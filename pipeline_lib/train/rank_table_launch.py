"""The rank-table route: start one trainer process per device of this node, as HCCL's rank table names them.

    python -m pipeline_lib.train.rank_table_launch --rank-table hccl_8p.json --node 0 --log-dir DIR -- -m ENTRY ARGS

msrun (the default route) assigns ranks itself; with parallel.rank_table_file each process gets RANK_TABLE_FILE,
RANK_ID, DEVICE_ID and RANK_SIZE from the table (runtime.rank_table.rank_env), the way mindformers'
scripts/run_distribute.sh starts a job. Each process writes DIR/worker_<rank>.log (the names msrun uses, so the
launcher's log follower reads both routes alike). SIGINT/SIGTERM are passed on to every process; the exit code is
the first non-zero one of the processes (0 when all succeed).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..runtime.rank_table import load_rank_table, rank_env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rank_table_launch")
    ap.add_argument("--rank-table", required=True)
    ap.add_argument("--node", type=int, required=True, help="this server's index in the table's server_list")
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the python arguments of each process")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command after --")
    try:
        envs = rank_env(load_rank_table(args.rank_table), args.node, args.rank_table)
    except ValueError as err:
        print(f"rank_table_launch: {err}", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for env in envs:
        log = open(log_dir / f"worker_{env['RANK_ID']}.log", "w", encoding="utf-8")
        procs.append(subprocess.Popen([sys.executable, *command], env={**os.environ, **env}, stdout=log,
                                      stderr=subprocess.STDOUT))
        log.close()  # the child holds its own descriptor

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    rc = 0
    while procs:
        for p in list(procs):
            code = p.poll()
            if code is None:
                continue
            procs.remove(p)
            if code and not rc:
                rc = code if code > 0 else 128 - code
                forward(signal.SIGTERM, None)  # one rank failed: the others would wait on it forever
        time.sleep(0.2)
    return rc


if __name__ == "__main__":
    sys.exit(main())
