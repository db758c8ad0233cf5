"""The CLI's terminal: per stage the marked lines, warnings once per source, no repeated stage error, a bar on a
TTY only, everything with verbose; Prefect's real console handler underneath."""
import io
import logging

from prefect.logging.handlers import PrefectConsoleHandler

from pipeline_lib.storage import RunPaths

from tasks import terminal
from tasks.stage_log import StageLog

WARN = ("2026-12-01 23:32:10,167 - mindformers/tmp/run/pretrain/log[mindformers/tools/register/template.py:84] - "
        "WARNING - The input config {key} is empty.")  # a deprecation notice would go to the log file only
STEP = ("2026-12-01 23:32:13,869 - mindformers/tmp/run/pretrain/log[mindformers/core/callback/callback.py:747] - "
        "INFO - {{ Epoch:[  1/  1], step:[    {n}/   80], loss:[7.615848/7.620859], per_step_time: 37ms, lr: 0.0006, "
        "overflow cond: False, loss_scale: 1.0, global_norm: [1.1596833], train_throughput_per_npu: 0.010T")


def run_stage_lines(tmp_path, tty: bool, verbose: bool = False) -> str:
    out = io.StringIO()
    handler = PrefectConsoleHandler(stream=out)
    logger = logging.getLogger(f"terminal-test-{tty}-{verbose}")
    logger.setLevel(logging.DEBUG)  # the run logger's own level decides what ships; here: everything reaches the handler
    logger.addHandler(handler)
    logger.propagate = False
    screen = terminal.Terminal(out, verbose=verbose, tty=tty).install([handler])
    try:
        logger.info("pretrain: started", extra=terminal.SHOW)
        log = StageLog("pretrain", RunPaths(str(tmp_path / "runs"), "r1"), logger, step_every_s=0,
                       tokens_per_step=256)
        terminal.progress("pretrain", "train", 0, 60)
        log("pretrain: 75.5 GB free for 4 checkpoints")
        log(WARN.format(key="moe_config"))
        log(WARN.format(key="lora_config"))  # same source location: counted, not shown again
        for n in (1, 2):
            log(STEP.format(n=n))
            terminal.progress("pretrain", "train", n, 60)
        log.close()
        failed = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "stage 'pretrain' failed", (), None)
        failed.repeats_stage_error = True
        handler.handle(failed)
        logger.info("pretrain: completed in 24.0 s -> /runs/r1/pretrain", extra=terminal.SHOW)
    finally:
        screen.uninstall()
    return out.getvalue()


def test_no_tty_shows_start_warning_once_log_path_result_and_no_bar(tmp_path):
    text = run_stage_lines(tmp_path, tty=False)
    lines = text.splitlines()
    assert "\r" not in text and len(lines) == 4, text
    assert lines[0].endswith(" pretrain: started")
    assert lines[1].endswith("WARNING pretrain: [mindformers/tools/register/template.py:84] The input config "
                             "moe_config is empty.")
    assert "pretrain: full log " in lines[2] and "(1 more warning" in lines[2]
    assert lines[3].endswith("pretrain: completed in 24.0 s -> /runs/r1/pretrain")
    assert "step:[" not in text and "75.5 GB" not in text and "failed" not in text


def test_tty_draws_the_training_bar_and_clears_it_for_each_line(tmp_path):
    text = run_stage_lines(tmp_path, tty=True)
    bar = [part for part in text.split("\r\x1b[K") if part.startswith("pretrain train [")]
    assert bar and "2/60" in bar[-1] and "loss 7.616" in bar[-1] and "6,919 tokens/s" in bar[-1]  # 256 / 0.037 s
    assert "ETA " in bar[-1]
    assert text.rstrip().endswith("pretrain: completed in 24.0 s -> /runs/r1/pretrain")


def test_verbose_shows_every_line_once(tmp_path):
    text = run_stage_lines(tmp_path, tty=False, verbose=True)
    assert text.count("75.5 GB free") == 1 and text.count("pretrain: step 1 (epoch 1), loss 7.6158") == 1
    assert text.count("pretrain: step 2 (epoch 1)") == 1
    assert text.count("The input config lora_config is empty") == 1
