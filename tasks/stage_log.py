"""What a stage's log lines become in the Prefect log, and the full log kept as a file of the run.

Every line goes to `<run folder>/logs/<stage>-<UTC time>.log` (uploaded there at the end for an S3
run store). The Prefect log gets what a person reads:
- trainer lines at their own level: `[WARNING] ...` as a warning, `[ERROR]`/`[CRITICAL]` as an error;
  the trainer's `[INFO]`/`[DEBUG]` chatter only at debug level (the file has it);
- step lines (`... step:[ 12/ 600], loss: ...`) at most one per `step_every_s`, the skipped count said
  with the next one, and the last step line always;
- the pipeline's own lines (no level prefix) as info.
"""
from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

STEP_EVERY_S = 30.0
_LEVEL = re.compile(r"^(?:\[worker_\d+\]\s*)?\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\]")
_STEP = re.compile(r"step:\[\s*\d+/\s*\d+\]")


class StageLog:
    def __init__(self, stage: str, paths, logger, step_every_s: float | None = None):
        self.stage, self.paths, self.logger = stage, paths, logger
        self.step_every_s = STEP_EVERY_S if step_every_s is None else step_every_s
        name = f"{stage}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.log"
        self.remote = paths.store().remote
        folder = Path(tempfile.mkdtemp(prefix="stage-log-")) if self.remote else Path(paths.run_uri) / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / name
        self.uri = f"{paths.run_uri}/logs/{name}" if self.remote else str(self.path)
        self.fh = open(self.path, "a", encoding="utf-8")
        self.last_step_sent = float("-inf")  # the first step line is always shown (monotonic time starts near boot)
        self.held: str | None = None  # the newest step line not sent yet
        self.held_count = 0

    def __call__(self, line: str) -> None:
        line = str(line).rstrip("\n")
        try:
            self.fh.write(line + "\n")
            self.fh.flush()
        except ValueError:  # closed: a late line from a thread after the stage ended
            pass
        if _STEP.search(line):
            now = time.monotonic()
            if now - self.last_step_sent >= self.step_every_s:
                self._send_step(line, skipped=self.held_count)
                self.last_step_sent = now
            else:
                self.held, self.held_count = line, self.held_count + 1
            return
        level = _LEVEL.match(line)
        kind = level.group(1) if level else None
        if kind == "WARNING":
            self.logger.warning(line)
        elif kind in ("ERROR", "CRITICAL"):
            self.logger.error(line)
        elif kind in ("INFO", "DEBUG"):
            self.logger.debug(line)
        else:
            self.logger.info(line)

    def write_only(self, text: str) -> None:
        """Into the file only (e.g. a failure's full traceback: the Prefect log gets one line)."""
        try:
            self.fh.write(text if text.endswith("\n") else text + "\n")
            self.fh.flush()
        except ValueError:
            pass

    def _send_step(self, line: str, skipped: int) -> None:
        more = f"  ({skipped} step lines since the last one shown: {self.uri})" if skipped > 0 else ""
        self.logger.info(line + more)
        self.held, self.held_count = None, 0

    def close(self) -> None:
        """Send the last step line held back, close the file, upload it for an S3 run store."""
        if self.held is not None:
            self._send_step(self.held, skipped=self.held_count - 1)
        try:
            self.fh.close()
            if self.remote:
                self.paths.store().put_file(self.path, self.uri)
                shutil.rmtree(self.path.parent, ignore_errors=True)
            self.logger.info(f"{self.stage}: full log {self.uri}")
        except Exception as err:  # the log file is a convenience; the stage's own result stands
            self.logger.warning(f"{self.stage}: could not keep the full log at {self.uri}: {err}")
