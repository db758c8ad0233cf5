"""The training stages (pretrain: stage.py, LoRA SFT: sft_stage.py) and what they share: the launcher
(launch.py, runner.py), checkpoints and their verification, metrics.jsonl, the preflight (the HF weight import is
pipeline_lib.model.hf). The code that runs inside the trainer subprocess is entry.py, cpu_wrappers.py, callbacks.py,
mf_callbacks.py and model_io.py; the rest runs in the orchestrating process and never imports MindSpore."""
