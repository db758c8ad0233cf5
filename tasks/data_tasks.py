"""The data stage as Prefect tasks: one task run per step (prep, dedup, tokenizer, tokenize, mindrecord,
finalize), not per shard.

Each task fans its shards out to the run's shard executor (flows/data_flow.py: the shared process pool
of data.num_workers workers, or the Dask cluster of data.executor=dask) and reports which shards are
done in the stage's progress artifact. Every step function of pipeline_lib.data skips work whose
completion marker exists, so a retried task or a resumed run redoes only unfinished shards. A task run
per shard cost the Prefect engine's bookkeeping (run creation, state changes, log records) per shard
on the stage's critical path, and grew with the shard count (bench/data.md, issue 31). Output does not
depend on how the shards are spread.
"""
from __future__ import annotations

import concurrent.futures as cf
from prefect import get_run_logger, task
from prefect.tasks import exponential_backoff

from pipeline_lib.config import config_from_dict
from pipeline_lib.storage import RunPaths

from tasks.error_log import report_outcome
from tasks.stage_task import retry_by_cause

_RETRY = dict(retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=2), retry_jitter_factor=0.5,
              retry_condition_fn=retry_by_cause, persist_result=False, cache_policy=None)


def _ctx(config: dict, run_id: str):
    cfg = config_from_dict(config)
    return cfg, RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)


def local_workers(cfg) -> int:
    """Processes of this machine's shard pool: none with Dask (its workers do the shard work)."""
    return 1 if cfg.data.executor == "dask" else cfg.data.num_workers


def warm_shard_work(cfg, *, imports: bool = True) -> None:
    """In the background: start the shard pool's workers (the fork server imports the data stage,
    ~0.6 s) and, with `imports`, import what the dedup step needs in this process (~0.9 s of CPU in a
    thread: it holds the GIL much of that time). For a caller about to wait on something else: the CLI
    on its Prefect API server, the prep task on its shards."""
    from pipeline_lib.data.stage import DEDUP_IMPORTS, preload, shard_pool, start_workers

    workers = local_workers(cfg)
    start_workers(shard_pool(workers), workers)
    if imports:
        preload(*DEDUP_IMPORTS)


def shard_ranges(indices) -> str:
    """`0-3, 7, 9-10`: shard indices as ranges, for a progress line a person reads."""
    parts, run = [], []
    for k in sorted(indices):
        if run and k == run[-1] + 1:
            run.append(k)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [k]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts)


def fan_out(executor, fn, items: list[tuple], step: str, progress) -> list:
    """fn(*item) for each item on `executor` (inline when None), results in item order; `progress`
    (step, done, total, detail) hears which items are not done yet. The first failure raises at once
    (the rest are cancelled: their markers make the retry skip what did finish)."""
    pending = dict.fromkeys(range(len(items)))

    def tell():
        left = f"not done: shards {shard_ranges(pending)}" if pending else "all done"
        progress(step, len(items) - len(pending), len(items), left)

    tell()
    if executor is None:
        out = []
        for i, item in enumerate(items):
            out.append(fn(*item))
            del pending[i]
            tell()
        return out
    futures = {executor.submit(fn, *item): i for i, item in enumerate(items)}
    try:
        for f in cf.as_completed(futures):
            f.result()
            del pending[futures[f]]
            tell()
        return [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()


def _shards(cfg, paths, n: int) -> list[tuple]:
    return [(cfg, paths, k) for k in range(n)]


@task(name="data-prep", task_run_name="data/{run_id}/prep", **_RETRY)
def prep_task(config: dict, run_id: str, executor, progress) -> tuple[int, int]:
    """List the inputs, plan the shards, prepare every shard, then the dedup step's partitions (each a
    mapped task like a shard: dedup_run.dedup_partition); returns (shards, records read)."""
    from pipeline_lib.data.dedup_run import dedup_partition
    from pipeline_lib.data.prep import dedup_partitions, plan_data_stage, prep_shard
    from pipeline_lib.data.stage import DEDUP_IMPORTS, preload
    from pipeline_lib.data.workspace import Workspace

    cfg, paths = _ctx(config, run_id)
    warm_shard_work(cfg, imports=False)  # nothing new when the CLI did it already
    n = len(plan_data_stage(cfg, paths))
    preload(*DEDUP_IMPORTS)  # the dedup step's imports, while this process waits on the shards
    counts = fan_out(executor.get(), prep_shard, _shards(cfg, paths, n), "prep", progress)
    if cfg.data.dedup.exact or cfg.data.dedup.near:  # the dedup step's partitions, mapped as the shards are
        parts = dedup_partitions(Workspace(cfg, paths))
        fan_out(executor.get(), dedup_partition, [(cfg, paths, p) for p in range(parts)], "dedup-partitions", progress)
    return n, sum(c["read"] for c in counts)


@task(name="data-dedup", task_run_name="data/{run_id}/dedup", **_RETRY)
def dedup_task(config: dict, run_id: str) -> dict:
    from pipeline_lib.data.errors import NoNewDocuments
    from pipeline_lib.data.prep import dedup_stage
    from pipeline_lib.data.stage import warm_mindrecord_writer

    cfg, paths = _ctx(config, run_id)
    if local_workers(cfg) > 1:
        warm_mindrecord_writer()  # MindSpore's import on the core the dedup and tokenizer steps leave idle
    try:
        summary = dedup_stage(cfg, paths)
    except NoNewDocuments as exc:
        report_outcome(get_run_logger(), exc)
        # an outcome, not a fault: this task ends Completed and the flow decides (flows/data_flow.py: a night ends
        # NoNewData without a red task run; a run that is not a nightly fails on it)
        return {"no_new_documents": exc}
    return {k: sum(s[k] for s in summary["shards"]) for k in ("exact_duplicates", "near_duplicates", "kept")}


@task(name="data-tokenizer", task_run_name="data/{run_id}/tokenizer", **_RETRY)
def tokenizer_task(config: dict, run_id: str, n_shards: int, executor) -> dict:
    from pipeline_lib.data.stage import tokenizer_and_cleaned

    cfg, paths = _ctx(config, run_id)  # the cleaned parts are written meanwhile, by the shard executor
    return tokenizer_and_cleaned(cfg, paths, executor.get(), n_shards)


@task(name="data-tokenize", task_run_name="data/{run_id}/tokenize", **_RETRY)
def tokenize_task(config: dict, run_id: str, n_shards: int, executor, progress) -> None:
    from pipeline_lib.data.encode import tokenize_shard

    cfg, paths = _ctx(config, run_id)
    fan_out(executor.get(), tokenize_shard, _shards(cfg, paths, n_shards), "tokenize", progress)


@task(name="data-mindrecord", task_run_name="data/{run_id}/mindrecord", **_RETRY)
def mindrecord_task(config: dict, run_id: str, executor, progress) -> None:
    """Plan the MindRecord files and write them: one group per process that pays MindSpore's import."""
    from pipeline_lib.data.encode import plan_mindrecord, write_mindrecord_files
    from pipeline_lib.data.replay import prepare_replay, reads_earlier_runs
    from pipeline_lib.data.stage import MindRecordLanes, in_mindrecord_writer, mindrecord_work, mindrecord_writer

    cfg, paths = _ctx(config, run_id)
    pool = executor.get()
    local = pool is not None and not executor.remote  # the dedup task warmed a writer in this process
    if local and reads_earlier_runs(cfg):  # read with MindSpore: in the warm writer
        in_mindrecord_writer(prepare_replay, cfg, paths)
    # spread: the executor (with the warm writer as one lane) when the rows pay for the imports; else one group
    spread, groups = mindrecord_work(pool, cfg, paths, plan_mindrecord(cfg, paths), executor.workers, warm=local)
    if local:
        on = MindRecordLanes(mindrecord_writer(), spread) if spread is not None else mindrecord_writer()
    else:  # one group: on one Dask worker, or inline
        on = spread or pool
    fan_out(on, write_mindrecord_files, [(cfg, paths, g) for g in groups], "mindrecord", progress)


@task(name="data-finalize", task_run_name="data/{run_id}/finalize", **_RETRY)
def finalize_task(config: dict, run_id: str) -> dict:
    from pipeline_lib.data.stage import finalize_data_stage

    return finalize_data_stage(*_ctx(config, run_id)).__dict__
