"""Names that become path segments: run ids, run dates, lineages, run.name. A name is never a path.

A run id from the CLI, a deployment form or a flow parameter is joined under run.output_root; `../../x` or an
absolute id would write (and a redo would remove) outside it. NAME_PATTERN is the one rule for every such name:
a letter or digit first, then letters, digits, `.`, `_`, `-`; at most MAX_NAME characters; the whole string
(a trailing newline is no part of a name: `re.match` with `$` took `run-1\\n`).
run.name may be any language's name (`电力语料`): the same rule with Unicode letters and digits (TEXT_NAME);
where it becomes an ASCII key (the dedup lineage), `name_key` keeps an ASCII name as it is and gives any other
a readable prefix plus a hash of the exact name, so two Chinese names never share a key.
Raises BadName (a ValueError with field, value and fix).
"""
from __future__ import annotations

import hashlib
import re

from .errors import PicklableError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # as a pydantic pattern (Rust regex: `$` is the end of the text)
TEXT_NAME_PATTERN = r"^[^\W_][\w.-]*$"  # \w: letters and digits of any language, and `_`
MAX_NAME = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TEXT_NAME = re.compile(r"[^\W_][\w.-]*")  # str patterns: \w is any language's letters and digits, and `_`


class BadName(PicklableError, ValueError):
    def __init__(self, field: str, value, fix: str, rule: str = "a letter or digit first, then letters, digits, "
                 "'.', '_', '-'"):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r}: not a name ({rule}; at most {MAX_NAME} characters): it would be a "
                         f"path. Fix: {fix}")


def check_name(field: str, value, fix: str = "use e.g. run-2026-12-01 (letters, digits, '.', '_', '-')") -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME or not _NAME.fullmatch(value):
        raise BadName(field, value, fix)
    return value


def check_text_name(field: str, value, fix: str = "use e.g. tiny-cpu or 电力语料 (letters and digits of any "
                    "language, '.', '_', '-')") -> str:
    """A name in any language (run.name): Unicode letters or digits first, then those, '.', '_', '-'."""
    if not isinstance(value, str) or len(value) > MAX_NAME or not _TEXT_NAME.fullmatch(value):
        raise BadName(field, value, fix, "a letter or digit of any language first, then those, '.', '_', '-'")
    return value


def name_key(name: str) -> str:
    """An ASCII name (NAME_PATTERN) for a text name: the name itself when it is one (keys made before stay
    found), else its ASCII letters and digits (or `name`) plus the first 12 hex digits of the sha256 of its
    UTF-8 bytes: `电力语料` -> `name-<hash>`, `电力语料-v2` -> `v2-<hash>`."""
    if _NAME.fullmatch(name):
        return name
    prefix = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:40] or "name"
    return f"{prefix}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"
