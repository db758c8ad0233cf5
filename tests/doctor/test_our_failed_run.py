"""A real failed tiny pretrain of ours (the loss guard's NaN test hook at step 2): the stage's exception and the run
folder's logs (`llm-pipeline doctor --run-id`) both come out as nan_or_overflow in pretrain, with our knobs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from pretrain_fixtures import new_run  # noqa: E402

from pipeline_lib.cli import main  # noqa: E402
from pipeline_lib.doctor.retry import attach_diagnosis, should_retry  # noqa: E402
from pipeline_lib.train.callbacks import INJECT_NAN_ENV  # noqa: E402
from pipeline_lib.train.launch import GuardTripped  # noqa: E402
from pipeline_lib.stages import run_stage  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.timeout(900)]


def test_a_real_nan_stop_is_diagnosed_from_the_exception_and_the_run_folder(pretrain_data, capsys, tmp_path):
    cfg, paths = new_run(pretrain_data, "doctor-nan", training={"steps": 4, "save_steps": 100, "shuffle": False})
    with pytest.raises(GuardTripped) as info:
        run_stage(cfg, paths, "pretrain", log=lambda line: None, env={INJECT_NAN_ENV: "2"})
    diag = attach_diagnosis(info.value, cfg, "pretrain")
    assert diag.category == "nan_or_overflow" and not should_retry(info.value, transient=False)
    assert any("loss guard stopped training at step 2" in line for line in diag.evidence)
    assert diag.remedies[0]["overrides"] == [f"training.learning_rate={cfg.training.learning_rate / 2:g}"]

    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(cfg.model_dump(mode="json")))  # yaml is a superset of json
    assert main(["doctor", "--run-id", "doctor-nan", str(config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stage"] == "pretrain" and out["category"] == "nan_or_overflow", out
    assert any("loss guard stopped training at step 2" in line for line in out["evidence"])


def test_the_logs_of_a_healthy_run_are_not_a_failure(pretrain_data, capsys, tmp_path):
    from pipeline_lib.doctor.classify import classify
    from pipeline_lib.doctor.logs import read_logs, stage_log_files

    cfg, paths = new_run(pretrain_data, "doctor-ok", training={"steps": 2, "save_steps": 2})
    lines: list[str] = []
    run_stage(cfg, paths, "pretrain", log=lines.append)
    files = stage_log_files(Path(paths.stage_uri("pretrain")))
    assert files  # mindformers' own logs are kept in the stage folder
    assert classify(read_logs(files) + "\n".join(lines)) == ("unknown", [])
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(cfg.model_dump(mode="json")))
    assert main(["doctor", "--run-id", "doctor-ok", str(config), "--stage", "pretrain", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["category"] == "unknown"
    # without --stage: a good run is an answer (exit 0, nothing is wrong), not an argument error (it exited 2)
    assert main(["doctor", "--run-id", "doctor-ok", str(config)]) == 0
    out = capsys.readouterr().out
    assert "run doctor-ok: nothing is wrong: every stage it ran has a complete manifest" in out and "--stage" in out
    assert main(["doctor", "--run-id", "doctor-ok", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["category"] is None
