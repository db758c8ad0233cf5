"""Errors of the data stage: each names the offending field or file, the value, and the fix.

`DataStageError` is a ValueError (a config or data problem: retrying cannot fix it), so the
Prefect task wrapper fails at once instead of retrying.
"""
from __future__ import annotations

from ..storage.errors import PicklableError


class DataStageError(PicklableError, ValueError):
    """A data-stage problem a user must fix: bad config value, unreadable input, broken index."""

    def __init__(self, field: str, value: object, problem: str, fix: str):
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


class NoNewDocuments(DataStageError):
    """Every document that survived cleaning is a duplicate of an earlier run of the lineage.
    `counts` holds read / candidates / duplicates of earlier runs / duplicates within the run."""

    # the Completed states a night ends in on it (a stage's flow run is named so: read from its state by a parent
    # on another machine)
    NIGHT_STATES = ("NoNewData", "NoUsableData")

    def __init__(self, field: str, value: object, problem: str, fix: str, counts: dict):
        super().__init__(field, value, problem, fix)
        self.counts = counts

    @property
    def night_state(self) -> str:
        """The state a night ends in on it (the nightly's names): nothing usable, or nothing new."""
        return "NoUsableData" if (self.counts or {}).get("kind") == "no_usable_documents" else "NoNewData"


class ConservationError(RuntimeError):
    """The stage's accounting does not add up (a bug, never a data problem); stats.json says where."""
