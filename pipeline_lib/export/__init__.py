"""Export: LoRA merge, sharded-checkpoint merge, MindIR export with logits checks.

Importing this package never imports MindSpore; the numpy LoRA merge is usable anywhere, the rest
runs in the worker process launched by `stage.run_export_stage`.
"""
from .lora_merge import LoraMergeError, lora_scale, merge_lora

__all__ = ["LoraMergeError", "lora_scale", "merge_lora", "run_export_stage"]


def run_export_stage(*args, **kwargs):
    """See pipeline_lib.export.stage.run_export_stage."""
    from .stage import run_export_stage as _run

    return _run(*args, **kwargs)
