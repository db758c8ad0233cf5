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


MAX_ISSUES_SHOWN = 50  # a file of a million bad keys printed 131 MB of errors


class Hidden:
    """The value of a key no field has: never echoed (a pasted kubeconfig's token was printed in the error)."""

    def __repr__(self) -> str:
        return "(value not shown)"

    def __reduce__(self):
        return Hidden, ()


class ConfigError(PicklableError, ValueError):
    """Raised with every issue found, so a user fixes them all in one edit; the message shows the first
    MAX_ISSUES_SHOWN and counts the rest."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = list(issues)
        shown = [f"  - {i}" for i in self.issues[:MAX_ISSUES_SHOWN]]
        if len(self.issues) > MAX_ISSUES_SHOWN:
            shown.append(f"  ... and {len(self.issues) - MAX_ISSUES_SHOWN} more issues (the first "
                         f"{MAX_ISSUES_SHOWN} shown)")
        super().__init__("invalid pipeline config:\n" + "\n".join(shown))

    def fields(self) -> list[str]:
        return [i.field for i in self.issues]
