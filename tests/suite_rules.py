"""What the suite holds itself to (imported by tests/conftest.py and by tests that need a machine feature).

- A skip for a machine reason (no chromium, no tmpfs mount, no PostgreSQL, no installed .venv) goes through
  `machine_skip`; under CI (`LLM_PIPELINE_CI=1`, set by .ci/run) such a skip fails the test instead, so a CI
  machine that lost a feature cannot turn a part of the suite green by skipping it.
- Markers select truthfully: a test that takes longer than SLOW_SECONDS (its own setup included; shared module or session fixtures are not) must carry one of
  SELECTING_MARKERS, else it fails with a message naming the marker to add; `-m "not (slow or train or e2e or
  browser)"` is then a fast subset that really is fast.
"""
from __future__ import annotations

import os

import pytest

MACHINE = "machine: "
SLOW_SECONDS = 10.0
SELECTING_MARKERS = ("slow", "train", "e2e", "browser", "reliability")


def in_ci() -> bool:
    return os.environ.get("LLM_PIPELINE_CI") == "1"


def machine_skip(reason: str):
    """Skip for a reason of this machine (a missing program or permission); fails instead under CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI must have it: .ci/run installs it; a machine skip is a failure in CI)",
                    pytrace=False)
    pytest.skip(MACHINE + reason)
