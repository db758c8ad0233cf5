"""The real data stage as Prefect tasks mapped over shards, against a real Prefect server."""
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from prefect import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

from flows.pipeline import llm_pipeline
from pipeline_lib.config import load_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]


def test_mapped_data_stage_matches_local_pool_and_skips_on_rerun(tmp_path):
    base = [f"run.output_root={tmp_path}", "data.docs_per_shard=150"]
    mapped = load_config("configs/pipelines/tiny-cpu.yaml", base + ["data.executor=prefect"])
    state = llm_pipeline(config=mapped.model_dump(mode="json"), run_id="mapped", stages=["data"], return_state=True)
    assert state.is_completed(), state.message
    data = Path(tmp_path) / "mapped" / "data"
    stats = json.loads((data / "stats.json").read_text())
    assert stats["balanced"] and stats["total"]["read"] > 0
    plan_shards = stats["shards"] if isinstance(stats.get("shards"), int) else None

    # One task run per step, whatever the shard count (tasks/data_tasks.py); the shards themselves show in the
    # progress artifact. Task runs reach the server as events (eventually consistent): poll briefly.
    steps = {f"data/mapped/{s}" for s in ("prep", "dedup", "tokenizer", "tokenize", "mindrecord", "finalize")}
    deadline = time.time() + 60
    while True:
        with get_client(sync_client=True) as client:
            names = sorted(tr.name for tr in client.read_task_runs(
                task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="data/mapped/"))))
        if set(names) >= steps or time.time() > deadline:
            break
        time.sleep(1)
    assert sorted(names) == sorted(steps), names
    assert plan_shards is None or plan_shards >= 2

    with get_client(sync_client=True) as client:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["data-stats"])))
    assert arts and arts[0].type == "table"
    assert "TOTAL" in str(arts[0].data) and str(stats["total"]["read"]) in str(arts[0].data)

    # Same output as the local process-pool executor (output does not depend on how work is spread).
    # A separate output root: the persistent dedup index under the first one has seen every document.
    local = load_config("configs/pipelines/tiny-cpu.yaml", [f"run.output_root={tmp_path}/other", "data.docs_per_shard=150",
                                                            "data.executor=local", "data.num_workers=1"])
    assert llm_pipeline(config=local.model_dump(mode="json"), run_id="local", stages=["data"],
                        return_state=True).is_completed()
    m_mapped = json.loads((data / "manifest.json").read_text())
    m_local = json.loads((Path(tmp_path) / "other" / "local" / "data" / "manifest.json").read_text())
    # stats.json names the run; MindRecord .db index files embed their own path.
    strip = lambda m: {o["path"]: o["sha256"] for o in m["outputs"]  # noqa: E731
                       if not o["path"].endswith(".db") and o["path"] != "stats.json"}
    assert strip(m_mapped) == strip(m_local)
    local_stats = json.loads((Path(tmp_path) / "other" / "local" / "data" / "stats.json").read_text())
    assert local_stats["total"] == stats["total"]

    again = llm_pipeline(config=mapped.model_dump(mode="json"), run_id="mapped", stages=["data"], return_state=True)
    assert again.result()["stages"]["data"]["state"] == "cached"


@contextmanager
def dask_processes(root: Path, n_workers: int = 2):
    """A `dask scheduler` and `n_workers` `dask worker` processes, as a team runs them on its machines: separate
    processes, each in its own working folder, talking TCP on 127.0.0.1 (free ports); the workers import this
    checkout's code (PYTHONPATH), as a team's workers have the package installed. Yields the scheduler address."""
    from distributed import Client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": str(REPO), "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
    procs = []
    try:
        for name, args in [("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"])] + [
                (f"worker-{i}", ["worker", f"tcp://127.0.0.1:{port}", "--host", "127.0.0.1", "--nthreads", "1",
                                 "--nworkers", "1", "--no-dashboard", "--name", f"worker-{i}",
                                 "--local-directory", str(root / f"worker-{i}")]) for i in range(n_workers)]:
            (root / name).mkdir(parents=True, exist_ok=True)
            procs.append(subprocess.Popen([str(bin_dir / "dask"), *args], cwd=root / name, env=env,
                                          stdout=open(root / f"{name}.log", "wb"), stderr=subprocess.STDOUT,
                                          start_new_session=True))
        address = f"tcp://127.0.0.1:{port}"
        with Client(address, timeout=60) as client:
            client.wait_for_workers(n_workers, timeout=120)
        yield address
    finally:
        for proc in reversed(procs):
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def stage_files(folder: Path) -> dict[str, str]:
    """sha256 of every file of a data stage folder but those that name the run: MindRecord .db index files embed
    their own path, stats.json and manifest.json the run id (stats.json is compared apart)."""
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.rglob("*"))
            if f.is_file() and not f.name.endswith(".db") and f.name not in ("stats.json", "manifest.json")}


@pytest.mark.slow
def test_dask_executor_matches_local_and_records_step_task_runs(tmp_path):
    """data.executor=dask on an external scheduler (a `dask scheduler` and two `dask worker` processes, each in its
    own folder, on 127.0.0.1) and on its own local cluster: the same stage folder, file for file (sha256), as the
    local executor; the shard work ran on the Dask workers (plain functions, one Dask task per shard) and every
    step is one task run on the server.
    The shards are sized by bytes (data.shard_mb), and the gzip input is split by the planner into chunk shards."""
    import gzip

    from distributed import Client

    corpus = Path("configs/data/tiny_corpus.jsonl").read_bytes().split(b"\n")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "first.jsonl").write_bytes(b"\n".join(corpus[:220]) + b"\n")
    (tmp_path / "in" / "second.jsonl.gz").write_bytes(gzip.compress(b"\n".join(corpus[220:]), mtime=0))
    inputs = [str(tmp_path / "in" / "first.jsonl"), str(tmp_path / "in" / "second.jsonl.gz")]
    base = [f"data.inputs={json.dumps(inputs)}",
            "data.docs_per_shard=null", "data.shard_mb=0.02"]
    with dask_processes(tmp_path / "cluster") as address:
        on_dask = load_config("configs/pipelines/tiny-cpu.yaml", base + [
            f"run.output_root={tmp_path}/dask", "data.executor=dask", f"data.dask_address={address}"])
        state = llm_pipeline(config=on_dask.model_dump(mode="json"), run_id="dask", stages=["data"],
                             return_state=True)
        assert state.is_completed(), state.message
        with Client(address) as client:  # the scheduler keeps a prefix (the task function's name) per kind it ran
            ran = client.run_on_scheduler(lambda dask_scheduler: {
                name: prefix.state_counts["memory"] for name, prefix in dask_scheduler.task_prefixes.items()})
            where = client.run(os.getcwd)  # each worker in its own folder, not this process's
    assert sorted(Path(w).name for w in where.values()) == ["worker-0", "worker-1"], where
    assert {"prep_shard", "tokenize_shard", "write_mindrecord_files", "write_cleaned_shard"} <= set(ran), ran

    # A separate output root: the persistent dedup index under the first one has seen every document.
    local = load_config("configs/pipelines/tiny-cpu.yaml", base + [
        f"run.output_root={tmp_path}/local", "data.executor=local", "data.num_workers=1"])
    assert llm_pipeline(config=local.model_dump(mode="json"), run_id="local", stages=["data"],
                        return_state=True).is_completed()
    d_dask, d_local = tmp_path / "dask" / "dask" / "data", tmp_path / "local" / "local" / "data"
    m_dask, m_local = (json.loads((d / "manifest.json").read_text()) for d in (d_dask, d_local))
    # MindRecord .db index files embed their own path; stats.json names the run (compared below).
    outputs = lambda m: {o["path"]: o["sha256"] for o in m["outputs"]  # noqa: E731
                         if not o["path"].endswith(".db") and o["path"] != "stats.json"}
    assert outputs(m_dask) == outputs(m_local)
    assert any(p.startswith("mindrecord/") or ".mindrecord" in p for p in outputs(m_dask))
    files = stage_files(d_dask)
    assert files == stage_files(d_local) and "tokenizer/tokenizer.model" in files and len(files) >= 10
    stats_dask, stats_local = (json.loads((d / "stats.json").read_text()) for d in (d_dask, d_local))
    assert stats_dask.pop("run_id") == "dask" and stats_local.pop("run_id") == "local"
    assert stats_dask == stats_local
    # byte-sized shards, and the gzip file was split too (6 + 6 shards)
    assert stats_dask["files"]["second.jsonl.gz"]["read"] > 0 and stats_dask["shards"] >= 10

    # data.dask_address null: the stage starts (and closes) its own local cluster of data.num_workers processes.
    own = load_config("configs/pipelines/tiny-cpu.yaml", base + [
        f"run.output_root={tmp_path}/own", "data.executor=dask", "data.num_workers=2"])
    assert llm_pipeline(config=own.model_dump(mode="json"), run_id="own", stages=["data"],
                        return_state=True).is_completed()
    assert outputs(json.loads((tmp_path / "own" / "own" / "data" / "manifest.json").read_text())) == outputs(m_local)

    # A Dask task per shard of each mapped step; on the server, a task run per step.
    shards = stats_dask["shards"] if isinstance(stats_dask["shards"], int) else len(stats_dask["shards"])
    assert shards >= 2 and ran["prep_shard"] == ran["tokenize_shard"] == shards, (shards, ran)
    steps = {f"data/dask/{s}" for s in ("prep", "dedup", "tokenizer", "tokenize", "mindrecord", "finalize")}
    deadline = time.time() + 60
    while True:
        with get_client(sync_client=True) as client:
            names = {tr.name for tr in client.read_task_runs(
                task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="data/dask/")))}
        if names >= steps or time.time() > deadline:
            break
        time.sleep(1)
    assert names == steps, sorted(names)


def _in_worker() -> dict:
    import os

    import dask

    return {"parent": os.getppid(), "profiler": dask.config.get("distributed.worker.profile.enabled")}


def _http_status(port: int, path: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_local_dask_cluster_serves_only_its_own_clients(tiny_cfg):
    """The local cluster's dashboard listened on 0.0.0.0 and its scheduler ran code for anyone local: now
    127.0.0.1 only (dashboard included), and TLS with temporary credentials a stranger's client does not have.
    Its workers fork from the fork server (not spawned by this process), without distributed's malloc trim
    threshold in their environment and without its profiler (issue 31: CPU they cost, bench/scale.md)."""
    import os

    from distributed import Client

    from flows.data_flow import start_local_cluster

    with start_local_cluster(tiny_cfg.model_copy(update={"data": tiny_cfg.data.model_copy(
            update={"executor": "dask", "num_workers": 1})})) as cluster:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:"), cluster.scheduler_address
        http = cluster.scheduler.http_server  # the dashboard and its routes
        assert {sock.getsockname()[0] for sock in http._sockets.values()} == {"127.0.0.1"}
        assert all("MALLOC_TRIM_THRESHOLD_" not in nanny.pre_spawn_env for nanny in cluster.workers.values())
        with Client(cluster) as ours:
            assert ours.submit(sum, [1, 2]).result(timeout=60) == 3
            (seen,) = ours.run(_in_worker).values()
            assert seen["parent"] != os.getpid() and seen["profiler"] is False, seen
        with pytest.raises(Exception):
            Client(cluster.scheduler_address.replace("tls://", "tcp://"), timeout=3)
        port = next(iter(http._sockets.values())).getsockname()[1]  # issue 45: no dashboard pages unless asked
        assert _http_status(port, "/health") == 200
        assert _http_status(port, "/info/main/workers.html") == 404 and _http_status(port, "/json/counts.json") == 404


@pytest.mark.parametrize("executor", ["local", "prefect"])
def test_a_nights_data_stage_with_nothing_to_train_ends_its_flow_run_in_the_nights_state(tmp_path, executor):
    """The state a dispatching parent reads from the worker's child run (flows/dispatch.py): NoUsableData here (8
    records under the length filter), NoNewData on the same path; Completed, not red, with the reason in its
    message, whichever executor ran the stage."""
    from flows.stage_flows import stage_flow

    raw = tmp_path / "short.jsonl"
    raw.write_text("".join(f'{{"text": "too short {i}"}}\n' for i in range(8)))
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [f"run.output_root={tmp_path}", f"data.inputs=[{raw}]",
                                                          "data.dedup.defer_publish=true", f"data.executor={executor}"])
    state = stage_flow("data")(config=cfg.model_dump(mode="json"), run_id=f"night-{executor}", return_state=True)
    assert (state.type.value, state.name) == ("COMPLETED", "NoUsableData"), state
    assert "no usable document: all 8 records read were rejected or filtered (8 too_short)" in state.message
    assert state.result()["no_new_documents"] == "NoUsableData"  # what a local parent reads (flows/pipeline.py)
