"""A command checks the stages it runs (pipeline_lib/config/stage_scope.py): a nightly (data, pretrain, evaluate) or a
`run --stages` is not refused for a setting only a stage it does not run reads, and says which settings it ignored."""
import pytest

from pipeline_lib.checks import problems, refuse_bad_config
from pipeline_lib.config import ConfigError, config_from_dict, validate
from pipeline_lib.config.stage_scope import field_stages
from pipeline_lib.config.validate import ignored_issues
from pipeline_lib.stages import nightly_stages

from flows.common import resolve_config

SFT_WARMUP_BROKEN = {"sft": {"steps": 6, "warmup_steps": 6}}


def test_a_field_concerns_the_stages_its_schema_marker_names_else_its_stage_section_else_every_stage():
    assert field_stages("sft.warmup_steps") == {"sft"}
    assert field_stages("sft.inputs[0]") == {"sft"}
    assert field_stages("sft.global_batch_size") == {"sft"}  # marked 'no output effect': its section's stage
    assert field_stages("parallel.model_parallel") == {"pretrain"}
    assert field_stages("data.filters[1].threshold") == {"data"}
    assert field_stages("evaluate.prompt_files") == {"evaluate", "data"}
    for everyone in ("run.output_root", "nightly.lr_schedule", "orchestration.timezone", "no.such"):
        assert field_stages(everyone) is None


def test_the_nightly_is_not_refused_for_an_sft_setting_and_names_it_as_ignored():
    cfg = config_from_dict(SFT_WARMUP_BROKEN)
    assert nightly_stages() == ["data", "pretrain", "evaluate"]
    with pytest.raises(ConfigError) as err:  # a run of every stage still refuses it
        validate(cfg)
    assert [i.field for i in err.value.issues] == ["sft.warmup_steps"]
    assert validate(cfg, stages=nightly_stages()) is cfg
    notes = ignored_issues(cfg, nightly_stages())
    assert [i.field for i in notes] == ["sft.warmup_steps"]
    assert "ignored: it concerns sft" in str(notes[0]) and "data, pretrain, evaluate" in str(notes[0])
    assert ignored_issues(cfg, ["data", "pretrain", "sft"]) == []


def test_the_flows_resolve_the_config_for_their_stages():
    with pytest.raises(ConfigError):
        resolve_config(SFT_WARMUP_BROKEN)
    assert resolve_config(SFT_WARMUP_BROKEN, stages=["data", "pretrain"]).sft.steps == 6
    with pytest.raises(ConfigError):
        resolve_config(SFT_WARMUP_BROKEN, stages=["sft"])


def test_run_stages_warns_for_a_stage_it_does_not_run_and_refuses_for_one_it_runs():
    cfg = config_from_dict(SFT_WARMUP_BROKEN)
    warnings = refuse_bad_config(cfg, ["data"])
    assert [i.field for i in warnings if "ignored" in i.problem] == ["sft.warmup_steps"]
    with pytest.raises(ConfigError):
        refuse_bad_config(cfg, ["data", "sft"])
    errors, _ = problems(cfg, None, for_run=False)  # validate: every stage
    assert [i.field for i in errors] == ["sft.warmup_steps"]
