"""Adding a stage is one stage module plus one row of the stage table: the row alone puts the stage in
the registry (run_stage, identity, manifest), the CLI's stage list, the Prefect pipeline flow and
the deployments."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from pipeline_lib import stages
from pipeline_lib.config.identity import stage_hash
from pipeline_lib.stages import StageSpec, StageUnavailable, manifest_fingerprint, parse_stages, run_stage
from pipeline_lib.storage import RunPaths, read_manifest


@pytest.fixture
def tally_row(stage_doubles):
    """The one row (the other stages run as stage_doubles); its module is tests/flows/tally_stage.py."""
    spec = stages.register(StageSpec("tally", "tally_stage:run_tally_stage", "cpu", upstream=("data",)))
    yield spec
    del stages.SPECS["tally"]


def test_added_stage_runs_through_the_registry_which_writes_its_manifest(tally_row, tiny_cfg):
    paths = RunPaths(tiny_cfg.run.output_root, "r-tally", None)
    with pytest.raises(StageUnavailable, match=r"needs \['data'\] first"):
        run_stage(tiny_cfg, paths, "tally")
    data, _ = run_stage(tiny_cfg, paths, "data")
    manifest, skipped = run_stage(tiny_cfg, paths, "tally")
    assert not skipped
    recorded = read_manifest(paths.stage_uri("tally"))
    assert recorded.config_hash == stage_hash(tiny_cfg, "tally")
    assert recorded.inputs == {"data": manifest_fingerprint(data)}
    assert [o["path"] for o in recorded.outputs] == ["tally.json"]
    tally = json.loads((Path(paths.stage_uri("tally")) / "tally.json").read_text())
    assert recorded.metrics == tally == {"files": len(data.outputs), "bytes": sum(o["size"] for o in data.outputs)}
    assert run_stage(tiny_cfg, paths, "tally")[1]  # done: skipped


def test_added_stage_is_in_the_stage_list_the_cli_help_and_the_deployments(tally_row):
    from deployments import pool_names, render_prefect_file
    from flows.cli import run_main

    assert parse_stages(None)[-1] == "tally" and parse_stages("tally,data") == ["data", "tally"]
    # not capsys: Prefect's log handler would keep its stream, closed after this test
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        run_main(["--help"])
    assert "data,pretrain,sft,evaluate,export,tally" in " ".join(out.getvalue().split())
    deployed = {d["entrypoint"]: d["work_pool"]["name"] for d in render_prefect_file()["deployments"]}
    assert deployed["flows/stage_flows.py:tally_flow"] == "cpu" and "cpu" in pool_names()
    import flows.stage_flows

    assert flows.stage_flows.tally_flow.name == "tally"  # the deployment's entrypoint resolves


def test_a_row_whose_upstream_is_not_in_the_table_is_refused():
    with pytest.raises(ValueError, match=r"upstream \['nowhere'\] not in the stage table.*Fix"):
        stages.register(StageSpec("orphan", "tally_stage:run_tally_stage", "cpu", upstream=("nowhere",)))
    assert "orphan" not in stages.SPECS


@pytest.mark.usefixtures("prefect_server")
def test_added_stage_runs_in_the_pipeline_flow(tally_row, tiny_cfg):
    from prefect import get_client

    from flows.pipeline import llm_pipeline

    state = llm_pipeline(config=tiny_cfg.model_dump(mode="json"), run_id="r-tally-flow", return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert list(summary["stages"]) == [*stages.SPECS] and summary["stages"]["tally"]["state"] == "completed"
    with get_client(sync_client=True) as client:
        names = {r.name for r in client.read_flow_runs()}
    assert "tally/r-tally-flow" in names  # its own stage flow, like every other stage
    assert read_manifest(RunPaths(tiny_cfg.run.output_root, "r-tally-flow", None).stage_uri("tally")) is not None
