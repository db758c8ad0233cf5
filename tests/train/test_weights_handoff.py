"""The weights handed from pretrain to SFT (issue 27): the tiny chain's SFT base, as the SFT manifest names it, is the
pretrain manifest's weights_checkpoint, loads with MindSpore and holds model parameters only."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_fixtures import new_run  # noqa: E402

pytestmark = pytest.mark.train

TRAINING_STATE = ("adam_m.", "adam_v.", "accu_grads.", "global_step", "epoch_num", "step_num", "scale_sense",
                  "loss_scale", "global_batch_size")


def test_the_sft_base_is_the_weights_only_file(pretrain_data):
    import mindspore as ms

    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import sha256_file

    cfg, paths = new_run(pretrain_data, "handoff", training={"steps": 4, "save_steps": 4},
                         sft={"steps": 4, "warmup_steps": 1})
    lines: list[str] = []
    pre, _ = run_stage(cfg, paths, "pretrain", log=lines.append)
    sft, _ = run_stage(cfg, paths, "sft", log=lines.append)
    weights = pre.metrics["weights_checkpoint"]
    base = sft.metrics["base_checkpoint"]
    assert Path(base) == Path(weights["path"]) and sha256_file(base) == weights["sha256"]
    params = ms.load_checkpoint(base)
    assert params and all(n.startswith(("model.", "lm_head.")) for n in params)
    assert not any(n.startswith(TRAINING_STATE) for n in params)
    training = ms.load_checkpoint(pre.metrics["latest_checkpoint"])
    assert set(params) == {n for n in training if not n.startswith(TRAINING_STATE)}
    assert any(line.startswith("sft: ") and "GB free for" in line for line in lines)  # the layout's disk check
