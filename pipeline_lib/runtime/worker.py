"""Run a MindSpore worker module in its own process and read back its json result.

What: `run_worker("pipeline_lib.evaluate.worker", request, workdir, timeout_s=..., log=...)` writes
`request.json` and runs `python -m <module> --request request.json --result result.json` through the one
launcher (launcher.launch: own session, env.subprocess_env with logs under workdir/logs, the timeout kills
the whole process tree, SIGTERM then SIGKILL after 10 s; the worker gets SIGTERM when the launching thread
dies) from a scratch cwd (mindformers writes ./output). It writes every output line to workdir/worker.log,
forwards the worker's progress lines (those starting with "[worker]") to `log`, and returns the parsed
result. The orchestrating process never imports MindSpore, so a crash or leak in the worker cannot take the
flow down.

The worker contract: it writes result.json with {"ok": true, ...} or {"ok": false, "error_type",
"error"} and exits 0 / 1. Raises WorkerFailed (with the error and the last log lines) when the
worker fails or dies without a result, and WorkerTimeout after `timeout_s`.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from .launcher import launch_module

PROGRESS_PREFIX = "[worker]"


class WorkerFailed(RuntimeError):
    def __init__(self, message: str, error_type: str = "", tail: list[str] | None = None):
        super().__init__(message)
        self.error_type = error_type
        self.tail = tail or []


class WorkerTimeout(WorkerFailed):
    pass


def as_log(log) -> Callable[[str], None]:
    """Accept None, a callable, or a logger with .info."""
    if log is None:
        return lambda msg: None
    if hasattr(log, "info"):
        return log.info
    return log


def run_worker(module: str, request: dict, workdir: str | Path, *, timeout_s: float, log=None,
               keep_log: str | Path | None = None) -> dict:
    """Run the worker; returns its result dict (with "ok": True). keep_log: where the worker's full log is
    copied when it ends, however it ends (the work folder is scratch)."""
    try:
        return _run_worker(module, request, workdir, timeout_s=timeout_s, log=log)
    finally:
        full = Path(workdir) / "worker.log"
        if keep_log is not None and full.exists():
            shutil.copyfile(full, keep_log)


def _run_worker(module: str, request: dict, workdir: str | Path, *, timeout_s: float, log=None) -> dict:
    emit = as_log(log)
    workdir = Path(workdir).resolve()  # the worker runs in workdir/cwd: its arguments and env must be absolute
    workdir.mkdir(parents=True, exist_ok=True)
    req, res = workdir / "request.json", workdir / "result.json"
    req.write_text(json.dumps(request, indent=1, ensure_ascii=False, default=str), encoding="utf-8")
    res.unlink(missing_ok=True)
    started = time.time()
    with open(workdir / "worker.log", "w", encoding="utf-8") as full_log:
        def on_line(line: str) -> None:
            full_log.write(line + "\n")
            if line.startswith(PROGRESS_PREFIX):
                emit(line[len(PROGRESS_PREFIX):].strip())

        done = launch_module(module, ["--request", str(req), "--result", str(res)], cwd=workdir / "cwd",
                             timeout_s=timeout_s, log_dir=workdir / "logs", on_line=on_line)
    if done.timed_out:
        raise WorkerTimeout(f"{module} did not finish within {timeout_s:.0f} s and was killed; raise "
                            "training.timeout_seconds or shrink the work (evaluate.perplexity_max_rows, "
                            "fewer prompts)", "timeout", done.tail)
    result = json.loads(res.read_text(encoding="utf-8")) if res.exists() else None
    if result is None:
        raise WorkerFailed(f"{module} exited with code {done.returncode} after {time.time() - started:.0f} s without "
                           f"a result; last lines:\n" + "\n".join(done.tail[-25:]), "crash", done.tail)
    if not result.get("ok"):
        raise WorkerFailed(f"{module}: {result.get('error_type', 'Error')}: {result.get('error')}",
                           result.get("error_type", ""), done.tail)
    return result


def worker_main(run: Callable[[dict], dict], argv: list[str] | None = None) -> int:
    """Entry helper for worker modules: parse --request/--result, call run(request), write the result."""
    import argparse
    import traceback

    ap = argparse.ArgumentParser()
    ap.add_argument("--request", required=True)
    ap.add_argument("--result", required=True)
    args = ap.parse_args(argv)
    request = json.loads(Path(args.request).read_text(encoding="utf-8"))
    try:
        result = {"ok": True, **run(request)}
        code = 0
    except Exception as err:  # reported to the stage, which raises it with the type and message
        traceback.print_exc()
        result = {"ok": False, "error_type": type(err).__name__, "error": str(err)}
        code = 1
    tmp = Path(args.result + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str), encoding="utf-8")
    os.replace(tmp, args.result)
    return code


def progress(msg: str) -> None:
    """Worker side: a line the stage forwards to its log."""
    print(f"{PROGRESS_PREFIX} {msg}", flush=True)
