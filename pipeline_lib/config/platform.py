"""Which device this run trains on, and the overrides a CPU run needs (measured, see docs/mindformers-facts.md)."""
from __future__ import annotations

import glob
import os

from .schema import PipelineConfig

# On CPU the fused/sliced Ascend kernels are missing; these model_config values make the
# same Llama graph run there. Sink mode on CPU silently multiplies the step count.
CPU_MODEL_OVERRIDES = {"use_rope_slice": True, "fused_rms_norm": False, "use_flash_attention": False}
CPU_RUNNER_OVERRIDES = {"sink_mode": False}


def ascend_visible() -> bool:
    return bool(glob.glob("/dev/davinci[0-9]*")) or bool(os.environ.get("LLM_PIPELINE_FORCE_ASCEND"))


def device_target(cfg: PipelineConfig) -> str:
    if cfg.run.device_target != "auto":
        return cfg.run.device_target
    return "Ascend" if ascend_visible() else "CPU"

CPU_ACHIEVED_TFLOPS = 0.008
"""Achieved training TFLOP/s of one CPU "device" (a trainer process), behind the planner's absolute step-time
prediction on CPU (training.planner_tflops overrides it). Calibrated on the tiny test config (hidden 64, 2 layers,
seq 64, batch 4; 368 MFLOP per step by planner.cost.train_flops_per_token) on the 2-core x86_64 dev machine: median
step 44 ms -> 0.0084 TFLOP/s. Such small matmuls are dominated by per-op overhead: a wider model gets more FLOP/s
out of the same CPU, so on CPU this predicts too slow a step for large models (set training.planner_tflops)."""
ASCEND_ACHIEVED_TFLOPS = 150.0
"""The planner's own figure (planner.cost.Hardware.tflops: about half of a 910B's 16-bit peak)."""


def achieved_tflops(cfg: PipelineConfig) -> tuple[float, str]:
    """(TFLOP/s per device, where the figure comes from) for the planner's step-time prediction."""
    if cfg.training.planner_tflops is not None:
        return cfg.training.planner_tflops, "training.planner_tflops"
    if device_target(cfg) == "CPU":
        return CPU_ACHIEVED_TFLOPS, "CPU default calibrated on the tiny run (config/platform.py)"
    return ASCEND_ACHIEVED_TFLOPS, "planner default (planner.cost.Hardware)"
