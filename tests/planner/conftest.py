"""Shapes and configs the planner tests share: published Llama-2 shapes, the 7B 4 x 64 GB layout."""
from __future__ import annotations

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.planner.params import ModelShape

LLAMA2_7B = ModelShape(vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, kv_heads=32,
                       intermediate_size=11008, tie_word_embeddings=False)
LLAMA2_70B = ModelShape(vocab_size=32000, hidden_size=8192, num_layers=80, num_heads=64, kv_heads=8,
                        intermediate_size=28672, tie_word_embeddings=False)

# The 7B continued-pretraining layout of configs/pipelines/llama2-7b-4x64gb.yaml, frozen here so the
# planner's numbers do not move when someone edits the shipped file.
LLAMA2_7B_4X64GB = {
    "run": {"name": "llama2-7b", "device_target": "Ascend"},
    "tokenizer": {"vocab_size": 32000},
    "model": {"name": "llama2_7b_cpt", "seq_length": 4096, "vocab_size": 32000, "hidden_size": 4096,
              "num_layers": 32, "num_heads": 32, "intermediate_size": 11008, "compute_dtype": "bfloat16",
              "use_flash_attention": True, "recompute": "full"},
    "parallel": {"devices": 4, "data_parallel": 1, "model_parallel": 2, "pipeline_stage": 2,
                 "micro_batch_num": 4, "optimizer_shard": True, "devices_per_node": 4, "device_memory_gb": 64},
    "training": {"micro_batch_size": 1, "gradient_accumulation_steps": 4, "global_batch_size": 4,
                 "precision": "bf16", "loss_scale": {"type": "none"}},
    "sft": {"inputs": ["s3://llm-raw/sft/*.jsonl"]},
}


@pytest.fixture
def llama7b():
    return LLAMA2_7B


@pytest.fixture
def llama70b():
    return LLAMA2_70B


@pytest.fixture
def cfg7b_raw():
    import copy

    return copy.deepcopy(LLAMA2_7B_4X64GB)


@pytest.fixture
def cfg7b(cfg7b_raw):
    return config_from_dict(cfg7b_raw)
