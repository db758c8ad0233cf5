"""Dispatch a stage to its deployment on its work pool and wait for it.

`run_deployment` returns the child's flow run whatever its final state: it is checked here, and
a failed child fails the parent with the child's own message. Multi-node training starts one
child per node rank together (timeout=0), then watches all of them: if one fails, the others
are cancelled, because a distributed job with a dead rank only hangs until its timeout.
"""
from __future__ import annotations

import datetime as dt
import time

from prefect import get_client, get_run_logger
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.states import Cancelling

from pipeline_lib.data.errors import NoNewDocuments
from pipeline_lib.stages import SPECS
from pipeline_lib.storage import RunPaths, read_manifest

from flows.same_child import failed_child, retry_deployment_run

FINAL = {StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED}


class ChildRunFailed(RuntimeError):
    pass


def _describe(run) -> str:
    state = run.state
    return f"{run.name} ({run.id}) ended {state.type.value}: {state.message or state.name}"


def _wait_all(flow_run_ids: list, poll: float = 2.0) -> list:
    """Poll until every child is final; on the first failure cancel the rest and raise."""
    logger = get_run_logger()
    with get_client(sync_client=True) as client:
        while True:
            runs = [client.read_flow_run(i) for i in flow_run_ids]
            failed = [r for r in runs if r.state and r.state.type in FINAL - {StateType.COMPLETED}]
            if failed:
                for r in runs:
                    if r.state is None or r.state.type not in FINAL:
                        logger.warning(f"cancelling {r.name}: a sibling rank failed")
                        client.set_flow_run_state(r.id, Cancelling(message="a sibling node rank failed"),
                                                  force=True)
                raise ChildRunFailed("; ".join(_describe(r) for r in failed))
            if all(r.state and r.state.type == StateType.COMPLETED for r in runs):
                return runs
            time.sleep(poll)


def _live_card(client, flow_run_id, stage: str, since: dt.datetime):
    """The child's newest `<stage>-live` card written since `since` (a retried child keeps its earlier attempt's)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    cards = client.read_artifacts(artifact_filter=ArtifactFilter(
        key=ArtifactFilterKey(any_=[f"{stage}-live"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    cards = [c for c in cards if c.updated is not None and c.updated >= since]
    return max(cards, key=lambda c: c.updated) if cards else None


def _wait_showing_progress(child, stage: str, run_id: str, poll: float = 2.0):
    """Wait until the child flow run is final; meanwhile its live card (training step, loss, tokens seen, time left:
    tasks/live_training.py), written on the worker, refreshes this run's overview Running row and links the card, as
    a stage running in this process does (tasks/overview.py live_progress). Returns the final flow run."""
    from tasks.live_training import card_line
    from tasks.overview import artifact_link, live_progress

    since, shown = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5), None
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(child.id)
            if run.state is not None and run.state.is_final():
                return run
            try:
                card = _live_card(client, child.id, stage, since)
                line = card_line(card.data) if card is not None else None
                if line and (card.id, line) != shown:
                    shown = (card.id, line)
                    live_progress(run_id, stage, line, artifact_link(card.id))
            except Exception:  # noqa: BLE001 (a view: never fail the stage over its progress line)
                pass
            time.sleep(poll)


def _failed_child_of_this_run(stage: str, deployment: str):
    """On a Retry of the parent (its attempt 2 or later): its child run of `deployment` that did not complete."""
    from prefect.runtime import flow_run

    if flow_run.id is None or flow_run.run_count <= 1:
        return None
    with get_client(sync_client=True) as client:
        deployment_id = client.read_deployment_by_name(deployment).id
    return failed_child(flow_run.id, stage, deployment_id)


def dispatch_stage(cfg, resolved: dict, run_id: str, stage: str, suffix: str = "default") -> dict:
    logger = get_run_logger()
    name = f"{stage}/{suffix}"
    started = dt.datetime.now(dt.timezone.utc)
    nodes = cfg.parallel.num_nodes if SPECS[stage].multi_node else 1
    params = {"config": resolved, "run_id": run_id}
    if nodes == 1:
        earlier = _failed_child_of_this_run(stage, name)
        if earlier is not None:  # a Retry of the parent: the stage's own run again, not a second one beside it
            logger.info(f"{stage}: retrying its flow run {earlier.name} of the earlier attempt on deployment {name}")
            child = retry_deployment_run(earlier)
        else:
            child = run_deployment(name, parameters=params, timeout=0)
        child = _wait_showing_progress(child, stage, run_id)
        if child.state is None or child.state.type != StateType.COMPLETED:
            raise ChildRunFailed(_describe(child))
        if child.state.name in NoNewDocuments.NIGHT_STATES:  # a night's data left nothing to train: its outcome, no manifest
            return {"stage": stage, "run_id": run_id, "no_new_documents": child.state.name,
                    "message": child.state.message or "", "flow_run_id": str(child.id)}
    else:
        logger.info(f"{stage}: starting {nodes} node ranks on deployment {name}")
        children = [run_deployment(name, parameters={**params, "node_rank": rank}, timeout=0,
                                   flow_run_name=f"{stage}/{run_id}/node-{rank}")
                    for rank in range(nodes)]
        _wait_all([c.id for c in children])
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    manifest = read_manifest(paths.stage_uri(stage), paths.endpoint_url)
    if manifest is None:
        raise ChildRunFailed(f"{name} completed but left no manifest in {paths.stage_uri(stage)}: "
                             "is the run store shared between the pools (output_root on S3)?")
    created = dt.datetime.fromisoformat(manifest.created_at)
    return {"stage": stage, "skipped": created < started, "manifest": manifest.__dict__,
            "stage_uri": paths.stage_uri(stage), "flow_run_id": str((child if nodes == 1 else children[0]).id)}
