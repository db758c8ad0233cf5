"""`llm-pipeline`: the command line.

  llm-pipeline validate CONFIG [key=value ...]        check a config (exit 2 with the errors)
  llm-pipeline plan --model CONFIG --devices N ...     memory plan and layout advice
  llm-pipeline run CONFIG [--run-id ID] [--stages a,b] [--dispatch] [--submit] [key=value ...]
  llm-pipeline status CONFIG --run-id ID               which stages of a run are complete
  llm-pipeline pools [--ascend-hosts node0,node1]     create work pools and per-node limits (idempotent)
  llm-pipeline nightly CONFIG [--run-date D] [key=value ...]   one nightly continued-pretraining round now
  llm-pipeline dedup-index list|clear CONFIG [--lineage X]   a lineage's incremental dedup index

`run` uses the Prefect API in PREFECT_API_URL, or Prefect's local ephemeral API when unset: nothing
needs to be started by hand. Rerun with the same --run-id to resume: finished stages are Cached (not redone).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

# The embedded (ephemeral) API writes to the same SQLite file as the UI; its telemetry heartbeat
# only adds lock contention there.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from pipeline_lib.cli import dedup_index_main, plan_main, print_warnings, validate_main  # noqa: E402
from pipeline_lib.config.inputs import validate_inputs  # noqa: E402
from pipeline_lib.config import ConfigError, load_config, validate  # noqa: E402
from pipeline_lib.stages import parse_stages  # noqa: E402

from flows.common import new_run_id  # noqa: E402


def _ui_hint(embedded: bool = False) -> str:
    api = os.environ.get("PREFECT_API_URL")
    if api and not embedded:
        return f"Prefect UI: {api.removesuffix('/api')}/runs"
    return ("Prefect UI: runs are recorded in the local Prefect database; start the UI with "
            "`.venv/bin/prefect server start` and open http://127.0.0.1:4200/runs")


def print_summary(summary: dict, failed: str | None = None, embedded: bool = False) -> None:
    print()
    print(f"run {summary['run_id']}: {'FAILED' if failed else 'done'}")
    print(f"run folder: {summary['run_uri']}")
    for stage, entry in summary["stages"].items():
        seconds = f"{entry['seconds']:>8.1f} s" if "seconds" in entry else " " * 10
        note = f"  ({entry['note']})" if entry.get("note") else ""
        print(f"  {stage:<9} {entry['state']:<13} {seconds}  {entry.get('stage_uri', '')}{note}")
    if failed:
        print(f"error: {failed}")
        print(f"resume: llm-pipeline run ... --run-id {summary['run_id']}  (finished stages are cached, not redone)")
    print(_ui_hint(embedded))


def _api_server_class():
    """Prefect's SubprocessASGIServer (start: free port, health wait; stop: terminate), with a server process
    that gets SIGTERM when this process dies: `llm-pipeline` killed with SIGKILL runs no atexit or finally, and
    Prefect's server would otherwise keep its port and ~200 MB forever."""
    import prefect
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    from pipeline_lib.lifetime import die_with_parent

    class DiesWithParentServer(SubprocessASGIServer):
        _instances: dict = {}  # Prefect keeps one instance per port per class: never hand out Prefect's own

        def _run_uvicorn_command(self):
            # the command and environment Prefect uses for its ephemeral server; only the preexec_fn is added
            env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                   "PREFECT__SERVER_FINAL": "1",
                   **get_current_settings().to_environment_variables(exclude_unset=True)}
            cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
                   "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                   "--log-level", "error", "--lifespan", "on", "--timeout-graceful-shutdown", "5"]
            return subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent(signal.SIGTERM))

    if not callable(getattr(SubprocessASGIServer, "_run_uvicorn_command", None)):
        raise RuntimeError("prefect's SubprocessASGIServer no longer has _run_uvicorn_command: update "
                           "flows/cli.py _api_server_class for the installed prefect version")
    return DiesWithParentServer


class embedded_api:
    """Without PREFECT_API_URL, start Prefect's local API once and point every process at it.

    Prefect's own ephemeral mode starts a temporary server per process; the data stage's process
    pool and the trainer subprocesses would each start (and wait for) their own. One server whose
    URL is in the environment is shared by all of them and records into the usual local database.
    The server process ends with this one, also when this one is killed with SIGKILL. Enter it in
    the main thread: the server is tied to the thread that starts it.
    """

    def __enter__(self):
        self.server = None
        if os.environ.get("PREFECT_API_URL"):
            return self
        from prefect.settings import PREFECT_API_URL, temporary_settings

        print("starting the embedded Prefect API (local database; set PREFECT_API_URL to use a server) ...")
        self.server = _api_server_class()()
        self.server.start(timeout=120)
        os.environ["PREFECT_API_URL"] = self.server.api_url
        self.settings = temporary_settings({PREFECT_API_URL: self.server.api_url})
        self.settings.__enter__()
        return self

    def __exit__(self, *exc):
        if self.server is not None:
            # Send the logs and events still queued while the API is up, not after it stopped.
            try:
                from prefect.events.worker import EventsWorker
                from prefect.logging.handlers import APILogHandler, APILogWorker

                APILogHandler().flush()
                APILogWorker.drain_all(timeout=10)
                EventsWorker.drain_all(timeout=10)
            except Exception:
                pass
            self.settings.__exit__(*exc)
            os.environ.pop("PREFECT_API_URL", None)
            self.server.stop()
        return False


def run_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="llm-pipeline run", description="Run the pipeline (or some stages).")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ap.add_argument("--run-id", help="reuse a run id to resume it (default: a new dated id)")
    ap.add_argument("--stages", help="comma-separated subset, e.g. data,pretrain")
    ap.add_argument("--dispatch", action="store_true",
                    help="send each stage to its deployment on its work pool (needs a Prefect server)")
    ap.add_argument("--submit", action="store_true",
                    help="create a run of the llm-pipeline/default deployment for a worker to run (retryable "
                         "in the UI) and return; needs a Prefect server, `llm-pipeline deploy` and a worker")
    args = ap.parse_intermixed_args(argv)
    try:
        cfg = validate(load_config(args.config, args.overrides))
        stages = parse_stages(args.stages)
        print_warnings(validate_inputs(cfg, stages), file=sys.stderr)
    except (ConfigError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    from flows.pipeline import llm_pipeline, stage_states

    run_id = args.run_id or new_run_id()
    if args.submit:
        from flows.submit import SubmitError, submit_run

        try:
            _, url = submit_run(args.config, args.overrides, run_id, stages, args.dispatch)
        except SubmitError as err:
            print(err, file=sys.stderr)
            return 2
        print(f"submitted run {run_id}: {url}")
        print(f"resume: llm-pipeline run ... --run-id {run_id} --submit, or Retry in the UI")
        return 0
    with embedded_api() as api:
        state = llm_pipeline(config=cfg.model_dump(mode="json"), run_id=run_id, stages=stages,
                             dispatch=args.dispatch, return_state=True)
        return _report(state, cfg, run_id, stages, embedded=api.server is not None)


def _report(state, cfg, run_id: str, stages: list[str], embedded: bool) -> int:
    from flows.pipeline import stage_states

    if state.is_completed():
        summary = state.result()
        print_summary(summary, embedded=embedded)
        return 0
    summary = {"run_id": run_id, "run_uri": None, "stages": {}}
    states = stage_states(cfg, run_id)
    summary["run_uri"] = next(iter(states.values()))["stage_uri"].rsplit("/", 1)[0]
    summary["stages"] = {s: v for s, v in states.items() if s in stages}
    print_summary(summary, failed=state.message, embedded=embedded)
    return 1


def status_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="llm-pipeline status")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--run-id", required=True)
    args = ap.parse_intermixed_args(argv)
    from flows.pipeline import stage_states

    cfg = load_config(args.config, args.overrides)
    for stage, entry in stage_states(cfg, args.run_id).items():
        print(f"{stage:<9} {entry['state']:<13} {entry['note']}")
    return 0


def pools_main(argv: list[str]) -> int:
    from deployments.setup_pools import main as setup_main

    return setup_main(argv)


def deploy_main(argv: list[str]) -> int:
    """`prefect deploy` of deployments/prefect.yaml from the project root (extra args are passed on)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env.setdefault("LLM_PIPELINE_HOME", str(root))
    prefect = Path(sys.executable).parent / "prefect"
    cmd = [str(prefect), "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", *(argv or ["--all"])]
    return subprocess.call(cmd, cwd=root, env=env)


def nightly_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="llm-pipeline nightly")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--run-date", help="the night's date, YYYY-MM-DD (default today); names the run nightly-<date>")
    args = ap.parse_intermixed_args(argv)
    from flows.nightly import nightly

    with embedded_api():
        state = nightly(config=args.config, overrides=args.overrides, run_date=args.run_date, return_state=True)
    print(f"nightly {state.name}: {state.message}" if state.name in ("Skipped", "NoNewData") else
          state.result() if state.is_completed() else f"nightly failed: {state.message}")
    return 0 if state.is_completed() else 1


COMMANDS = {"validate": validate_main, "plan": plan_main, "run": run_main, "status": status_main,
            "pools": pools_main, "deploy": deploy_main, "nightly": nightly_main, "dedup-index": dedup_index_main}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
