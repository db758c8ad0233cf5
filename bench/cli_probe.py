"""Where the time of one `llm-pipeline run` goes: the CLI in this process with timers around Prefect's engine
and its API calls (bench/bench_data.py --only overhead runs it; not a product module).

    python bench/cli_probe.py OUT.json run CONFIG --stages data [key=value ...]

Time is attributed exclusively on each thread to the innermost timed frame: a task run's engine (creation,
state changes, hooks, result handling) apart from its function, a flow run's engine apart from its
function, every HTTP request to the Prefect API by path (flow_runs, task_runs, artifacts, logs, ...), result
persistence, the log handler. The main thread's figures are on the run's critical path; other threads'
(the thread-pool task runner's, the log and event workers') are summed apart. Marks (time.time()) for the
imports, the server wait and the end of main() let the caller split the whole process's wall time.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

T0 = time.time()
ROOT = Path(os.environ.get("LLM_PIPELINE_BENCH_TREE") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))

_local = threading.local()
EXCL: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # thread kind -> category -> s
COUNT: dict[str, int] = defaultdict(int)


def _thread() -> str:
    return "main" if threading.current_thread() is threading.main_thread() else "other"


def _push(cat: str) -> None:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    now = time.perf_counter()
    if stack:
        EXCL[_thread()][stack[-1][0]] += now - stack[-1][1]
    stack.append([cat, now])
    COUNT[cat] += 1


def _pop() -> None:
    stack, now = _local.stack, time.perf_counter()
    cat, since = stack.pop()
    EXCL[_thread()][cat] += now - since
    if stack:
        stack[-1][1] = now


MARKS: dict[str, float] = {}
_depth = [0]


def _wrap(owner, name: str, cat, outermost: str | None = None) -> None:
    """owner.name timed as `cat`; `outermost`: also mark when its outermost call starts and ends."""
    fn = getattr(owner, name)

    def timed(*args, **kwargs):
        if outermost and _depth[0] == 0:
            MARKS.setdefault(f"{outermost} start", time.time())
        _depth[0] += bool(outermost)
        _push(cat(args, kwargs) if callable(cat) else cat)
        try:
            return fn(*args, **kwargs)
        finally:
            _pop()
            _depth[0] -= bool(outermost)
            if outermost and _depth[0] == 0:
                MARKS[f"{outermost} end"] = time.time()

    setattr(owner, name, timed)


def _api_path(args, kwargs) -> str:
    request = args[1]
    parts = [p for p in request.url.path.split("/") if p and p != "api"]
    return f"api {request.method} /{parts[0] if parts else ''}"


def install() -> None:
    import httpx
    import prefect.flow_engine as fe
    import prefect.task_engine as te
    from prefect.logging.handlers import APILogHandler
    from prefect.results import ResultStore

    _wrap(httpx.Client, "send", _api_path)
    # a whole run, exclusive of its function and its API calls: creation, contexts, state changes, hooks
    _wrap(fe, "run_flow_sync", "flow run engine", outermost="flow")
    _wrap(te, "run_task_sync", "task run engine")
    _wrap(fe.FlowRunEngine, "call_flow_fn", "flow function")
    _wrap(te.SyncTaskRunEngine, "call_task_fn", "task function")
    for name in ("persist_result_record", "create_result_record"):
        if hasattr(ResultStore, name):
            _wrap(ResultStore, name, "results")
    _wrap(APILogHandler, "emit", "log handler")


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    marks = MARKS
    marks["interpreter"] = T0
    import flows.cli as cli

    marks["cli imported"] = time.time()
    import flows.pipeline  # noqa: F401  (the CLI imports it after loading the config: timed apart)
    marks["flows imported"] = time.time()
    install()
    enter = cli.embedded_api.__enter__

    def timed_enter(self):
        t = time.time()
        try:
            return enter(self)
        finally:
            marks["server wait"] = time.time() - t

    cli.embedded_api.__enter__ = timed_enter
    code = cli.main(argv)
    marks["main returned"] = time.time()
    Path(out).write_text(json.dumps({"code": code, "marks": marks, "count": COUNT,
                                     "excl": {k: dict(v) for k, v in EXCL.items()}}))
    return code


if __name__ == "__main__":
    sys.exit(main())
