"""model.weights_only on a checkpoint with every name our pretrain stage's training checkpoints hold on this stack:
the MindSpore rewrite and the record copy keep the same tensors, and the copy is the rewrite's file byte for byte."""
from __future__ import annotations

import numpy as np
import pytest

from random_init import save_params

from pipeline_lib.model.weights_only import copy_weights, is_model_weight, write_weights_only

WEIGHTS = {"model.tok_embeddings.embedding_weight": (16, 4), "model.layers.0.attention.wq.weight": (4, 4),
           "model.norm_out.weight": (4,), "lm_head.weight": (16, 4)}
# what a tiny pretrain checkpoint of ours holds besides the weights (read from one with ms.load_checkpoint), plus the
# accumulators mindformers adds under gradient accumulation
STATE = {"scale_sense": (), "global_step": (1,), "epoch_num": (), "step_num": (), "loss_scale": (),
         "global_batch_size": (), "accu_grads.model.layers.0.attention.wq.weight": (4, 4)}


def _training_params() -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in {**WEIGHTS, **BIG}.items()}
    params = {**weights, **{f"adam_{m}.{k}": rng.standard_normal(s).astype(np.float32)
                            for m in "mv" for k, s in WEIGHTS.items()},
              **{k: np.ones(s, np.float32) for k, s in STATE.items()}}
    return weights, params


BIG = {"model.layers.0.feed_forward.w1.weight": (400, 500)}  # 800 KB: MindSpore writes it as two slices


@pytest.mark.parametrize("write", [write_weights_only, copy_weights], ids=["mindspore", "copy"])
def test_only_the_model_parameters_are_kept_bit_for_bit(tmp_path, write):
    import mindspore as ms

    weights, params = _training_params()
    src = save_params(params, tmp_path / "train.ckpt")
    dst = write(src, tmp_path / "checkpoint" / "weights.ckpt")
    got = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(dst)).items()}
    assert set(got) == set(weights)
    assert all(got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes() for k, v in weights.items())
    assert not any(is_model_weight(k) for k in params if k not in weights)
    assert not list(dst.parent.glob("*.tmp*"))
    with pytest.raises(ValueError, match="no model parameter"):
        write(save_params({"adam_m.x": np.ones(2, np.float32)}, tmp_path / "opt.ckpt"), tmp_path / "o")


def test_the_copy_is_the_mindspore_rewrite_byte_for_byte_and_leaves_what_it_cannot_read(tmp_path):
    _, params = _training_params()
    src = save_params(params, tmp_path / "train.ckpt")
    ours = copy_weights(src, tmp_path / "copy.ckpt")
    theirs = write_weights_only(src, tmp_path / "rewrite.ckpt")
    assert ours.read_bytes() == theirs.read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(src.read_bytes()[:-5])
    assert copy_weights(tmp_path / "cut.ckpt", tmp_path / "never.ckpt") is None
    assert not (tmp_path / "never.ckpt").exists()

