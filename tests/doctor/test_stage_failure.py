"""The stage failure path runs the doctor: retry follows the category, and the failure message, the webhook and the
CLI summary carry the category and the first remedy."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline_lib import stages
from pipeline_lib.config import load_config
from pipeline_lib.doctor.classify import ALL_CATEGORIES, NO_RETRY_CATEGORIES
from pipeline_lib.doctor.retry import attach_diagnosis, parse_headline, should_retry
from pipeline_lib.stages import TransientError

from doctor_cases import LOGS, log_text
from test_classify import EXPECTED
from webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.e2e  # runs the CLI or flows end to end (servers, workers, subprocesses)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_retry_decision_per_category(name):
    exc = TransientError(log_text(name))  # even an error raised as transient: the cause decides
    retry = should_retry(exc, transient=True)
    assert retry is (EXPECTED[name] in ("collective_timeout", "killed", "hang"))


def test_unknown_cause_keeps_the_transient_rule():
    assert should_retry(ConnectionError("connection reset by peer"), transient=True) is True
    assert should_retry(ValueError("bad value"), transient=False) is False


def test_every_category_has_a_retry_rule():
    assert set(ALL_CATEGORIES) - NO_RETRY_CATEGORIES == {"collective_timeout", "killed", "hang", "unknown"}


def test_attach_appends_the_headline_to_the_message():
    exc = RuntimeError("trainer exited with code 1\n" + log_text("disk_full_save_checkpoint.log"))
    diag = attach_diagnosis(exc, load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml")), "pretrain")
    assert diag.category == "disk_full" and exc.diagnosis is diag
    last = str(exc).splitlines()[-1]
    assert last == diag.headline() and last.startswith("doctor: disk_full in pretrain: checkpoints on this node")
    assert parse_headline(f"stage 'pretrain' failed (run r): RuntimeError: {exc}")["category"] == "disk_full"
    plain = ValueError("no known text")
    assert attach_diagnosis(plain).category == "unknown" and str(plain) == "no known text"


def fake_cgroup_fs(tmp_path: Path) -> Path:
    """A cgroup v2 filesystem for this process (its 0:: path from /proc/self/cgroup) with a memory.events as the
    kernel writes it; tests/doctor/sigkill_entry.py raises its oom_kill count before it dies, as the kernel's OOM
    killer would, when LLM_PIPELINE_TEST_OOM_EVENTS names the file."""
    v2 = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
              if line.startswith("0::"))
    here = tmp_path / "cgroupfs" / v2.strip("/")
    here.mkdir(parents=True, exist_ok=True)
    (here / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    (here / "memory.max").write_text("max\n")
    return here / "memory.events"


def _kill_trainer(tmp_path):
    from pipeline_lib.train.runner import TrainerKilled, launch_trainer

    cfg = load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml"), [f"run.output_root={tmp_path}"])
    (tmp_path / "run.yaml").write_text("{}\n")
    with pytest.raises(TrainerKilled) as info:
        launch_trainer(cfg, tmp_path / "run.yaml", tmp_path / "out", 0, lambda line: None,
                       entry_module="tests.doctor.sigkill_entry")
    return cfg, info.value


def test_a_killed_trainer_without_memory_evidence_is_killed_and_retried(tmp_path, monkeypatch):
    """A real trainer process killed by SIGKILL through the real launcher, its cgroup's oom_kill count unchanged:
    a lost node / preemption / kill -9, retried (TrainerKilled is transient; the retry resumes)."""
    from tasks.stage_task import is_transient

    monkeypatch.setenv("LLM_PIPELINE_CGROUP_FS", str(tmp_path / "cgroupfs"))
    fake_cgroup_fs(tmp_path)
    cfg, exc = _kill_trainer(tmp_path)
    assert exc.result.returncode == -9 and exc.result.memory.oom_kills_before == 0
    assert "[launcher] no memory evidence of an OOM kill: " in str(exc)
    diag = attach_diagnosis(exc, cfg, "pretrain")
    assert diag.category == "killed" and should_retry(exc, is_transient(exc))
    assert "oom_kill count stayed at 0" in diag.evidence[0] and "doctor: killed in pretrain:" in str(exc)


def test_an_oom_killed_trainer_is_host_oom_and_not_retried(tmp_path, monkeypatch):
    """The same real kill, but the cgroup's memory.events oom_kill count rose while it ran: host_oom, no retry; the
    saved log alone (the launcher's line) gives the same answer."""
    from pipeline_lib.doctor.classify import classify
    from tasks.stage_task import is_transient

    monkeypatch.setenv("LLM_PIPELINE_CGROUP_FS", str(tmp_path / "cgroupfs"))
    monkeypatch.setenv("LLM_PIPELINE_TEST_OOM_EVENTS", str(fake_cgroup_fs(tmp_path)))
    cfg, exc = _kill_trainer(tmp_path)
    assert (exc.result.memory.oom_kills_before, exc.result.memory.oom_kills_after) == (0, 1)
    diag = attach_diagnosis(exc, cfg, "pretrain")
    assert diag.category == "host_oom" and not should_retry(exc, is_transient(exc))
    assert "decided by: " in diag.headline() and "the cgroup's oom_kill count rose from 0 to 1" in diag.headline()
    assert classify("\n".join(exc.result.tail))[0] == "host_oom"


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize("oom, attempts", [(True, "1"), (False, "3")])
def test_prefect_retries_a_killed_stage_unless_it_was_an_oom_kill(tmp_path, monkeypatch, oom, attempts):
    """OOM-killed (the cgroup's count rose): run once, the cause reported; killed without that evidence: retried
    (task_retries=2: three attempts; the double is killed every time)."""
    from flows.pipeline import llm_pipeline

    monkeypatch.setenv("LLM_PIPELINE_CGROUP_FS", str(tmp_path / "cgroupfs"))
    events = fake_cgroup_fs(tmp_path)
    if oom:
        monkeypatch.setenv("LLM_PIPELINE_TEST_OOM_EVENTS", str(events))
    for name in ("data", "pretrain"):
        monkeypatch.setitem(stages.SPECS, name, dataclasses.replace(stages.SPECS[name],
                                                                   runner=f"doctor_doubles:{name}"))
    with WebhookReceiver() as hook:
        cfg = load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml"),
                          [f"run.output_root={tmp_path}", "orchestration.retry_delay_seconds=0.1",
                           "orchestration.task_retries=2", f"orchestration.failure_webhook_url={hook.url}"])
        state = llm_pipeline(config=cfg.model_dump(mode="json"), run_id="r-oom", stages=["data", "pretrain"],
                             return_state=True)
    assert state.is_failed()
    assert (tmp_path / "r-oom" / "attempts-pretrain").read_text() == attempts
    category = "host_oom" if oom else "killed"
    assert f"doctor: {category} in pretrain:" in state.message
    note = hook.received[-1]
    assert note["stage"] == "pretrain" and note["category"] == category and note["remedy"]
    # the message: ours, the log file's path and the doctor's headline, not the trainer's tail (that is in the file)
    message = state.message
    assert "the trainer was killed by signal 9" in message and "--- last " not in message and "command: " not in message
    assert len(message) < 1200, len(message)
    # the run's message: how many attempts failed, and no cgroup file (the stage's log keeps what was read)
    assert ("all 3 attempts failed; the last: " in message) is (not oom), message
    assert "cgroupfs" not in message and "memory.events" not in message, message
    log_file = Path(message.split("\nfull log: ", 1)[1].split("\n", 1)[0])
    assert "--- last " in log_file.read_text(encoding="utf-8") and "a retry resumes" not in message
    # what happens next, said as it happens: the last attempt's record says no retry follows and why
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterLevel
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        logged = client.read_logs(log_filter=LogFilter(level=LogFilterLevel(ge_=40)))
    final = [r.message for r in sorted(logged, key=lambda r: r.timestamp)
             if r.message.startswith(f"doctor: {category} in pretrain:") and "\npretrain failed: " in r.message][-1]
    assert f"full log: {log_file}" in final
    if oom:
        assert "not retried (retrying the same config cannot fix host_oom); resume with" in final
    else:
        assert "not retried again: all 3 attempts failed (orchestration.task_retries=2); resume with" in final


def test_cli_summary_names_the_cause(capsys):
    from flows.cli import print_summary

    exc = RuntimeError("trainer exited with code 1\n" + log_text("nan_mindformers_monitor.log"))
    attach_diagnosis(exc, None, "pretrain")
    print_summary({"run_id": "r1", "run_uri": "/runs/r1", "stages": {}},
                  failed=f"stage 'pretrain' failed (run r1): RuntimeError: {exc}")
    out = capsys.readouterr().out
    assert "\ncause: nan_or_overflow: the loss became NaN/inf" in out
    assert "details: llm-pipeline doctor --run-id r1 CONFIG" in out
