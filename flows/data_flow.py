"""The data stage flow: the steps of pipeline_lib.data.stage as tasks mapped over shards.

Shard steps run as concurrent task runs (a thread pool of data.num_workers; the heavy parts,
MinHash in numpy, sentencepiece encoding and MindRecord writing, run in native code). Task runs
in a process pool are not recorded by Prefect 3.9's server in our tests, so every shard could
not be watched in the UI; data.executor=local runs the stage in one task with its own process
pool instead. Every step is idempotent: a retry or a resumed run redoes only unfinished shards.
"""
from __future__ import annotations

import time

from prefect import flow, get_run_logger, unmapped
from prefect.states import Completed
from prefect.task_runners import ThreadPoolTaskRunner

from pipeline_lib.runtime.contract import StageOutput
from pipeline_lib.stages import record_stage, stage_done
from pipeline_lib.storage import RunPaths, invalidate, read_manifest

from tasks import data_tasks as t
from tasks.artifacts import ProgressReporter, publish_stage_artifacts


@flow(name="data-shards", flow_run_name="data/{run_id}/shards", log_prints=True)
def _shard_steps(config: dict, run_id: str) -> dict:
    progress = ProgressReporter("data")
    n = t.plan_task(config, run_id)
    progress("prep", 0, n)
    t.prep_task.map(unmapped(config), unmapped(run_id), list(range(n))).result()
    progress("dedup", 0, 1)
    dup = t.dedup_task(config, run_id)
    get_run_logger().info(f"data: dedup {dup}")
    progress("tokenizer", 0, 1)
    t.tokenizer_task(config, run_id)
    progress("tokenize", 0, n)
    t.tokenize_task.map(unmapped(config), unmapped(run_id), list(range(n))).result()
    items = t.mindrecord_plan_task(config, run_id)
    progress("mindrecord", 0, len(items))
    t.mindrecord_task.map(unmapped(config), unmapped(run_id), [s for s, _ in items], [j for _, j in items]).result()
    manifest = t.finalize_task(config, run_id)
    progress("finalize", 1, 1)
    return manifest


def run_mapped_data(cfg, run_id: str) -> dict:
    """Run (or skip) the data stage with shard mapping; returns the stage-task-shaped result."""
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    started = time.time()
    done, why = stage_done(cfg, paths, "data")
    uri = paths.stage_uri("data")
    if done:
        result = {"stage": "data", "run_id": run_id, "skipped": True, "seconds": 0.0, "stage_uri": uri,
                  "manifest": read_manifest(uri, paths.endpoint_url).__dict__}
        return Completed(message="data: manifest complete, not redone", name="Cached", data=result)
    get_run_logger().info(f"data: running ({why})")
    invalidate(uri, paths.endpoint_url)
    runner = ThreadPoolTaskRunner(max_workers=cfg.data.num_workers)
    raw = _shard_steps.with_options(task_runner=runner)(config=cfg.model_dump(mode="json"), run_id=run_id)
    manifest = record_stage(cfg, paths, "data", StageOutput(**raw))
    publish_stage_artifacts(cfg, paths, "data", manifest)
    return {"stage": "data", "run_id": run_id, "skipped": False, "seconds": round(time.time() - started, 2),
            "stage_uri": uri, "manifest": manifest.__dict__}
