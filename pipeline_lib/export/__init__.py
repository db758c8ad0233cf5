"""Export: merged, checked standalone checkpoint + Hugging Face folder + checked MindIR for serving.

Import from the modules (stage.run_export_stage); this package re-exports nothing. Importing it never
imports MindSpore: the work runs in the worker process launched by `stage.run_export_stage`. The LoRA
and shard merges it uses live in pipeline_lib.model.
"""
