"""Flow runs of one pipeline run id: a resume is its own, named flow run, linked to the earlier ones.

`llm-pipeline run CONFIG --run-id X` again (a resume) starts a new flow run. So that the UI does not
show two runs called `llm-pipeline/X`, the new one is `llm-pipeline/X (resume N)` (N = how many flow
runs of X exist already), and the run overview lists the earlier ones. A deployment run retried from
the UI (or by `llm-pipeline run --submit` on the same id) is the same flow run and keeps its name.
"""
from __future__ import annotations

FLOW = "llm-pipeline"


def base_name(run_id: str) -> str:
    return f"{FLOW}/{run_id}"


def flow_runs_of(run_id: str, client) -> list:
    """Every flow run of the `llm-pipeline` flow for this run id (the first and its resumes), oldest first."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName

    base = base_name(run_id)
    found = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW])),
                                  flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=base)))
    mine = [r for r in found if r.name == base or r.name.startswith(base + " (resume ")]
    return sorted(mine, key=lambda r: r.created)


def earlier_flow_runs(run_id: str, current_id) -> list:
    """The flow runs of run_id other than the current one ([] when the API cannot be asked: a view only)."""
    from prefect import get_client

    try:
        with get_client(sync_client=True) as client:
            return [r for r in flow_runs_of(run_id, client) if str(r.id) != str(current_id)]
    except Exception:
        return []


def flow_run_name() -> str:
    """flow_run_name of the pipeline flow: `llm-pipeline/<run id>`, `... (resume N)` for the N-th resume."""
    from prefect.runtime import flow_run

    run_id = flow_run.parameters["run_id"]
    earlier = earlier_flow_runs(run_id, flow_run.id)
    return base_name(run_id) + (f" (resume {len(earlier)})" if earlier else "")


def ui_link(flow_run_id, kind: str = "flow-run") -> str | None:
    """The UI page of a flow run (kind task-run: of a task run), or None when the server has no UI URL (the
    embedded server) or there is no id."""
    try:
        from prefect.settings import get_current_settings

        ui = get_current_settings().ui_url
    except Exception:
        return None
    return f"{str(ui).rstrip('/')}/runs/{kind}/{flow_run_id}" if ui and flow_run_id else None


def task_run_link(task_run_id) -> str | None:
    return ui_link(task_run_id, "task-run")


def finished_in(created_at: str, current_id, earlier: list) -> str:
    """Which attempt wrote a manifest created at `created_at` (ISO, UTC): "attempt N" of this flow run (a UI
    Retry is attempt 2 of the same flow run: its Running states are counted), or the earlier flow run of the
    same run id it falls in (a resume), or "" when the API cannot say. `earlier`: flow runs, oldest first."""
    import datetime as dt

    from prefect import get_client

    try:
        when = dt.datetime.fromisoformat(created_at)
        with get_client(sync_client=True) as client:
            states = client.read_flow_run_states(current_id)
        starts = sorted(s.timestamp for s in states if s.type.value == "RUNNING")
        attempt = sum(start <= when for start in starts)
        if attempt:
            return f"attempt {attempt}"
        before = [r for r in earlier if r.start_time and r.start_time <= when]
        return f"flow run {before[-1].name}" if before else ""
    except Exception:  # a view only: the overview still says Cached
        return ""
