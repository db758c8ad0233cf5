"""Adding a stage is one stage module plus one row of the stage table: the row alone puts the stage in
the registry (run_stage, identity, manifest), the CLI's stage list and its pre-run checks, the Prefect
pipeline flow, the run overview's key figures, the kill points and the deployments; and
docs/architecture.md's "Where to add" says so."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest

from pipeline_lib import killpoints, stages
from pipeline_lib.config.identity import schema_fields, stage_hash
from pipeline_lib.stages import StageSpec, UpstreamMissing, manifest_fingerprint, parse_stages, run_stage
from pipeline_lib.checks import problems
from pipeline_lib.storage import RunPaths, read_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tally_row(stage_doubles):
    """The one row (the other stages run as stage_doubles); its module is tests/flows/tally_stage.py."""
    spec = stages.register(StageSpec("tally", "tally_stage:run_tally_stage", "cpu", upstream=("data",),
                                     checks=("tally_stage:check_tally",), figures="tally_stage:tally_figures",
                                     key_files=("tally.json",)))
    yield spec
    del stages.SPECS["tally"]
    del killpoints.POINTS["tally.before_manifest"]


def test_added_stage_runs_through_the_registry_which_writes_its_manifest(tally_row, tiny_cfg):
    paths = RunPaths(tiny_cfg.run.output_root, "r-tally", None)
    with pytest.raises(UpstreamMissing, match=r"needs \['data'\] first"):
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
    assert "tally.before_manifest" in killpoints.POINTS  # the kill point of its record_stage


@pytest.mark.e2e  # the CLI's run command
@pytest.mark.usefixtures("prefect_server")  # its PREFECT_API_URL: the CLI starts no embedded server
def test_added_stage_checks_refuse_bad_input_before_any_flow_runs(tally_row, tiny_cfg, tmp_path):
    from flows.cli import run_main

    empty = tmp_path / "empty.jsonl"
    empty.touch()
    argv = ["configs/pipelines/tiny-cpu.yaml", f"run.output_root={tmp_path / 'runs'}",
            f"data.inputs=[configs/data/tiny_corpus.jsonl, {empty}]", "--run-id", "r-refused"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert run_main([*argv, "--stages", "data,tally"]) == 2
    assert "data.inputs[1]" in err.getvalue() and str(empty) in err.getvalue()
    assert "the tally stage has nothing to count" in err.getvalue() and "remove it from data.inputs" in err.getvalue()
    assert not (tmp_path / "runs").exists()  # refused before anything ran
    cfg = tiny_cfg.model_copy(update={"data": tiny_cfg.data.model_copy(update={"inputs": [str(empty)]})})
    assert problems(cfg, ["data"])[0] == []  # the data stage alone does not mind: the check is tally's


def test_added_stage_key_figures_and_key_files_are_in_the_run_overview(tally_row, tmp_path):
    from tasks.overview import RunOverview

    published = []
    overview = RunOverview(RunPaths(str(tmp_path / "runs"), "r1"), ["data", "tally"],
                           publish=lambda aid, md, run_id: published.append(md) or "id")
    overview.finished("tally", "completed", 1.0, {"metrics": {"files": 7, "bytes": 10}, "outputs": [{"path": "tally.json"}]})
    row = next(line for line in published[-1].splitlines() if line.startswith("| **tally** |"))
    assert "files tallied 7" in row


def test_the_where_to_add_table_of_the_architecture_doc_holds():
    """docs/architecture.md's "A stage" entry: the module, one row (naming every per-stage fact StageSpec
    carries) and a schema section marked identity("<stage>"); each stage of the table is built that way."""
    doc = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    entry = re.search(r"^- \*\*A stage\*\*:(.*?)(?=^- \*\*)", doc, re.S | re.M).group(1)
    per_stage = [f.name for f in dataclasses.fields(StageSpec) if f.name not in ("name", "runner", "pool")]
    assert [f for f in per_stage if f"`{f}`" not in entry] == []
    for path in re.findall(r"`((?:pipeline_lib|tests)/[\w/.]+\.py)`", entry):
        assert (ROOT / path).is_file(), path
    marked = {s for _, marker in schema_fields() if marker for s in marker["stages"]}
    for name, spec in stages.SPECS.items():
        assert spec.runner.endswith(f":run_{name}_stage") and callable(stages.runner(name)), name
        assert name in marked, f"no config field marked identity({name!r})"


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


@pytest.mark.e2e  # the whole pipeline flow (stage doubles): ~6 s, 10+ on a busy machine
@pytest.mark.usefixtures("prefect_server")
def test_added_stage_runs_in_the_pipeline_flow(tally_row, tiny_cfg):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.pipeline import llm_pipeline
    from tasks.overview import overview_key

    state = llm_pipeline(config=tiny_cfg.model_dump(mode="json"), run_id="r-tally-flow", return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert list(summary["stages"]) == [*stages.SPECS] and summary["stages"]["tally"]["state"] == "completed"
    with get_client(sync_client=True) as client:
        names = {r.name for r in client.read_flow_runs()}
        overview = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[overview_key("r-tally-flow")])))
    assert "tally/r-tally-flow" in names  # its own stage flow, like every other stage
    assert any("files tallied" in str(a.data) for a in overview)  # its key figures, in the run overview
    assert read_manifest(RunPaths(tiny_cfg.run.output_root, "r-tally-flow", None).stage_uri("tally")) is not None
