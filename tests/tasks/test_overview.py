"""The run overview's content: every stage, one state vocabulary, rounded figures, links that open."""
import urllib.request

from pipeline_lib.storage import RunPaths

from tasks.overview import RunOverview

PRETRAIN = {"outputs": [{"path": "loss_curve.png"}],
            "metrics": {"steps": 60, "loss_first": 7.631234567, "final_loss": 3.7412345678}}
EVALUATE = {"outputs": [{"path": "report.html"}],
            "metrics": {"checkpoints": [{"checkpoint": "pretrained", "perplexity": 41.23456789},
                                        {"checkpoint": "sft", "perplexity": 38.1}]}}


def overview(paths, stages):
    published = []
    ov = RunOverview(paths, stages, publish=lambda aid, md, run_id: published.append(md) or "id-1")
    return ov, published


def test_every_stage_listed_with_state_time_figures_and_local_paths_as_text(tmp_path):
    paths = RunPaths(str(tmp_path / "runs"), "r1")
    ov, published = overview(paths, ["data", "pretrain", "sft", "evaluate", "export"])
    ov.finished("data", "cached", 0.0, {"metrics": {"tokens": 22345, "kept": 420}, "outputs": []})
    ov.finished("pretrain", "completed", 21.456, PRETRAIN)
    ov.finished("evaluate", "completed", 6.0, EVALUATE)
    md = published[-1]
    assert len(published) == 3 and ov.artifact_id == "id-1"  # rewritten after each stage
    for stage in ("data", "pretrain", "sft", "evaluate", "export"):
        assert f"| **{stage}** |" in md
    assert "| **data** | Cached |" in md and "| **sft** | Pending |" in md
    assert "tokens 22,345" in md and "loss 7.631 → 3.741" in md and "21.5 s" in md
    assert "perplexity pretrained 41.23" in md and "perplexity sft 38.1" in md
    assert "file://" not in md and f"`{paths.stage_uri('pretrain')}`" in md


def test_failure_shows_the_stage_its_error_and_what_was_not_run(tmp_path):
    paths = RunPaths(str(tmp_path / "runs"), "r2")
    ov, published = overview(paths, ["data", "pretrain", "sft"])
    ov.finished("data", "completed", 3.0, {"metrics": {}, "outputs": []})
    ov.running("pretrain")
    assert "| **pretrain** | Running |" in published[-1]
    ov.failed("pretrain", 1.5, "ValueError: training.lr=-1 must be > 0. Fix: set training.lr=3e-4")
    md = published[-1]
    assert "| **pretrain** | Failed |" in md and "## Failed: pretrain" in md
    assert "ValueError: training.lr=-1 must be > 0. Fix: set training.lr=3e-4" in md
    assert "| **sft** | Not run |" in md and "after the failure of pretrain" in md


def test_s3_outputs_get_presigned_links_that_open(s3_bucket):
    root, endpoint = s3_bucket
    paths = RunPaths(root + "/runs", "r3", endpoint)
    store = paths.store()
    store.put_bytes(paths.stage_uri("evaluate") + "/manifest.json", b"{}")
    store.put_bytes(paths.stage_uri("evaluate") + "/report.html", b"<h1>eval</h1>")
    ov, published = overview(paths, ["evaluate"])
    ov.finished("evaluate", "completed", 6.0, EVALUATE)
    md = published[-1]
    link = md.split("[report.html](", 1)[1].split(")", 1)[0]
    assert link.startswith(endpoint) and "s3://" not in link
    with urllib.request.urlopen(link) as resp:
        assert resp.read() == b"<h1>eval</h1>"


def test_no_presigned_link_carries_a_session_token(s3_bucket, monkeypatch):
    """Temporary credentials (issue 26, item 9): a presigned URL would embed AWS_SESSION_TOKEN, read by every
    user of the UI; the overview shows the s3:// URI instead, and the outputs artifact has no link."""
    import boto3

    import pipeline_lib.storage.store as store_module

    root, endpoint = s3_bucket
    monkeypatch.setenv("AWS_SESSION_TOKEN", "planted-session-token-123")
    monkeypatch.setattr(store_module, "_S3_CLIENTS", {})  # a client made with the token: a new client
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # of a new session (a session keeps its credentials)
    paths = RunPaths(root + "/runs", "r4", endpoint)
    store = paths.store()
    store.put_bytes(paths.stage_uri("evaluate") + "/manifest.json", b"{}")  # moto takes the token
    store.put_bytes(paths.stage_uri("evaluate") + "/report.html", b"<h1>eval</h1>")
    assert store.share_url(paths.stage_uri("evaluate") + "/report.html") is None
    ov, published = overview(paths, ["evaluate"])
    ov.finished("evaluate", "completed", 6.0, EVALUATE)
    md = published[-1]
    assert "planted-session-token-123" not in md and "X-Amz-Security-Token" not in md and "](" not in md
    assert paths.stage_uri("evaluate") in md


def test_cached_row_says_when_and_in_which_attempt_and_the_legend_only_then(tmp_path):
    paths = RunPaths(str(tmp_path / "runs"), "r5")
    ov, published = overview(paths, ["data", "pretrain"])
    ov.running("data")
    assert "Cached" not in published[-1] and "updated " in published[-1]  # nothing cached yet: no legend
    ov.cached("data", {"metrics": {"tokens": 100}, "outputs": []}, "2026-12-01T23:51:02.5+00:00", "attempt 1",
              link="http://ui/runs/task-run/t1")
    md = published[-1]
    assert "| [data](http://ui/runs/task-run/t1) | Cached (finished 2026-12-01 23:51:02 UTC in attempt 1) |" in md
    assert "Cached: finished in an earlier attempt" in md
    ov.finished("pretrain", "completed", 2.0, PRETRAIN)
    assert "updated " not in published[-1] and "s in this attempt" in published[-1]  # the run has ended


def test_the_running_row_shows_the_live_cards_progress_and_links_it_and_times_are_clock_times(tmp_path, monkeypatch):
    import time

    from tasks import overview as overview_module

    clock = [1_700_000_000.0]  # 2023-11-14 22:13:20 UTC
    monkeypatch.setattr(time, "time", lambda: clock[0])
    paths = RunPaths(str(tmp_path / "runs"), "r6")
    ov, published = overview(paths, ["data", "pretrain"])
    ov.finished("data", "completed", 3.0, {"metrics": {"tokens": 100}, "outputs": []})
    clock[0] += 600
    ov.running("pretrain")
    clock[0] += 120
    overview_module.live_progress("r6", "pretrain", "training, step 40 of 100, loss 3.2, about 2 min left",
                                  "http://ui/artifacts/artifact/a1")
    md = published[-1]
    assert "started 22:13:20 UTC, updated 22:25:20 UTC" in md and "so far" not in md
    row = next(line for line in md.splitlines() if line.startswith("| **pretrain**"))
    assert "| Running | since 22:23:20 UTC | training, step 40 of 100, loss 3.2, about 2 min left<br>" in row
    assert "[live curve: pretrain-live](http://ui/artifacts/artifact/a1)" in row
    overview_module.live_progress("another-run", "pretrain", "step 99", None)  # another run's card: not this row
    assert "step 99" not in ov.render()
    ov.finished("pretrain", "completed", 130.0, PRETRAIN)
    assert "live curve" not in published[-1] and "step 40 of 100" not in published[-1]


def test_the_parent_message_counts_failed_attempts_and_carries_no_cgroup_path():
    from tasks.error_log import stage_failure

    err = RuntimeError("the trainer was killed by SIGKILL\ndoctor: killed in pretrain: killed by SIGKILL without an "
                       "OOM kill (no memory pressure: the cgroup's oom_kill count stayed at 0 "
                       "(/sys/fs/cgroup/system.slice/x.scope/memory.events); last sampled RSS 1.20 GB)")
    assert stage_failure("pretrain", "r1", err).startswith("stage 'pretrain' failed (run r1): RuntimeError: the ")
    err.failed_attempts = 3
    text = stage_failure("pretrain", "r1", err)
    assert text.startswith("stage 'pretrain' failed (run r1): all 3 attempts failed; the last: RuntimeError: ")
    assert "cgroup" in text and "/sys/fs/cgroup" not in text and "memory.events" not in text
    assert "the cgroup's oom_kill count stayed at 0; last sampled RSS 1.20 GB" in text


def test_the_engines_repeat_of_our_error_is_dropped_an_unexpected_one_kept():
    import logging
    import sys

    from flows.pipeline import StageFailed
    from tasks.error_log import EngineRepeatsOurs

    def record(exc):
        try:
            raise exc
        except Exception:
            return logging.LogRecord("prefect.engine", logging.ERROR, __file__, 1,
                                     "Execution of flow run 'x' exited with unexpected exception", (), sys.exc_info())

    assert not EngineRepeatsOurs().filter(record(StageFailed("stage 'pretrain' failed (run r): boom")))
    assert EngineRepeatsOurs().filter(record(KeyError("a bug")))  # an unexpected error keeps its record


def test_our_one_line_error_is_logged_once_when_the_engine_logs_it_twice():
    import logging
    import sys

    from flows.pipeline import StageFailed
    from tasks.error_log import OurErrorsOnce

    try:
        raise StageFailed("stage 'pretrain' failed (run r): boom")
    except StageFailed:
        info = sys.exc_info()
    records = [logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, text, (), info)
               for text in ("Encountered exception during execution:", "Finished in state Failed")]
    kept = [r for r in records if OurErrorsOnce().filter(r)]
    assert [r.getMessage() for r in kept] == ["stage 'pretrain' failed (run r): boom"]


def test_the_tensorboard_command_of_a_training_run_is_in_the_overview(tmp_path):
    """Issue 48 item 7: the loss curves one command away, where the trainers write them (a local run store)."""
    from pipeline_lib.config import load_config
    from pipeline_lib.train.session import tensorboard_dir
    from tasks.overview import tensorboard_command

    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [f"run.output_root={tmp_path / 'runs'}"])
    command = tensorboard_command(cfg, ["data", "pretrain", "evaluate"])
    logdir = tmp_path / "runs" / "_tensorboard" / cfg.run.name
    assert command == f"tensorboard --logdir {logdir}"
    assert tensorboard_dir(cfg, "r1", "pretrain").is_relative_to(logdir)  # where pretrain writes r1's events
    assert tensorboard_command(cfg, ["data", "evaluate"]) is None  # nothing trains: no curves
    s3 = load_config("configs/pipelines/tiny-cpu.yaml", ["run.output_root=s3://bucket/runs"])
    assert tensorboard_command(s3, ["pretrain"]) is None  # mindformers writes events locally only
    ov, published = overview(RunPaths(str(tmp_path / "runs"), "r1"), ["data", "pretrain"])
    ov.tensorboard = command
    ov.finished("data", "completed", 1.0, {"metrics": {}, "outputs": []})
    assert f"Loss curves of this run and the earlier runs of its lineage: `{command}`" in published[-1]
