"""Classify a failure from log text: which category, the lines that show it, and (with a config) what to change.

`classify(text, returncode=None, timed_out=False)` -> (category, evidence lines). `diagnose(text, cfg=None,
stage=None, ...)` -> `Diagnosis` with remedies computed from our planner and config (remedies.py).
Works on any mindformers / msrun / MindSpore / HCCL log, ours or not. Categories and their text: patterns.py.

Device OOM is split by phase, from the evidence the log has: after a training step line was logged, or met by a
kernel of a step (a backward pass, an op being executed, a data-source actor feeding a running graph) it happened in
a step (`device_oom_step`); otherwise before the first step (`device_oom_compile`): while the graph was compiled and
its memory laid out (in graph mode MindSpore plans a graph's memory before its first step), or the weights loaded.
A trainer killed by SIGKILL (exit -9 / 137, msrun's "Error code: -9") that no timeout of ours killed is `host_oom` only
with evidence of memory pressure: the kernel's OOM-killer lines in the log, or the launcher's memory evidence
(runtime/memory_evidence.py: the cgroup's oom_kill count rose, or the tree's last sampled RSS was near the limit),
passed as `memory=` or read from the launcher's line in the log. Without it the kill is `killed` (a lost node, a
preemption, an operator's kill -9): retried, and the retry resumes from the last checkpoint. The evidence line that
decided is in the diagnosis. No recognised text gives `unknown`, never a guess; `diagnose` then quotes the log's
error lines as its evidence, so the user sees what doctor saw.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .patterns import CATEGORIES, COMPILE_HINT, CONTEXT, ERROR_LINE, PATTERNS, STEP_HINT, STEP_LINE

MAX_EVIDENCE = 6
MAX_LINE = 400
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STAGE_LINE = re.compile(r"^(?:\[[^\]]*\]\s*)?(data|pretrain|sft|evaluate|export): ")
_FAILED_STAGE = re.compile(r"stage '(\w+)' failed")
SIGKILL_CODES = (-9, 137)

# Retry policy by category: only infrastructure that comes back on its own is retried with the same config (a hang
# resumes from the last checkpoint; the watchdog does not retry a second hang at the same step). A stalled input
# pipeline stalls again with the same workers and prefetch: the config changes first.
RETRY_CATEGORIES = frozenset({"collective_timeout", "killed", "hang"})
NO_RETRY_CATEGORIES = frozenset({"device_oom_compile", "device_oom_step", "host_oom", "nan_or_overflow",
                                 "disk_full", "config_name_clash", "missing_kernel", "dataset_schema",
                                 "checkpoint_shape_mismatch", "dataloader_stall", "preflight"})
ALL_CATEGORIES = tuple(sorted(RETRY_CATEGORIES | NO_RETRY_CATEGORIES)) + ("unknown",)


@dataclass
class Diagnosis:
    category: str
    stage: str | None = None
    evidence: list[str] = field(default_factory=list)
    remedies: list[dict] = field(default_factory=list)  # [{"why": str, "overrides": ["key=value", ...]}]

    def as_dict(self) -> dict:
        return {"category": self.category, "stage": self.stage, "evidence": self.evidence,
                "remedies": self.remedies}

    @property
    def retry(self) -> bool | None:
        """True: retry with the same config may help; False: it cannot; None: the category does not say."""
        if self.category in RETRY_CATEGORIES:
            return True
        if self.category in NO_RETRY_CATEGORIES:
            return False
        return None

    def headline(self) -> str:
        """One line for a failure message / webhook: the category and the first remedy."""
        where = f" in {self.stage}" if self.stage else ""
        text = f"doctor: {self.category}{where}"
        if self.remedies:
            first = self.remedies[0]
            text += f": {first['why']}"
            if first["overrides"]:
                text += f" (overrides: {' '.join(first['overrides'])})"
        return text


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + " ..."


def _lines(text: str) -> list[str]:
    return _ANSI.sub("", text).splitlines()


def _kill_verdict(category: str, evidence: list[str], memory) -> tuple[str, list[str]]:
    """A kill with the launcher's MemoryEvidence: host_oom when it shows memory pressure, else killed; the sentence
    that decided goes first in the evidence."""
    if memory is None:
        return category, evidence
    oom, why = memory.verdict()
    evidence = [ln for ln in evidence if "memory evidence of an OOM kill: " not in ln]  # the object decides
    return ("host_oom" if oom else "killed"), ([_clip(why)] + evidence)[:MAX_EVIDENCE]


def classify(text: str, *, returncode: int | None = None, timed_out: bool = False,
             memory=None) -> tuple[str, list[str]]:
    """(category, evidence lines) of a log; ("unknown", []) when no known failure text is in it.
    `memory`: the launch's runtime.memory_evidence.MemoryEvidence; it decides host_oom vs killed for a SIGKILL."""
    lines = _lines(text)
    hits: dict[str, list[tuple[int, str]]] = {}
    for i, line in enumerate(lines):
        for pat in PATTERNS:
            if pat.matches(line):
                hits.setdefault(pat.category, []).append((i, line))
                break
    category = next((c for c in CATEGORIES if c in hits), None)
    if category is None:
        if returncode in SIGKILL_CODES and not timed_out:
            line = f"exit code {returncode}: killed by SIGKILL, not by a timeout of ours"
            if memory is None:
                line += "; no memory evidence was recorded, so no OOM kill is shown"
            return _kill_verdict("killed", [line], memory)
        return "unknown", []
    if category == "killed" and timed_out:
        return "unknown", []  # our own timeout killed the tree: the kill is not the cause
    found = hits[category]
    evidence = []
    for _, line in found:
        clipped = _clip(line)
        if clipped not in evidence:
            evidence.append(clipped)
        if len(evidence) >= MAX_EVIDENCE:
            break
    context = CONTEXT.get(category)
    if context is not None:
        for line in lines:
            if len(evidence) < MAX_EVIDENCE and context.search(line) and _clip(line) not in evidence:
                evidence.append(_clip(line))
    if category == "device_oom":
        category, evidence = _oom_phase(lines, found[0][0], evidence)
    if category == "killed":
        return _kill_verdict(category, evidence, memory)
    return category, evidence


def _oom_phase(lines: list[str], first: int, evidence: list[str]) -> tuple[str, list[str]]:
    """device_oom_step when a step line came before the OOM or a step's kernel met it, else device_oom_compile; the
    line that decided joins the evidence (a step line first: the last step that finished before memory ran out)."""
    steps = [ln for ln in lines[:first] if STEP_LINE.search(ln)]
    if steps:
        return "device_oom_step", ([_clip(steps[-1])] + evidence)[:MAX_EVIDENCE]
    kernel = next((ln for ln in lines if STEP_HINT.search(ln.strip())), None)
    if kernel is not None:
        return "device_oom_step", _with(evidence, kernel)
    hint = next((ln for ln in lines if COMPILE_HINT.search(ln)), None)
    return "device_oom_compile", (_with(evidence, hint) if hint is not None else evidence)


def _with(evidence: list[str], line: str) -> list[str]:
    clipped = _clip(line)
    if clipped in evidence:
        return evidence
    return (evidence[:MAX_EVIDENCE - 1] + [clipped]) if len(evidence) >= MAX_EVIDENCE else evidence + [clipped]


def error_lines(text: str) -> list[str]:
    """The lines of a log that report an error (exceptions, [ERROR], Ascend error codes), last ones first: what an
    `unknown` diagnosis quotes so that the user sees what doctor saw."""
    found: list[str] = []
    for line in reversed(_lines(text)):
        if ERROR_LINE.search(line) and _clip(line) not in found:
            found.append(_clip(line))
            if len(found) >= MAX_EVIDENCE:
                break
    return found


def stage_from_text(text: str) -> str | None:
    """The pipeline stage a log of ours names ("stage 'pretrain' failed", "pretrain: ..."), else None."""
    found = _FAILED_STAGE.search(text)
    if found:
        return found.group(1)
    for line in _lines(text):
        m = _STAGE_LINE.match(line.strip())
        if m:
            return m.group(1)
    return None


def diagnose(text: str, cfg=None, *, stage: str | None = None, returncode: int | None = None,
             timed_out: bool = False, memory=None) -> Diagnosis:
    """Classify `text` and compute remedies (with numbers when `cfg`, a PipelineConfig, is given)."""
    from .remedies import remedies_for

    category, evidence = classify(text, returncode=returncode, timed_out=timed_out, memory=memory)
    if category == "unknown" and not evidence:
        evidence = error_lines(text)
    stage = stage or stage_from_text(text)
    diag = Diagnosis(category, stage, evidence)
    diag.remedies = remedies_for(diag, cfg)
    return diag


def exception_text(exc: BaseException) -> str:
    """Everything an exception of a stage carries that may hold failure text: its message (ours include the log
    tail), the launcher's per-source tails, a worker's tail, and the chained causes."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        result = getattr(exc, "result", None)
        for lines in (getattr(result, "tails", None) or {}).values():
            parts.extend(lines)
        parts.extend(getattr(exc, "tail", None) or [])
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def diagnose_exception(exc: BaseException, cfg=None, stage: str | None = None) -> Diagnosis:
    result = getattr(exc, "result", None)
    return diagnose(exception_text(exc), cfg, stage=stage, returncode=getattr(result, "returncode", None),
                    timed_out=bool(getattr(result, "timed_out", False)), memory=getattr(result, "memory", None))
