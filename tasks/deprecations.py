"""Third-party deprecation notices: said once per run, in the run's log file, not as warnings.

mindformers warns at WARNING level about its own API changes each time a trainer starts (`load_checkpoint is
deprecated`, `full_batch will be deprecated`, `.ckpt file loading mode will be offline`: 4-6 per launch, 13-30 with the
repeats of a pretrain and an sft). They are about the yaml this pipeline generates, so the user has nothing to change:
they are not sent to the terminal or the Prefect log at WARNING; each stage's log file keeps every line as printed and,
at its end, one line listing the run's notices not listed by an earlier stage of the run (each source once).
"""
from __future__ import annotations

import re
import threading

_NOTICE = re.compile(r"deprecat|will be offline|will be removed|in (?:a )?future (?:version|release|interface)", re.I)
_listed: dict[str, set[str]] = {}  # run folder -> sources already listed in one of its stage logs (this process)
_lock = threading.Lock()


def is_deprecation_notice(message: str) -> bool:
    return bool(_NOTICE.search(message))


class Notices:
    """The deprecation notices one stage log saw: {source: first message} and how many records in all."""

    def __init__(self, run_uri: str):
        self.run_uri, self.first, self.count = run_uri, {}, 0

    def add(self, source: str, message: str) -> None:
        self.count += 1
        self.first.setdefault(source, message)

    def summary(self, stage: str) -> str | None:
        """The log file's one line for them (None when there were none)."""
        if not self.count:
            return None
        with _lock:
            listed = _listed.setdefault(self.run_uri, set())
            new = {s: m for s, m in self.first.items() if s not in listed}
            listed.update(new)
        head = (f"{stage}: {self.count} third-party deprecation notice(s) from {len(self.first)} place(s) (about the "
                "generated yaml: nothing to change in your config; not shown on the terminal or in the Prefect log)")
        if not new:
            return head + ": each listed by an earlier stage's log of this run"
        return head + ": " + "; ".join(f"[{s}] {m}" for s, m in new.items())
