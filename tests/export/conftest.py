"""The tiny world shared by the export tests (built once per session): config, tokenizer, a
random-init base checkpoint and a LoRA adapter with non-zero B."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline_lib.config.load import config_from_dict
from random_init import random_llama_params, random_lora_params, save_params, tiny_tokenizer


@dataclass
class TinyExport:
    root: Path
    cfg: object
    tokenizer: Path
    base_params: dict
    adapter_params: dict
    base: Path
    adapter: Path


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory) -> TinyExport:
    root = tmp_path_factory.mktemp("tiny_export")
    cfg = config_from_dict({
        "run": {"output_root": str(root / "runs"), "device_target": "CPU", "seed": 3},
        "model": {"seq_length": 32, "vocab_size": 640, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                  "n_kv_heads": 2, "intermediate_size": 64},
        "sft": {"lora_rank": 4, "lora_alpha": 8.0, "target_modules": ["wq", "wk", "wv", "wo"]},
        "export": {"batch_size": 2}, "training": {"timeout_seconds": 300}})
    texts = [f"The quick brown fox jumps over the lazy dog number {i}." for i in range(100)]
    texts += [f"我们每天晚上都会用新数据继续训练模型，第{i}次。" for i in range(100)]
    tok = tiny_tokenizer(texts, root / "tok", cfg.tokenizer, vocab_size=400)
    base = random_llama_params(cfg.model, seed=0)
    adapter = random_lora_params(base, list(cfg.sft.target_modules), cfg.sft.lora_rank, seed=4)
    return TinyExport(root=root, cfg=cfg, tokenizer=tok, base_params=base, adapter_params=adapter,
                      base=save_params(base, root / "base.ckpt"), adapter=save_params(adapter, root / "adapter.ckpt"))
