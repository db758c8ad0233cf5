"""The checks run once before any flow (`llm-pipeline validate` and `run`): every problem a config has
that can be found without running a stage, each a ConfigIssue naming the field, the value and the fix.

`problems(cfg, stages, for_run=...)` returns (errors, warnings): the config's pure rules
(config.validate.check), the rules that need stage code or read a file (the tokenizer's ids, the data
filters) and, for a run here (`for_run`), the input checks the stage table names for `stages` (None:
every stage). `refuse_bad_config(cfg, stages)` raises ConfigError with every error and returns the
warnings. Unlike config/, this package may import the stages: nothing below it imports it.
"""
from __future__ import annotations

from typing import Iterable

from ..config.errors import ConfigError, ConfigIssue
from ..config.schema import PipelineConfig
from ..config.stage_scope import ignored_note, scope
from ..config.validate import check
from .filters import filter_issues
from .hang_limit import hang_limit_issues
from .parallel_rules import parallel_issues
from .inputs import check_inputs
from .token_ids import token_id_issues


def problems(cfg: PipelineConfig, stages: Iterable[str] | None = None, *, for_run: bool = True,
             check_remote: bool = True) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """check_remote: list s3:// inputs on the endpoint (a run does; `validate` only with --check-remote). An error
    only stages not in `stages` would meet is a warning saying it was ignored (config/stage_scope.py)."""
    errors, skipped = scope(check(cfg, for_run=for_run) + parallel_issues(cfg) + token_id_issues(cfg)
                            + filter_issues(cfg), stages)
    notes = [ignored_note(issue, stages) for issue in skipped]
    trains = stages is None or bool({"pretrain", "sft"} & set(stages))
    hang_errors, hang_warnings = hang_limit_issues(cfg) if trains else ([], [])
    errors += hang_errors
    if not for_run:  # a plan is checked for another machine: its files are not here
        return errors, notes + hang_warnings
    input_errors, warnings = check_inputs(cfg, stages, check_remote)
    if trains and cfg.parallel.rank_table_file:
        errors += _rank_table_issues(cfg)
    return errors + input_errors, notes + hang_warnings + warnings


def _rank_table_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    """parallel.rank_table_file read and checked against the layout (runtime.rank_table)."""
    from ..runtime.rank_table import load_rank_table, rank_table_issues

    try:
        return rank_table_issues(cfg, load_rank_table(cfg.parallel.rank_table_file))
    except ValueError as err:
        return [ConfigIssue("parallel.rank_table_file", cfg.parallel.rank_table_file, str(err),
                            "point it at the job's HCCL rank table JSON (hccl_tools.py writes one per server; "
                            "merge_hccl.py joins them)")]


def refuse_bad_config(cfg: PipelineConfig, stages: Iterable[str] | None = None) -> list[ConfigIssue]:
    errors, warnings = problems(cfg, stages)
    if errors:
        raise ConfigError(errors)
    return warnings
