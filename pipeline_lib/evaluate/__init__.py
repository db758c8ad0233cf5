"""Evaluation: decoding over a logits function, fixed prompt sets, held-out perplexity, side-by-side reports.

Importing this package never imports MindSpore: `perplexity.read_heldout_rows` and the
worker do, and they run in the worker process launched by `stage.run_evaluate_stage`.
"""
from .decoding import Generation, decode, filtered_probs, fixed_batch, sample_token, truncate_prompt
from .prompts import Prompt, PromptSetError, keyword_hits, load_prompt_sets

__all__ = ["Generation", "Prompt", "PromptSetError", "decode", "filtered_probs", "fixed_batch", "keyword_hits",
           "load_prompt_sets", "run_evaluate_stage", "sample_token", "truncate_prompt"]


def run_evaluate_stage(*args, **kwargs):
    """See pipeline_lib.evaluate.stage.run_evaluate_stage."""
    from .stage import run_evaluate_stage as _run

    return _run(*args, **kwargs)
