"""Logs and configs the doctor tests share (imported by name: a module, not a conftest, so it does not
clash with other folders' conftest modules in one pytest session)."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planner"))
from llama2_configs import LLAMA2_7B_4X64GB  # noqa: E402

LOGS = Path(__file__).parent / "logs"

# A 7B layout that does not fit 4 x 64 GB (pure data parallel, no recompute): device OOM remedies have numbers.
LLAMA2_7B_DP4 = copy.deepcopy(LLAMA2_7B_4X64GB)
LLAMA2_7B_DP4["model"]["recompute"] = "none"
LLAMA2_7B_DP4["parallel"] = {"devices": 4, "data_parallel": 4, "model_parallel": 1, "pipeline_stage": 1,
                             "micro_batch_num": 1, "devices_per_node": 4, "device_memory_gb": 64}
LLAMA2_7B_DP4["training"]["gradient_accumulation_steps"] = 1


def log_text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")
