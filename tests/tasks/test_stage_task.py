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
