"""Which stages a config field concerns, so a command checks only the stages it runs.

A field's stages are the ones its schema marker names (config/schema.py `identity`, read by identity.schema_fields);
a field marked as having no output effect (`[]`) takes its section's when the section is a stage's own
(SECTION_STAGES: `sft.global_batch_size` is sft's); any other field (`run.*`, `orchestration.*`, `nightly.*`)
concerns every command. `scope(issues, stages)` splits a check's issues into
those of the stages run and those ignored, and `ignored_note` says why one was left out (a nightly runs data,
pretrain and evaluate: an sft setting that would fail an sft run must not stop it).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable

from .errors import ConfigIssue
from .identity import schema_fields

_INDEX = re.compile(r"\[[^\]]*\]")


# the sections only some stages read (training.* is pretrain's schedule, and sft reads its optimizer and precision)
SECTION_STAGES = {"data": frozenset({"data"}), "tokenizer": frozenset({"data"}),
                  "training": frozenset({"pretrain", "sft"}), "sft": frozenset({"sft"}),
                  "evaluate": frozenset({"evaluate"}), "export": frozenset({"export"})}


@lru_cache(maxsize=1)
def _stages_by_prefix() -> dict[str, frozenset[str]]:
    """Every leaf field whose marker names stages, and the stage sections -> the stages they concern."""
    marked = {dotted: frozenset(marker["stages"]) for dotted, marker in schema_fields() if marker and marker["stages"]}
    return {**SECTION_STAGES, **marked}


def field_stages(field: str) -> frozenset[str] | None:
    """The stages `field` (a dotted name as an issue gives it, `sft.inputs[0]` too) concerns; None: every stage."""
    parts = _INDEX.sub("", field).split(".")
    table = _stages_by_prefix()
    for i in range(len(parts), 0, -1):
        stages = table.get(".".join(parts[:i]))
        if stages:
            return stages
    return None


def scope(issues: Iterable[ConfigIssue], stages: Iterable[str] | None) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """(the issues of the stages run, the issues only stages not run would meet); stages None: every stage runs."""
    if stages is None:
        return list(issues), []
    run = set(stages)
    kept, ignored = [], []
    for issue in issues:
        concerns = field_stages(issue.field)
        (kept if concerns is None or concerns & run else ignored).append(issue)
    return kept, ignored


def ignored_note(issue: ConfigIssue, stages: Iterable[str]) -> ConfigIssue:
    """The warning for an issue left out: which stages it concerns, which ones this command runs, what it says."""
    concerns = ", ".join(sorted(field_stages(issue.field) or ()))
    return ConfigIssue(issue.field, issue.value,
                       f"ignored: it concerns {concerns}, which this command does not run (it runs "
                       f"{', '.join(stages)}); for a run of {concerns} it is an error: {issue.problem}",
                       f"{issue.fix} before running {concerns}")
