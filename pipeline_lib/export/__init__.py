"""Export: merged, checked standalone checkpoint + Hugging Face folder + checked MindIR for serving.

Importing this package never imports MindSpore: the work runs in the worker process launched by
`stage.run_export_stage`. The LoRA and shard merges it uses live in pipeline_lib.model.
"""
__all__ = ["run_export_stage"]


def run_export_stage(*args, **kwargs):
    """See pipeline_lib.export.stage.run_export_stage."""
    from .stage import run_export_stage as _run

    return _run(*args, **kwargs)
