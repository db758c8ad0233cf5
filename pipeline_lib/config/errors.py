"""Config errors that name the field, the value and the fix."""
from __future__ import annotations

from dataclasses import dataclass

from ..storage.errors import PicklableError


@dataclass(frozen=True)
class ConfigIssue:
    field: str
    value: object
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.problem}. Fix: {self.fix}"


class ConfigError(PicklableError, ValueError):
    """Raised with every issue found, so a user fixes them all in one edit."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = list(issues)
        super().__init__("invalid pipeline config:\n" + "\n".join(f"  - {i}" for i in self.issues))

    def fields(self) -> list[str]:
        return [i.field for i in self.issues]
