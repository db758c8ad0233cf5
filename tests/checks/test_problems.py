"""What `validate` and `run` check once before any flow (pipeline_lib/checks): the pure config rules, the
rules that need stage code, and the input checks of the stages asked for."""
import pytest

from pipeline_lib.checks import problems, refuse_bad_config
from pipeline_lib.config import ConfigError, config_from_dict


def test_a_plan_skips_the_input_files_but_not_the_rules_that_need_stage_code(tmp_path):
    cfg = config_from_dict({"data": {"inputs": [str(tmp_path / "missing.jsonl")],
                                     "filters": [{"name": "lenght"}]},
                            "parallel": {"devices": 3}})
    errors, _ = problems(cfg, for_run=False)
    assert {i.field for i in errors} == {"data.filters[0].name", "parallel.devices"}
    errors, _ = problems(cfg)
    assert {i.field for i in errors} == {"data.filters[0].name", "parallel.devices", "data.inputs[0]"}


def test_only_the_stages_asked_for_have_their_inputs_checked(tmp_path):
    cfg = config_from_dict({"data": {"inputs": [str(tmp_path / "missing.jsonl")]}})
    assert refuse_bad_config(cfg, ["pretrain"]) == []
    with pytest.raises(ConfigError) as err:
        refuse_bad_config(cfg, ["data", "pretrain"])
    assert [i.field for i in err.value.issues] == ["data.inputs[0]"]
