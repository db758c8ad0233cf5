"""The data stage flow: the steps of pipeline_lib.data.stage as tasks mapped over shards.

data.executor=prefect: shard steps run as concurrent task runs (a thread pool of data.num_workers)
whose prep and tokenize work runs in a shared process pool of as many workers
(pipeline_lib.data.stage.in_worker): task runs in a process pool are not recorded by Prefect 3.9's
server in our tests, so the task runs stay in threads (one per shard in the UI) and only their work
goes to processes.
data.executor=dask: the same task runs go to Dask workers through prefect-dask's DaskTaskRunner
(data.dask_address, or a local cluster of data.num_workers processes); each worker runs its
Prefect task engine and reports the task run to the server itself, and does the work inline.
data.executor=local runs the stage in one task with its own process pool instead.
Every step is idempotent: a retry or a resumed run redoes only unfinished shards.
"""
from __future__ import annotations

import time

from prefect import flow, get_run_logger, unmapped
from prefect.states import Completed
from prefect.task_runners import ThreadPoolTaskRunner

from pipeline_lib.config.secrets import public_config
from pipeline_lib.runtime.contract import StageOutput, StageRun
from pipeline_lib.doctor.retry import attach_diagnosis
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths

from tasks import data_tasks as t
from tasks.artifacts import ProgressReporter, publish_stage_artifacts
from tasks.stage_log import StageLog


def _each_done(futures, progress, step: str) -> None:
    """Wait for all mapped shard tasks, reporting each one done (the progress bar counts shards); then raise the
    first failure in shard order, as `.result()` on the list does."""
    from prefect.futures import as_completed

    futures = list(futures)
    for done, _ in enumerate(as_completed(futures), 1):
        progress(step, done, len(futures))
    for future in futures:
        future.result()


@flow(name="data-shards", flow_run_name="data/{run_id}/shards", log_prints=True)
def _shard_steps(config: dict, run_id: str) -> dict:
    progress = ProgressReporter("data")
    n = t.plan_task(config, run_id)
    progress("prep", 0, n)
    _each_done(t.prep_task.map(unmapped(config), unmapped(run_id), list(range(n))), progress, "prep")
    progress("dedup", 0, 1)
    dup = t.dedup_task(config, run_id)
    get_run_logger().info(f"data: dedup {dup}")
    progress("tokenizer", 0, 1)
    t.tokenizer_task(config, run_id, n)
    progress("tokenize", 0, n)
    _each_done(t.tokenize_task.map(unmapped(config), unmapped(run_id), list(range(n))), progress, "tokenize")
    items = t.mindrecord_plan_task(config, run_id)
    progress("mindrecord", 0, len(items))
    _each_done(t.mindrecord_task.map(unmapped(config), unmapped(run_id), [s for s, _ in items],
                                     [j for _, j in items]), progress, "mindrecord")
    manifest = t.finalize_task(config, run_id)
    progress("finalize", 1, 1)
    return manifest


def _task_runner(cfg):
    """Where the shard task runs go: Dask workers (data.executor=dask) or a thread pool."""
    if cfg.data.executor != "dask":
        return ThreadPoolTaskRunner(max_workers=cfg.data.num_workers)
    from prefect_dask import DaskTaskRunner

    if cfg.data.dask_address:
        return DaskTaskRunner(address=cfg.data.dask_address)
    # One thread per worker process: a shard's work is CPU-bound Python (the GIL), one at a time. The local
    # cluster listens on 127.0.0.1 only (its dashboard too, on a free port), with temporary TLS credentials (security=True):
    # a Dask scheduler runs whatever code a client sends it, so another local account must not be one.
    return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.data.num_workers, "threads_per_worker": 1,
                                          "processes": True, "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0",
                                          "security": True})


def run_mapped_data(cfg, run_id: str) -> dict:
    """Run (or skip) the data stage with shard mapping through the registry (stages.run_stage: skip rule,
    invalidation, manifest); returns the stage-task-shaped result, a Cached state when skipped."""
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    started = time.time()

    def shard_tasks(run: StageRun) -> StageOutput:
        return StageOutput(**_shard_steps.with_options(task_runner=_task_runner(cfg))(config=public_config(cfg),
                                                                                         run_id=run_id))

    log = StageLog("data", paths, get_run_logger())  # the stage's lines in its log file too, its path on the terminal
    try:
        manifest, skipped = run_stage(cfg, paths, "data", log=log, work=shard_tasks)
    except Exception as exc:  # the doctor's category and first remedy in the message, as the stage task does; here,
        attach_diagnosis(exc, cfg, "data")  # outside run_stage, which names a full disk (DiskFull) first
        log.write_only(str(exc))
        raise
    finally:
        log.close()
    result = {"stage": "data", "run_id": run_id, "skipped": skipped, "seconds": round(time.time() - started, 2),
              "stage_uri": paths.stage_uri("data"), "manifest": manifest.__dict__}
    if skipped:
        return Completed(message="data: manifest complete, not redone", name="Cached", data={**result, "seconds": 0.0})
    publish_stage_artifacts(cfg, paths, "data", manifest)
    return result
