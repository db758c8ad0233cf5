"""runner.describe_guard: the guard's diagnosis names the knobs of the stage that tripped."""
from pipeline_lib.train.runner import describe_guard

DIAG = {"step": 30, "rank": 0, "reason": "nonfinite", "loss": float("nan"), "lr": 1e-3, "batch_rows": [4, 5]}
LATEST = {"step": 20, "path": "train/checkpoint/rank_0/x-20_1.ckpt"}


def test_pretrain_guard_offers_the_rollback_policy():
    text = describe_guard(DIAG, LATEST)
    assert text.startswith("pretrain: loss guard stopped training at step 30")
    assert "training.learning_rate" in text and "training.guard.on_failure=rollback" in text


def test_sft_guard_names_sft_knobs_and_no_rollback_it_does_not_apply():
    text = describe_guard(DIAG, LATEST, stage="sft")
    assert text.startswith("sft: loss guard stopped training at step 30")
    assert "sft.learning_rate" in text and "on_failure=rollback" not in text
    assert "last good checkpoint: step 20" in text
