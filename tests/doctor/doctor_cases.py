"""Logs and configs the doctor tests share (imported by name: a module, not a conftest, so it does not
clash with other folders' conftest modules in one pytest session)."""
from __future__ import annotations

from pathlib import Path


LOGS = Path(__file__).parent / "logs"

# A 7B layout that does not fit 4 x 64 GB (pure data parallel, no recompute): device OOM remedies have numbers.
LLAMA2_7B_DP4 = {
    "run": {"name": "llama2-7b", "device_target": "Ascend"},
    "tokenizer": {"vocab_size": 32000},
    "model": {"name": "llama2_7b_cpt", "seq_length": 4096, "vocab_size": 32000, "hidden_size": 4096,
              "num_layers": 32, "num_heads": 32, "intermediate_size": 11008, "compute_dtype": "bfloat16",
              "use_flash_attention": True, "recompute": "none"},
    "parallel": {"devices": 4, "data_parallel": 4, "model_parallel": 1, "pipeline_stage": 1,
                 "micro_batch_num": 1, "devices_per_node": 4, "device_memory_gb": 64},
    "training": {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "global_batch_size": 4,
                 "precision": "bf16", "loss_scale": {"type": "none"}},
    "sft": {"inputs": ["s3://llm-raw/sft/*.jsonl"]},
}


def log_text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")
