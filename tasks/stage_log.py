"""What a stage's log lines become in the Prefect log, and the full log kept as a file of the run.

Every line goes to `<run folder>/logs/<stage>-<UTC time>.log` (uploaded there at the end for an S3
run store). The Prefect log gets what a person reads:
- mindformers' records in their real stdout format (tools/logger.py DEFAULT_STDOUT_FORMAT,
  `2026-12-01 17:45:50,322 - mindformers<log dir>[mindformers/<path>.py:<line>] - WARNING - <message>`) and the
  bracketed `[WARNING] ...` format (MindSpore, mindpet, mindformers' file format) at their own level: WARNING as a
  warning `[<module>:<line>] <message>`, ERROR/CRITICAL as an error; INFO/DEBUG only at debug level, which the run
  logger does not ship (the file has them);
- a record's continuation lines (mindformers prints config dumps one key per line, or pprints a dict right after
  a record) stay with it: one record, not one per line;
- step lines (`... step:[ 12/ 600], loss: ...`) at most one per `step_every_s`, as `<stage>: step 12 (epoch 1),
  loss 6.4700, lr 0.005, 62 ms/step, 4,129 tokens/s`, the skipped count said with the next one, and the last step
  line always;
- the pipeline's own lines (no level prefix) as info, `<stage>: WARNING ...` as a warning;
- a third-party deprecation notice (tasks/deprecations.py) at debug: the file has it, and one line at its end lists
  the run's notices.
With the CLI's terminal installed (tasks/terminal.py) step lines also feed its progress bar and, with `-v`, the lines
the run logger does not ship (debug records, held step lines) are echoed there: with Prefect's console, every line.
"""
from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from pathlib import Path

from tasks import terminal as term
from tasks.deprecations import Notices, is_deprecation_notice

STEP_EVERY_S = 30.0
# a record's continuation lines arrive in one burst; a line after a pause starts a record of its own
CONTINUATION_GAP_S = 1.0
LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
          "CRITICAL": logging.CRITICAL}
_MF = re.compile(r"^(?:\[worker_\d+\]\s*)?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - (?P<name>.*?)"
                 r"\[(?P<module>[^\[\]]+:\d+)\] - (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) - (?P<message>.*)$")
_BRACKET = re.compile(r"^(?:\[worker_\d+\]\s*)?\[(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\]\s*"
                      r"(?:[\d\-: ,.]+)?(?:\[(?P<module>[^\[\]]+:\d+)\]\s*)?(?P<message>.*)$")
# lines that begin a record of their own even right after a mindformers record: ours ("pretrain: ...",
# "[checkpoints] ...", "PIPELINE_TIMING {...}") and any bracketed level
_OWN_START = re.compile(r"^(?:\[[\w.-]+\]|PIPELINE_\w+ |[\w.-]+: )")
_STEP = re.compile(r"step:\[\s*\d+/\s*\d+\]")
_OWN_WARNING = re.compile(r"^[\w.-]+: WARNING\b")


def parse_line(line: str) -> tuple[int | None, str | None, str]:
    """(level, module, message) of a trainer line; (None, None, line) for a line without a level."""
    m = _MF.match(line) or _BRACKET.match(line)
    if not m:
        return None, None, line
    return LEVELS[m["level"]], m["module"], m["message"]


class StageLog:
    def __init__(self, stage: str, paths, logger, step_every_s: float | None = None,
                 tokens_per_step: int | None = None):
        self.stage, self.paths, self.logger = stage, paths, logger
        self.step_every_s = STEP_EVERY_S if step_every_s is None else step_every_s
        self.tokens_per_step = tokens_per_step
        name = f"{stage}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.log"
        self.remote = paths.store().remote
        folder = Path(tempfile.mkdtemp(prefix="stage-log-")) if self.remote else Path(paths.run_uri) / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / name
        self.uri = f"{paths.run_uri}/logs/{name}" if self.remote else str(self.path)
        self.fh = open(self.path, "a", encoding="utf-8")
        self.last_step_sent: float | None = None  # monotonic time is small on a freshly booted machine: not 0.0
        self.held: str | None = None  # the newest step line not sent yet
        self.held_count = 0
        self.open: dict | None = None  # the level-prefixed record whose continuation lines may still come
        self.warnings = 0
        self.notices = Notices(paths.run_uri)  # third-party deprecation notices: the file only (tasks/deprecations.py)

    def __call__(self, line: str) -> None:
        line = str(line).rstrip("\n")
        try:
            self.fh.write(line + "\n")
            self.fh.flush()
        except ValueError:  # closed: a late line from a thread after the stage ended
            pass
        now = time.monotonic()
        terminal = term.current()
        if self.open is not None:
            if now - self.open["at"] < CONTINUATION_GAP_S and not (_MF.match(line) or _OWN_START.match(line)):
                self.open["lines"].append(line)
                self.open["at"] = now
                return
            self._send_open()
        if _STEP.search(line):
            self._step(line, now, terminal)
            return
        level, module, message = parse_line(line)
        if level is None:
            # our own warnings read `<stage>: WARNING ...` (e.g. the planner's step-time alert)
            (self.logger.warning if _OWN_WARNING.match(line) else self.logger.info)(line)
            return
        self.open = {"level": level, "module": module, "message": message, "raw": line, "lines": [], "at": now}

    def _send_open(self) -> None:
        rec, self.open = self.open, None
        notice = rec["level"] == logging.WARNING and is_deprecation_notice(rec["message"])
        if notice:
            self.notices.add(rec["module"] or rec["message"], rec["message"])
        if rec["level"] < logging.WARNING or notice:  # the whole record, dump included, as one debug record
            text = "\n".join([rec["raw"], *rec["lines"]])
            self.logger.debug(text)
            self._echo(text)
            return
        self.warnings += rec["level"] == logging.WARNING
        where = f"[{rec['module']}] " if rec["module"] else ""
        text = "\n".join([f"{where}{rec['message']}", *rec["lines"]])
        self.logger.log(rec["level"], text, extra={
            "terminal_text": f"{self.stage}: {text}",
            "terminal_source": rec["module"] or rec["message"], "terminal_stage": self.stage})

    def _step(self, line: str, now: float, terminal) -> None:
        if terminal is not None:
            from pipeline_lib.train.metrics import parse_loss_line

            record = parse_loss_line(line, self.tokens_per_step)
            if record is not None:
                terminal.train_step(self.stage, record)
        if self.last_step_sent is None or now - self.last_step_sent >= self.step_every_s:
            self._send_step(line, skipped=self.held_count)
            self.last_step_sent = now
        else:
            self.held, self.held_count = line, self.held_count + 1
            self._echo(line)

    @staticmethod
    def _echo(text: str) -> None:
        """A line the run logger does not ship (debug, a held step line): on the terminal with `-v` only."""
        terminal = term.current()
        if terminal is not None:
            terminal.echo(text)

    def write_only(self, text: str) -> None:
        """Into the file only (e.g. a failure's full traceback or a trainer's tail: the Prefect log gets one line)."""
        try:
            self.fh.write(text if text.endswith("\n") else text + "\n")
            self.fh.flush()
        except ValueError:
            pass

    def _send_step(self, line: str, skipped: int) -> None:
        more = f"  ({skipped} step lines since the last one shown: {self.uri})" if skipped > 0 else ""
        self.logger.info(self._step_text(line) + more)
        self.held, self.held_count = None, 0

    def _step_text(self, line: str) -> str:
        """MFLossMonitor's step line as a short one of ours (the log file keeps it as printed)."""
        from pipeline_lib.train.metrics import parse_loss_line

        r = parse_loss_line(line, self.tokens_per_step)
        if r is None:
            return line
        parts = [f"{self.stage}: step {r['step']} (epoch {r['epoch']}), loss {r['loss']:.4f}"]
        if r.get("lr") is not None:
            parts.append(f"lr {r['lr']:.3g}")
        parts.append(f"{r['step_time_ms']:.0f} ms/step")
        if r.get("tokens_per_s"):
            parts.append(f"{r['tokens_per_s']:,.0f} tokens/s")
        return ", ".join(parts)

    def flush(self) -> None:
        """Send the record still open (a failure is about to be reported: its warnings come first)."""
        if self.open is not None:
            self._send_open()

    def close(self) -> None:
        """Send what is held back, close the file, upload it for an S3 run store, name it (on the terminal too)."""
        self.flush()
        if self.held is not None:
            self._send_step(self.held, skipped=self.held_count - 1)
        terminal = term.current()
        if terminal is not None:
            terminal.end(self.stage)
        notices = self.notices.summary(self.stage)
        if notices:
            self.write_only(notices)
        try:
            self.fh.close()
            if self.remote:
                self.paths.store().put_file(self.path, self.uri)
                shutil.rmtree(self.path.parent, ignore_errors=True)
            hidden = terminal.hidden_count(self.stage) if terminal is not None else 0
            note = (f" ({hidden} more warning{'s' if hidden > 1 else ''} from places already shown above: in this log)"
                    if hidden else "")
            self.logger.info(f"{self.stage}: full log {self.uri}", extra={**term.SHOW, "terminal_text":
                                                                           f"{self.stage}: full log {self.uri}{note}"})
        except Exception as err:  # the log file is a convenience; the stage's own result stands
            self.logger.warning(f"{self.stage}: could not keep the full log at {self.uri}: {err}")
