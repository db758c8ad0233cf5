"""The names of the nightly's flow runs: `nightly/<date>` from the moment a run is scheduled, `nightly/<date>-2`
for a later run of a decided date.

Prefect's scheduler creates a deployment's upcoming runs with random names (its schedules have no name template;
the flow's `flow_run_name` is applied only when a run starts). `name_scheduled_nights` renames the Scheduled runs
of the nightly deployment to `nightly/<date>`, the date of their start in the schedule's zone (a second run
scheduled on a date gets `-2`, ...): `llm-pipeline deploy` calls it once the server has scheduled them, and every
night at its start for the one the scheduler added since. `rename_this_night` gives a running night the name of
the run id it was allocated under the nightly lock (nightly-<date>-2 -> nightly/<date>-2): several runs of one
date are told apart in the runs list.
"""
from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

PREFIX = "nightly/"


def night_name(run_id: str) -> str:
    """nightly-2026-12-04-2 -> nightly/2026-12-04-2."""
    return PREFIX + run_id.removeprefix("nightly-")


def scheduled_names(starts: list[tuple[object, dt.datetime]], timezone: str) -> dict:
    """run id -> nightly/<date> for runs starting at those times (in `timezone`), the second of a date `-2`."""
    zone, seen, out = ZoneInfo(timezone), {}, {}
    for run_id, start in sorted(starts, key=lambda rs: rs[1]):
        date = start.astimezone(zone).date().isoformat()
        seen[date] = seen.get(date, 0) + 1
        out[run_id] = f"{PREFIX}{date}" + (f"-{seen[date]}" if seen[date] > 1 else "")
    return out


def name_scheduled_nights(client, deployment_id, timezone: str) -> int:
    """Rename the deployment's Scheduled runs to nightly/<date> (sync client); returns how many were renamed."""
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter,
                                                FlowRunFilterState, FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    runs = client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))
    names = scheduled_names([(r.id, r.expected_start_time or r.next_scheduled_start_time) for r in runs
                             if r.expected_start_time or r.next_scheduled_start_time], timezone)
    renamed = 0
    for run in runs:
        if run.id in names and run.name != names[run.id]:
            client.update_flow_run(run.id, name=names[run.id])
            renamed += 1
    return renamed


def name_upcoming_nights(timezone: str, log) -> None:
    """At a night's start: name the upcoming runs of its deployment (none when it runs without one). Best effort:
    a name is never worth failing a night."""
    from prefect import get_client
    from prefect.runtime import deployment

    try:
        deployment_id = deployment.id
        if not deployment_id:
            return
        with get_client(sync_client=True) as client:
            name_scheduled_nights(client, deployment_id, timezone)
    except Exception as err:  # noqa: BLE001
        log(f"the upcoming nights keep Prefect's names ({type(err).__name__}: {err})")


def rename_this_night(run_id: str, log) -> None:
    """This flow run takes the name of the night's run id (nightly/<date>-2 for a second run of a date)."""
    from prefect import get_client
    from prefect.runtime import flow_run

    name = night_name(run_id)
    try:
        if not flow_run.id or flow_run.name == name:
            return
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name)
    except Exception as err:  # noqa: BLE001
        log(f"this run keeps the name {flow_run.name} ({type(err).__name__}: {err})")


def name_deployed_nights(deployment: str, timezone: str, wait_s: float = 20.0, log=print) -> int:
    """After `llm-pipeline deploy`: wait (up to wait_s) for the server to schedule the nightly's upcoming runs, then
    name them; returns how many were named."""
    import time

    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        if not dep.schedules:
            return 0
        until = time.monotonic() + wait_s
        while not client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
                                        limit=1) and time.monotonic() < until:
            time.sleep(1)  # the server's scheduler picks a new or changed deployment up within seconds
        named = name_scheduled_nights(client, dep.id, timezone)
    log(f"{deployment}: {named} upcoming run(s) named nightly/<date> (their date in {timezone})")
    return named
