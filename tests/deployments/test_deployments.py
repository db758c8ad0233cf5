"""deployments/: pools, prefect.yaml, a worker picking a run up, schedules, dispatch to pools.
Everything against a real `prefect server` and real `prefect worker` processes."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect import get_client
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from process_groups import stop_worker

pytestmark = pytest.mark.e2e  # runs the CLI or flows end to end (servers, workers, subprocesses)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def cli(*args, timeout=180):
    env = dict(os.environ, LLM_PIPELINE_HOME=str(ROOT))
    return subprocess.run([str(BIN / "llm-pipeline"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def deployed(prefect_server):
    first = cli("pools", "--ascend-hosts", "node0")
    assert first.returncode == 0, first.stderr
    again = cli("pools", "--ascend-hosts", "node0")
    assert again.returncode == 0 and "created" not in again.stdout, again.stdout
    res = cli("deploy")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def test_deploy_names_the_upcoming_nights_and_says_why_pools_without_workers_are_not_ready(deployed):
    """Issue 48 items 6, 7: upcoming nights are nightly/<date> (their date in the schedule's zone), not random names;
    no worker polls a pool yet, so its deployments are Not Ready: deploy says so and how to fix it."""
    import datetime as dt
    from zoneinfo import ZoneInfo

    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.objects import WorkerStatus

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("nightly-pretrain/nightly")
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))
        stage = client.read_deployment_by_name("pretrain/default")
    scheduled = [r for r in runs if r.state_type == StateType.SCHEDULED]
    assert scheduled, "the server scheduled no nightly run"
    for r in scheduled:
        date = r.expected_start_time.astimezone(ZoneInfo("Asia/Shanghai")).date()
        assert r.name == f"nightly/{date.isoformat()}" and isinstance(date, dt.date), (r.name, r.expected_start_time)
    assert "upcoming run(s) named nightly/<date>" in deployed.stdout
    # the session's server is shared: another test file's ascend worker may still count as online (then deploy
    # rightly names no Not Ready deployment of that pool)
    with get_client(sync_client=True) as client:
        served = any(w.status == WorkerStatus.ONLINE for w in client.read_workers_for_work_pool("ascend"))
    assert served or ("pretrain/default, sft/default, evaluate/default, export/default: Not Ready in the UI: no worker "
                      "polls work pool 'ascend'. Start a worker on work pool `ascend`") in deployed.stdout, \
        deployed.stdout[-2000:]
    assert "Needs a worker on work pool `ascend`" in stage.description


@pytest.fixture(scope="module")
def workers(deployed, tmp_path_factory):
    logs = tmp_path_factory.mktemp("workers")
    procs = []
    for pool in ("cpu", "ascend"):
        env = dict(os.environ, LLM_PIPELINE_HOME=str(ROOT), PREFECT_WORKER_QUERY_SECONDS="1")
        procs.append(subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process"],
                                      cwd=ROOT, env=env, stdout=open(logs / f"{pool}.log", "wb"),
                                      stderr=subprocess.STDOUT, start_new_session=True))
    yield logs
    for p in procs:
        stop_worker(p)


def test_pools_and_limits_created_idempotently(deployed):
    with get_client(sync_client=True) as client:
        cpu = client.read_work_pool("cpu")
        ascend = client.read_work_pool("ascend")
        limit = client.read_global_concurrency_limit_by_name("ascend-node-node0")
    assert cpu.type == ascend.type == "process"
    assert "ASCEND_RT_VISIBLE_DEVICES" in ascend.base_job_template["variables"]["properties"]["env"]["default"]
    assert limit.limit == 1


def test_every_stage_and_the_chain_are_deployed_to_their_pools(deployed):
    with get_client(sync_client=True) as client:
        found = {f"{client.read_flow(d.flow_id).name}/{d.name}": d.work_pool_name for d in client.read_deployments()}
    assert found["llm-pipeline/default"] == "cpu"
    assert found["data/default"] == "cpu"
    for stage in ("pretrain", "sft", "evaluate", "export"):
        assert found[f"{stage}/default"] == "ascend"
    assert found["nightly-pretrain/nightly"] == "cpu"


def test_nightly_schedule_is_registered(deployed):
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("nightly-pretrain/nightly")
    schedules = [s.schedule for s in dep.schedules]
    assert len(schedules) == 1
    assert schedules[0].cron == "0 2 * * *" and schedules[0].timezone == "Asia/Shanghai"
    assert dep.schedules[0].active
    assert "Scheduled `0 2 * * *` in Asia/Shanghai" in dep.description  # the UI says which 2 am


def test_nightly_schedule_comes_from_the_config_with_its_time_zone(tmp_path):
    from deployments import nightly_schedule

    assert nightly_schedule("configs/pipelines/tiny-cpu.yaml") == {"cron": "0 2 * * *", "timezone": "Asia/Shanghai",
                                                                   "active": True}
    assert nightly_schedule("configs/pipelines/tiny-cpu.yaml", ["orchestration.timezone=Europe/Berlin",
                                                                "orchestration.nightly_cron=30 1 * * *"]) == {
        "cron": "30 1 * * *", "timezone": "Europe/Berlin", "active": True}
    with pytest.raises(ValueError, match=r"orchestration.timezone='Mars/Olympus' .* Fix: an IANA name"):
        nightly_schedule("configs/pipelines/tiny-cpu.yaml", ["orchestration.timezone=Mars/Olympus"])


def test_dispatch_failing_child_in_other_pool_fails_parent(workers, tmp_path):
    """Parent on the cpu pool dispatches data (cpu) then pretrain (ascend pool); pretrain fails (the data makes
    fewer rows than one step of 1000). The data child is a worker picking up a run and completing it (the stage
    really ran: its manifest); a chain run of llm-pipeline/default completing on a cpu worker without dispatch:
    tests/ui/test_run_form.py (the same deployment, stages [data], from the UI's form)."""
    run = run_deployment("llm-pipeline/default", timeout=300, poll_interval=1,
                         parameters={"config": "configs/pipelines/tiny-cpu.yaml", "run_id": "dispatch-run",
                                     "stages": ["data", "pretrain"], "dispatch": True,
                                     "overrides": [f"run.output_root={tmp_path}",
                                                   "training.micro_batch_size=1000",
                                                   "training.global_batch_size=1000"]})
    assert run.state.type == StateType.FAILED, run.state
    assert "pretrain/default" in run.state.message or "pretrain" in run.state.message
    with get_client(sync_client=True) as client:
        children = [r for r in client.read_flow_runs() if r.name in ("data/dispatch-run", "pretrain/dispatch-run")]
    states = {r.name: r.state.type for r in children}
    assert states.get("data/dispatch-run") == StateType.COMPLETED, (workers / "cpu.log").read_text()[-3000:]
    assert (tmp_path / "dispatch-run" / "data" / "manifest.json").exists()  # the worker really ran the stage
    assert states.get("pretrain/dispatch-run") == StateType.FAILED
    pools = {r.name: r.work_pool_name for r in children}
    assert pools == {"data/dispatch-run": "cpu", "pretrain/dispatch-run": "ascend"}


def test_deploy_config_sets_what_the_chain_and_the_nightly_run_and_the_schedules_zone(deployed, tmp_path):
    """`llm-pipeline deploy --config PATH` (issue 28 item 6): the user's config, not the shipped tiny one."""
    import yaml

    mine = tmp_path / "mine.yaml"
    doc = yaml.safe_load((ROOT / "configs/pipelines/tiny-cpu.yaml").read_text())
    doc.setdefault("orchestration", {}).update(timezone="Europe/Berlin", nightly_cron="30 1 * * *")
    doc["data"]["shard_mb"] = 16
    mine.write_text(yaml.safe_dump(doc))
    names = ["--name", "llm-pipeline/default", "--name", "nightly"]  # prefect matches flow/name by entrypoint function
    res = cli("deploy", "--config", str(mine), *names)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"deployments run {mine}" in res.stdout and "time zone Europe/Berlin" in res.stdout
    try:
        with get_client(sync_client=True) as client:
            chain = client.read_deployment_by_name("llm-pipeline/default")
            night = client.read_deployment_by_name("nightly-pretrain/nightly")
        assert chain.parameters["config"] == night.parameters["config"] == str(mine)
        # the run form's data section is closed and opens at the user's file (flows/run_form.py)
        assert chain.parameters.get("data") is None
        shard_mb = chain.parameter_openapi_schema["definitions"]["DataConfig"]["properties"]["shard_mb"]
        assert shard_mb["default"] == 16
        assert [(s.schedule.cron, s.schedule.timezone) for s in night.schedules] == [("30 1 * * *", "Europe/Berlin")]
        assert "Scheduled `30 1 * * *` in Europe/Berlin" in night.description
    finally:
        assert cli("deploy", *names).returncode == 0  # the shipped config again, for the session's other tests


def test_deploy_refuses_a_config_that_is_not_there_or_not_valid_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  steps: -3\n")
    for given, said in ((tmp_path / "missing.yaml", "no such file"), (bad, "training.steps=-3")):
        res = cli("deploy", "--config", str(given))
        assert res.returncode == 2, res.stdout + res.stderr
        assert f"--config='{given}'" in res.stderr and said in res.stderr and "Fix:" in res.stderr


def test_a_night_with_nothing_to_train_under_dispatch_ends_named_and_leaves_no_red_run(workers, tmp_path):
    """Issue 48 item 6 under dispatch: a night's data (defer_publish, as the nightly sets it) leaves nothing to train;
    the data stage runs on the cpu pool's worker. Its flow run ends in the state NoUsableData (the same path as
    NoNewData: NoNewDocuments.night_state), and the chain reads that from the child's state and ends so: no run is
    red (it failed on the missing manifest, the child's result being on the worker)."""
    raw = tmp_path / "short.jsonl"
    raw.write_text("".join(f'{{"text": "too short {i}"}}\n' for i in range(8)))  # under the length filter's 20 chars
    run = run_deployment("llm-pipeline/default", timeout=300, poll_interval=1,
                         parameters={"config": "configs/pipelines/tiny-cpu.yaml", "run_id": "dispatch-nodata",
                                     "stages": ["data", "pretrain"], "dispatch": True,
                                     "overrides": [f"run.output_root={tmp_path / 'runs'}", f"data.inputs=[{raw}]",
                                                   "data.dedup.defer_publish=true"]})
    assert (run.state.type, run.state.name) == (StateType.COMPLETED, "NoUsableData"), \
        (run.state, (workers / "cpu.log").read_text()[-3000:])
    assert "no usable document" in run.state.message
    with get_client(sync_client=True) as client:
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
    assert [(r.name, r.state.type, r.state.name, r.work_pool_name) for r in children] == [
        ("data/dispatch-nodata", StateType.COMPLETED, "NoUsableData", "cpu")]  # pretrain: not started
