"""The reliability suite (issue 16): fuzzed input, secrets, and later kill points and storage faults.

Every test here carries the `reliability` marker. Hypothesis profiles:
- `ci` (default): a modest number of examples, so `make test` stays within its budget;
- `reliability` (`HYPOTHESIS_PROFILE=reliability`): >= 10,000 fuzzed records in all (`bench/reliability.py`).
Tests add their figures to the session `tally` (records fuzzed, bytes scanned, secrets found ...); a failed
test counts as a crash / a leak of its row. With LLM_PIPELINE_RELIABILITY_RESULTS=<file.json> set, the
tally is written there at the end of the session (the table `bench/reliability.py` prints).
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase

# Failing examples are replayed first on the next run; hypothesis's files stay with the other test
# scratch, not in the repository (its default is ./.hypothesis).
_DB = Path(os.environ.get("LLM_PIPELINE_TEST_TMP", "/tmp/llm-pipeline-tests")) / "hypothesis"
set_hypothesis_home_dir(str(_DB / "home"))
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much],
               database=DirectoryBasedExampleDatabase(str(_DB)))
settings.register_profile("ci", max_examples=40, **_COMMON)
settings.register_profile("reliability", max_examples=600, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

RESULTS_ENV = "LLM_PIPELINE_RELIABILITY_RESULTS"
_TALLY: dict[str, dict] = defaultdict(lambda: defaultdict(int))
_ROWS: dict[str, str] = {}  # test module nodeid -> its RELIABILITY_ROW


class Tally:
    """Counters per table row: `tally.add("fuzz", records=20)`."""

    def add(self, row: str, **counts: int) -> None:
        for key, n in counts.items():
            _TALLY[row][key] += int(n)

    def get(self, row: str, key: str) -> int:
        return _TALLY[row][key]


@pytest.fixture(scope="session")
def tally() -> Tally:
    return Tally()


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)
            row = getattr(getattr(item, "module", None), "RELIABILITY_ROW", None)
            if row:
                _ROWS[item.nodeid.split("::")[0]] = row


def pytest_runtest_logreport(report):
    """A failed reliability test is a crash (fuzz) or a leak (secrets): counted under its module's ROW."""
    if report.when != "call" and not (report.when == "setup" and report.failed):
        return
    row = _ROWS.get(report.nodeid.split("::")[0])
    if row is None:
        return
    _TALLY[row]["tests"] += report.when == "call"
    _TALLY[row]["failed_tests"] += report.failed


def pytest_sessionfinish(session):
    out = os.environ.get(RESULTS_ENV)
    if not out or not _TALLY:
        return
    path = Path(out)
    merged = json.loads(path.read_text()) if path.exists() else {}
    for row, counts in _TALLY.items():
        merged[row] = {**merged.get(row, {}), **counts}
    path.write_text(json.dumps(merged, indent=2, sort_keys=True))
