"""What the suite holds itself to (imported by tests/conftest.py and by tests that need a machine feature).

- A skip for a machine reason (no chromium, no tmpfs mount, no PostgreSQL, no installed .venv) goes through
  `machine_skip`; under CI (`LLM_PIPELINE_CI=1`, set by .ci/run) such a skip fails the test instead, so a CI
  machine that lost a feature cannot turn a part of the suite green by skipping it.
- Markers select truthfully: a test that takes longer than slow_limit() (SLOW_SECONDS on an idle machine; its own setup included; shared module or session fixtures are not) must carry one of
  SELECTING_MARKERS, else it fails with a message naming the marker to add; `-m "not (slow or train or e2e or
  browser)"` is then a fast subset that really is fast.
"""
from __future__ import annotations

import os

import pytest

MACHINE = "machine: "
SLOW_SECONDS = 10.0  # on an idle machine: slow_limit() scales it by the load


def slow_limit() -> float:
    """SLOW_SECONDS on a machine no busier than its cores; beyond that, scaled by the run-queue per core (the
    1-minute load average): `make test` runs its workers side by side on 2 cores, so a test's wall time grows
    with what its neighbours run, not with what it does."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return SLOW_SECONDS * max(1.0, per_core)
SELECTING_MARKERS = ("slow", "train", "e2e", "browser", "reliability")


def in_ci() -> bool:
    return os.environ.get("LLM_PIPELINE_CI") == "1"


def machine_skip(reason: str):
    """Skip for a reason of this machine (a missing program or permission); fails instead under CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI must have it: .ci/run installs it; a machine skip is a failure in CI)",
                    pytrace=False)
    pytest.skip(MACHINE + reason)
