"""The training stages and the runner they share.

Stages: pretrain (stage.py) and LoRA SFT (sft_stage.py), each `run_<name>_stage(run: StageRun) -> StageOutput`.
Both train through session.py (work folder, resume, preflight, yaml, the attempt loop with checkpoint ticks and the
loss guard), which builds on the trainer launch (launch.py, runner.py: runtime.launcher underneath), checkpoints
and their verification (checkpoints.py) and metrics.jsonl (metrics.py); SFT's rows come from sft_data.py (instruction records:
instructions.py; chat template and tokenizer: pipeline_lib.model); adapter.py extracts SFT's LoRA factors (the Hugging Face
Llama conversion is pipeline_lib.model.hf). The trainer subprocess runs entry.py with cpu_wrappers.py, callbacks.py
and mf_callbacks.py. The orchestrating process never imports MindSpore: checkpoints.py, runner.py, adapter.py and
model/hf.py do their MindSpore work in subprocesses of their own (runtime.launcher.launch_module)."""
