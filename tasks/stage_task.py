"""The Prefect task that runs one pipeline stage: a thin wrapper over pipeline_lib.stages.

- Retries (exponential backoff + jitter) follow the failure's cause (pipeline_lib.doctor): a collective timeout or a
  transient error (storage/network failure, lost worker) is retried; OOM (also a trainer SIGKILLed by the kernel OOM
  killer), NaN, a full disk, config and data errors fail at once: retrying the same config cannot fix them. The
  doctor's category and first remedy are appended to the failure message.
- The stage manifest on the run store decides whether a stage is done (so a retry on another
  machine agrees); the Prefect cache (inputs + task source, persisted result) mirrors it so a
  "Retry" of a failed flow run in the UI shows finished stages as Cached. The cache is refreshed
  whenever the manifest does not match, so a stale cache can never skip real work.
- A stage not redone finishes in a Completed state named "Cached", the same word Prefect uses for a
  cache hit after a UI Retry, the CLI summary and the logs use: one word for "finished earlier, not redone".
"""
from __future__ import annotations

import socket
import time

from prefect import get_run_logger, task
from prefect.concurrency.sync import concurrency
from prefect.cache_policies import INPUTS, NO_CACHE, TASK_SOURCE
from prefect.states import Completed
from prefect.tasks import exponential_backoff

from pipeline_lib.config import PipelineConfig, config_from_dict
from pipeline_lib.config.schema import global_batch
from pipeline_lib.config.secrets import public_config
from pipeline_lib.data.errors import NoNewDocuments
from pipeline_lib.doctor.retry import attach_diagnosis, should_retry
from pipeline_lib.nightly.night_ids import resume_hint
from pipeline_lib.stages import SPECS, TransientError, run_stage, stage_done
from pipeline_lib.storage import RunPaths

from tasks import error_log
from tasks.artifacts import ProgressReporter, publish_stage_artifacts
from tasks.error_log import report_outcome, report_stage_error
from tasks.live_training import LiveTraining
from tasks.overview import live_progress
from tasks.stage_log import StageLog

error_log.install()


def node_limit_name(host: str | None = None) -> str:
    """Global concurrency limit (1 slot, made by `llm-pipeline pools`) that keeps a node to one training."""
    return f"ascend-node-{host or socket.gethostname()}"


def node_training_slot(logger):
    """The node's training slot for the length of a training stage, or nothing when the API has no such limit
    (the embedded API of `make demo`, a server `llm-pipeline pools` did not set up). Prefect itself would answer a
    missing limit with a WARNING in every training stage's terminal (`Concurrency limits [...] do not exist -
    skipping acquisition`), which reads as a fault on a laptop; said here once, at INFO, with what it means."""
    from contextlib import nullcontext

    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    name = node_limit_name()
    try:
        with get_client(sync_client=True) as client:
            client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        logger.info(f"no concurrency limit {name!r} on this Prefect API (`llm-pipeline pools --ascend-hosts HOST` "
                    "makes it): nothing keeps a second training off this node")
        return nullcontext()
    return concurrency(name, occupy=1, strict=False, timeout_seconds=None)


TRANSIENT_NAMES = {"EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                   "ConnectTimeoutError", "ProtocolError", "LostWorkerError"}


def is_transient(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    if isinstance(exc, (TransientError, ConnectionError, TimeoutError)):
        return True
    return type(exc).__name__ in TRANSIENT_NAMES


def retry_by_cause(task, task_run, state) -> bool:
    try:
        state.result()
    except BaseException as exc:  # the task's own exception is re-raised by result()
        return retry_by_cause_exc(exc)
    return False


def retry_plan(exc: BaseException, stage: str, run_id: str) -> tuple[bool, str]:
    """(final, what happens next): whether no retry of this task run follows (the cause is not retried, or the
    retries are used up), said as it will happen."""
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    afresh = getattr(exc, "starts_afresh", False)  # e.g. a failed preflight: no checkpoint was written
    restart = (", training starts afresh and preflights again (no checkpoint was written)" if afresh
               else ", training restarts from the last verified checkpoint")
    resume = f"{resume_hint(run_id)} (or Retry in the UI for a deployment run)" + (
        restart if SPECS[stage].multi_node else "")
    if not retry_by_cause_exc(exc):
        diag = getattr(exc, "diagnosis", None)
        category = getattr(diag, "category", "unknown")
        why = (f"retrying the same config cannot fix {category}" if category != "unknown"
               else "not a transient error")
        return True, f"not retried ({why}); {resume}"
    if ctx is None:
        return True, f"not retried (no Prefect task run); {resume}"
    attempt, retries = ctx.task_run.run_count, ctx.task.retries
    if attempt > retries:
        return True, f"not retried again: all {attempt} attempts failed (orchestration.task_retries={retries}); {resume}"
    return False, (f"attempt {attempt} of {retries + 1}: the task retries it after a backoff"
                   + (", from the last verified checkpoint" if SPECS[stage].multi_node else ""))


def retry_by_cause_exc(exc: BaseException) -> bool:
    return should_retry(exc, is_transient(exc))


def _tokens_per_step(cfg: PipelineConfig, stage: str) -> int | None:
    """Tokens per optimizer step of a training stage (the terminal's tokens/s), None for the others."""
    if stage not in ("pretrain", "sft"):
        return None
    return global_batch(cfg, stage) * cfg.model.seq_length


def _run_paths(cfg: PipelineConfig, run_id: str) -> RunPaths:
    return RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)


@task(name="stage", task_run_name="{stage}/{run_id}", retries=2,
      retry_delay_seconds=exponential_backoff(backoff_factor=2), retry_jitter_factor=0.5,
      retry_condition_fn=retry_by_cause, cache_policy=INPUTS + TASK_SOURCE, persist_result=True)
def stage_task(config: dict, run_id: str, stage: str) -> dict:
    """Run `stage` for `run_id` unless its manifest is complete; returns the manifest as a dict."""
    logger = get_run_logger()
    cfg = config_from_dict(config)
    paths = _run_paths(cfg, run_id)
    reporter = ProgressReporter(stage)
    # trainer lines at their level, step lines rate-limited, full log file
    log = StageLog(stage, paths, logger, tokens_per_step=_tokens_per_step(cfg, stage))
    started = time.time()
    try:
        if SPECS[stage].multi_node:
            # loss curve + last steps while training, kept on failure; it refreshes the overview's Running row
            live = LiveTraining(stage, paths, reporter, tokens_per_step=_tokens_per_step(cfg, stage),
                                preflight_steps=cfg.training.preflight_steps,
                                on_update=lambda s, line, link: live_progress(run_id, s, line, link))
            try:
                with node_training_slot(logger):  # held for the whole training run
                    manifest, skipped = run_stage(cfg, paths, stage, log=log, progress=live)
            except BaseException:
                live.finish(failed=True)
                raise
            live.finish(failed=False)
        else:
            manifest, skipped = run_stage(cfg, paths, stage, log=log, progress=reporter)
    except NoNewDocuments as exc:
        if not cfg.data.dedup.defer_publish:  # not a night: a run that fails on it (the handler below)
            raise
        # a night's data left nothing to train: an outcome the nightly decides on (NoNewData), not a red stage
        report_outcome(logger, exc)
        return Completed(name=exc.night_state, message=str(exc), data={
            "stage": stage, "run_id": run_id, "no_new_documents": exc.night_state, "message": str(exc)})
    except Exception as exc:
        log.flush()  # the trainer's last warning before the failure that follows it
        diagnosis = attach_diagnosis(exc, cfg, stage)  # category + first remedy into the message
        # once, doctor first, the traceback in the stage's log file (tasks/error_log.py)
        final, next_step = retry_plan(exc, stage, run_id)
        if final:
            error_log.note_attempts(exc)
        report_stage_error(logger, log, exc, diagnosis, stage, final=final, next_step=next_step)
        raise
    finally:
        log.close()
    reporter.finish()
    result = {"stage": stage, "run_id": run_id, "skipped": skipped, "seconds": round(time.time() - started, 2),
              "stage_uri": paths.stage_uri(stage), "manifest": manifest.__dict__}
    if skipped:
        return Completed(message=f"{stage}: manifest complete, not redone", name="Cached", data=result)
    publish_stage_artifacts(cfg, paths, stage, manifest)
    return result


@task(name="stage", task_run_name="{stage}/{run_id}", cache_policy=NO_CACHE, persist_result=False)
def cached_stage(stage: str, run_id: str, stage_uri: str, finished_at: str, finished_in: str):
    """The record, in this attempt, of a stage finished in an earlier one: a task run in the state Cached (a
    Completed state of that name, as Prefect's own cache hits are), saying when and in which attempt."""
    when = f"finished {finished_at}" + (f" in {finished_in}" if finished_in else "")
    # No data: Prefect links a task's result and the values in it (by object identity: the run_id string, interned
    # stage names) to every later call they reach, so the next stages drew arrows from this node, across its label,
    # and the Cached stage read as an unlabelled dot in the run graph. The state's name and message are the record.
    return Completed(name="Cached", message=f"{stage}: {when}; manifest complete, not redone ({stage_uri})")


def submit_stage(cfg: PipelineConfig, run_id: str, stage: str) -> dict:
    """Call the stage task with this config's retry policy and a cache that follows the manifest."""
    done, _ = stage_done(cfg, _run_paths(cfg, run_id), stage)
    configured = stage_task.with_options(
        retries=cfg.orchestration.task_retries,
        retry_delay_seconds=exponential_backoff(backoff_factor=cfg.orchestration.retry_delay_seconds),
        refresh_cache=not done,
    )
    state = configured(public_config(cfg), run_id, stage, return_state=True)
    result = state.result()  # raises the stage's own exception when it failed
    if state.name == "Cached":  # finished in an earlier attempt of this run: nothing was executed
        result = {**result, "skipped": True, "seconds": 0.0}
    return result
