"""A failing stage's error in the Prefect log: shown once, our message first, no engine traceback.

Without this, one failure appeared three times with ~40 lines of Prefect traceback each: the task
("Task run failed with exception ..."), the stage flow and the parent flow ("Encountered exception
during execution ..."). Now:
- the stage task logs one ERROR line of its own: the doctor's category and remedy first (when the
  doctor knows the cause), then our message (a trainer's tail cut off into the stage's log file, whose path it
  names: compact_message), then what happens next (a retry, or how to resume);
- the engine's repeats of that same exception are dropped from the log (the state message keeps it);
- our own one-line exceptions (e.g. the pipeline's StageFailed, marked `log_without_traceback`) are
  logged as their message only.
An exception neither reported nor marked keeps Prefect's full record: an unexpected bug needs it.
"""
from __future__ import annotations

import logging
import re
import traceback
from collections import deque

from pipeline_lib.doctor.retry import HEADLINE

ENGINE_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


_SHOWN: deque[BaseException] = deque(maxlen=20)  # our one-line exceptions already logged (this process)
_REPORTED: deque[str] = deque(maxlen=20)  # messages of the exceptions the stage tasks reported (this process)


class OurErrorsOnce(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        if not record.exc_info or record.exc_info[1] is None:
            # the task engine's "Finished in state Failed(<the message>)" is an ERROR too: a state change
            # (INFO, as the flow engine logs it) once the error itself is in the log
            text = record.getMessage()
            if text.startswith("Finished in state ") and any(m and m in text for m in _REPORTED):
                record.levelno, record.levelname = logging.INFO, "INFO"
            return True
        exc = record.exc_info[1]
        if getattr(exc, "log_without_traceback", False):
            # a worker's flow run logs the same exception from two places of the flow engine: once is enough
            if any(seen is exc for seen in _SHOWN):
                return False
            _SHOWN.append(exc)
            record.msg, record.args = str(exc), ()
            record.exc_info, record.exc_text = None, None
            # e.g. the parent flow's StageFailed: its run's log keeps it; the CLI's terminal showed the stage's own
            record.repeats_stage_error = any(getattr(e, "reported_by_stage", False) for e in _chain(exc))
            return True
        # reported by the stage task already (the exception itself, or the one it wraps)
        return not any(getattr(e, "reported_by_stage", False) for e in _chain(exc))


_FILTER = OurErrorsOnce()


class EngineRepeatsOurs(logging.Filter):
    """A flow run started by a worker ends in `prefect.engine`, which logs the flow's exception once more ("Execution
    of flow run ... exited with unexpected exception" and its traceback) after the flow engine did: for our own
    errors (the parent's StageFailed, a stage error reported by its task) that record is a repeat, dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and any(getattr(e, "log_without_traceback", False)
                                            or getattr(e, "reported_by_stage", False) for e in _chain(exc)))


_ENGINE_FILTER = EngineRepeatsOurs()


def install() -> None:
    """Idempotent: the filter on Prefect's task-run and flow-run loggers (the records they create), and the engine's
    repeat of a worker run's exception."""
    for name in ENGINE_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    engine = logging.getLogger("prefect.engine")
    if _ENGINE_FILTER not in engine.filters:
        engine.addFilter(_ENGINE_FILTER)


def report_outcome(logger, exc: BaseException) -> None:
    """An exception that is an outcome of the run, not a fault in it (the data stage's NoNewDocuments, on which a
    night ends NoNewData / NoUsableData): its message once, as a WARNING; the engine's records of it (the task's
    "Finished in state Failed(...)", the data flow's exception, the parent's StageFailed) are then treated as for a
    reported stage error, so the terminal of a night that ended as designed shows no ERROR (it showed three). A run
    that is not a nightly still fails on it, and its summary says so."""
    logger.warning(str(exc))
    _REPORTED.append(repr(str(exc))[1:-1])
    try:
        exc.reported_by_stage = True
    except AttributeError:
        pass


MESSAGE_CHARS = 600  # our part of a failure message; the rest (a trainer's tail, a long listing) goes to the log file
# where a launcher's failure text (runtime/launcher.py LaunchResult.describe) turns from our words into the child's
_TAIL_START = re.compile(r"^(?:command: |--- last \d+ lines of )")


def compact_message(exc: BaseException, stage_log, stage: str) -> str:
    """Cut the exception's message to ours: the lines before a launcher's command and tails, at most MESSAGE_CHARS,
    the doctor's headline (attach_diagnosis) kept last, plus `full log: <the stage's log file>`; the whole text goes
    into that file first. The Prefect state message, the run overview, the webhook and the CLI summary are all built
    from this message. An exception whose message is not one string argument keeps its message."""
    text = str(exc)
    where = getattr(stage_log, "uri", None)
    if not (len(exc.args) == 1 and isinstance(exc.args[0], str)):
        return text
    lines = text.splitlines()
    headlines = [ln for ln in lines if HEADLINE.match(ln)]
    ours = []
    for line in lines:
        if _TAIL_START.match(line):
            break
        if not HEADLINE.match(line):
            ours.append(line)
    short = "\n".join(ours).strip()
    if len(short) > MESSAGE_CHARS:
        short = short[:MESSAGE_CHARS].rstrip() + " ..."
    if short != "\n".join(ln for ln in lines if not HEADLINE.match(ln)).strip():
        try:
            stage_log.write_only(f"--- {stage} failed; the whole message ---\n{text}")
        except Exception:
            pass
    if where:
        short += f"\nfull log: {where}"
    exc.args = ("\n".join([short, *headlines[-1:]]),)
    return str(exc)


def report_stage_error(logger, stage_log, exc: BaseException, diagnosis, stage: str, final: bool,
                       next_step: str = "") -> str:
    """Log the stage's failure once (ERROR when final, WARNING when the task will retry it): the doctor's headline
    first, then our message (compact_message: with the log file's path), then what happens next (`next_step`); the
    full traceback goes to the stage's log file. Returns the line logged."""
    compact_message(exc, stage_log, stage)
    message = str(exc)
    headline = diagnosis.headline() if diagnosis is not None and diagnosis.category != "unknown" else None
    if headline and message.rstrip().endswith(headline):  # attach_diagnosis appended it: say it first instead
        message = message.rstrip()[: -len(headline)].rstrip()
    first = f"{headline}\n" if headline else ""
    line = f"{first}{stage} failed: {type(exc).__name__}: {message}" + (f"\n{next_step}" if next_step else "")
    try:
        stage_log.write_only("".join(traceback.format_exception(exc)))
    except Exception:  # the file is a convenience; the failure itself is what matters
        pass
    (logger.error if final else logger.warning)(line)
    if final:
        _REPORTED.append(repr(str(exc))[1:-1])  # as the state message shows it (newlines escaped)
        try:
            exc.reported_by_stage = True
        except AttributeError:  # an exception type without __dict__: Prefect's record stays
            pass
    return line


# the cgroup file the memory evidence read (runtime/memory_evidence.py): for the stage's log, not the run's message
_CGROUP_FILE = re.compile(r" \([^()\s]*/(?:memory\.events|memory\.oom_control)\)")


def note_attempts(exc: BaseException) -> None:
    """On the last failed attempt of a stage task: how many attempts failed (the parent's message says so)."""
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    if ctx is not None:
        try:
            exc.failed_attempts = ctx.task_run.run_count
        except AttributeError:
            pass


def stage_failure(stage: str, run_id: str, err: BaseException) -> str:
    """The run's one message for a failed stage (its log line, state, overview): how many attempts failed when
    more than one did, the stage's own message, no cgroup file paths."""
    attempts = getattr(err, "failed_attempts", None) or 1
    text = (f"stage '{stage}' failed (run {run_id}): "
            + (f"all {attempts} attempts failed; the last: " if attempts > 1 else "")
            + f"{type(err).__name__}: {err}")
    return _CGROUP_FILE.sub("", text)
