"""Trainer lines at their own level (mindformers' real format), a record's continuation lines kept with it, step
lines rate-limited, everything in the stage's log file."""
import logging
import re
from pathlib import Path

from pipeline_lib.storage import RunPaths

from tasks.stage_log import StageLog, parse_line

LOGS = Path(__file__).parent / "logs"
REAL = (LOGS / "pretrain_preflight_tiny_cpu.log").read_text(encoding="utf-8").splitlines()
DEPRECATION = re.compile(r"deprecat|will be offline", re.I)  # what mindformers' notices of its own API changes say
MF_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - mindformers\S*\[(\S+:\d+)\] - (\w+) - (.*)$")


def replay(tmp_path, caplog, lines, **kw):
    logger = logging.getLogger("stage-log-test")
    caplog.set_level(logging.DEBUG, logger="stage-log-test")
    log = StageLog("pretrain", RunPaths(str(tmp_path / "runs"), "r1"), logger, **kw)
    for line in lines:
        log(line)
    log.close()
    return log, [r for r in caplog.records if r.name == "stage-log-test"]


def test_real_mindformers_output_levels_and_one_record_per_dump(tmp_path, caplog):
    log, records = replay(tmp_path, caplog, REAL, step_every_s=3600)
    expected = [MF_RECORD.match(line) for line in REAL]
    expected = [m for m in expected if m]
    deprecations = [(m[1], m[3]) for m in expected if m[2] == "WARNING" and DEPRECATION.search(m[3])]
    warnings = [(m[1], m[3]) for m in expected if m[2] == "WARNING" and not DEPRECATION.search(m[3])]
    assert len(warnings) >= 15 and len(deprecations) >= 4  # the real file: import-time warnings among them
    shipped = [r for r in records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in shipped] == [f"[{module}] {message}" for module, message in warnings]
    # not one mindformers INFO line reaches the run logger at INFO (the logger ships INFO and up)
    info = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert not [m for m in info if " - INFO - " in m]
    steps = [m for m in info if m.startswith("pretrain: step ")]
    assert len(steps) == 2 and steps[0].startswith("pretrain: step 1 (epoch 1), loss 7.6259, lr 0, 3456 ms/step")
    assert steps[1].startswith("pretrain: step 5 (epoch 1), loss 7.3747") and "(3 step lines since" in steps[1]
    assert "step:[" not in " ".join(info)
    assert "PIPELINE_TIMING" in " ".join(info) and any(m.startswith("pretrain: preflight ok") for m in info)
    # every other mindformers record is one debug record, its continuation lines with it
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    infos = [m for m in expected if m[2] == "INFO" and "step:[" not in m[3]]
    assert len(debug) == len(infos) + len(deprecations)  # a deprecation notice is not a warning: debug
    dump = next(m for m in debug if "parallel_config will be change to default config" in m)
    assert "\n_swap:False\n" in dump and "\n_pipeline_stage:1\n" in dump
    pprinted = next(m for m in debug if "Starting Init Train Model" in m)
    assert "\n{'adapter_id': None,\n" in pprinted and "\n 'auto_trans_ckpt': False,\n" in pprinted
    assert len(records) < len(REAL) / 3
    written = log.path.read_text(encoding="utf-8").splitlines()
    assert written[:-1] == REAL  # the file has every line as it came, then the one line of the deprecation notices
    assert written[-1].startswith(f"pretrain: {len(deprecations)} third-party deprecation notice(s) from "
                                  f"{len({m for m, _ in deprecations})} place(s)")


def test_bracketed_levels_and_a_late_line_is_a_record_of_its_own(tmp_path, caplog, monkeypatch):
    import tasks.stage_log as stage_log

    sdk = "[INFO] 2026-12-01 23:32:33,133 [2596] [SDK] : Start to freeze model for delta, mode: lora"
    file_format = ("[WARNING] 2026-12-01 23:38:50,646 [mindformers/tools/register/template.py:84] _none_process: "
                   "The input config moe_config is empty.")
    assert parse_line(file_format) == (logging.WARNING, "mindformers/tools/register/template.py:84",
                                       "_none_process: The input config moe_config is empty.")
    assert parse_line(sdk)[0] == logging.INFO and parse_line("pretrain: hello") == (None, None, "pretrain: hello")
    monkeypatch.setattr(stage_log, "CONTINUATION_GAP_S", 0.0)  # every line arrives "late"
    ours = "pretrain: WARNING step time: measured 133 ms is 2.88x the planner's prediction 46 ms"
    _, records = replay(tmp_path, caplog, [file_format, "  a line after a pause", "[worker_0] [ERROR] ME(1:2):boom",
                                           ours])
    by_level = {r.levelno: r.getMessage() for r in records}
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert warned[0].endswith("The input config moe_config is empty.") and warned[1] == ours
    assert by_level[logging.ERROR] == "ME(1:2):boom"
    assert [r.getMessage() for r in records if r.levelno == logging.INFO][0] == "  a line after a pause"


def test_deprecation_notices_are_listed_once_per_run_in_the_log_file_not_warned(tmp_path, caplog):
    """mindformers' notices of its own API changes (4-6 per trainer launch, 13-30 per run with repeats) were
    WARNINGs on the terminal and in the Prefect log; the stage's log file keeps them, listed once per run."""
    notice = ("2026-12-04 12:29:34,101 - mindformers[mindformers/trainer/utils.py:796] - WARNING - The config "
              "load_checkpoint is deprecated. Please use config load_path in `checkpoint_config` instead.")
    offline = ("2026-12-04 12:29:48,101 - mindformers[mindformers/trainer/utils.py:471] - WARNING - .ckpt file loading "
               "mode will be offline in June 2025.Recommend loading .safetensors file")
    real = ("2026-12-04 12:29:34,102 - mindformers[mindformers/tools/register/template.py:84] - WARNING - The input "
            "config moe_config is empty.")
    log, records = replay(tmp_path, caplog, [notice, real, notice, notice])
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == [
        "[mindformers/tools/register/template.py:84] The input config moe_config is empty."]
    last = log.path.read_text(encoding="utf-8").splitlines()[-1]
    assert last.startswith("pretrain: 3 third-party deprecation notice(s) from 1 place(s)")
    assert last.endswith("[mindformers/trainer/utils.py:796] The config load_checkpoint is deprecated. Please use "
                         "config load_path in `checkpoint_config` instead.")
    # the run's next stage lists only the notices no earlier stage of the run listed
    sft = StageLog("sft", RunPaths(str(tmp_path / "runs"), "r1"), logging.getLogger("stage-log-test"))
    for line in (notice, offline):
        sft(line)
    sft.close()
    last = sft.path.read_text(encoding="utf-8").splitlines()[-1]
    assert "2 third-party deprecation notice(s) from 2 place(s)" in last
    assert "will be offline" in last and "load_checkpoint" not in last


def test_s3_run_store_gets_the_log_file(s3_bucket):
    root, endpoint = s3_bucket
    paths = RunPaths(root + "/runs", "r2", endpoint)
    log = StageLog("sft", paths, logging.getLogger("stage-log-test"))
    log("sft: hello")
    log.close()
    assert paths.store().get_bytes(log.uri) == b"sft: hello\n"
