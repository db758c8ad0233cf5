"""What `llm-pipeline run` prints while it runs: the lines a person reads, not the Prefect log.

Installed by the CLI only (`install(verbose)`); a worker or a test that does not install it keeps Prefect's
console as it is. Once installed, Prefect's console handler shows
- the lines marked `extra=SHOW` (per stage its start line, its result line and its log file's path),
- every record at WARNING or above, as a short line (a mindformers warning as `<stage>: [<module>:<line>]
  <message>`); a warning from a source location already shown in this run is counted, not shown again (the stage's
  log file and the Prefect log have each one),
- not the parent flow's repeat of a stage error the stage task already showed (`repeats_stage_error`),
- on a TTY one progress bar per running stage, redrawn in place (training: step, loss, tokens/s, ETA; data: the
  step and its shards); without a TTY (CI, nohup) the same lines and no bar.
`verbose=True` (`-v`): Prefect's console unchanged plus every trainer line (`echo`). The run's log files get every
line either way (tasks/stage_log.py).
"""
from __future__ import annotations

import logging
import sys
import threading
import time

SHOW = {"terminal": True}
_current: "Terminal | None" = None


def current() -> "Terminal | None":
    return _current


class _Short(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        text = getattr(record, "terminal_text", None) or record.getMessage()
        level = "" if record.levelno < logging.WARNING else f"{record.levelname} "
        return f"{when} {level}{text}"


class Terminal:
    def __init__(self, stream=None, verbose: bool = False, tty: bool | None = None):
        self.stream = stream or sys.stderr
        self.verbose = verbose
        self.tty = self.stream.isatty() if tty is None else tty
        self.lock = threading.RLock()
        self.bars: dict[str, dict] = {}
        self.drawn = False
        self.seen_sources: set[str] = set()
        self.hidden: dict[str, int] = {}  # stage -> repeated warnings not shown
        self.handlers: list[logging.Handler] = []

    # ------------------------------------------------------------------ Prefect's console handler
    def install(self, handlers: list[logging.Handler] | None = None) -> "Terminal":
        """On `handlers`, by default Prefect's console handlers on the root logger (logging.yml: `console`)."""
        global _current
        if handlers is None:
            handlers = [h for h in logging.getLogger().handlers if type(h).__name__ == "PrefectConsoleHandler"]
        for handler in handlers:
            if handler in self.handlers:
                continue
            self.handlers.append(handler)
            if not self.verbose:
                handler.addFilter(self.filter)
                handler.setFormatter(_Short())
            emit = handler.emit

            def emit_clear(record, emit=emit):
                with self.lock:
                    self._clear()
                    emit(record)
                    self._draw()

            handler.emit = emit_clear
        _current = self
        return self

    def uninstall(self) -> None:
        global _current
        for handler in self.handlers:
            handler.removeFilter(self.filter)
            handler.__dict__.pop("emit", None)
        self.handlers = []
        with self.lock:
            self._clear()
        _current = None if _current is self else _current

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "repeats_stage_error", False):
            return False
        if getattr(record, "terminal", False):
            return True
        if record.levelno < logging.WARNING:
            return False
        source = getattr(record, "terminal_source", None)
        if source is not None:
            with self.lock:
                if source in self.seen_sources:
                    stage = getattr(record, "terminal_stage", "")
                    self.hidden[stage] = self.hidden.get(stage, 0) + 1
                    return False
                self.seen_sources.add(source)
        return True

    def hidden_count(self, stage: str) -> int:
        with self.lock:
            return self.hidden.pop(stage, 0)

    # ------------------------------------------------------------------ verbose: every trainer line
    def echo(self, text: str) -> None:
        if not self.verbose:
            return
        with self.lock:
            self._clear()
            self.stream.write(text + "\n")
            self.stream.flush()
            self._draw()

    # ------------------------------------------------------------------ progress bars (TTY only)
    def progress(self, stage: str, step: str, done: int, total: int) -> None:
        with self.lock:
            bar = self.bars.setdefault(stage, {})
            if bar.get("step") != step:
                bar.update(step=step, started=time.monotonic(), first=done, loss=None, tps=None)
            bar.update(done=done, total=total)
            self._redraw()

    def train_step(self, stage: str, record: dict) -> None:
        """A parsed step line (pipeline_lib.train.metrics.parse_loss_line): loss and tokens/s for the bar."""
        with self.lock:
            bar = self.bars.get(stage)
            if bar is None or bar.get("step") != "train":
                return
            bar.update(loss=record.get("loss"), tps=record.get("tokens_per_s"))
            self._redraw()

    def end(self, stage: str) -> None:
        with self.lock:
            self._clear()
            self.bars.pop(stage, None)
            self._draw()

    def _text(self, stage: str, bar: dict) -> str:
        done, total = bar.get("done", 0), bar.get("total") or 0
        width = 24
        filled = int(width * done / total) if total else 0
        parts = [f"{stage} {bar.get('step', '')} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"]
        if bar.get("loss") is not None:
            parts.append(f"loss {bar['loss']:.4g}")
        if bar.get("tps"):
            parts.append(f"{bar['tps']:,.0f} tokens/s")
        moved = done - bar.get("first", 0)
        if total and 0 < moved and done < total:
            eta = (time.monotonic() - bar["started"]) / moved * (total - done)
            parts.append(f"ETA {int(eta // 60)}:{int(eta % 60):02d}")
        return "  ".join(parts)

    def _redraw(self) -> None:
        self._clear()
        self._draw()

    def _clear(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False

    def _draw(self) -> None:
        if not self.tty or not self.bars:
            return
        line = " | ".join(self._text(s, b) for s, b in self.bars.items())
        self.stream.write(line[: 200])
        self.stream.flush()
        self.drawn = True


def install(verbose: bool = False, stream=None, tty: bool | None = None) -> Terminal:
    return Terminal(stream, verbose, tty).install()


def progress(stage: str, step: str, done: int, total: int) -> None:
    if _current is not None:
        _current.progress(stage, step, done, total)
