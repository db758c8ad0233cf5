"""Evaluation: decoding over a logits function, fixed prompt sets, held-out perplexity, side-by-side reports.

Import from the modules (stage.run_evaluate_stage, decoding, prompts, report); this package re-exports
nothing. Importing it never imports MindSpore: `perplexity.read_heldout_rows` and the worker do, and
they run in the worker process launched by `stage.run_evaluate_stage`.
"""
