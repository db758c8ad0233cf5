"""The nightly's Prefect automations (deployments/automations.py) on the session's real server: the deadline's
proactive trigger notifies about a nightly run that has not ended within its window and not about one that ended in
time; the crashed trigger notifies about a crashed run; deploying again updates, never duplicates. Notifications go
through a real Custom Webhook block to a receiver on 127.0.0.1."""
from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path

import pytest

from deployments.automations import (CRASHED, LATE, NIGHT_ENDS, NOTIFY_BLOCK, _upsert, ensure_nightly_automations,
                                     nightly_automations, nightly_window, webhook_block)
from webhook_receiver import WebhookReceiver

ROOT = Path(__file__).resolve().parents[2]
UTC = dt.timezone.utc


def test_window_runs_from_the_schedules_start_to_the_deadline_after_it():
    now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert nightly_window("0 2 * * *", "Asia/Shanghai", "07:00", now) == dt.timedelta(hours=5)
    assert nightly_window("30 23 * * *", "UTC", "06:00", now) == dt.timedelta(hours=6, minutes=30)


def test_every_final_state_the_nightly_names_is_an_end_the_late_trigger_expects():
    source = (ROOT / "flows" / "nightly.py").read_text()
    named = set(re.findall(r'Completed\(name="(\w+)"', source)) | set(re.findall(r'"(Promoted|Held)"', source))
    assert named and named <= set(NIGHT_ENDS), named - set(NIGHT_ENDS)


def _deployment(client, name: str):
    flow_id = client.create_flow_from_name("nightly-pretrain")
    return client.create_deployment(flow_id=flow_id, name=name, entrypoint="flows/nightly.py:nightly",
                                    path=str(ROOT), enforce_parameter_schema=False)


def _run(client, deployment_id, *states):
    run = client.create_flow_run_from_deployment(deployment_id)
    for state in states:
        client.set_flow_run_state(run.id, state, force=True)
        assert client.read_flow_run(run.id).state.name == state.name
    return run


@pytest.mark.e2e
@pytest.mark.slow
def test_the_late_trigger_fires_for_a_night_not_ended_in_time_only_and_crashed_failed_held_fire(prefect_server):
    from prefect import get_client
    from prefect.states import Completed, Crashed, Failed, Running

    with WebhookReceiver() as hook, get_client(sync_client=True) as client:
        dep_id = _deployment(client, "automation-test")
        block_id = webhook_block(hook.url, "nightly-automation-test")
        # the team's own block: Failed and Held are notified too (with the webhook block the night posts them itself)
        made = nightly_automations(dep_id, block_id, "07:00", dt.timedelta(seconds=12), own_block=True,
                                   tag=" (test)")
        for _, automation in made:
            _upsert(client, automation)
        try:
            late = _run(client, dep_id, Running())
            in_time = _run(client, dep_id, Running(), Completed(name="Promoted"))
            crashed = _run(client, dep_id, Running(), Crashed(message="the worker's node lost power"))
            failed = _run(client, dep_id, Running(), Failed(message="pretrain: out of memory"))
            held = _run(client, dep_id, Running(), Completed(name="Held", message="general_zh perplexity +12%"))
            deadline = time.time() + 60
            while time.time() < deadline and not (
                    any(str(late.id) in b["message"] for b in hook.received if b["name"] == "NotDoneByDeadline")
                    and {"Crashed", "Failed", "Held"} <= {b["name"] for b in hook.received}):
                time.sleep(1)
            time.sleep(3)  # anything else the triggers would send arrives by now
        finally:
            for name, _ in made:
                for found in client.read_automations_by_name(name):
                    client.delete_automation(found.id)
            client.delete_block_document(block_id)
    late_notes = [b for b in hook.received if b["name"] == "NotDoneByDeadline"]
    assert [str(late.id) in b["message"] for b in late_notes] == [True], hook.received
    assert "deadline 07:00 has passed" in late_notes[0]["message"] and late_notes[0]["flow"] == "nightly-pretrain"
    assert not any(str(in_time.id) in b["message"] for b in hook.received)  # ended in time: nothing
    for name, run, said in (("Crashed", crashed, "the worker's node lost power"), ("Failed", failed, "out of memory"),
                            ("Held", held, "general_zh perplexity +12%")):
        notes = [b for b in hook.received if b["name"] == name]
        assert len(notes) == 1 and str(run.id) in notes[0]["message"] and said in notes[0]["message"], hook.received


@pytest.mark.e2e
def test_deploy_makes_the_automations_once_keeps_the_webhook_secret_and_updates_on_redeploy(prefect_server, capsys):
    from prefect import get_client

    from pipeline_lib.config import load_config

    cfg = load_config("configs/pipelines/tiny-cpu.yaml", ["nightly.deadline=07:00"])
    cfg.orchestration.failure_webhook_url = "http://127.0.0.1:9/hook?token=s3cr3t-t0ken"
    with get_client(sync_client=True) as client:
        _deployment(client, "automation-redeploy")
        try:
            first = ensure_nightly_automations(cfg, "nightly-pretrain/automation-redeploy", tag=" (redeploy)")
            again = ensure_nightly_automations(cfg, "nightly-pretrain/automation-redeploy", tag=" (redeploy)")
            assert f"automation '{LATE} (redeploy)': created" in first
            assert f"automation '{LATE} (redeploy)': updated" in again
            assert f"automation '{CRASHED} (redeploy)': updated" in again
            late = client.read_automations_by_name(f"{LATE} (redeploy)")
            assert len(late) == 1 and late[0].trigger.within == dt.timedelta(hours=5)  # 02:00 -> 07:00 Shanghai
            assert len(client.read_automations_by_name(f"{CRASHED} (redeploy)")) == 1
            # the secret is in the block's secrets only: not in its readable fields, the automations or the output
            doc = client.read_block_document_by_name(NOTIFY_BLOCK, "custom-webhook", include_secrets=False)
            assert "s3cr3t" not in str(doc.data) and doc.data["url"] == "{{webhook_url}}"
            assert "s3cr3t" not in str([a.model_dump() for a in late]) and "s3cr3t" not in capsys.readouterr().out
            # no deadline any more: the late automation goes, the crashed one stays
            cfg.nightly.deadline = None
            third = ensure_nightly_automations(cfg, "nightly-pretrain/automation-redeploy", tag=" (redeploy)")
            assert f"automation '{LATE} (redeploy)': deleted (no nightly.deadline)" in third
            assert client.read_automations_by_name(f"{LATE} (redeploy)") == []
        finally:
            for name in (f"{LATE} (redeploy)", f"{CRASHED} (redeploy)"):
                for found in client.read_automations_by_name(name):
                    client.delete_automation(found.id)
            for doc in client.read_block_documents():  # the session's other deploys find no block of this name
                if doc.name == NOTIFY_BLOCK:
                    client.delete_block_document(doc.id)
