"""The key figures the run overview shows per stage (pipeline_lib/key_figures.py, named by the stage table)."""
from pipeline_lib.key_figures import fmt
from pipeline_lib.stages import key_figures

PRETRAIN = {"steps": 60, "loss_first": 7.631234567, "final_loss": 3.7412345678}


def test_numbers_are_rounded_for_reading():
    assert fmt(3.741234567) == "3.741" and fmt(1234567) == "1,234,567" and fmt(None) == "-"


def test_pretrain_figures_name_what_strays_from_the_planner_only():
    rows = [{"figure": "step time", "predicted": 46.0, "measured": 251.3, "unit": "ms", "alert": True},
            {"figure": "memory per device", "predicted": 2.01, "measured": 2.55, "unit": "GB", "alert": False}]
    figures = key_figures("pretrain", {**PRETRAIN, "planner_check": {"rows": rows}})
    assert "step time 251.3 ms vs planner 46 ms (off)" in figures
    assert not any("memory" in f for f in figures)
    assert not any("planner" in f for f in key_figures("pretrain", PRETRAIN))


def test_every_stage_says_how_it_went_and_missing_metrics_say_nothing():
    figures = {"data": {"tokens": 22345, "kept": 420}, "pretrain": PRETRAIN, "sft": {"steps": 3, "loss_last": 1.5},
               "evaluate": {"checkpoints": [{"checkpoint": "sft", "perplexity": 38.1}]},
               "export": {"tables": {"checks": {"rows": [{"ok": True, "max_abs_diff": 0.00123}]}}}}
    assert {stage: key_figures(stage, m) for stage, m in figures.items()} == {
        "data": ["tokens 22,345", "documents kept 420"], "pretrain": ["steps 60", "loss 7.631 → 3.741"],
        "sft": ["steps 3", "final loss 1.5"], "evaluate": ["perplexity sft 38.1"],
        "export": ["logits checks ok 1/1", "max logits diff 0.00123"]}
    assert all(key_figures(stage, {}) == [] for stage in figures) and key_figures("nowhere", {"x": 1}) == []
