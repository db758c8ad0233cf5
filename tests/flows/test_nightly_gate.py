"""The nightly's promotion gate on a real Prefect server, with stand-in stages whose evaluate scores are planned:
within budget -> Promoted; over it -> Held (latest stays, files consumed, the candidate under `held`, the message
and webhook name each metric with both values and the budget); ask -> a person approves or rejects from the API."""
from __future__ import annotations

import contextvars
import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from flows.nightly import nightly
from pipeline_lib import stages
from pipeline_lib.nightly import load_state, promote_held
from webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server", "stage_doubles")]


@pytest.fixture
def night(tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.setitem(stages.SPECS, "pretrain", dataclasses.replace(stages.SPECS["pretrain"],
                                                                      runner="stage_doubles:pretrain_with_checkpoint"))
    hook = WebhookReceiver().__enter__()
    raw = tmp_path / "raw"
    raw.mkdir()
    root = Path(tiny_cfg.run.output_root)

    def run(date: str, factor: float, **gate):
        (raw / f"{date}.jsonl").write_text(json.dumps({"text": f"news of {date}"}) + "\n")
        root.mkdir(parents=True, exist_ok=True)
        (root / "gate-plan").write_text(str(factor))
        cfg = tiny_cfg.model_copy(deep=True)
        cfg.data.inputs = [str(raw / "*.jsonl")]
        cfg.orchestration.failure_webhook_url = hook.url
        for k, v in gate.items():
            setattr(cfg.nightly.gate, k, v)
        return nightly(config=cfg.model_dump(mode="json"), run_date=date, return_state=True)

    run.hook = hook
    yield run
    hook.__exit__()


def test_within_budget_promotes_over_budget_holds_and_a_held_night_can_be_promoted_by_hand(night, tiny_cfg):
    first = night("2026-12-01", 1.0)
    assert first.name == "Promoted" and "nothing promoted to compare with" in first.message
    second = night("2026-12-02", 1.3)  # +30% perplexity: over the 5% budget
    assert second.is_completed() and second.name == "Held", second.message
    for text in ("held-out perplexity 20 -> 26 (+30.0%, budget +5.0%)", "general_zh perplexity 40 -> 52"):
        assert text in second.message, second.message
    state = load_state(tiny_cfg)
    assert state["latest"]["run_id"] == "nightly-2026-12-01"  # tomorrow's base stays
    assert [h["run_id"] for h in state["held"]] == ["nightly-2026-12-02"]
    assert any(p.endswith("2026-12-02.jsonl") for p in state["consumed"])  # consumed: not retried forever
    assert [h["name"] for h in night.hook.received] == ["Held"]
    assert {f["metric"] for f in night.hook.received[0]["failed"]} == {"held-out perplexity", "general_zh perplexity"}
    third = night("2026-12-03", 1.02)  # +2%: within budget, against night 1 (the promoted model)
    assert third.name == "Promoted", third.message
    state = load_state(tiny_cfg)
    assert state["latest"]["run_id"] == "nightly-2026-12-03"
    decisions = [(h["run_id"], h["decision"]) for h in state["history"]]
    assert decisions == [("nightly-2026-12-01", "promoted"), ("nightly-2026-12-02", "held"),
                         ("nightly-2026-12-03", "promoted")]
    assert state["history"][1]["verdict"]["rows"][0]["candidate"] == pytest.approx(26.0)
    promote_held(tiny_cfg, "nightly-2026-12-02", who="alice", reason="the scraper fix is worth it")
    state = load_state(tiny_cfg)
    assert state["latest"]["run_id"] == "nightly-2026-12-02" and state["held"] == []
    assert state["history"][-1]["decided_by"]["who"] == "alice"


def _answer_when_paused(approve: bool, reason: str) -> threading.Thread:
    """A person at the UI: waits for the paused night, then resumes it with the form's answer (the API)."""
    def answer():
        try:
            from prefect.client.orchestration import get_client
            from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
            from prefect.client.schemas.objects import StateType
            from prefect.flow_runs import resume_flow_run

            deadline = time.time() + 120
            paused_filter = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
            while time.time() < deadline:
                with get_client(sync_client=True) as client:
                    paused = client.read_flow_runs(flow_run_filter=paused_filter)
                if paused:
                    resume_flow_run(paused[0].id, run_input={"approve": approve, "reason": reason, "who": "bob"})
                    return
                time.sleep(0.5)
        except Exception as err:  # seen by the test, not lost in the thread
            errors.append(repr(err))

    errors: list = []
    # this thread's Prefect settings (the test server) travel with it: a bare thread reads Prefect's global ones
    thread = threading.Thread(target=contextvars.copy_context().run, args=(answer,), daemon=True)
    thread.errors = errors
    thread.start()
    return thread


@pytest.mark.parametrize("approve, name", [(True, "Promoted"), (False, "Held")])
def test_ask_waits_for_a_person_and_records_the_decision(night, tiny_cfg, approve, name):
    night("2026-12-01", 1.0)
    person = _answer_when_paused(approve, "checked the samples")
    asked = night("2026-12-02", 1.5, on_regression="ask", ask_timeout_hours=0.05)
    person.join(5)
    assert person.errors == []
    assert asked.is_completed() and asked.name == name, asked.message
    assert "decided by unverified: bob: checked the samples" in asked.message
    state = load_state(tiny_cfg)
    assert state["latest"]["run_id"] == ("nightly-2026-12-02" if approve else "nightly-2026-12-01")
    by = state["history"][-1]["decided_by"]  # a typed name on a server without accounts (issue 45 item 11)
    assert by["who"] == "unverified: bob" and by["verified"] is False and by["given_name"] == "bob"


def test_ask_holds_when_nobody_answers_in_time(night, tiny_cfg):
    night("2026-12-01", 1.0)
    asked = night("2026-12-02", 1.5, on_regression="ask", ask_timeout_hours=4 / 3600)  # 4 s
    assert asked.is_completed() and asked.name == "Held", asked.message
    state = load_state(tiny_cfg)
    assert state["latest"]["run_id"] == "nightly-2026-12-01"
    assert state["history"][-1]["decided_by"]["reason"] == "no decision within 0.00111111 h"
