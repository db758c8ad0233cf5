"""validate's rules on the learning-rate schedules (config/validate.py _schedule, _lineage_schedule,
checks/lr_range.py): each issue names the field, the value and the fix."""
from __future__ import annotations

import pytest
import yaml

from pipeline_lib.config import config_from_dict
from pipeline_lib.config.errors import ConfigError
from pipeline_lib.checks.lr_range import lr_range_warnings, usual_peak_lr
from pipeline_lib.config.validate import check
from pipeline_lib.planner.params import count_params

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _issues(raw: dict) -> dict:
    return {i.field: i for i in check(config_from_dict(raw), for_run=False)}


def test_min_lr_above_the_peak_is_refused_for_pretraining_and_sft():
    found = _issues({"training": {"learning_rate": 1e-3, "min_lr": 2e-3}, "sft": {"learning_rate": 1e-4, "min_lr": 1e-3}})
    t, s = found["training.min_lr"], found["sft.min_lr"]
    assert t.value == 2e-3 and "above the peak training.learning_rate=0.001" in t.problem
    assert "set training.min_lr below training.learning_rate" in t.fix and "0.0001" in t.fix
    assert s.value == 1e-3 and "sft.learning_rate=0.0001" in s.problem
    assert not _issues({"training": {"learning_rate": 1e-3, "min_lr": 1e-3}})  # a constant rate is a choice


def test_wsd_whose_warm_up_and_decay_do_not_fit_the_run_is_refused():
    found = _issues({"training": {"lr_schedule": "wsd", "steps": 10, "warmup_steps": 5, "decay_steps": 6}})
    issue = found["training.decay_steps"]
    assert issue.value == 6 and "the decay (6 steps) and the warm-up left (5 steps)" in issue.problem
    assert "training.steps=10" in issue.problem and "training.decay_steps=2" in issue.fix
    # by fraction: 10 steps x 0.6 = 6 decay steps, named by the field that set them
    by_fraction = _issues({"training": {"lr_schedule": "wsd", "steps": 10, "warmup_steps": 5, "decay_fraction": 0.6}})
    assert by_fraction["training.decay_fraction"].value == 0.6
    # the same night of a lineage whose warm-up is done fits
    assert not _issues({"training": {"lr_schedule": "wsd", "steps": 10, "warmup_steps": 5, "decay_steps": 6,
                                     "lineage_steps": 5}})
    assert not _issues({"training": {"lr_schedule": "wsd", "steps": 10, "warmup_steps": 5, "decay_steps": 5}})


def test_warm_up_longer_than_the_run_is_refused_at_load_unless_a_lineage_did_it():
    with pytest.raises(ConfigError, match=r"training.warmup_steps=8 \(of which training.lineage_steps=2 are done\) "
                                          r"exceeds training.steps=4"):
        config_from_dict({"training": {"lr_schedule": "wsd", "steps": 4, "warmup_steps": 8, "lineage_steps": 2}})
    config_from_dict({"training": {"lr_schedule": "wsd", "steps": 4, "warmup_steps": 8, "lineage_steps": 6}})


def test_wsd_knobs_under_cosine_and_wsd_without_steps_are_refused():
    found = _issues({"training": {"lineage_steps": 7, "keep_stable_weights": True}})
    assert found["training.lineage_steps"].value == 7 and "lr_schedule=wsd only" in found["training.lineage_steps"].problem
    assert "set training.lr_schedule=wsd" in found["training.keep_stable_weights"].fix
    found = _issues({"training": {"lr_schedule": "wsd", "steps": None}})
    assert found["training.lr_schedule"].value == "wsd" and "set training.steps" in found["training.lr_schedule"].fix


def test_lineage_schedule_with_a_sharded_layout_is_refused():
    found = _issues({"nightly": {"lr_schedule": "lineage"}, "run": {"device_target": "Ascend"},
                     "parallel": {"devices": 2, "model_parallel": 2, "devices_per_node": 2}})
    issue = found["nightly.lr_schedule"]
    assert issue.value == "lineage" and "parallel.model_parallel=2" in issue.problem
    assert issue.fix == "set nightly.lr_schedule=per_run for this layout"


def test_usual_peak_follows_the_published_figures():
    # GPT-3 125M 6e-4 (the anchor), Llama 2 7B 3e-4 and GPT-3 6.7B 1.2e-4 within a factor 2, tiny ~3e-3
    assert usual_peak_lr(125e6) == pytest.approx(6e-4)
    assert 1.2e-4 / 2 < usual_peak_lr(7e9) < 3e-4 * 2
    assert 1e-3 < usual_peak_lr(0.36e6) < 6e-3


def test_a_peak_far_from_the_usual_one_is_warned_with_the_fix():
    tiny = config_from_dict({"training": {"learning_rate": 0.5}, "sft": {"learning_rate": 1e-7}})
    usual = usual_peak_lr(count_params(tiny.model).total)
    found = [w for w in lr_range_warnings(tiny) if "learning_rate" in w]
    assert len(found) == 2
    above, below = found
    assert above.startswith("training.learning_rate=0.5 is ") and "far above it" in above
    assert f"set training.learning_rate near {usual:.1e}" in above
    assert below.startswith("sft.learning_rate=1e-07 is ") and "far below it" in below


@pytest.mark.parametrize("name", ["tiny-cpu.yaml", "llama2-7b-4x64gb.yaml", "llama-1.5b-lite.yaml"])
def test_shipped_configs_schedules_are_clean(name):
    cfg = config_from_dict(yaml.safe_load((ROOT / "configs" / "pipelines" / name).read_text()))
    assert not [i for i in check(cfg, for_run=False) if "lr" in i.field or "schedule" in i.field]
    assert not [w for w in lr_range_warnings(cfg) if "learning_rate" in w]
