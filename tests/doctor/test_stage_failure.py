"""The stage failure path runs the doctor: retry follows the category, and the failure message, the webhook and the
CLI summary carry the category and the first remedy."""
from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from pipeline_lib import stages
from pipeline_lib.config import load_config
from pipeline_lib.doctor.classify import ALL_CATEGORIES, NO_RETRY_CATEGORIES
from pipeline_lib.doctor.retry import attach_diagnosis, parse_headline, should_retry
from pipeline_lib.stages import TransientError

from doctor_cases import LOGS, log_text
from test_classify import EXPECTED

pytestmark = pytest.mark.e2e  # runs the CLI or flows end to end (servers, workers, subprocesses)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_retry_decision_per_category(name):
    exc = TransientError(log_text(name))  # even an error raised as transient: the cause decides
    retry = should_retry(exc, transient=True)
    assert retry is (EXPECTED[name] == "collective_timeout")


def test_unknown_cause_keeps_the_transient_rule():
    assert should_retry(ConnectionError("connection reset by peer"), transient=True) is True
    assert should_retry(ValueError("bad value"), transient=False) is False


def test_every_category_has_a_retry_rule():
    assert set(ALL_CATEGORIES) - NO_RETRY_CATEGORIES == {"collective_timeout", "unknown"}


def test_attach_appends_the_headline_to_the_message():
    exc = RuntimeError("trainer exited with code 1\n" + log_text("disk_full_save_checkpoint.log"))
    diag = attach_diagnosis(exc, load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml")), "pretrain")
    assert diag.category == "disk_full" and exc.diagnosis is diag
    last = str(exc).splitlines()[-1]
    assert last == diag.headline() and last.startswith("doctor: disk_full in pretrain: checkpoints on this node")
    assert parse_headline(f"stage 'pretrain' failed (run r): RuntimeError: {exc}")["category"] == "disk_full"
    plain = ValueError("no known text")
    assert attach_diagnosis(plain).category == "unknown" and str(plain) == "no known text"


def test_an_oom_killed_trainer_is_not_retried(tmp_path):
    """A real trainer process killed by SIGKILL through the real launcher: TrainerKilled is a TransientError (the
    old rule retried it twice with the same config); the doctor calls it host_oom and says no."""
    from pipeline_lib.train.runner import TrainerKilled, launch_trainer
    from tasks.stage_task import is_transient

    cfg = load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml"), [f"run.output_root={tmp_path}"])
    (tmp_path / "run.yaml").write_text("{}\n")
    with pytest.raises(TrainerKilled) as info:
        launch_trainer(cfg, tmp_path / "run.yaml", tmp_path / "out", 0, lambda line: None,
                       entry_module="tests.doctor.sigkill_entry")
    exc = info.value
    assert exc.result.returncode == -9 and is_transient(exc)  # what used to be retried
    diag = attach_diagnosis(exc, cfg, "pretrain")
    assert diag.category == "host_oom" and not should_retry(exc, is_transient(exc))


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        _Hook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.usefixtures("prefect_server")
def test_prefect_runs_an_oom_killed_stage_once_and_reports_the_cause(tmp_path, monkeypatch):
    from flows.pipeline import llm_pipeline

    for name in ("data", "pretrain"):
        monkeypatch.setitem(stages.SPECS, name, dataclasses.replace(stages.SPECS[name],
                                                                   runner=f"doctor_doubles:{name}"))
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml"),
                          [f"run.output_root={tmp_path}", "orchestration.retry_delay_seconds=0.1",
                           "orchestration.task_retries=2",
                           f"orchestration.failure_webhook_url=http://127.0.0.1:{server.server_port}/hook"])
        state = llm_pipeline(config=cfg.model_dump(mode="json"), run_id="r-oom", stages=["data", "pretrain"],
                             return_state=True)
    finally:
        server.shutdown()
    assert state.is_failed()
    assert (tmp_path / "r-oom" / "attempts-pretrain").read_text() == "1"  # not retried with the same config
    assert "doctor: host_oom in pretrain:" in state.message
    note = _Hook.received[-1]
    assert note["stage"] == "pretrain" and note["category"] == "host_oom" and note["remedy"]


def test_cli_summary_names_the_cause(capsys):
    from flows.cli import print_summary

    exc = RuntimeError("trainer exited with code 1\n" + log_text("nan_mindformers_monitor.log"))
    attach_diagnosis(exc, None, "pretrain")
    print_summary({"run_id": "r1", "run_uri": "/runs/r1", "stages": {}},
                  failed=f"stage 'pretrain' failed (run r1): RuntimeError: {exc}")
    out = capsys.readouterr().out
    assert "\ncause: nan_or_overflow: the loss became NaN/inf" in out
    assert "details: llm-pipeline doctor --run-id r1 CONFIG" in out
