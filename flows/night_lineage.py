"""What the UI says about the lineage after a night's end or a decision (pipeline_lib/nightly/lineage.py renders it):

- the artifact `nightly-lineage` (one key, a new version each time: the Artifacts page shows the newest): the live
  night, the held ones and the last decisions;
- the night's flow run tags (`HELD`, `decide`, `promoted`, ...) and, for a night that asks for a person, its name
  (`nightly/<date> · HELD, decide`): Prefect colours every Completed state green (a custom state type is not
  possible), so a Held night is told apart from a Promoted one in the runs list by its name, tags and state name;
- the `nightly-decide` deployments' form: its `run_id` field lists the nights held now (a select in the UI).

Each is a view: a failure to write one is logged as a warning, never a failed night or decision.
"""
from __future__ import annotations

from pathlib import Path

from pipeline_lib.nightly import load_state
from pipeline_lib.nightly.lineage import end_name, end_tags, held_run_ids, lineage_markdown

LINEAGE_KEY = "nightly-lineage"
DECIDE_FLOW = "nightly-decide"
DECIDE_HINT = ("Decide in the UI: Deployments -> nightly-decide -> Run -> Custom run: pick the night, promote or "
               "reject, a reason and your name (or: llm-pipeline nightly promote CONFIG --run-id ID).")


def publish_lineage(cfg, logger=None) -> None:
    """The artifact and the decide form, from the newest state."""
    try:
        from prefect.artifacts import create_markdown_artifact

        state = load_state(cfg)
        live = (state.get("latest") or {}).get("run_id") or "none"
        held = held_run_ids(state)
        create_markdown_artifact(key=LINEAGE_KEY, markdown=lineage_markdown(state, DECIDE_HINT),
                                 description=f"live night {live}; held: {', '.join(held) or 'none'}")
        refresh_decide_form(cfg, held)
    except Exception as err:  # a view only
        if logger is not None:
            logger.warning(f"the {LINEAGE_KEY} artifact was not updated: {type(err).__name__}: {err}")


def tag_night(state_name: str, logger=None) -> None:
    """Add the end state's tags (lineage.END_TAGS) to the current flow run, and to its name what asks for a person
    (lineage.end_name)."""
    tags = end_tags(state_name)
    if not tags:
        return
    try:
        from prefect import get_client
        from prefect.runtime import flow_run

        if flow_run.id is None:
            return
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run.id)
            client.update_flow_run(flow_run.id, tags=list(dict.fromkeys([*run.tags, *tags])),
                                   name=end_name(run.name, state_name))
    except Exception as err:  # a view only
        if logger is not None:
            logger.warning(f"the night's tags {tags} were not set: {type(err).__name__}: {err}")


def decide_schema(schema: dict, held: list[str]) -> dict:
    """The decide deployment's parameter schema with `run_id` a choice of the nights held now."""
    out = {**schema, "properties": {**schema.get("properties", {})}}
    field = {k: v for k, v in out["properties"].get("run_id", {}).items() if k not in ("enum", "anyOf", "type")}
    if held:
        field.update(type="string", enum=list(held))
    else:
        field.update(type="string")
    field["description"] = ("The held night to decide on: " + (", ".join(held) if held else
                            "no night is held now (the list is refreshed at every night's end and decision)"))
    out["properties"]["run_id"] = field
    return out


def refresh_decide_form(cfg, held: list[str]) -> int:
    """Set the held nights as the choices of every nightly-decide deployment whose config writes to this output
    root; returns how many were updated."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import DeploymentFilter, FlowFilter, FlowFilterName

    from deployments import ROOT
    from flows.common import resolve_config

    updated = 0
    with get_client(sync_client=True) as client:
        deployments = client.read_deployments(flow_filter=FlowFilter(name=FlowFilterName(any_=[DECIDE_FLOW])),
                                              deployment_filter=DeploymentFilter())
        for dep in deployments:
            params = dep.parameters or {}
            try:
                path = Path(params["config"]) if Path(params["config"]).is_absolute() else ROOT / params["config"]
                root = resolve_config(str(path), params.get("overrides")).run.output_root
            except Exception:  # another lineage's config that does not load here: not ours to touch
                continue
            if root != cfg.run.output_root:
                continue
            client.update_deployment(dep.id, DeploymentUpdate(
                parameter_openapi_schema=decide_schema(dep.parameter_openapi_schema or {}, held)))
            updated += 1
    return updated
