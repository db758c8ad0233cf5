"""nightly.deadline: how many training steps fit before the night must be done.

The measure is the previous trained night's (its `timing` in the state's history: steps, the median step time of its
pretrain manifest, the pretrain stage's wall time and the other stages' wall time). Tonight's training gets the time
left until the deadline, less a safety share, less what the other stages and the trainer's own start (launch, graph
compile, preflight, checkpoint saves: pretrain's wall time beyond its steps) took last night. A night is never cut
below `floor` steps (the preflight's steps + 1: fewer would train nothing after the preflight's judgement; and the
warm-up's, which may not be longer than the run); when even that does not fit it trains the floor and says so.
"""
from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

SAFETY = 0.10  # share of the time left kept free: a night's stages vary by more than a few percent
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


def parse_hhmm(value: str) -> tuple[int, int]:
    """"07:30" -> (7, 30); a clear error naming the field, the value and the fix otherwise."""
    found = _HHMM.match(value or "")
    if not found:
        raise ValueError(f"nightly.deadline={value!r} is not a time of day. Fix: HH:MM on a 24-hour clock in "
                         "orchestration.timezone, e.g. '07:00', or leave it empty for no deadline")
    return int(found.group(1)), int(found.group(2))


def deadline_at(hhmm: str, timezone: str, now: dt.datetime) -> dt.datetime:
    """The first HH:MM in `timezone` after `now` (a night started at 23:30 with a 07:00 deadline has until tomorrow
    07:00; one started at 02:00 has until 07:00 the same day). Aware datetime in that zone."""
    from zoneinfo import ZoneInfo

    hour, minute = parse_hhmm(hhmm)
    local = now.astimezone(ZoneInfo(timezone))
    at = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if at <= local:
        # next calendar day at the same wall time (a DST change in between shifts it by the zone's rule)
        day = (local + dt.timedelta(days=1)).date()
        at = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=ZoneInfo(timezone))
    return at


def night_timing(steps: int | None, step_time_ms: float | None, stage_seconds: dict[str, float]) -> dict | None:
    """What tonight measured, for tomorrow's sizing (kept in the state as `timing`): None when it trained nothing.
    Without a median step time (a run too short to have one) the pretrain wall time per step stands in for it: an
    over-estimate, which cuts more than needed, never less."""
    pretrain_s = stage_seconds.get("pretrain")
    if not steps or not pretrain_s:
        return None
    step_s = step_time_ms / 1000 if step_time_ms else pretrain_s / steps
    return {"steps": int(steps), "step_s": round(step_s, 6), "pretrain_s": round(pretrain_s, 3),
            "startup_s": round(max(0.0, pretrain_s - steps * step_s), 3),
            "other_s": round(sum(s for k, s in stage_seconds.items() if k != "pretrain"), 3)}


def last_timing(state: dict) -> dict | None:
    """The newest history entry's `timing` (the previous trained night's measure), None before any."""
    for night in reversed(state.get("history", [])):
        if night.get("timing"):
            return night["timing"]
    return None


@dataclass(frozen=True)
class StepPlan:
    steps: int           # what tonight trains
    configured: int      # training.steps
    fit: int | None      # steps that fit before the deadline (None: nothing measured yet)
    seconds_left: float  # until the deadline, at the night's start
    message: str

    @property
    def cut(self) -> bool:
        return self.steps < self.configured

    @property
    def late(self) -> bool:
        """Even the steps it trains do not fit: the night will end after the deadline."""
        return self.fit is not None and self.fit < self.steps

    @property
    def worth_saying(self) -> bool:
        """The night's message says so (cut steps, or a night that will end late)."""
        return self.cut or self.late


def plan_steps(configured: int, floor: int, seconds_left: float, timing: dict | None, deadline: str = "the deadline",
               safety: float = SAFETY) -> StepPlan:
    """Tonight's steps: `configured` when they fit, else as many as fit, never fewer than `floor` (nor more than
    `configured`)."""
    floor = max(1, min(floor, configured))
    left = f"{seconds_left / 3600:.2f} h left until {deadline}"
    if not timing:
        return StepPlan(configured, configured, None, seconds_left,
                        f"{left}; no earlier night measured a step time yet: {configured} steps as configured")
    budget = seconds_left * (1 - safety) - timing["other_s"] - timing["startup_s"]
    fit = max(0, math.floor(budget / timing["step_s"])) if timing["step_s"] > 0 else configured
    measure = (f"last night: {timing['step_s']:.3g} s a step, {timing['startup_s'] + timing['other_s']:.0f} s of "
               f"other stages and trainer start, {safety:.0%} kept free")
    if fit >= configured:
        return StepPlan(configured, configured, fit, seconds_left,
                        f"{left}: {configured} steps fit ({fit} would; {measure})")
    if fit >= floor:
        return StepPlan(fit, configured, fit, seconds_left,
                        f"steps cut {configured} -> {fit} to end before {deadline} ({left}; {measure})")
    return StepPlan(floor, configured, fit, seconds_left,
                    f"even the floor of {floor} steps does not fit before {deadline} ({left}; {fit} would; {measure}): "
                    f"training {floor} steps, the night will end late")


def size_tonight(cfg, state: dict, now: dt.datetime | None = None) -> StepPlan | None:
    """The plan for tonight under cfg.nightly.deadline; None without a deadline or without a step count to cut
    (training.steps empty: the epochs decide)."""
    deadline = cfg.nightly.deadline
    if not deadline or not cfg.training.steps:
        return None
    now = now or dt.datetime.now(dt.timezone.utc)
    at = deadline_at(deadline, cfg.orchestration.timezone, now)
    floor = max(cfg.training.preflight_steps + 1, cfg.training.warmup_steps)  # a warm-up longer than the run is refused
    return plan_steps(cfg.training.steps, floor, (at - now).total_seconds(), last_timing(state),
                      f"{deadline} {cfg.orchestration.timezone}")
