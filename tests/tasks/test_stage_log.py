"""Trainer lines at their own level, step lines rate-limited, everything in the stage's log file."""
import logging

from pipeline_lib.storage import RunPaths

from tasks.stage_log import StageLog

STEP = ("[INFO] 2026-11-30 20:33:33,678 [mindformers/core/callback/callback.py:747] print_output_info: "
        "{{ Epoch:[  1/  9], step:[ {n:4d}/   24], loss:[6.47/6.47], per_step_time: 62ms, lr: 0.005")
WARN = "[WARNING] 2026-11-30 20:21:09,968 [mindformers/tools/register/template.py:84] _none_process: moe_config is empty."


def test_levels_rate_limit_and_full_file(tmp_path, caplog):
    logger = logging.getLogger("stage-log-test")
    caplog.set_level(logging.DEBUG, logger="stage-log-test")
    log = StageLog("pretrain", RunPaths(str(tmp_path / "runs"), "r1"), logger, step_every_s=3600)
    log("pretrain: running (no manifest)")
    log(WARN)
    log("[worker_0] [ERROR] 2026-11-30 ME(1:2):boom")
    log("[INFO] 2026-11-30 20:21:09 [mindformers/trainer.py:1] built the model")
    for n in range(1, 25):
        log(STEP.format(n=n))
    log.close()
    by_level = {lvl: [r.getMessage() for r in caplog.records if r.levelno == lvl]
                for lvl in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)}
    assert by_level[logging.WARNING] == [WARN]
    assert by_level[logging.ERROR] == ["[worker_0] [ERROR] 2026-11-30 ME(1:2):boom"]
    assert by_level[logging.DEBUG] == ["[INFO] 2026-11-30 20:21:09 [mindformers/trainer.py:1] built the model"]
    steps = [m for m in by_level[logging.INFO] if "step:[" in m]
    assert len(steps) == 2 and "step:[    1/" in steps[0] and "step:[   24/" in steps[1]  # first and last
    assert "(22 step lines since the last one shown" in steps[1]
    text = log.path.read_text()
    assert text.count("step:[") == 24 and WARN in text  # the file has every line
    assert log.path.parent == tmp_path / "runs" / "r1" / "logs"
    assert by_level[logging.INFO][-1] == f"pretrain: full log {log.path}"


def test_s3_run_store_gets_the_log_file(s3_bucket):
    root, endpoint = s3_bucket
    paths = RunPaths(root + "/runs", "r2", endpoint)
    log = StageLog("sft", paths, logging.getLogger("stage-log-test"))
    log("sft: hello")
    log.close()
    assert paths.store().get_bytes(log.uri) == b"sft: hello\n"
