"""tasks/stage_task.py: what a failed stage's message says happens next."""
from pipeline_lib.train.checkpoints import InsufficientDiskError
from pipeline_lib.train.stage import PreflightFailed
from tasks.stage_task import retry_plan


def test_a_failed_preflight_says_the_rerun_starts_afresh_not_from_a_checkpoint():
    final, plan = retry_plan(PreflightFailed("preflight failed:\n- peak memory 9.1 GB > 8 GB"), "pretrain", "r1")
    assert final and "llm-pipeline run CONFIG --run-id r1" in plan
    assert "starts afresh and preflights again" in plan and "last verified checkpoint" not in plan


def test_another_training_failure_resumes_from_the_last_verified_checkpoint():
    final, plan = retry_plan(InsufficientDiskError("2 GB free, 5 GB needed"), "pretrain", "r1")
    assert final and "restarts from the last verified checkpoint" in plan and "afresh" not in plan


def test_a_stage_without_checkpoints_names_no_training_restart():
    _, plan = retry_plan(ValueError("bad record"), "data", "r1")
    assert "finished stages are not redone" in plan and "training" not in plan


def test_a_failed_night_says_what_a_nightly_user_does_not_llm_pipeline_run():
    """`llm-pipeline run --run-id nightly-...` would run the chain without the night's inputs, base and lineage and
    leave the nightly state as it was: a night is rerun by its date (or left to the next night)."""
    for run_id in ("nightly-2026-11-17", "nightly-2026-11-17-2"):
        final, plan = retry_plan(InsufficientDiskError("2 GB free, 5 GB needed"), "pretrain", run_id)
        assert final and "llm-pipeline nightly CONFIG --run-date 2026-11-17" in plan, plan
        assert f"it resumes {run_id}" in plan and "llm-pipeline run " not in plan
    _, plan = retry_plan(ValueError("bad record"), "data", "nightly-notadate")
    assert "llm-pipeline run CONFIG --run-id nightly-notadate" in plan
