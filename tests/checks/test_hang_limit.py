"""training.hang_timeout_s against the planner's step and checkpoint save at the shipped 7B layout: 1 s passed for a
2.2 s step (and a ~40 s save of a 20 GB rank file)."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline_lib.checks import problems
from pipeline_lib.checks.hang_limit import SAVE_BYTES_PER_S, busy_between_steps_s
from pipeline_lib.config import load_config
from pipeline_lib.planner.disk import rank_checkpoint_bytes

ROOT = Path(__file__).resolve().parents[2]
SEVEN_B = str(ROOT / "configs/pipelines/llama2-7b-4x64gb.yaml")


def _issues(limit, stages=None):
    cfg = load_config(SEVEN_B, [f"training.hang_timeout_s={limit}"])
    errors, warnings = problems(cfg, stages, for_run=False)
    pick = lambda found: [str(i) for i in found if i.field == "training.hang_timeout_s"]  # noqa: E731
    return pick(errors), pick(warnings)


def test_the_step_and_save_are_the_planners_at_the_7b_layout():
    cfg = load_config(SEVEN_B, [])
    step_s, save_s = busy_between_steps_s(cfg)
    assert step_s == pytest.approx(2.2, abs=0.05)  # the planner's 7B step on 4 devices at 150 TFLOP/s
    assert save_s == pytest.approx(max(rank_checkpoint_bytes(cfg, r) for r in range(4)) / SAVE_BYTES_PER_S)
    assert 30 < save_s < 60  # weights + optimizer state of a quarter of 7B parameters


def test_a_limit_shorter_than_a_step_and_a_save_is_an_error_naming_both_and_the_fix():
    errors, warnings = _issues(1)
    assert len(errors) == 1 and not warnings
    assert "training.hang_timeout_s=1.0" in errors[0] and "step time is 2.21 s" in errors[0]
    assert "checkpoint save 40.4 s" in errors[0] and "at least 128" in errors[0]


def test_a_limit_under_three_steps_and_saves_warns_and_a_roomy_or_empty_one_passes():
    errors, warnings = _issues(60)
    assert not errors and len(warnings) == 1 and "a slow step would be declared a hang" in warnings[0]
    assert _issues(600) == ([], [])
    assert _issues(0) == ([], [])  # the watchdog off
    assert _issues("null") == ([], [])  # derived from measured steps
    assert _issues(1, stages=["data", "evaluate"]) == ([], [])  # nothing trains: not checked
