"""A Retry of the chain reruns a failed stage's own flow run, as Prefect's Retry reruns a flow run, instead of
starting a second one beside it.

Prefect's engine gives a subflow that did not complete a fresh flow run when its parent is retried, and
run_deployment always makes a new one: the parent's graph then kept the red run of attempt 1 beside the green one
of attempt 2, the same stage twice. Here the stage's earlier child run of this parent (the newest one, when it ended
Failed, Crashed or Cancelled) is set to AwaitingRetry and run again: one node per stage, its state history and log
holding both attempts (run_count 2), as a retried deployment run's do.
"""
from __future__ import annotations

from prefect import get_client
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.states import AwaitingRetry

RERUN = {StateType.FAILED, StateType.CRASHED, StateType.CANCELLED}


def failed_child(parent_flow_run_id, stage: str, deployment_id=None):
    """The newest child flow run of the parent for `stage` (a run of the stage's flow; of `deployment_id` when
    given) when it did not complete; None when there is none or it completed."""
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowFilter, FlowFilterName,
                                                FlowRunFilter, FlowRunFilterParentFlowRunId)

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[stage])),
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_flow_run_id])),
            deployment_filter=(DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
                               if deployment_id else None),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=1)
    run = runs[0] if runs else None
    return run if run is not None and run.state is not None and run.state.type in RERUN else None


def rerun_subflow(flow, child, parameters: dict):
    """Run the subflow's earlier flow run `child` again in this process (its attempt 2); returns its final state."""
    from prefect.flow_engine import run_flow

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(child.id, AwaitingRetry(message="the parent run was retried"), force=True)
        child = client.read_flow_run(child.id)
    return run_flow(flow, flow_run=child, parameters=parameters, return_type="state")


def retry_deployment_run(child):
    """Hand the deployment run `child` back to its work pool's workers (AwaitingRetry, what the UI's Retry does);
    returns it as it is now (the caller waits for its end)."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(child.id, AwaitingRetry(message="the parent run was retried"), force=True)
        return client.read_flow_run(child.id)
