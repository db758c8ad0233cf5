"""LoRA merge in numpy: the formula, the mindformers names, the guards, and a wrong scale caught."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.config.schema import ModelConfig
from pipeline_lib.model.lora_merge import (LORA_A, LORA_B, LoraMergeError, adapter_config, has_lora, lora_scale,
                                            merge_lora)
from random_init import random_llama_params, random_lora_params

W = "model.layers.0.attention.wq"


def test_merge_is_w_plus_alpha_over_rank_b_at_a_by_hand():
    base = {W + ".weight": np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]], np.float32)}  # [out=3, in=2]
    a = np.array([[1.0, 2.0]], np.float32)            # [rank=1, in=2]
    b = np.array([[1.0], [0.0], [-1.0]], np.float32)  # [out=3, rank=1]
    merged, report = merge_lora(base, {W + LORA_A: a, W + LORA_B: b}, alpha=4.0, rank=1)
    # scale 4 / 1 = 4; B @ A = [[1, 2], [0, 0], [-1, -2]]
    np.testing.assert_array_equal(merged[W + ".weight"], [[5, 8], [0, 1], [-2, -6]])
    assert report.scale == 4.0 and report.modules == [W] and merged[W + ".weight"].dtype == np.float32
    assert lora_scale(16.0, 8) == 2.0


def test_merged_linear_equals_base_plus_adapter_and_a_wrong_scale_does_not():
    m = ModelConfig(hidden_size=16, num_layers=2, num_heads=4, n_kv_heads=2, intermediate_size=24, vocab_size=50)
    base = random_llama_params(m, seed=0)
    adapter = random_lora_params(base, ["wq", "wk", "wv", "wo"], rank=4, seed=1)
    merged, report = merge_lora(base, adapter, alpha=8.0, rank=4)
    assert len(report.modules) == 8 and not has_lora(merged) and set(merged) == set(base)
    x = np.random.default_rng(2).standard_normal((5, 16))
    for prefix in report.modules:
        w, a, b = base[prefix + ".weight"], adapter[prefix + LORA_A], adapter[prefix + LORA_B]
        lora_out = x @ w.T + (8.0 / 4) * (x @ a.T) @ b.T  # mindpet LoRADense forward
        np.testing.assert_allclose(x @ merged[prefix + ".weight"].T, lora_out, atol=1e-5)
        wrong, _ = merge_lora(base, adapter, alpha=8.0, rank=4, scale=8.0)  # alpha instead of alpha / rank
        assert not np.allclose(x @ wrong[prefix + ".weight"].T, lora_out, atol=1e-4)
    untouched = "model.layers.0.feed_forward.w1.weight"
    np.testing.assert_array_equal(merged[untouched], base[untouched])
    assert adapter_config(report, 8.0)["target_modules"] == ".*wk$|.*wo$|.*wq$|.*wv$"


def test_full_sft_checkpoint_and_optimizer_states():
    m = ModelConfig(hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8, vocab_size=20)
    base = random_llama_params(m)
    adapter = random_lora_params(base, ["wq"], rank=2)
    full = {**base, **adapter, **{"adam_m." + k: v for k, v in adapter.items()}, "global_step": np.array([3])}
    merged, report = merge_lora(full, full, alpha=4.0, rank=2)
    # Only real lora pairs are merged; optimizer states of the adapter are dropped, other entries kept.
    assert set(merged) == set(base) | {"global_step"} and not has_lora(merged)
    assert report.modules == ["model.layers.0.attention.wq"] and len(report.ignored) == 2


@pytest.mark.parametrize("mutate, match", [
    (lambda base, ad: ad.pop(W + LORA_B), "no model.layers.0.attention.wq.mindpet_delta_lora_b"),
    (lambda base, ad: ad.update({W + LORA_A: np.ones((3, 8), np.float32), W + LORA_B: np.ones((8, 3), np.float32)}),
     "sft.lora_rank=2"),
    (lambda base, ad: base.update({W + ".weight": np.ones((5, 5), np.float32)}), "another base model"),
    (lambda base, ad: ad.clear(), "no '<module>.mindpet_delta_lora_a/_b' pair"),
])
def test_merge_errors_name_the_parameter_or_field(mutate, match):
    m = ModelConfig(hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8, vocab_size=20)
    base = random_llama_params(m)
    adapter = random_lora_params(base, ["wq"], rank=2)
    mutate(base, adapter)
    with pytest.raises(LoraMergeError, match=match):
        merge_lora(base, adapter, alpha=4.0, rank=2)


def test_target_modules_must_match_the_adapter():
    m = ModelConfig(hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8, vocab_size=20)
    base = random_llama_params(m)
    adapter = random_lora_params(base, ["wq", "wv"], rank=2)
    with pytest.raises(LoraMergeError, match=r"sft.target_modules=\['wk', 'wq'\]"):
        merge_lora(base, adapter, alpha=4.0, rank=2, target_modules=["wq", "wk"])


def test_adapter_config_written_by_sft_must_match_the_config(tmp_path):
    import json

    from pipeline_lib.config.load import config_from_dict
    from pipeline_lib.model.checkpoints import check_adapter_config

    (tmp_path / "adapter.ckpt").write_bytes(b"x")
    (tmp_path / "adapter_config.json").write_text(json.dumps({"lora_rank": 8, "lora_alpha": 32.0}))
    cfg = config_from_dict({"sft": {"lora_rank": 8, "lora_alpha": 16.0}})
    with pytest.raises(LoraMergeError, match=r"sft.lora_alpha=16.0 .* set sft.lora_alpha=32.0"):
        check_adapter_config(str(tmp_path / "adapter.ckpt"), cfg)
    check_adapter_config(str(tmp_path / "adapter.ckpt"), config_from_dict({"sft": {"lora_rank": 8, "lora_alpha": 32}}))
