"""An `ask` night run as a deployment with a concurrency limit, by a real worker, left unanswered: it pauses past
several renewals of its deployment lease (time compressed by lease_site/sitecustomize.py), holds the deployment's
slot while paused, is answered by its own timeout, and ends Held, not Crashed ("Concurrency lease renewal failed ...
410 Gone" crashed such nights 94 s and 171 s into their pause)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.nightly import nightly
from pipeline_lib import stages
from pipeline_lib.nightly import load_state
from process_groups import stop_worker

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("prefect_server", "stage_doubles")]

ROOT = Path(__file__).resolve().parents[2]
POOL, DEPLOYMENT = "ask-lease", "nightly-pretrain/ask-lease"
PAUSE_S = 6  # the night's ask_timeout_hours: 8 renewals of the engine's compressed lease, 1.6 of the held slot's
# (lease_site: every 0.75 s and 3.75 s; the count of renewals is what the test needs, not the seconds)


@pytest.fixture
def worker(tmp_path):
    """A process worker on its own pool whose flow runs load lease_site/sitecustomize.py."""
    env = dict(os.environ, PREFECT_WORKER_QUERY_SECONDS="1", LLM_PIPELINE_HOME=str(ROOT),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent / "lease_site"), str(ROOT)]))
    log = tmp_path / "worker.log"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool", POOL,
                             "--type", "process"], cwd=ROOT, env=env, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    yield log
    stop_worker(proc)


def _deploy_with_limit() -> str:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        except Exception:  # made by an earlier run of this test in the session, or by the worker
            pass
        flow_id = client.create_flow_from_name("nightly-pretrain")
        return str(client.create_deployment(
            flow_id=flow_id, name="ask-lease", entrypoint="flows/nightly.py:nightly", path=str(ROOT),
            work_pool_name=POOL, concurrency_limit=1, enforce_parameter_schema=False,
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]))


def _slots(deployment_id: str) -> int:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(f"deployment:{deployment_id}").active_slots


def test_unanswered_ask_outlives_its_lease_holds_the_slot_and_ends_held(worker, tiny_cfg, tmp_path, monkeypatch):
    from prefect import get_client
    from prefect.deployments import run_deployment

    monkeypatch.setitem(stages.SPECS, "pretrain", dataclasses.replace(stages.SPECS["pretrain"],
                                                                      runner="stage_doubles:pretrain_with_checkpoint"))
    raw = tmp_path / "raw"
    raw.mkdir()
    root = Path(tiny_cfg.run.output_root)
    root.mkdir(parents=True)
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.data.inputs = [str(raw / "*.jsonl")]
    cfg.nightly.gate.on_regression = "ask"
    cfg.nightly.gate.ask_timeout_hours = PAUSE_S / 3600
    (raw / "2026-12-01.jsonl").write_text(json.dumps({"text": "news of the first night"}) + "\n")
    (root / "gate-plan").write_text("1.0")
    first = nightly(config=cfg.model_dump(mode="json"), run_date="2026-12-01", return_state=True)  # in this process
    assert first.name == "Promoted", first.message
    (raw / "2026-12-02.jsonl").write_text(json.dumps({"text": "news of the second night"}) + "\n")
    (root / "gate-plan").write_text("1.5")  # +50% perplexity: over budget, the night asks

    deployment_id = _deploy_with_limit()
    started = time.time()
    run = run_deployment(DEPLOYMENT, parameters={"config": cfg.model_dump(mode="json"), "run_date": "2026-12-02"},
                         timeout=0)
    paused_at, slots_while_paused = None, []
    while time.time() - started < 240:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run.id).state
        if state.is_paused():
            paused_at = paused_at or time.time()
            slots_while_paused.append(_slots(deployment_id))
        if state.is_final():
            break
        time.sleep(1)
    log = worker.read_text()[-4000:]
    assert state.is_final(), (state, log)
    assert paused_at is not None, (state, log)
    assert state.is_completed() and state.name == "Held", (state.type, state.name, state.message, log)
    assert f"no decision within {PAUSE_S / 3600:g} h" in state.message
    assert time.time() - paused_at >= PAUSE_S - 2  # it waited its whole timeout
    # paused, the night kept its deployment's one slot (past the first second, when the server has freed it)
    assert slots_while_paused[2:] and set(slots_while_paused[2:]) == {1}, slots_while_paused
    assert _slots(deployment_id) == 0  # and gave it back
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
    assert not [rec.message for rec in logs if "lease renewal failed" in rec.message.lower()]
    assert any("holding the deployment's concurrency slot" in rec.message for rec in logs)
    state_file = load_state(tiny_cfg)
    assert state_file["latest"]["run_id"] == "nightly-2026-12-01"
    assert state_file["history"][-1]["decided_by"]["reason"] == f"no decision within {PAUSE_S / 3600:g} h"
