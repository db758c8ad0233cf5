"""The stage failure path: classify a stage's exception, carry the category and first remedy in its message, and
decide whether retrying with the same config can help.

`attach_diagnosis(exc, cfg, stage)` sets `exc.diagnosis` and, for a known category, appends the doctor's one-line
headline (`doctor: <category> in <stage>: <first remedy> (overrides: ...)`) to the exception's message, so the
Prefect failure message, the failure webhook and the CLI summary (all built from that message) carry it.
`should_retry(exc, transient)`: the category decides when it knows (collective_timeout, killed: yes; OOM, NaN, disk,
config, data, kernel: no, whatever the exception type, so a trainer the kernel OOM killer SIGKILLed, as the memory
evidence shows, is not retried with the same config, while one SIGKILLed without that evidence is, and resumes);
for `unknown` the caller's transient-error rule (storage/network errors, lost workers) stands. An exception that says
itself (`retryable = False`, e.g. train.session's second hang at the same step) overrides its category.
"""
from __future__ import annotations

import re

from .classify import Diagnosis, classify, diagnose_exception, exception_text

HEADLINE = re.compile(r"^doctor: (\w+)(?: in (\w+))?(?:: (.*))?$", re.M)


def attach_diagnosis(exc: BaseException, cfg=None, stage: str | None = None) -> Diagnosis | None:
    try:
        diag = diagnose_exception(exc, cfg, stage)
    except Exception:  # the doctor must never mask the stage's own failure
        return None
    try:
        exc.diagnosis = diag
    except AttributeError:  # an exception type without __dict__
        return diag
    if diag.category != "unknown":
        line = diag.headline()
        if len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (f"{exc.args[0]}\n{line}",)
        else:
            exc.add_note(line)
    return diag


def category_of(exc: BaseException) -> str:
    diag = getattr(exc, "diagnosis", None)
    if isinstance(diag, Diagnosis):
        return diag.category
    result = getattr(exc, "result", None)
    return classify(exception_text(exc), returncode=getattr(result, "returncode", None),
                    timed_out=bool(getattr(result, "timed_out", False)), memory=getattr(result, "memory", None))[0]


def should_retry(exc: BaseException, transient: bool) -> bool:
    if getattr(exc, "retryable", None) is False:
        return False
    retry = Diagnosis(category_of(exc)).retry
    return transient if retry is None else retry


def parse_headline(message: str) -> dict:
    """{"category", "remedy"} from a failure message carrying a doctor headline; {} when it has none."""
    found = None
    for found in HEADLINE.finditer(message or ""):
        pass  # the last one: the innermost stage's
    if found is None:
        return {}
    return {"category": found.group(1), "remedy": found.group(3)}
