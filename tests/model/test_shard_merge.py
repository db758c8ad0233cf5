"""Sharded checkpoints (per-rank files + strategy files we write ourselves) merged back exactly."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from sharding_helpers import shard, write_sharded

from pipeline_lib.model.shard_merge import ShardMergeError, merge_sharded_checkpoint, pick_rank_checkpoints


def _load(path):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {"layer.split_rows": rng.standard_normal((4, 6)).astype(np.float32),
            "layer.split_cols": rng.standard_normal((4, 6)).astype(np.float32),
            "layer.split_both": rng.standard_normal((8, 4)).astype(np.float32),
            "norm.replicated": rng.standard_normal((6,)).astype(np.float32)}


def test_tensor_parallel_2way_dim0_dim1_replicated(tmp_path):
    params = _params()
    layouts = {"layer.split_rows": [0, -1], "layer.split_cols": [-1, 0], "layer.split_both": [0, -1],
               "norm.replicated": [-1]}
    ckpt_dir, strategy = write_sharded(tmp_path, params, layouts, [2])
    assert _load(ckpt_dir / "rank_1" / "llama_rank-1_10.ckpt")["layer.split_cols"].shape == (4, 3)
    merged = _load(merge_sharded_checkpoint(ckpt_dir, tmp_path / "merged.ckpt", strategy))
    assert set(merged) == set(params)
    for name, full in params.items():
        np.testing.assert_array_equal(merged[name], full, err_msg=name)


def test_data_x_model_parallel_device_matrix(tmp_path):
    params = _params(1)
    layouts = {"layer.split_rows": [1, -1], "layer.split_cols": [-1, 0], "layer.split_both": [1, 0],
               "norm.replicated": [-1]}
    ckpt_dir, strategy = write_sharded(tmp_path, params, layouts, [2, 2])
    assert _load(ckpt_dir / "rank_3" / "llama_rank-1_10.ckpt")["layer.split_both"].shape == (4, 2)
    merged = _load(merge_sharded_checkpoint(ckpt_dir, tmp_path / "merged.ckpt", strategy))
    for name, full in params.items():
        np.testing.assert_array_equal(merged[name], full, err_msg=name)


def test_pipeline_2_stages_x_tensor_parallel_2(tmp_path):
    params = _params(2)
    layouts = {"layer.split_rows": [0, -1], "layer.split_cols": [-1, 0], "layer.split_both": [-1, 0],
               "norm.replicated": [-1]}
    stage_of = {"layer.split_rows": 0, "layer.split_cols": 0, "layer.split_both": 1, "norm.replicated": 1}
    ckpt_dir, strategy = write_sharded(tmp_path, params, layouts, [2], stage_of)
    assert sorted(os.listdir(strategy)) == ["ckpt_strategy_rank_0.ckpt", "ckpt_strategy_rank_2.ckpt"]
    assert set(_load(ckpt_dir / "rank_3" / "llama_rank-1_10.ckpt")) == {"layer.split_both", "norm.replicated"}
    # The strategy folder next to checkpoint/ is found without being named.
    merged = _load(merge_sharded_checkpoint(ckpt_dir, tmp_path / "merged.ckpt"))
    for name, full in params.items():
        np.testing.assert_array_equal(merged[name], full, err_msg=name)


def test_highest_step_is_used_not_the_lexicographic_last(tmp_path):
    params, layouts = _params(3), {k: [0, -1] if k != "norm.replicated" else [-1] for k in _params()}
    old = {k: v + 100 for k, v in params.items()}
    write_sharded(tmp_path, old, layouts, [2], ckpt_name="llama_rank-1_20.ckpt")
    time.sleep(0.01)
    ckpt_dir, strategy = write_sharded(tmp_path, params, layouts, [2], ckpt_name="llama_rank-1_100.ckpt")
    assert pick_rank_checkpoints(ckpt_dir)[0].name == "llama_rank-1_100.ckpt"
    merged = _load(merge_sharded_checkpoint(ckpt_dir, tmp_path / "m.ckpt", strategy))
    np.testing.assert_array_equal(merged["layer.split_rows"], params["layer.split_rows"])
    merged20 = _load(merge_sharded_checkpoint(ckpt_dir, tmp_path / "m20.ckpt", strategy, step=20))
    np.testing.assert_array_equal(merged20["layer.split_rows"], old["layer.split_rows"])


def test_refusals(tmp_path):
    params = _params(4)
    layouts = {k: [0, -1] if k != "norm.replicated" else [-1] for k in params}
    ckpt_dir, strategy = write_sharded(tmp_path / "a", params, layouts, [2])
    import shutil

    shutil.rmtree(strategy)
    with pytest.raises(ShardMergeError, match="no strategy file"):
        merge_sharded_checkpoint(ckpt_dir, tmp_path / "x.ckpt")
    shutil.rmtree(ckpt_dir / "rank_0")
    with pytest.raises(ShardMergeError, match="rank folder is missing"):
        merge_sharded_checkpoint(ckpt_dir, tmp_path / "x.ckpt")
    # Data parallel (every rank a full copy) needs no strategy: rank_0 is the checkpoint.
    dp_dir, _ = write_sharded(tmp_path / "dp", params, {k: [-1] * v.ndim for k, v in params.items()}, [2])
    shutil.rmtree(tmp_path / "dp" / "strategy")
    merged = _load(merge_sharded_checkpoint(dp_dir, tmp_path / "dp.ckpt"))
    np.testing.assert_array_equal(merged["layer.split_cols"], params["layer.split_cols"])
    assert shard(params["layer.split_rows"], [0, -1], [2], 1).shape == (2, 6)
