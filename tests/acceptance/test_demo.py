"""The README's first command, twice in a row, from a fresh copy of the repository.

What a new user does first: `make demo`, look at the result, `make demo` again. Both must
succeed with the shipped tiny default (relative output root `runs`, bundled data), and the second
run must really run its stages (a new run id: nothing of the first run is reused as "done").
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import readme_commands

pytestmark = [pytest.mark.slow, pytest.mark.train]
STAGES = ("data", "pretrain", "sft", "evaluate", "export")


def report(stdout: str) -> tuple[str, dict[str, str]]:
    """(run id, {stage: state}) from the summary `llm-pipeline run` prints at its end."""
    m = re.findall(r"^run (\S+): (done|FAILED)$", stdout, re.M)
    assert m, stdout[-4000:]
    run_id, verdict = m[-1]
    assert verdict == "done", stdout[-6000:]
    tail = stdout[stdout.rindex(f"run {run_id}: "):]
    states = dict(re.findall(r"^  (\w+)\s+(\w+)", tail, re.M))
    return run_id, states


def test_make_demo_twice_from_a_fresh_copy(user_repo):
    demo = readme_commands()["demo"]
    first_id, first = report(user_repo.make(demo, timeout=1500).stdout)
    second_id, second = report(user_repo.make(demo, timeout=1500).stdout)
    assert first_id != second_id
    for states in (first, second):
        assert {s: states.get(s) for s in STAGES} == {s: "completed" for s in STAGES}, states
    runs = user_repo.path / "runs"  # the relative default output root, under the user's working directory
    for run_id in (first_id, second_id):
        data = json.loads((runs / run_id / "data" / "manifest.json").read_text())
        assert data["metrics"]["kept"] > 0 and data["metrics"]["rows_train"] > 0
        assert (runs / run_id / "export" / "manifest.json").exists()
    # The second run trained on the same corpus: its data stage kept documents (it was not
    # emptied by the dedup index of the first run).
    assert json.loads((runs / second_id / "data" / "stats.json").read_text())["total"]["kept"] == \
        json.loads((runs / first_id / "data" / "stats.json").read_text())["total"]["kept"]
