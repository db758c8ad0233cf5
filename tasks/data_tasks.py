"""The data stage as Prefect tasks mapped over shards.

Each task wraps one idempotent step of pipeline_lib.data.stage (a step whose completion marker
exists returns at once), so a retried or resumed flow redoes only unfinished shards, and every
shard shows as its own task run in the UI. Output does not depend on how many run at once.
"""
from __future__ import annotations

from prefect import task
from prefect.tasks import exponential_backoff

from pipeline_lib.config import config_from_dict
from pipeline_lib.storage import RunPaths

from tasks.stage_task import retry_by_cause

_RETRY = dict(retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=2), retry_jitter_factor=0.5,
              retry_condition_fn=retry_by_cause, persist_result=False, cache_policy=None)


def _ctx(config: dict, run_id: str):
    cfg = config_from_dict(config)
    return cfg, RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)


def _shard_processes(cfg) -> int:
    """Processes for a shard's CPU work: on Dask the task already runs in a worker process (one task
    at a time per worker), so it works inline; in the thread-pool runner a shared process pool."""
    return 1 if cfg.data.executor == "dask" else cfg.data.num_workers


def warm_shard_work(cfg) -> None:
    """In the background: start the shard pool's workers (the fork server imports the data stage,
    ~0.6 s) and import what the dedup step needs in this process. For a caller about to wait on
    something else: the plan task on listing the inputs, the CLI on its Prefect API server."""
    from pipeline_lib.data.stage import DEDUP_IMPORTS, preload, shard_pool, start_workers

    workers = _shard_processes(cfg)
    start_workers(shard_pool(workers), workers)
    preload(*DEDUP_IMPORTS)


@task(name="data-plan", task_run_name="data/{run_id}/plan", **_RETRY)
def plan_task(config: dict, run_id: str) -> int:
    from pipeline_lib.data.prep import plan_data_stage

    cfg, paths = _ctx(config, run_id)
    warm_shard_work(cfg)  # nothing new when the CLI did it already
    return len(plan_data_stage(cfg, paths))


@task(name="data-prep", task_run_name="data/{run_id}/prep-{index:05d}", **_RETRY)
def prep_task(config: dict, run_id: str, index: int) -> dict:
    from pipeline_lib.data.prep import prep_shard
    from pipeline_lib.data.stage import in_worker

    cfg, paths = _ctx(config, run_id)  # the work runs in a process pool: data.num_workers shards at once
    return in_worker(prep_shard, cfg, paths, index, workers=_shard_processes(cfg))


@task(name="data-dedup", task_run_name="data/{run_id}/dedup", **_RETRY)
def dedup_task(config: dict, run_id: str) -> dict:
    from pipeline_lib.data.prep import dedup_stage
    from pipeline_lib.data.stage import warm_mindrecord_writer

    cfg, paths = _ctx(config, run_id)
    if _shard_processes(cfg) > 1:
        warm_mindrecord_writer()  # MindSpore's import on the core the dedup and tokenizer steps leave idle
    summary = dedup_stage(cfg, paths)
    return {k: sum(s[k] for s in summary["shards"]) for k in ("exact_duplicates", "near_duplicates", "kept")}


@task(name="data-tokenizer", task_run_name="data/{run_id}/tokenizer", **_RETRY)
def tokenizer_task(config: dict, run_id: str, n_shards: int) -> dict:
    from pipeline_lib.data.stage import shard_pool, tokenizer_and_cleaned

    cfg, paths = _ctx(config, run_id)  # the cleaned parts are written meanwhile, in the shard processes
    return tokenizer_and_cleaned(cfg, paths, shard_pool(_shard_processes(cfg)), n_shards)


@task(name="data-tokenize", task_run_name="data/{run_id}/tokenize-{index:05d}", **_RETRY)
def tokenize_task(config: dict, run_id: str, index: int) -> dict:
    from pipeline_lib.data.encode import tokenize_shard
    from pipeline_lib.data.stage import in_worker

    cfg, paths = _ctx(config, run_id)
    return in_worker(tokenize_shard, cfg, paths, index, workers=_shard_processes(cfg))


@task(name="data-mindrecord-plan", task_run_name="data/{run_id}/mindrecord-plan", **_RETRY)
def mindrecord_plan_task(config: dict, run_id: str) -> list[tuple[str, int]]:
    from pipeline_lib.data.encode import plan_mindrecord
    from pipeline_lib.data.replay import prepare_replay, reads_earlier_runs
    from pipeline_lib.data.stage import in_mindrecord_writer

    cfg, paths = _ctx(config, run_id)
    if _shard_processes(cfg) > 1 and reads_earlier_runs(cfg):  # read with MindSpore: in the warm writer
        in_mindrecord_writer(prepare_replay, cfg, paths)
    return [tuple(x) for x in plan_mindrecord(cfg, paths)]


@task(name="data-mindrecord", task_run_name="data/{run_id}/mindrecord-{split}-{j:05d}", **_RETRY)
def mindrecord_task(config: dict, run_id: str, split: str, j: int) -> str:
    from pipeline_lib.data.encode import write_mindrecord_shard
    from pipeline_lib.data.stage import in_mindrecord_writer

    cfg, paths = _ctx(config, run_id)
    if _shard_processes(cfg) > 1:  # the process warmed by the dedup task
        return in_mindrecord_writer(write_mindrecord_shard, cfg, paths, split, j)
    return write_mindrecord_shard(cfg, paths, split, j)


@task(name="data-finalize", task_run_name="data/{run_id}/finalize", **_RETRY)
def finalize_task(config: dict, run_id: str) -> dict:
    from pipeline_lib.data.stage import finalize_data_stage

    return finalize_data_stage(*_ctx(config, run_id)).__dict__
