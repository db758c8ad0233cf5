"""Names that become path segments: run ids, run dates, lineages. A name is never a path.

A run id from the CLI, a deployment form or a flow parameter is joined under run.output_root; `../../x` or an
absolute id would write (and a redo would remove) outside it. NAME_PATTERN is the one rule for every such name:
a letter or digit first, then letters, digits, `.`, `_`, `-`; at most MAX_NAME characters.
Raises BadName (a ValueError with field, value and fix).
"""
from __future__ import annotations

import re

from .errors import PicklableError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_NAME = 128
_NAME = re.compile(NAME_PATTERN)


class BadName(PicklableError, ValueError):
    def __init__(self, field: str, value, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r}: not a name (a letter or digit first, then letters, digits, '.', '_', "
                         f"'-'; at most {MAX_NAME} characters): it would be a path. Fix: {fix}")


def check_name(field: str, value, fix: str = "use e.g. run-2026-12-01 (letters, digits, '.', '_', '-')") -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME or not _NAME.match(value):
        raise BadName(field, value, fix)
    return value
