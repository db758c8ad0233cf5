"""One Prefect flow per stage of the stage table (pipeline_lib.stages.SPECS), so each stage can be
triggered, watched and retried alone in the UI and deployed to its own work pool (the table's
`pool`). Flow-run names say what and which run: `pretrain/<run_id>`. Each flow is also a module
attribute `<stage>_flow`: the entrypoint of its deployment (deployments/__init__.py)."""
from __future__ import annotations

import os

from prefect import flow
from prefect.states import Completed

from pipeline_lib.runtime.nodes import NODE_RANK_ENV
from pipeline_lib.stages import SPECS
from tasks.stage_task import submit_stage

from flows.common import resolve_config
from flows.heartbeats import beating


def _run_name(stage: str):
    """`<stage>/<run_id>`, and `<stage>/<run_id>/node-<rank>` for one node rank of a multi-node job: a failure
    (the parent's message, the UI) then names the node."""
    def name() -> str:
        from prefect.runtime import flow_run

        params = flow_run.parameters
        rank = params.get("node_rank")
        return f"{stage}/{params['run_id']}" + (f"/node-{rank}" if rank is not None else "")

    return name


def night_outcome(result):
    """A night's data stage that left nothing to train ends its flow run in the state it names (NoNewData,
    NoUsableData; Completed), not a plain Completed: a parent that dispatched it to a worker reads the outcome from
    the child's state (flows/dispatch.py), and the runs list shows what the night found."""
    if isinstance(result, dict) and result.get("no_new_documents"):
        return Completed(name=result["no_new_documents"], message=result.get("message", ""), data=result)
    return result


def _make_stage_flow(stage: str):
    def stage_flow(config: str | dict, run_id: str, overrides: list[str] | None = None,
                   node_rank: int | None = None) -> dict:
        cfg = resolve_config(config, overrides, stages=[stage])
        # The launcher reads the node rank of a multi-node job from the environment (msrun --node_rank). Dispatch
        # passes it per child; without it the process's own $LLM_PIPELINE_NODE_RANK (a node started by hand) holds.
        if node_rank is not None:
            os.environ[NODE_RANK_ENV] = str(node_rank)
        if stage == "data" and cfg.data.executor in ("prefect", "dask"):
            from flows.data_flow import run_mapped_data

            return run_mapped_data(cfg, run_id)
        return night_outcome(submit_stage(cfg, run_id, stage))

    # Its own name before it becomes a flow: Prefect keys the parent's record of a subflow call by the function's
    # name (and counts calls per key), and a Retry of the parent hands back the subflow found under that key. With
    # one name for every stage, a Retry that skips a Cached stage's subflow would get that stage's old result for
    # the next stage.
    stage_flow.__name__ = stage_flow.__qualname__ = f"{stage}_flow"
    return flow(name=stage, flow_run_name=_run_name(stage), log_prints=True, persist_result=True,
                description=f"The {stage} stage of the LLM pipeline (skipped when its manifest is complete).")(
        beating(stage_flow))


_FLOWS: dict = {}


def stage_flow(stage: str):
    """The flow of `stage` (made once; a stage registered after import gets its flow on first use)."""
    if stage not in SPECS:
        raise KeyError(f"no stage '{stage}' in the stage table {list(SPECS)}")
    if stage not in _FLOWS:
        _FLOWS[stage] = _make_stage_flow(stage)
    return _FLOWS[stage]


for _stage in SPECS:  # module attributes, so the deployments' entrypoints import as plain names
    globals()[f"{_stage}_flow"] = stage_flow(_stage)


def __getattr__(name: str):
    # <stage>_flow of a row registered after this module was imported
    if name.endswith("_flow") and name.removesuffix("_flow") in SPECS:
        return stage_flow(name.removesuffix("_flow"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
