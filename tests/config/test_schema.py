"""Identity markers on the schema (config/schema.py `identity` / NO_OUTPUT_EFFECT): every field is
classified, so a new field cannot silently stay out of (or wrongly in) every stage's identity."""
from __future__ import annotations

import pytest
from pydantic import Field

from pipeline_lib.config import ConfigError
from pipeline_lib.config.schema import NO_OUTPUT_EFFECT, PipelineConfig, _Section, identity
from pipeline_lib.config.identity import schema_fields
from pipeline_lib.stages import SPECS


def test_every_schema_field_belongs_to_a_stage_identity_or_is_marked_as_not_changing_outputs():
    unmarked = [name for name, marker in schema_fields() if marker is None]
    assert unmarked == [], (f"unclassified config fields {unmarked}. Fix: mark each in config/schema.py with "
                            "json_schema_extra=identity(<stages whose outputs it changes>) or NO_OUTPUT_EFFECT")


def test_markers_name_only_stages_of_the_table_and_every_stage_has_an_identity():
    named = {stage for _, marker in schema_fields() for stage in marker["stages"]}
    assert named <= set(SPECS), named - set(SPECS)
    assert set(SPECS) <= named, set(SPECS) - named  # a stage whose config nothing marks would never rerun


def test_the_walk_finds_an_unmarked_field_and_inherits_section_markers():
    class Knobs(_Section):
        marked: int = Field(1, json_schema_extra=NO_OUTPUT_EFFECT)
        forgotten: int = 2

    class Root(_Section):
        knobs: Knobs = Field(default_factory=Knobs)
        covered: Knobs = Field(default_factory=Knobs, json_schema_extra=identity("data"))

    found = dict(schema_fields(Root))
    assert found["knobs.forgotten"] is None and found["knobs.marked"] == NO_OUTPUT_EFFECT["identity"]
    assert found["covered.forgotten"] == identity("data")["identity"]  # the section's marker covers it
    assert found["covered.marked"] == NO_OUTPUT_EFFECT["identity"]  # a field's own marker wins


def test_fields_that_only_change_how_the_work_runs_are_in_no_identity():
    markers = dict(schema_fields(PipelineConfig))
    for name in ("data.num_workers", "data.executor", "data.read_batch_size", "tokenizer.encode_threads",
                 "training.timeout_seconds", "training.upload_checkpoints", "training.preflight_steps",
                 "training.dataset_workers", "training.prefetch_size", "training.profile.enabled",
                 "training.profile.record", "training.planner_alert_factor", "training.planner_tflops",
                 "run.output_root"):
        assert markers[name]["stages"] == [], name


def test_profile_is_a_section_and_a_bool_is_its_shorthand():
    from pipeline_lib.config import config_from_dict

    assert config_from_dict({"training": {"profile": True}}).training.profile.enabled is True
    assert config_from_dict({"training": {"profile": False}}).training.profile.enabled is False
    full = config_from_dict({"training": {"profile": {"enabled": True, "start_step": 3, "stop_step": 5,
                                                      "record": ["memory", "communication"]}}}).training.profile
    assert (full.start_step, full.stop_step, full.record) == (3, 5, ["memory", "communication"])
    with pytest.raises(ConfigError, match=r"training\.profile\.record"):
        config_from_dict({"training": {"profile": {"record": ["flops"]}}})
