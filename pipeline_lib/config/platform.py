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
