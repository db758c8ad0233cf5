"""The nightly's name and summary: the date in the schedule's zone, what the night did on its own run."""
import datetime as dt
import math

from prefect.utilities.callables import parameter_schema

from flows.night_summary import render
from flows.nightly import FORM_SECTIONS, night_date, nightly
from pipeline_lib.config import load_config
from pipeline_lib.nightly.gate import judge

UTC = dt.timezone.utc


def test_the_night_date_is_the_schedules_not_the_servers():
    at_2am_shanghai = dt.datetime(2026, 12, 1, 18, 0, tzinfo=UTC)  # 02:00 on Dec 2 in Shanghai
    assert night_date("Asia/Shanghai", at_2am_shanghai) == "2026-12-02"
    assert night_date("UTC", at_2am_shanghai) == "2026-12-01"
    assert night_date("America/Los_Angeles", at_2am_shanghai) == "2026-12-01"


def test_the_summary_says_what_was_read_decided_and_in_which_zone():
    cfg = load_config("configs/pipelines/tiny-cpu.yaml")
    files = [f"/data/inbox/part-{i}.jsonl" for i in range(25)]
    md = render(cfg, "nightly-2026-12-02", "2026-12-02", "Held", "perplexity rose 9% (budget 5%)",
                {"run_id": "nightly-2026-12-02", "new_files": 25, "files": files, "decision": "held",
                 "checkpoint": "/runs/nightly-2026-12-02/pretrain/x.ckpt"})
    assert md.startswith("# Night 2026-12-02: Held") and "zone Asia/Shanghai" in md
    assert "| read | 25 new file(s) |" in md and "| decision | held (the gate) |" in md
    assert "part-19.jsonl" in md and "part-20.jsonl" not in md and "and 5 more" in md
    assert "pipeline run" not in md  # no stage ran in this record: no link to a run that is not there


def test_the_summary_shows_every_metric_the_gate_read_with_its_interval_and_why():
    cfg = load_config("configs/pipelines/tiny-cpu.yaml")
    metrics = {"tokenizer_vocab_size": 2000, "checkpoints": [
        {"checkpoint": label, "perplexity": 20.0 * f, "reference": {"general_zh": 1990.0 * f}}
        for label, f in (("base", 1.0), ("pretrained", 1.3))]}
    scores = {label: {"perplexity": {"held-out perplexity": {"nll": [10 * math.log(20 * f)] * 8, "tokens": [10] * 8}}}
              for label, f in (("base", 1.0), ("pretrained", 1.3))}
    verdict = judge(cfg, metrics, scores)
    md = render(cfg, "nightly-2026-12-02", "2026-12-02", "Held", verdict.message("nightly-2026-12-02"),
                {"run_id": "nightly-2026-12-02", "decision": "held", "verdict": verdict.to_json()})
    assert "Gate: hold (regressed beyond noise: held-out perplexity)" in md
    assert "| held-out perplexity | 20 | 26 | +30.0% | +30.0% .. +30.0% | +5.0% | yes | regressed |" in md
    assert "| general_zh perplexity | 1990 | 2587 | +30.0% | – | +5.0% | **no** | uninformative | the promoted" in md


def test_the_nightly_form_is_typed():
    schema = parameter_schema(nightly).model_dump()
    for name in FORM_SECTIONS:
        assert schema["properties"][name]["anyOf"][0]["$ref"].startswith("#/definitions/")
    assert schema["properties"]["run_date"]["anyOf"][0] == {"format": "date", "type": "string"}


def test_the_nightly_form_is_folded_and_opens_its_sections_at_the_config_files_values():
    """Its four sections were 19,562 px of form: closed now (None: the file's), opening at the deployed file's values
    (flows/run_form.py), the fields set per night first."""
    from pathlib import Path

    from deployments import render_prefect_file
    from flows.run_form import NIGHT_PER_RUN, folded_form_schema
    from pipeline_lib.config.form import form_defaults

    doc = render_prefect_file()
    params = next(d for d in doc["deployments"] if d["entrypoint"].endswith(":nightly"))["parameters"]
    assert not set(params) & set(FORM_SECTIONS) and params["config"] == "configs/pipelines/tiny-cpu.yaml"
    defaults = form_defaults(Path(__file__).resolve().parents[2] / params["config"])
    schema = folded_form_schema(parameter_schema(nightly).model_dump(), {k: defaults[k] for k in FORM_SECTIONS},
                                NIGHT_PER_RUN)
    props, defs = schema["properties"], schema["definitions"]
    assert sorted(props, key=lambda k: props[k]["position"])[:len(NIGHT_PER_RUN)] == list(NIGHT_PER_RUN)
    assert defs["TrainingConfig"]["properties"]["preflight_steps"]["default"] == defaults["training"]["preflight_steps"] == 5
    assert defs["DataConfig"]["properties"]["docs_per_shard"]["default"] == 200
