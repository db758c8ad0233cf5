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


MF_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ - mindformers\S*\[\S+\] - (DEBUG|INFO|WARNING|ERROR) - (.*)$")
DEPRECATION = re.compile(r"deprecat|will be offline", re.I)
MF_FILE_LINE = re.compile(r"^\[(DEBUG|INFO|WARNING|ERROR)\] [\d\- :,]+ \[\S+:\d+\] \w+: (.*)$")


def quiet_terminal(stdout: str) -> None:
    """What `make demo` prints without a TTY: a few lines per stage, not one of mindformers' INFO lines."""
    lines = stdout.splitlines()
    assert len(lines) <= 150, f"{len(lines)} lines:\n" + "\n".join(lines[:200])
    assert not [ln for ln in lines if " - INFO - " in ln or ln.startswith("[INFO]") or "step:[" in ln]
    assert not [ln for ln in lines if "Concurrency limits" in ln]  # Prefect's warning of a limit a laptop has not
    assert not [ln for ln in lines if DEPRECATION.search(ln)]  # mindformers' notices: the log file's (issue 49)
    assert not [ln for ln in lines if "planner's prediction" in ln and "memory" in ln]  # a tiny model: overheads
    for stage in STAGES:
        assert any(ln.endswith(f" {stage}: started") for ln in lines), stage


def prefect_records(home: Path, run_id: str, log_file: Path) -> list[tuple[int, str]]:
    """The pretrain task run's Prefect log records as the embedded API stored them (the user's local database):
    at most 120, each mindformers WARNING of the trainer's output (the stage's log file) among them at WARNING."""
    import sqlite3

    with sqlite3.connect(home / ".prefect" / "prefect.db") as db:
        records = db.execute("SELECT l.level, l.message FROM log l JOIN task_run t ON l.task_run_id = t.id "
                             "WHERE t.name = ?", (f"pretrain/{run_id}",)).fetchall()
    assert 0 < len(records) <= 120, len(records)
    warnings = [m[2] for m in map(MF_LINE.match, log_file.read_text(encoding="utf-8").splitlines())
                if m and m[1] == "WARNING"]
    notices = [w for w in warnings if DEPRECATION.search(w)]  # mindformers' own API changes: the log file's only
    shipped = [message for level, message in records if level == 30]
    assert notices and not [w for w in notices if any(w in message for _, message in records)]
    assert "third-party deprecation notice(s)" in log_file.read_text(encoding="utf-8").splitlines()[-1]
    warnings = [w for w in warnings if w not in notices]
    assert warnings and all(any(message.endswith(w) for message in shipped) for w in warnings)
    assert not [m for level, m in records if level < 30 and ("WARNING" in m or " - INFO - " in m)]
    return records


def full_log_holds_every_line(stage_dir: Path, log_file: Path) -> None:
    """Every record mindformers wrote to its own log files (info.log per trainer launch, a sink apart from the
    stdout we read) is in the stage's log file."""
    ours = log_file.read_text(encoding="utf-8")
    files = sorted(stage_dir.rglob("log/rank_0/info.log"))
    assert files, files  # one per trainer launch (the preflight rides on the training's)
    theirs = [m[2] for f in files for m in map(MF_FILE_LINE.match, f.read_text(encoding="utf-8").splitlines()) if m]
    assert len(theirs) > 100 and [t for t in theirs if t not in ours] == []


def test_make_demo_twice_from_a_fresh_copy(user_repo):
    demo = readme_commands()["demo"]
    first_out = user_repo.make(demo, timeout=1500).stdout
    first_id, first = report(first_out)
    second_id, second = report(user_repo.make(demo, timeout=1500).stdout)
    quiet_terminal(first_out)
    runs = user_repo.path / "runs"
    log_file = next((runs / first_id / "logs").glob("pretrain-*.log"))
    records = prefect_records(user_repo.home, first_id, log_file)
    full_log_holds_every_line(runs / first_id / "pretrain", log_file)
    print(f"demo: {len(first_out.splitlines())} terminal lines, {len(records)} Prefect records of the pretrain task "
          f"run ({sum(level == 30 for level, _ in records)} at WARNING)")
    # TensorBoard: both runs of the lineage (run.name tiny-cpu) under one folder, pretrain and sft each
    board = runs / "_tensorboard" / "tiny-cpu"
    for run_id in (first_id, second_id):
        for stage in ("pretrain", "sft"):
            assert list((board / run_id / stage / "rank_0").glob("events.out.tfevents.*")), (run_id, stage)
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
