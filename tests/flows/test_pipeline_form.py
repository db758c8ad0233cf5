"""The typed run form of llm-pipeline/default: the parameter schema Prefect builds the form from, its
defaults (the deployment's config file), and runs made with changed fields (flows/pipeline.py)."""
import json
from pathlib import Path

import pytest
from prefect import get_client
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.validation import is_valid_schema, validate

from deployments import render_prefect_file
from flows.common import resolve_config
from flows.pipeline import llm_pipeline
from pipeline_lib.config import load_config
from pipeline_lib.config.form import form_defaults, form_sections
from pipeline_lib.config.schema import PipelineConfig
from pipeline_lib.stages import stage_done
from pipeline_lib.storage import RunPaths

ROOT = Path(__file__).resolve().parents[2]
TINY = "configs/pipelines/tiny-cpu.yaml"


def _refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _chain_parameters() -> dict:
    doc = render_prefect_file()
    return next(d for d in doc["deployments"] if d["entrypoint"].endswith(":llm_pipeline"))["parameters"]


def test_every_section_is_a_typed_parameter_of_a_schema_the_ui_can_render():
    schema = parameter_schema(llm_pipeline).model_dump()
    is_valid_schema(schema)
    for name in form_sections():
        model = PipelineConfig.model_fields[name].annotation.__name__
        assert schema["properties"][name]["anyOf"][0] == {"$ref": f"#/definitions/{model}"}
        assert schema["properties"][name]["description"]  # the form says what the section is
    assert all(ref.removeprefix("#/definitions/") in schema["definitions"] for ref in _refs(schema))
    assert len(json.dumps(schema)) < 80_000  # one page of form, not a schema that stalls the UI (72 kB with the nightly's screen, retention and schedule knobs)


def _opened(schema: dict, node: dict) -> dict:
    """What the UI fills in when a person opens a model-valued field: each field's default, a nested model's built
    the same way (a field without a default left out)."""
    ref = node.get("$ref") or next(a["$ref"] for a in node["anyOf"] if "$ref" in a)
    out = {}
    for name, prop in schema["definitions"][ref.rsplit("/", 1)[1]]["properties"].items():
        if "default" in prop:
            out[name] = prop["default"]
        elif "$ref" in prop or any("$ref" in a for a in prop.get("anyOf", [])):
            out[name] = _opened(schema, prop)
    return out


def test_the_chain_form_is_folded_and_opens_its_sections_at_the_config_files_values(monkeypatch):
    """Issue 48 item 7: the form was 33,000 px of pre-filled sections. The deployment leaves them None (closed in the
    UI) and its schema opens each at the deployment's file: sent as opened, a section changes nothing."""
    from flows.run_form import PER_RUN, folded_form_schema

    params = _chain_parameters()
    assert params["config"] == TINY and not set(params) & set(form_sections())
    defaults = form_defaults(ROOT / TINY)
    schema = folded_form_schema(parameter_schema(llm_pipeline).model_dump(), defaults)
    is_valid_schema(schema)
    assert all(ref.removeprefix("#/definitions/") in schema["definitions"] for ref in _refs(schema))
    opened = {k: _opened(schema, schema["properties"][k]) for k in form_sections()}
    # the webhook URL, a secret, is never pre-filled: it opens empty (an empty one keeps the file's)
    assert opened["orchestration"].pop("failure_webhook_url") is None
    assert opened == defaults  # training.guard and sft.guard each with its own values (one definition before)
    assert opened["training"]["preflight_steps"] == 5 and opened["sft"]["learning_rate"] == 5e-3  # the file's
    order = sorted(schema["properties"], key=lambda k: schema["properties"][k]["position"])
    assert order[:len(PER_RUN)] == list(PER_RUN)
    assert folded_form_schema(schema, defaults) == schema  # deploy twice: the same form
    errors = validate({**params, **opened}, schema, ignore_required=True)
    assert errors == []  # what the server enforces for a run of the deployment
    monkeypatch.chdir(ROOT)  # the worker's cwd (the pull step)
    assert resolve_config(params["config"], None, opened) == resolve_config(TINY)  # unchanged form = the file


@pytest.mark.e2e  # the whole chain flow, on the stage doubles
def test_a_run_with_two_changed_fields_has_the_stage_identities_of_the_same_overrides(prefect_server, stage_doubles,
                                                                                      tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = str(tmp_path / "runs")
    sections = form_defaults(ROOT / TINY)
    sections["run"]["output_root"] = out
    sections["data"]["executor"] = "local"  # the stage doubles replace the local executor's engine
    sections["data"]["docs_per_shard"] = 50  # the two changed fields
    sections["training"]["learning_rate"] = 1e-3
    state = llm_pipeline(config=TINY, run_id="form-run", stages=["data", "pretrain"], return_state=True, **sections)
    assert state.is_completed(), state.message

    paths = RunPaths(out, "form-run", None)
    same_by_cli = load_config(TINY, [f"run.output_root={out}", "data.docs_per_shard=50", "training.learning_rate=1e-3"])
    unchanged = load_config(TINY, [f"run.output_root={out}"])
    for stage in ("data", "pretrain"):
        assert stage_done(same_by_cli, paths, stage)[0], stage
        assert not stage_done(unchanged, paths, stage)[0], stage


def test_a_submitted_run_reads_its_config_not_the_forms_defaults(prefect_server, monkeypatch, tmp_path):
    import flows.submit

    name = llm_pipeline.to_deployment(name="form-defaults", parameters=_chain_parameters()).apply()
    assert name
    monkeypatch.setattr(flows.submit, "DEPLOYMENT", "llm-pipeline/form-defaults")
    run_id, _, _ = flows.submit.submit_run(TINY, [f"run.output_root={tmp_path}"], "sub-form", ["data"], False)
    with get_client(sync_client=True) as client:
        params = client.read_flow_run(run_id).parameters
    # the server merges a run's parameters over the deployment's: every section must be None here
    assert {k: params[k] for k in form_sections()} == dict.fromkeys(form_sections())
    assert params["config"] == TINY


@pytest.mark.parametrize("section", form_sections())
def test_no_description_loses_text_in_the_forms_markdown(section):
    """The UI renders descriptions as markdown: a bare <placeholder> is dropped as HTML (keep it in `code`)."""
    import re

    schema = parameter_schema(llm_pipeline).model_dump()
    model = PipelineConfig.model_fields[section].annotation.__name__
    for name, prop in schema["definitions"][model]["properties"].items():
        text = re.sub(r"`[^`]*`", "", prop.get("description", ""))
        assert not re.search(r"<[A-Za-z_/|]", text), f"{section}.{name}: {prop['description']}"


def test_only_a_run_with_another_config_file_drops_the_sections_left_at_the_forms_defaults():
    from flows.common import untouched_form_sections

    defaults = {"config": TINY, **form_defaults(ROOT / TINY)}
    changed = dict(defaults["data"], docs_per_shard=7)
    given = {"run": defaults["run"], "data": changed, "sft": None}
    assert untouched_form_sections("configs/pipelines/other.yaml", given, defaults) == ["run"]
    assert untouched_form_sections(TINY, given, defaults) == []  # the deployment's own file: the form as sent
    assert untouched_form_sections("configs/pipelines/other.yaml", given, {}) == []  # not a deployment run


def test_a_deployment_run_given_another_config_file_runs_that_file(prefect_server, stage_doubles, tmp_path,
                                                                   monkeypatch):
    """run_deployment(config=<another file>) must not get the deployment's form defaults (another model), also when
    the deployment leaves its sections empty and only its schema holds them (flows/common.py with_form_defaults)."""
    from prefect.deployments import run_deployment
    from prefect.flow_engine import run_flow

    monkeypatch.chdir(ROOT)
    other = tmp_path / "other.yaml"
    other.write_text((ROOT / TINY).read_text().replace("docs_per_shard: 200", "docs_per_shard: 77"))
    llm_pipeline.to_deployment(name="form-other", parameters=_chain_parameters()).apply()
    out = str(tmp_path / "runs")
    overrides = [f"run.output_root={out}", "data.executor=local"]
    # the form's data section opened and left as it opened: the deployment's file's values
    flow_run = run_deployment("llm-pipeline/form-other", timeout=0,
                              parameters={"config": str(other), "run_id": "other-run", "stages": ["data"],
                                          "overrides": overrides, "data": form_defaults(ROOT / TINY)["data"]})
    assert flow_run.parameters["data"]["docs_per_shard"] == 200
    state = run_flow(llm_pipeline, flow_run=flow_run, parameters=flow_run.parameters, return_type="state")
    assert state.is_completed(), state.message
    assert stage_done(load_config(other, overrides), RunPaths(out, "other-run", None), "data")[0]


def test_fields_carry_their_section_and_filters_are_typed_items():
    schema = parameter_schema(llm_pipeline).model_dump()
    defs = schema["definitions"]
    assert defs["TrainingConfig"]["properties"]["steps"]["title"] == "training.steps"
    assert defs["SFTConfig"]["properties"]["steps"]["title"] == "sft.steps"
    assert defs["DedupConfig"]["properties"]["threshold"]["title"] == "data.dedup.threshold"
    # the sections changed most often come first in the form
    order = sorted(form_sections(), key=lambda s: schema["properties"][s]["position"])
    assert order[:4] == ["training", "data", "sft", "evaluate"]
    items = [defs[ref["$ref"].rsplit("/", 1)[1]] for ref in defs["DataConfig"]["properties"]["filters"]["items"]["anyOf"]]
    length = next(i for i in items if i["title"] == "length")
    params = defs[length["properties"]["params"]["$ref"].rsplit("/", 1)[1]]["properties"]
    assert params["min_chars"]["type"] == "integer" and params["min_chars"]["default"] == 20
    from pipeline_lib.data.filters import FILTERS

    assert sorted(i["title"] for i in items) == sorted(FILTERS)
