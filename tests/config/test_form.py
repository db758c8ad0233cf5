"""config/form.py and load.merge_sections: the run form's defaults and how its sections apply."""
from pathlib import Path

import pytest
import yaml

from pipeline_lib.config import ConfigError, load_config
from pipeline_lib.config.form import form_defaults, form_sections
from pipeline_lib.config.load import merge_sections
from pipeline_lib.config.identity import stage_hash
from pipeline_lib.stages import SPECS

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/pipelines/tiny-cpu.yaml"


def test_defaults_fill_every_field_and_are_the_config_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a deploying machine's cwd must not leak into the paths
    defaults = form_defaults(TINY)
    assert list(defaults) == form_sections()
    assert defaults["data"]["docs_per_shard"] == 200 and defaults["training"]["preflight_steps"] == 5  # file values
    assert len(defaults["data"]["filters"]) == 8  # a default-factory field is filled, not left empty
    monkeypatch.chdir(ROOT)
    assert load_config(TINY, sections=defaults) == load_config(TINY)


def test_paths_stay_as_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    defaults = form_defaults(TINY)
    assert defaults["run"]["output_root"] == "runs"
    assert defaults["data"]["inputs"] == ["configs/data/tiny_corpus.jsonl"]
    assert defaults["sft"]["inputs"] == ["configs/data/tiny_sft.jsonl"]  # a default, not in the file
    assert load_config(TINY).run.output_root == str(tmp_path / "runs")  # resolution itself is back on


def test_derived_fields_show_their_own_default_so_precision_rederives():
    defaults = form_defaults(TINY)
    assert load_config(TINY).model.compute_dtype == "float32"  # derived from training.precision=fp32
    assert defaults["model"]["compute_dtype"] is None
    defaults["training"]["precision"] = "bf16"
    assert load_config(TINY, sections=defaults) == load_config(TINY, ["training.precision=bf16"])


def test_a_secret_is_never_a_default_and_an_empty_one_keeps_the_files(tmp_path):
    raw = yaml.safe_load(TINY.read_text())
    raw["orchestration"] = {"failure_webhook_url": "https://hooks.example/T0KEN"}
    path = tmp_path / "with-secret.yaml"
    path.write_text(yaml.safe_dump(raw))
    defaults = form_defaults(path)
    assert "T0KEN" not in repr(defaults)
    defaults["orchestration"]["failure_webhook_url"] = None  # what a form sends for an untouched empty field
    assert load_config(path, sections=defaults).orchestration.failure_webhook_url.endswith("T0KEN")
    defaults["orchestration"]["failure_webhook_url"] = "https://hooks.example/other"
    assert load_config(path, sections=defaults).orchestration.failure_webhook_url.endswith("other")


def test_sections_merge_field_by_field_and_overrides_apply_last():
    cfg = load_config(TINY, ["training.steps=9"],
                      sections={"training": {"steps": 30, "optimizer": {"beta2": 0.99}}, "data": None})
    assert cfg.training.steps == 9  # the override wins over the section
    assert cfg.training.optimizer.beta2 == 0.99 and cfg.training.optimizer.beta1 == 0.9  # sub-section merged
    assert cfg.training.learning_rate == 3e-3  # the file's value where the section says nothing
    assert cfg.data.docs_per_shard == 200  # a None section is the file's


def test_a_leaf_list_is_replaced_not_merged():
    cfg = load_config(TINY, sections={"sft": {"target_modules": ["wq"]}})
    assert cfg.sft.target_modules == ["wq"]


def test_two_changed_fields_give_the_stage_identity_of_the_same_overrides():
    defaults = form_defaults(TINY)
    defaults["data"]["docs_per_shard"] = 50
    defaults["training"]["learning_rate"] = 1e-3
    by_form = load_config(TINY, sections=defaults)
    by_cli = load_config(TINY, ["data.docs_per_shard=50", "training.learning_rate=1e-3"])
    assert {s: stage_hash(by_form, s) for s in SPECS} == {s: stage_hash(by_cli, s) for s in SPECS}
    assert stage_hash(by_form, "data") != stage_hash(load_config(TINY), "data")


def test_an_unknown_section_is_named_with_the_fix():
    with pytest.raises(ConfigError) as err:
        merge_sections({}, {"trainig": {"steps": 3}})
    assert "trainig" in str(err.value) and "training" in str(err.value)
