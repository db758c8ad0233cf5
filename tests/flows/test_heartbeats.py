"""flows/heartbeats.py against a real Prefect server: the flows a CLI runs send the heartbeat events Prefect would,
from a thread no flow's end waits for."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
import urllib.request
import uuid

import pytest
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

from flows.cli import drain_prefect_queues
from flows.heartbeats import _ACTIVE, _Heartbeats, beating, own_heartbeats

pytestmark = pytest.mark.e2e  # flows against the real Prefect server; the server stores events a few seconds later


def _events(api: str, resource_id: str) -> list[dict]:
    body = {"filter": {"resource": {"id": [resource_id]}}, "limit": 50}
    req = urllib.request.Request(f"{api}/events/filter", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)["events"]


def _heartbeats_until(api: str, resource_ids: list[str], last: str) -> dict[str, list[dict]]:
    """Each resource's heartbeat events stored by the server, once it stored the event `last` sent for each after
    them (the server stores events a few seconds after they arrive)."""
    from prefect.events.utilities import emit_event

    for rid in resource_ids:
        emit_event(event=last, resource={"prefect.resource.id": rid})
    drain_prefect_queues()
    deadline = time.monotonic() + 30
    while True:
        got = {rid: _events(api, rid) for rid in resource_ids}
        if all(any(e["event"] == last for e in g) for g in got.values()) or time.monotonic() > deadline:
            return {rid: [e for e in g if e["event"] == "prefect.flow-run.heartbeat"] for rid, g in got.items()}
        time.sleep(0.2)


seen: dict = {}


@flow(name="beating-child")
@beating
def _child() -> str:
    from prefect.context import FlowRunContext

    seen["child"] = str(FlowRunContext.get().flow_run.id)
    return "child"


@flow(name="beating-parent")
@beating
def _parent(x: int) -> int:
    from prefect.context import FlowRunContext

    seen["parent"] = str(FlowRunContext.get().flow_run.id)
    seen["prefect_heartbeats"] = get_current_settings().flows.heartbeat_frequency
    seen["registered"] = len(_ACTIVE[-1].runs) if _ACTIVE else 0
    _child()
    return x + 1


def test_the_cli_flows_send_prefects_heartbeat_event_and_prefects_own_thread_is_off(prefect_server):
    seen.clear()
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 60}):  # a team's running server: heartbeats on
        with own_heartbeats() as beats:
            assert _parent(1) == 2  # parameters pass through the decorator
            assert beats.runs == {}  # each flow's end unregistered it; nothing is pending or joined
        beats.thread.join(5)
        assert not beats.thread.is_alive()  # leaving stops the thread
        assert get_current_settings().flows.heartbeat_frequency == 60  # restored
    assert seen["prefect_heartbeats"] is None and seen["registered"] == 1  # Prefect's own thread never started
    recorded = _heartbeats_until(prefect_server, [f"prefect.flow-run.{seen[n]}" for n in ("parent", "child")],
                                 "test.flow-ended")
    for name in ("parent", "child"):
        got = recorded[f"prefect.flow-run.{seen[name]}"]
        assert len(got) == 1, name  # one at the start: the next would be due in 60 s
        related = {r["prefect.resource.role"]: r for r in got[0]["related"]}
        assert related["flow"]["prefect.resource.name"] == f"beating-{name}"
        assert got[0]["resource"]["prefect.resource.name"] and got[0]["resource"]["prefect.version"]


def test_heartbeats_repeat_at_their_period_and_stop_when_the_run_is_removed(prefect_server):
    resource = f"prefect.flow-run.{uuid.uuid4()}"
    beats = _Heartbeats(0.3)
    try:
        beats.add("run", {"event": "prefect.flow-run.heartbeat", "resource": {"prefect.resource.id": resource},
                          "related": []})
        time.sleep(1.0)
        beats.remove("run")
        removed = datetime.now(timezone.utc)
        time.sleep(0.7)
        got = _heartbeats_until(prefect_server, [resource], "test.later")[resource]
        after = [e for e in got if datetime.fromisoformat(e["occurred"].replace("Z", "+00:00")) > removed]
        assert 3 <= len(got) <= 5 and not after  # at 0, 0.3, 0.6, 0.9 s; none after the removal
    finally:
        beats.stop()


def test_without_heartbeats_configured_nothing_is_started(prefect_server):
    seen.clear()
    with own_heartbeats() as beats:  # this test process runs its flows with Prefect's heartbeats off
        assert beats is None and not _ACTIVE
        assert _parent(2) == 3
    assert seen["registered"] == 0
