"""`llm-pipeline`: the command line.

  llm-pipeline validate CONFIG [key=value ...]        check a config (exit 2 with the errors)
  llm-pipeline plan --model CONFIG --devices N ...     memory plan and layout advice
  llm-pipeline run CONFIG [--run-id ID] [--stages a,b] [--dispatch] [--submit] [key=value ...]
  llm-pipeline status CONFIG --run-id ID               which stages of a run are complete
  llm-pipeline pools [--ascend-hosts node0,node1]     create work pools and per-node limits (idempotent)
  llm-pipeline deploy [--config PATH] [prefect deploy args]   the deployments, running PATH (default tiny-cpu)
  llm-pipeline nightly CONFIG [--run-date D] [key=value ...]   one nightly continued-pretraining round now
  llm-pipeline nightly promote CONFIG --run-id ID [--reason R]  a night the gate held becomes latest
  llm-pipeline nightly status CONFIG                  per raw file what became of it; what asks for a person
  llm-pipeline dedup-index list|clear CONFIG [--lineage X]   a lineage's incremental dedup index
  llm-pipeline doctor --log FILE [CONFIG] | --run-id ID CONFIG [--json]   why a run failed, what to change
  llm-pipeline diff CONFIG --run-id A --run-id B [--out FILE] [--markdown]   what changed from run A to run B
  llm-pipeline gc CONFIG [--dry-run] [key=value ...]   remove what nightly.retention does not keep; prints what it frees

`run` uses the Prefect API in PREFECT_API_URL, or Prefect's local ephemeral API when unset: nothing
needs to be started by hand. Rerun with the same --run-id to resume: finished stages are Cached (not redone).
"""
from __future__ import annotations

import argparse
import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

# Nothing the CLI starts calls out (flows/offline.py): set before Prefect is imported, inherited by the embedded API
# server and every subprocess.
from flows.offline import telemetry_off  # noqa: E402

telemetry_off()

from pipeline_lib.cli import (dedup_index_main, diff_main, doctor_main, gc_main, plan_main,  # noqa: E402
                              print_warnings, validate_main)
from pipeline_lib.checks import refuse_bad_config  # noqa: E402
from pipeline_lib.config import ConfigError, load_config, validate  # noqa: E402
from pipeline_lib.config.validate import ignored_issues  # noqa: E402
from pipeline_lib.config.secrets import public_config  # noqa: E402
from pipeline_lib.doctor.retry import parse_headline  # noqa: E402
from pipeline_lib.stages import SPECS, nightly_stages, parse_stages, unmet_upstream  # noqa: E402
from pipeline_lib.storage import RunPaths  # noqa: E402
from pipeline_lib.storage.names import check_name  # noqa: E402

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
        from pipeline_lib.doctor.retry import HEADLINE

        print(f"error: {HEADLINE.sub('', failed).strip()}")  # the cause is the next line's
        cause = parse_headline(failed)  # pipeline_lib.doctor's category and first remedy, in the failure message
        if cause:
            print(f"cause: {cause['category']}" + (f": {cause['remedy']}" if cause.get("remedy") else ""))
            print(f"details: llm-pipeline doctor --run-id {summary['run_id']} CONFIG")
        print(f"resume: llm-pipeline run ... --run-id {summary['run_id']}  (finished stages are cached, not redone)")
    print(_ui_hint(embedded))


def drain_prefect_queues(timeout: float = 10) -> None:
    """Send the logs and events this process still has queued; call it while the API server is up (sent
    after it stopped, they are retried for about a minute, then lost)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogHandler, APILogWorker

    APILogHandler().flush()
    APILogWorker.drain_all(timeout=timeout)
    EventsWorker.drain_all(timeout=timeout)


class _EmbeddedServer:
    """Prefect's API server in a uvicorn subprocess (flows/embedded_server.py), launched with the
    environment flags of Prefect's ephemeral one, but without importing Prefect here (~3 s), so the
    CLI can go on while it boots. The process gets SIGTERM when the launching thread dies:
    `llm-pipeline` killed with SIGKILL runs no atexit or finally, and the server would otherwise
    keep its port and ~200 MB forever. It reads the same profile and environment as this process."""

    def __init__(self):
        import secrets

        self.port = self._free_port()
        # Prefect's server auth (basic): the port is on 127.0.0.1, but any local account could otherwise read
        # every run's parameters and artifacts (presigned links) and write variables. Only this process and
        # its children (the environment) know the string.
        self.auth = f"llm-pipeline:{secrets.token_urlsafe(24)}"
        self.server_process = self._run_uvicorn_command()

    @staticmethod
    def _free_port() -> int:
        import random
        import socket

        for port in random.sample(range(8000, 9000), 50):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                    return port
                except OSError:
                    continue
        raise RuntimeError("no free port in 8000-8999 for the embedded Prefect API; set PREFECT_API_URL")

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _run_uvicorn_command(self):
        from pipeline_lib.lifetime import die_with_parent

        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               "PREFECT_SERVER_API_AUTH_STRING": self.auth}
        env.pop("PREFECT_API_URL", None)
        # Not this process's stdout/stderr: a server outliving the CLI must not hold the pipes of whoever
        # reads the CLI's output (it logs errors only; a failed start shows as its exit code).
        self.ready, ready_w = os.pipe()  # one byte when it serves (flows/embedded_server.py): no polling
        cmd = [sys.executable, "-m", "flows.embedded_server", str(self.port), str(os.getpid()), str(ready_w)]
        try:
            return subprocess.Popen(cmd, env=env, pass_fds=(ready_w,),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    preexec_fn=die_with_parent(signal.SIGTERM))
        finally:
            os.close(ready_w)

    def relaunch(self) -> None:
        os.close(self.ready)
        self.port = self._free_port()
        self.server_process = self._run_uvicorn_command()


class embedded_api:
    """Without PREFECT_API_URL, start Prefect's local API once and point every process at it.

    Prefect's own ephemeral mode starts a temporary server per process; the data stage's process
    pool and the trainer subprocesses would each start (and wait for) their own. One server whose
    URL is in the environment is shared by all of them and records into the usual local database.
    The server process ends with this one, also when this one is killed with SIGKILL. Launch it in
    the main thread (the server is tied to the thread that starts it): `launch()` as early as
    possible, then work (load the config, import the flows) while it boots; entering waits only
    for what is left of its start. Leaving stops it without waiting for its shutdown.
    """

    def __init__(self):
        self.server, self.launched = None, False

    def launch(self) -> "embedded_api":
        """Start the server process (not waiting for it); nothing when PREFECT_API_URL is set."""
        if self.launched or os.environ.get("PREFECT_API_URL"):
            self.launched = True
            return self
        self.launched = True
        print("starting the embedded Prefect API (local database; set PREFECT_API_URL to use a server) ...")
        self.server = _EmbeddedServer()
        return self

    def _wait_ready(self, timeout: float = 120) -> None:
        import select
        import time

        server, deadline = self.server, time.monotonic() + timeout
        while time.monotonic() < deadline:
            readable, _, _ = select.select([server.ready], [], [], 0.5)
            if readable and os.read(server.ready, 1) == b"1":
                os.close(server.ready)
                return
            if not readable and server.server_process.poll() is None:
                continue
            code = server.server_process.wait(timeout=30)  # the pipe closed without a byte: it exits
            if code == 3:  # the port was taken meanwhile: another one (as Prefect's start does)
                server.relaunch()
                continue
            raise RuntimeError(f"the embedded Prefect API exited with code {code} while starting")
        raise RuntimeError(f"the embedded Prefect API did not answer within {timeout:g} s; set PREFECT_API_URL "
                           "to a running Prefect server instead")

    def __enter__(self):
        self.launch()
        if self.server is None:
            return self
        from prefect.settings import (PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
                                      temporary_settings)

        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        os.environ["PREFECT_API_URL"] = self.server.api_url
        os.environ["PREFECT_API_AUTH_STRING"] = self.server.auth  # this process's children talk to it too
        # No flow-run heartbeats: they let a server tell that a run's process died, and this server dies with
        # this process; ending each flow waits for its heartbeat thread's 1-second sleep (~0.5-1 s per flow,
        # three flows in a data-stage run).
        self.settings = temporary_settings({PREFECT_API_URL: self.server.api_url, PREFECT_API_AUTH_STRING: self.server.auth,
                                            PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
        self.settings.__enter__()
        # Threads started without this context (a worker's output reader logging to the run, Prefect's own
        # services) read Prefect's process-global settings, made at import without the URL: they would
        # start a second, unmanaged ephemeral server (it outlives a killed CLI). Point the global one here too.
        from prefect.context import SettingsContext, _temporary_global_settings_context

        self.global_settings = _temporary_global_settings_context(SettingsContext.get())
        self.global_settings.__enter__()
        return self

    def stop(self) -> None:
        """SIGTERM to the server, without waiting for its graceful shutdown (it ends on its own)."""
        server, self.server = self.server, None
        if server is None:
            return
        proc = server.server_process
        if proc.poll() is None:
            proc.terminate()

    def __exit__(self, *exc):
        if self.server is not None:
            try:
                drain_prefect_queues()
            except Exception:
                pass
            self.global_settings.__exit__(*exc)
            self.settings.__exit__(*exc)
            os.environ.pop("PREFECT_API_URL", None)
            os.environ.pop("PREFECT_API_AUTH_STRING", None)
            self.stop()
        return False


def run_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="llm-pipeline run", description="Run the pipeline (or some stages).")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ap.add_argument("--run-id", help="reuse a run id to resume it (default: a new dated id)")
    ap.add_argument("--stages", help=f"comma-separated subset of {','.join(SPECS)} (run in that order), "
                    "e.g. data,pretrain")
    ap.add_argument("--dispatch", action="store_true",
                    help="send each stage to its deployment on its work pool (needs a Prefect server)")
    ap.add_argument("--submit", action="store_true",
                    help="create a run of the llm-pipeline/default deployment for a worker to run (retryable "
                         "in the UI) and return; needs a Prefect server, `llm-pipeline deploy` and a worker")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print every log line (Prefect's and the trainers'), not only each stage's start, progress, "
                         "result, warnings and errors; the run's log files hold every line either way")
    args = ap.parse_intermixed_args(argv)
    # boots while the config loads, the inputs are listed and the flows import (--submit talks to a real server)
    api = embedded_api() if args.submit else embedded_api().launch()
    gc.disable()  # until the flows are imported (_imports_done)
    try:
        if args.run_id:
            check_name("--run-id", args.run_id)
        cfg = load_config(args.config, args.overrides)
        stages = parse_stages(args.stages)
        print_warnings(refuse_bad_config(cfg, stages), file=sys.stderr)
        run_id = args.run_id or new_run_id()
        unmet = unmet_upstream(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url), stages)
        if unmet:
            raise ValueError(unmet)
    except (ConfigError, ValueError) as err:
        api.stop()
        gc.enable()
        print(err, file=sys.stderr)
        return 2
    except BaseException:
        api.stop()
        gc.enable()
        raise
    try:
        from flows.pipeline import llm_pipeline
    finally:
        _imports_done()

    if args.submit:
        from flows.submit import SubmitError, submit_run

        try:
            _, url, action = submit_run(args.config, args.overrides, run_id, stages, args.dispatch)
        except SubmitError as err:
            print(err, file=sys.stderr)
            return 2
        said = {"submitted": "submitted run", "retried": "retried the flow run of run"}
        print(f"{said.get(action, f'not resubmitted ({action}): run')} {run_id}: {url}")
        print(f"resume: llm-pipeline run ... --run-id {run_id} --submit, or Retry in the UI")
        return 0
    if not args.dispatch and "data" in stages:
        _warm_data_stage(cfg, run_id, imports=api.server is not None)
    from flows.heartbeats import own_heartbeats
    from tasks import terminal

    screen = terminal.install(verbose=args.verbose)
    try:
        with api, own_heartbeats():  # a running server's heartbeats without each flow's wait (flows/heartbeats.py)
            state = llm_pipeline(config=public_config(cfg), run_id=run_id, stages=stages,
                                 dispatch=args.dispatch, return_state=True)
            return _report(state, cfg, run_id, stages, embedded=api.server is not None)
    finally:
        screen.uninstall()


_FROZE = []


def _imports_done() -> None:
    """After the CLI's imports (Prefect, the flows: ~1M objects), with the collector off during them (~0.1 s
    of its passes): freeze what is there (once per process), so the passes during the run (the dedup step
    runs in this process) do not walk Prefect's objects again and again."""
    if not _FROZE:
        _FROZE.append(True)
        gc.freeze()
    gc.enable()


def _warm_data_stage(cfg, run_id: str, *, imports: bool) -> None:
    """The data stage's worker pool, and with `imports` the dedup step's imports (tasks.data_tasks.warm_shard_work),
    when this run's data stage is not done already: while the embedded API server boots (~3-4 s, one core), or
    while a running server answers the flow's first calls (~0.7 s of waiting; the imports wait for the plan
    then: in a thread now they would take the GIL from the flow's start)."""
    from pipeline_lib.stages import stage_done
    from pipeline_lib.storage import RunPaths
    from tasks.data_tasks import warm_shard_work

    try:
        done = stage_done(cfg, RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url), "data")[0]
    except Exception:  # an unreachable store: the flow says so properly; warming is only a head start
        return
    if not done:
        warm_shard_work(cfg, imports=imports)


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

    try:
        check_name("--run-id", args.run_id)
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    from pipeline_lib.known_runs import unknown_run

    unknown = unknown_run(cfg, args.run_id)  # a typo is not a run whose every stage is "not complete"
    if unknown:
        print(unknown, file=sys.stderr)
        return 2
    print(f"{'stage':<9} {'state':<13} detail")
    for stage, entry in stage_states(cfg, args.run_id).items():
        detail = entry["stage_uri"] if entry["note"] == "complete" else entry["note"]  # not "complete" twice
        print(f"{stage:<9} {entry['state']:<13} {detail}")
    from pipeline_lib.nightly.retention import removed_lines

    for line in removed_lines(cfg, args.run_id):  # a night the nightly's retention thinned says what went
        print(line)
    return 0


def pools_main(argv: list[str]) -> int:
    from deployments.setup_pools import main as setup_main

    return setup_main(argv)


def deploy_main(argv: list[str]) -> int:
    """`prefect deploy` from the project root of deployments/prefect.yaml plus one deployment per stage of
    the stage table (deployments.render_prefect_file); `--config PATH` sets the config file every deployment
    runs (the chain's run form, the nightly's and its schedule's); other args are passed on (default --all)."""
    import tempfile

    import yaml

    from deployments import ROOT, deployed_config, render_prefect_file

    ap = argparse.ArgumentParser(prog="llm-pipeline deploy", add_help=False)
    ap.add_argument("--config", default=None)
    known, argv = ap.parse_known_args(argv)

    from pipeline_lib.runtime.env import subprocess_env

    env = subprocess_env()  # the flows it imports find this repository's pipeline_lib
    env.setdefault("LLM_PIPELINE_HOME", str(ROOT))
    prefect = Path(sys.executable).parent / "prefect"
    with tempfile.TemporaryDirectory() as tmp:
        rendered = Path(tmp) / "prefect.yaml"
        try:
            doc = render_prefect_file(deployed_config(known.config) if known.config else None)
        except (ConfigError, ValueError) as err:
            print(err, file=sys.stderr)
            return 2
        rendered.write_text(yaml.safe_dump(doc, sort_keys=False))
        cmd = [str(prefect), "--no-prompt", "deploy", "--prefect-file", str(rendered), *(argv or ["--all"])]
        code = subprocess.call(cmd, cwd=ROOT, env=env)
        if code == 0 and known.config:
            print(f"deployments run {doc['deployments'][0]['parameters']['config']} (--config; relative paths are "
                  "read from the project root on the workers)")
        for dep in doc["deployments"]:
            for sched in dep.get("schedules") or []:
                print(f"{dep['name']}: scheduled `{sched['cron']}` in time zone {sched['timezone']} "
                      "(orchestration.nightly_cron, orchestration.timezone)")
        nightly = not argv or any("nightly" in a for a in argv)
        if code == 0 and nightly:
            code = _nightly_automations(doc)
        chain = not argv or "--all" in argv or any(a.startswith("llm-pipeline/") for a in argv)
        if code == 0 and (chain or nightly):
            code = _fold_forms(doc, chain, nightly)
        if code == 0:
            _after_deploy(doc, nightly)
        if code == 0 and nightly:
            _decide_form(doc)
        return code


def _fold_forms(doc: dict, chain: bool, nightly: bool) -> int:
    """The chain's and the nightly's run forms: per-run fields first, the sections closed, their fields pre-filled
    with the deployed config file's values when opened (flows/run_form.py)."""
    from deployments import ROOT
    from flows.nightly import FORM_SECTIONS
    from flows.run_form import NIGHT_PER_RUN, PER_RUN, fold_deployed_form
    from pipeline_lib.config.form import form_defaults

    wanted = [(":llm_pipeline", "llm-pipeline", None, PER_RUN)] if chain else []
    wanted += [(":nightly", "nightly-pretrain", FORM_SECTIONS, NIGHT_PER_RUN)] if nightly else []
    for entrypoint, flow, sections, per_run in wanted:
        dep = next(d for d in doc["deployments"] if d["entrypoint"].endswith(entrypoint))
        config = Path(dep["parameters"]["config"])
        try:
            defaults = form_defaults(config if config.is_absolute() else ROOT / config)
            fold_deployed_form(f"{flow}/{dep['name']}", {k: v for k, v in defaults.items()
                                                         if sections is None or k in sections}, per_run)
        except Exception as err:  # noqa: BLE001 (without it the sections would open at the schema's own defaults)
            print(f"the {flow}/{dep['name']} run form was not folded: {type(err).__name__}: {err}", file=sys.stderr)
            return 1
    return 0


def _after_deploy(doc: dict, nightly: bool) -> None:
    """Upcoming nights named nightly/<date> (flows/night_names.py); pools no worker polls named (Not Ready)."""
    from deployments import pools_without_workers
    from flows.night_names import name_deployed_nights

    night = next(d for d in doc["deployments"] if d["entrypoint"].endswith(":nightly"))
    try:
        for sched in (night.get("schedules") or []) if nightly else []:
            name_deployed_nights(f"nightly-pretrain/{night['name']}", sched["timezone"])
        pools_without_workers(doc)
    except Exception as err:  # noqa: BLE001 (the deployments are made: names and notes are extras)
        print(f"after deploy: {type(err).__name__}: {err}", file=sys.stderr)


def _decide_form(doc: dict) -> None:
    """The nightly-decide form's list of held nights, from the nightly deployment's config (flows/night_lineage.py)."""
    from deployments import ROOT
    from flows.night_lineage import refresh_decide_form
    from pipeline_lib.nightly import load_state
    from pipeline_lib.nightly.lineage import held_run_ids

    params = next(d for d in doc["deployments"] if d["entrypoint"].endswith(":nightly"))["parameters"]
    path = Path(params["config"]) if Path(params["config"]).is_absolute() else ROOT / params["config"]
    try:
        cfg = load_config(str(path), params.get("overrides") or [])
        refresh_decide_form(cfg, held_run_ids(load_state(cfg)))
    except Exception as err:  # the deployments are made; the list fills at the next night's end
        print(f"the nightly-decide form's list of held nights was not set: {type(err).__name__}: {err}",
              file=sys.stderr)


def _nightly_automations(doc: dict) -> int:
    """The nightly's Prefect automations (deployments/automations.py) from the nightly deployment's config."""
    from deployments import ROOT
    from deployments.automations import ensure_nightly_automations

    params = next(d for d in doc["deployments"] if d["entrypoint"].endswith(":nightly"))["parameters"]
    path = Path(params["config"]) if Path(params["config"]).is_absolute() else ROOT / params["config"]
    try:
        ensure_nightly_automations(load_config(str(path), params.get("overrides") or []))
    except Exception as err:  # the deployments are made; say what is missing
        print(f"the nightly's automations were not made: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


def nightly_promote_main(argv: list[str]) -> int:
    """`llm-pipeline nightly promote CONFIG --run-id ID [--who NAME] [--reason TEXT]`: a held night becomes latest,
    once its checkpoint's sha256 matches what its run recorded (nightly.verify)."""
    import getpass

    from pipeline_lib.nightly import NotHeld, load_state, promote_held
    from pipeline_lib.nightly.verify import verify_held_checkpoint

    ap = argparse.ArgumentParser(prog="llm-pipeline nightly promote",
                                 description="Promote a night the gate held (it becomes tomorrow's base).")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--run-id", required=True, help="the held night, e.g. nightly-2026-11-02")
    ap.add_argument("--who", default=None, help="who decides (default: this account)")
    ap.add_argument("--reason", default="", help="why (recorded in the nightly state)")
    args = ap.parse_intermixed_args(argv)
    try:
        check_name("--run-id", args.run_id)
        cfg = load_config(args.config, args.overrides)
        held = next((h for h in load_state(cfg).get("held", []) if h["run_id"] == args.run_id), None)
        if held is not None:  # the checkpoint is still the one the night wrote (a missing night: promote_held says)
            verify_held_checkpoint(cfg, held)
        promote_held(cfg, args.run_id, who=args.who or getpass.getuser(), reason=args.reason)
    except (ConfigError, NotHeld, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    print(f"promoted {args.run_id}: it is latest now; the next night continues from it")
    return 0


def nightly_status_main(argv: list[str]) -> int:
    """`llm-pipeline nightly status CONFIG`: the ledger (per raw file its status, nights and documents), the share
    of accepted documents that reached the promoted model, and the attention list."""
    from pipeline_lib.nightly import load_state
    from pipeline_lib.nightly.ledger import render_ledger

    ap = argparse.ArgumentParser(prog="llm-pipeline nightly status",
                                 description="What became of every raw file the nightly read.")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    print(render_ledger(load_state(cfg)))
    return 0


def nightly_main(argv: list[str]) -> int:
    if argv and argv[0] == "promote":
        return nightly_promote_main(argv[1:])
    if argv and argv[0] == "status":
        return nightly_status_main(argv[1:])
    ap = argparse.ArgumentParser(prog="llm-pipeline nightly")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--run-date", help="the night's date, YYYY-MM-DD (default today); names the run nightly-<date>")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print every log line, not only each stage's start, progress, result, warnings and errors")
    args = ap.parse_intermixed_args(argv)
    from flows.nightly import check_run_date

    try:  # refused before anything starts: field, value and fix, exit 2 (as run and validate)
        if args.run_date:
            check_run_date(args.run_date)
        cfg = validate(load_config(args.config, args.overrides), stages=nightly_stages())
    except (ConfigError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    print_warnings(ignored_issues(cfg, nightly_stages()), file=sys.stderr)  # a night runs no sft: said, not refused
    api = embedded_api().launch()
    from flows.nightly import nightly
    from flows.heartbeats import own_heartbeats
    from tasks import terminal

    screen = terminal.install(verbose=args.verbose)  # the same quiet terminal as `run`
    try:
        with api, own_heartbeats():
            # the resolved config, its secrets as env: references: the overrides (a webhook URL among them) never
            # become flow-run parameters
            state = nightly(config=public_config(cfg), run_date=args.run_date, return_state=True)
    finally:
        screen.uninstall()
    # every end of a night is a named Completed state with its message (flows.nightly), or a failure
    print(f"nightly {state.name}: {state.message}" if state.is_completed() else f"nightly failed: {state.message}")
    return 0 if state.is_completed() else 1


COMMANDS = {"validate": validate_main, "plan": plan_main, "run": run_main, "status": status_main,
            "pools": pools_main, "deploy": deploy_main, "nightly": nightly_main, "dedup-index": dedup_index_main,
            "doctor": doctor_main, "diff": diff_main, "gc": gc_main}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
