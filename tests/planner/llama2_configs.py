"""Llama-2 7B pipeline configs the planner and doctor tests share (a module, not a conftest, so other
folders can import it in one pytest session)."""

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
