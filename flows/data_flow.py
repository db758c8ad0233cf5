"""The data stage flow: the steps of pipeline_lib.data.stage as six task runs (prep, dedup, tokenizer,
tokenize, mindrecord, finalize) in the `data` stage flow, each fanning its shards out to a shard executor
and naming the shards done in the stage's progress artifact (tasks/data_tasks.py).

data.executor=prefect: the shard executor is a process pool of data.num_workers workers shared by the
process (pipeline_lib.data.stage.shard_pool; the CLI starts it while its Prefect API server boots).
data.executor=dask: the shard work goes to the Dask cluster as plain functions (no Prefect engine on the
workers): data.dask_address, or a local cluster of data.num_workers processes, started in the background
while the prep task lists the inputs. Work and results move by path: a Dask task gets the config and a
shard index and returns its counts; the shard's files are in the stage folder (s3:// across machines).
The single steps (dedup, tokenizer training, finalize) run in the flow's process.
data.executor=local runs the stage in one task with its own process pool instead.
Every step is idempotent: a retry or a resumed run redoes only unfinished shards.
"""
from __future__ import annotations

import threading
import time

from prefect import get_run_logger
from prefect.states import Completed

from pipeline_lib.config.secrets import public_config
from pipeline_lib.data import fork_server
from pipeline_lib.data.errors import NoNewDocuments
from pipeline_lib.doctor.retry import attach_diagnosis
from pipeline_lib.runtime.contract import StageOutput, StageRun
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths

from tasks import data_tasks as t
from tasks.artifacts import ProgressReporter, publish_stage_artifacts
from tasks.stage_log import StageLog


def local_cluster_kwargs(cfg) -> dict:
    """The stage's own Dask cluster (data.dask_address null): data.num_workers processes of one thread (a
    shard's work is CPU-bound Python, one at a time), on 127.0.0.1 only (its HTTP server too, on a free port: the
    dashboard's pages only with data.dask_dashboard, NO_DASHBOARD),
    with temporary TLS credentials (security=True): a Dask scheduler runs whatever code a client sends it,
    so another local account must not be one."""
    return {"n_workers": cfg.data.num_workers, "threads_per_worker": 1, "processes": True, "host": "127.0.0.1",
            "dashboard_address": "127.0.0.1:0", "security": True,
            # each worker imports the data stage as it starts, while the inputs are listed, not on its first shard
            "preload": ["pipeline_lib.data._warm"]}


# distributed's defaults that cost CPU for this cluster and buy it nothing (bench/scale.md, issue 31), set while
# the cluster starts: the nannies read them then (a worker restarted later by its nanny is spawned as by default).
LOCAL_CLUSTER_CONFIG = {
    # the nanny puts MALLOC_TRIM_THRESHOLD_=65536 in each worker's environment (freed memory back to the OS at once):
    # glibc then no longer raises its mmap threshold, every large numpy/pyarrow buffer is a fresh mmap, and the
    # page faults cost ~3 s of system CPU per worker over a 22 MB stage. The thread caps stay (one thread a worker).
    "distributed.nanny.pre-spawn-environ": {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1},
    # the statistical profiler walks every thread's stack every 10 ms for the dashboard (bokeh is not installed):
    # half the worker's GIL hand-offs (futex calls) with the thread doing the shard's work
    "distributed.worker.profile.enabled": False,
    # each worker forked from one fork server that imported distributed and the data stage (FORKSERVER_PRELOAD),
    # as the local pool's workers are, not a spawned interpreter importing them again
    "distributed.worker.multiprocessing-method": "forkserver",
}
FORKSERVER_PRELOAD = ["distributed", "pipeline_lib.data._warm"]
# Off unless data.dask_dashboard: the scheduler's HTTP server (127.0.0.1, which every local account reaches) serves
# its health check only, not the pages and JSON that show the run's tasks, workers and their logs.
NO_DASHBOARD = {"distributed.scheduler.http.routes": ["distributed.http.health"]}


def start_local_cluster(cfg):
    """The stage's own LocalCluster (local_cluster_kwargs) with LOCAL_CLUSTER_CONFIG, its workers from the fork
    server. The fork server is multiprocessing's, one per process: when this process's local pool
    (pipeline_lib.data.stage) started it first, it preloaded only the data stage and each worker imports
    distributed itself; the outputs are the same either way."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({**LOCAL_CLUSTER_CONFIG, **({} if cfg.data.dask_dashboard else NO_DASHBOARD)}):
        # distributed names its own preload on its first call (itself and its dependencies): ours after it
        fork_server.start(FORKSERVER_PRELOAD)
        return LocalCluster(**local_cluster_kwargs(cfg))


class ShardExecutor:
    """Where a step's shards run: get() is a concurrent.futures executor (or None: inline). With Dask the
    client connects (or the local cluster starts, ~1-3 s: the fork server's imports) in a background thread from
    construction on, so that time overlaps with listing the inputs; get() waits for it."""

    def __init__(self, cfg):
        self.remote = cfg.data.executor == "dask"
        self.workers = cfg.data.num_workers
        self._cluster = self._client = self._error = None
        self._ready = threading.Event()
        if self.remote:
            threading.Thread(target=self._connect, args=(cfg,), name="dask-connect", daemon=True).start()

    def _connect(self, cfg) -> None:
        try:
            from distributed import Client

            if cfg.data.dask_address:
                self._client = Client(cfg.data.dask_address)
            else:
                self._cluster = start_local_cluster(cfg)
                self._client = Client(self._cluster)
            self.workers = max(1, len(self._client.scheduler_info().get("workers", {})) or self.workers)
        except BaseException as exc:  # raised by get(), in the task that needs the cluster
            self._error = exc
        finally:
            self._ready.set()

    def get(self):
        if not self.remote:
            from pipeline_lib.data.stage import shard_pool

            return shard_pool(self.workers)
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._client.get_executor(pure=False)

    def close(self) -> None:
        if not self.remote:
            return
        self._ready.wait()
        for part in (self._client, self._cluster):
            if part is not None:
                part.close()


def shard_steps(config: dict, run_id: str, executor: ShardExecutor) -> dict:
    """The stage's steps as task runs of the calling flow; returns the finalize step's outputs."""
    progress = ProgressReporter("data")  # which shards each step has done
    logger = get_run_logger()
    n, read = t.prep_task(config, run_id, executor, progress)
    logger.info(f"data: {n} shards, read {read} records")
    progress("dedup", 0, 1)
    dedup = t.dedup_task(config, run_id)
    if "no_new_documents" in dedup:
        raise dedup["no_new_documents"]  # run_mapped_data: a night's outcome, any other run's failure
    logger.info(f"data: dedup {dedup}")
    progress("tokenizer", 0, 1)
    t.tokenizer_task(config, run_id, n, executor)
    t.tokenize_task(config, run_id, n, executor, progress)
    t.mindrecord_task(config, run_id, executor, progress)
    manifest = t.finalize_task(config, run_id)
    progress.finish()
    return manifest


def run_mapped_data(cfg, run_id: str) -> dict:
    """Run (or skip) the data stage with shard mapping through the registry (stages.run_stage: skip rule,
    invalidation, manifest); returns the stage-task-shaped result, a Cached state when skipped."""
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    started = time.time()

    def shard_tasks(run: StageRun) -> StageOutput:
        executor = ShardExecutor(cfg)
        try:
            return StageOutput(**shard_steps(public_config(cfg), run_id, executor))
        finally:
            executor.close()

    log = StageLog("data", paths, get_run_logger())  # the stage's lines in its log file too, its path on the terminal
    try:
        manifest, skipped = run_stage(cfg, paths, "data", log=log, work=shard_tasks)
    except NoNewDocuments as exc:
        if cfg.data.dedup.defer_publish:  # a night (the nightly sets it): it ends NoNewData / NoUsableData, not red
            return Completed(name=exc.night_state, message=str(exc),
                             data={"stage": "data", "run_id": run_id, "no_new_documents": exc.night_state,
                                   "message": str(exc)})
        attach_diagnosis(exc, cfg, "data")
        log.write_only(str(exc))
        raise
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
