"""Pure-Python parts of the SFT stage: LoRA shape arithmetic, adapter naming, where the base and tokenizer come from."""
from __future__ import annotations

import pytest

from pipeline_lib.config.schema import ModelConfig, PipelineConfig
from pipeline_lib.runtime.contract import StageRun
from pipeline_lib.stages import upstream_manifests
from pipeline_lib.storage import Manifest, RunPaths, write_manifest
from pipeline_lib.train.adapter import AdapterError, expected_lora_shapes, is_lora_param, target_dims, trainable_count
from pipeline_lib.train.sft_stage import SFTStageError, find_base_checkpoint, run_sft_stage


def test_lora_shapes_follow_mindformers_a_rank_by_in_b_out_by_rank():
    m = ModelConfig(hidden_size=64, num_heads=4, n_kv_heads=2, intermediate_size=176, num_layers=2)
    assert [target_dims(m, t) for t in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")] == \
        [(64, 64), (64, 32), (64, 32), (64, 64), (64, 176), (176, 64), (64, 176)]
    shapes = expected_lora_shapes(m, ["wq", "wk"], 4)
    assert shapes["model.layers.1.attention.wk.mindpet_delta_lora_a"] == (4, 64)
    assert shapes["model.layers.1.attention.wk.mindpet_delta_lora_b"] == (32, 4)
    assert len(shapes) == 2 * 2 * 2
    # r x (in + out) per target and layer: 2 layers x 8 x (128 + 96 + 96 + 128)
    assert trainable_count(m, ["wq", "wk", "wv", "wo"], 8) == 7168
    assert trainable_count(m, ["w1", "w2", "w3"], 8) == 2 * 8 * 3 * (64 + 176)
    seven_b = ModelConfig(hidden_size=4096, num_heads=32, intermediate_size=11008, num_layers=32, vocab_size=32000)
    assert trainable_count(seven_b, ["wq", "wk", "wv", "wo"], 8) == 32 * 4 * 8 * (4096 + 4096)  # 8.4M for Llama-2-7B
    with pytest.raises(AdapterError, match="sft.target_modules"):
        target_dims(m, "q_proj")


def test_only_network_lora_factors_count_as_adapter_parameters():
    assert is_lora_param("model.layers.0.attention.wq.mindpet_delta_lora_a")
    assert not is_lora_param("adam_m.model.layers.0.attention.wq.mindpet_delta_lora_a")
    assert not is_lora_param("adam_v.model.layers.0.attention.wq.mindpet_delta_lora_b")
    assert not is_lora_param("model.layers.0.attention.wq.weight")


def _paths(tmp_path) -> RunPaths:
    return RunPaths(str(tmp_path / "runs"), "r1")


def _run(cfg, paths) -> StageRun:
    """The SFT stage's StageRun as the registry builds it (the upstream manifests that exist), without its
    refusal to start when one is missing: these tests ask what the stage itself does then."""
    return StageRun("sft", cfg, paths, upstream_manifests(paths, "sft"), log=lambda line: None)


def test_base_checkpoint_precedence_and_relative_paths(tmp_path):
    paths = _paths(tmp_path)
    cfg = PipelineConfig.model_validate({"model": {"base_checkpoint": "/models/base.ckpt"}})
    assert find_base_checkpoint(_run(cfg, paths)) == "/models/base.ckpt"  # no pretrain stage
    write_manifest(paths.stage_uri("pretrain"), Manifest("pretrain", "r1", "h", outputs=[
        {"path": "checkpoint/rank_0/m_rank_0-1_20.ckpt", "size": 1, "sha256": ""},
        {"path": "checkpoint/rank_0/m_rank_0-3_4.ckpt", "size": 1, "sha256": ""}]))
    assert find_base_checkpoint(_run(cfg, paths)) == str(tmp_path / "runs/r1/pretrain/checkpoint/rank_0/m_rank_0-3_4.ckpt")
    write_manifest(paths.stage_uri("pretrain"), Manifest("pretrain", "r1", "h",
                                                         metrics={"latest_checkpoint": "/abs/latest.ckpt"}))
    assert find_base_checkpoint(_run(cfg, paths)) == "/abs/latest.ckpt"  # the pretrained weights beat the pretrain start
    assert find_base_checkpoint(_run(cfg, paths), explicit="/given.ckpt") == "/given.ckpt"


def test_stage_without_base_or_tokenizer_names_the_fields(tmp_path):
    with pytest.raises(SFTStageError, match="model.base_checkpoint=None.*tokenizer.path"):
        run_sft_stage(_run(PipelineConfig(), _paths(tmp_path)))
    cfg = PipelineConfig.model_validate({"model": {"base_checkpoint": str(tmp_path / "missing.ckpt")},
                                         "tokenizer": {"path": str(tmp_path / "tok.model")}})
    with pytest.raises(SFTStageError, match="is not a file"):
        run_sft_stage(_run(cfg, _paths(tmp_path)))
