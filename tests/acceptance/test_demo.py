"""The README's first hour, from a fresh copy of the repository, with no outbound connection.

What a new user does first: the README's walk block (`make demo`, the commands that look at the result, `make demo`
again, `diff`), each line as written in a fresh bash. Both demos must succeed with the shipped tiny default (relative
output root `runs`, bundled data), and the second run must really run its stages (a new run id: nothing of the first
run is reused as "done"). Every Python process of the walk carries tests/offline's guard: a connect or name lookup of
anything but loopback fails and is recorded, and the record must stay empty.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import ROOT, readme_commands, readme_walk

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
    # a run that is done prints no traceback, not even in the interpreter's teardown (a process pool made before the
    # CLI's gc.freeze printed "Exception ignored in ... weakref_cb" there)
    assert not [ln for ln in lines if ln.startswith(("Traceback", "Exception ignored"))], "\n".join(lines[-40:])
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


OFFLINE = Path(__file__).resolve().parents[1] / "offline"  # its sitecustomize refuses every non-loopback connect


def offline_env(user_repo) -> dict:
    """The user's environment plus the guard in every Python process started under it (PYTHONPATH's sitecustomize),
    checked to refuse and record a public address before the walk relies on it."""
    log = user_repo.home / "outbound.log"
    env = {"PYTHONPATH": f"{user_repo.path}:{user_repo.path / OFFLINE.relative_to(ROOT)}",
           "LLM_PIPELINE_OUTBOUND_LOG": str(log)}
    probe = user_repo.run([".venv/bin/python", "-c", "import socket; socket.create_connection(('192.0.2.1', 443), 1)"],
                          env=env, check=False)
    assert probe.returncode != 0 and "refused by the test's guard" in probe.stdout, probe.stdout
    assert "192.0.2.1" in log.read_text()
    log.unlink()
    return env


def test_the_readme_walk_from_a_fresh_copy_with_no_outbound_connection(user_repo):
    """The README's first-hour block, line by line as written, in a fresh bash: `make demo` twice and the commands
    between and after, with every connection but loopback refused in every process (issue 49 items 1 and 2)."""
    lines = readme_walk()
    demo = readme_commands()["demo"]
    assert [ln.split("#")[0].strip() for ln in lines].count(demo) == 2, lines
    env = offline_env(user_repo)
    done = user_repo.walk(lines, env=env)
    outbound = user_repo.home / "outbound.log"
    assert not outbound.exists(), f"outbound connections tried:\n{outbound.read_text()[:4000]}"
    outputs = [out for line, out in done if line.split("#")[0].strip() == demo]
    first_out = outputs[0]
    first_id, first = report(first_out)
    second_id, second = report(outputs[1])
    said = {line.split("#")[0].strip().split()[1]: out for line, out in done if line.startswith("llm-pipeline ")}
    assert f"{'stage':<9} {'state':<13} detail" in said["status"] and "not complete" not in said["status"]
    assert f"run {first_id}: nothing is wrong" in said["doctor"]
    assert "2 run(s), 420 documents (840 entries" in said["dedup-index"], said["dedup-index"]
    assert "llama2-7b-4x64gb.yaml: OK" in said["validate"] and "not checked" in said["validate"]  # its s3:// inputs
    quiet_terminal(first_out)
    runs = user_repo.path / "runs"
    log_file = next((runs / first_id / "logs").glob("pretrain-*.log"))
    records = prefect_records(user_repo.home, first_id, log_file)
    full_log_holds_every_line(runs / first_id / "pretrain", log_file)
    print(f"demo: {len(first_out.splitlines())} terminal lines, {len(records)} Prefect records of the pretrain task "
          f"run ({sum(level == 30 for level, _ in records)} at WARNING); README walk: {len(lines)} lines")
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
