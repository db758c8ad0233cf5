"""nightly.deadline: the deadline's moment, what a night measured, and tonight's steps, on cases worked by hand."""
from __future__ import annotations

import datetime as dt

import pytest

from pipeline_lib.nightly.deadline import (deadline_at, last_timing, night_timing, parse_hhmm, plan_steps,
                                           size_tonight)

UTC = dt.timezone.utc
# last night: 60 steps of 2 s (120 s) in a pretrain stage of 150 s (30 s of start), 200 s in data + evaluate
TIMING = {"steps": 60, "step_s": 2.0, "pretrain_s": 150.0, "startup_s": 30.0, "other_s": 200.0}


def test_deadline_is_the_next_such_time_in_the_schedules_zone():
    # 02:00 Shanghai = 18:00 UTC the day before; 07:00 Shanghai the same Shanghai day = 23:00 UTC
    at = deadline_at("07:00", "Asia/Shanghai", dt.datetime(2026, 12, 3, 18, 0, tzinfo=UTC))
    assert at.astimezone(UTC) == dt.datetime(2026, 12, 3, 23, 0, tzinfo=UTC)
    # started 23:30 Shanghai (15:30 UTC): tomorrow 07:00, 7.5 h later
    at = deadline_at("07:00", "Asia/Shanghai", dt.datetime(2026, 12, 3, 15, 30, tzinfo=UTC))
    assert at.astimezone(UTC) - dt.datetime(2026, 12, 3, 15, 30, tzinfo=UTC) == dt.timedelta(hours=7, minutes=30)
    # exactly at the deadline: the next one, a day later
    at = deadline_at("07:00", "UTC", dt.datetime(2026, 12, 3, 7, 0, tzinfo=UTC))
    assert at.astimezone(UTC) == dt.datetime(2026, 12, 4, 7, 0, tzinfo=UTC)
    # across the spring-forward night in Berlin (2026-03-29 02:00 -> 03:00): 01:00 CET to 07:00 CEST is 5 h
    at = deadline_at("07:00", "Europe/Berlin", dt.datetime(2026, 3, 29, 0, 0, tzinfo=UTC))
    assert at - dt.datetime(2026, 3, 29, 0, 0, tzinfo=UTC) == dt.timedelta(hours=5)


@pytest.mark.parametrize("bad", ["7:00", "24:00", "07:60", "seven", "", "07:00:00"])
def test_a_time_that_is_not_hh_mm_is_refused_naming_the_field_and_the_fix(bad):
    with pytest.raises(ValueError, match=r"nightly.deadline=.* Fix: HH:MM"):
        parse_hhmm(bad)


def test_night_timing_separates_the_steps_from_the_trainers_start_and_the_other_stages():
    t = night_timing(60, 2000.0, {"data": 150.0, "pretrain": 150.0, "evaluate": 50.0})
    assert t == TIMING
    # no median step time (too few steps): the wall time per step stands in (no start-up left over)
    t = night_timing(10, None, {"data": 5.0, "pretrain": 40.0, "evaluate": 5.0})
    assert t["step_s"] == 4.0 and t["startup_s"] == 0.0 and t["other_s"] == 10.0
    # nothing trained (pretrain cached: 0 s) or no steps: nothing to measure
    assert night_timing(60, 2000.0, {"data": 1.0, "pretrain": 0.0}) is None
    assert night_timing(None, 2000.0, {"pretrain": 10.0}) is None


def test_last_timing_is_the_newest_trained_nights():
    state = {"history": [{"run_id": "a", "timing": {"step_s": 1.0}}, {"run_id": "b", "timing": {"step_s": 3.0}},
                         {"run_id": "c", "decision": "no new data"}]}
    assert last_timing(state) == {"step_s": 3.0}
    assert last_timing({"history": []}) is None


def test_steps_that_fit_are_kept():
    # 1 h left: 3600 x 0.9 = 3240 s; less 200 + 30 = 3010 s; at 2 s a step 1505 steps fit
    plan = plan_steps(60, 11, 3600, TIMING, "07:00 UTC")
    assert (plan.steps, plan.fit, plan.cut, plan.late) == (60, 1505, False, False)
    assert not plan.worth_saying


def test_steps_are_cut_to_what_fits_and_the_message_says_so():
    # 500 s left: 450 - 230 = 220 s: 110 steps of 2 s; configured 200
    plan = plan_steps(200, 11, 500, TIMING, "07:00 UTC")
    assert (plan.steps, plan.fit, plan.cut, plan.late) == (110, 110, True, False)
    assert "steps cut 200 -> 110 to end before 07:00 UTC" in plan.message
    assert "2 s a step" in plan.message and "230 s of other stages and trainer start" in plan.message


def test_never_below_the_floor_and_a_night_that_cannot_fit_says_it_will_end_late():
    # 300 s left: 270 - 230 = 40 s: 20 steps fit, floor 25: trains 25 and says it will be late
    plan = plan_steps(200, 25, 300, TIMING, "07:00 UTC")
    assert (plan.steps, plan.fit, plan.cut, plan.late) == (25, 20, True, True)
    assert "even the floor of 25 steps does not fit" in plan.message and "20 would" in plan.message
    # already past what other stages take: 0 fit, still the floor
    assert plan_steps(200, 25, 100, TIMING).steps == 25
    # a floor above the configured steps is the configured steps: never more than asked
    plan = plan_steps(8, 11, 100, TIMING)
    assert plan.steps == 8 and plan.late and not plan.cut and plan.worth_saying


def test_without_a_measure_the_configured_steps_run():
    plan = plan_steps(60, 11, 500, None, "07:00 UTC")
    assert plan.steps == 60 and plan.fit is None and not plan.worth_saying
    assert "no earlier night measured a step time yet" in plan.message


def test_size_tonight_reads_the_config_and_the_state(tmp_path):
    from pipeline_lib.config import load_config

    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [f"run.output_root={tmp_path}", "nightly.deadline=07:00",
                                                          "orchestration.timezone=UTC", "training.steps=200",
                                                          "training.preflight_steps=10"])
    state = {"history": [{"run_id": "nightly-2026-12-02", "timing": TIMING}]}
    plan = size_tonight(cfg, state, now=dt.datetime(2026, 12, 3, 6, 51, 40, tzinfo=UTC))  # 500 s before 07:00
    assert (plan.steps, plan.configured) == (110, 200) and "07:00 UTC" in plan.message
    # the floor is the preflight's steps + 1, or the warm-up when longer (a warm-up longer than the run is refused)
    too_late = dt.datetime(2026, 12, 3, 6, 59, 0, tzinfo=UTC)
    assert size_tonight(cfg, state, now=too_late).steps == 11
    cfg.training.warmup_steps = 40
    assert size_tonight(cfg, state, now=too_late).steps == 40
    cfg.nightly.deadline = None
    assert size_tonight(cfg, state) is None
