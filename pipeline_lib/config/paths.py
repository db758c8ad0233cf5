"""Resolve the paths of a pipeline config once, against the directory the user ran the command from.

Stages hand paths to workers and subprocesses that run in scratch working directories, so every
local path in a PipelineConfig is made absolute when the config is built (schema.py applies these
functions as field validators; resolving an absolute path again is a no-op, so a config dumped and
rebuilt in a worker keeps the same paths):

- URIs with a scheme (s3://...) are returned untouched; `file://` keeps its prefix, its path is resolved.
- `~` is expanded; glob patterns stay glob patterns, made absolute.
- `resolve_input`: a relative path that matches nothing from the working directory but exists from
  the repository root resolves there (so the bundled configs/data and configs/eval files work from
  any directory); otherwise it resolves against the working directory.
- `resolve_output`: always against the working directory (where the user expects results to land).

`paths_as_typed()` turns resolution off while a config is built for display (the run form's
defaults, config/form.py): there the paths must stay as the user typed them, to be resolved where
the run happens.
"""
from __future__ import annotations

import contextlib
import contextvars
import glob
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
_FILE = "file://"
_RESOLVING = contextvars.ContextVar("llm_pipeline_resolve_paths", default=True)


@contextlib.contextmanager
def paths_as_typed():
    """Within this block configs keep their paths exactly as written (no resolution)."""
    token = _RESOLVING.set(False)
    try:
        yield
    finally:
        _RESOLVING.reset(token)


def _split_scheme(value: str) -> tuple[str, str] | None:
    """(prefix, path) for a local path ('' or 'file://'), None for any other URI."""
    if value.startswith(_FILE):
        return _FILE, value[len(_FILE):]
    if "://" in value:
        return None
    return "", value


def _exists(path: str) -> bool:
    return bool(glob.glob(path, recursive=True)) if glob.has_magic(path) else os.path.exists(path)


def _absolute(path: str, base: str | Path) -> str:
    return os.path.normpath(os.path.join(str(base), os.path.expanduser(path)))


def resolve_input(value: str | None, cwd: str | Path | None = None) -> str | None:
    """An input path or glob made absolute (see the module docstring): against the working directory,
    or the repository root for a relative path that exists only there (the bundled files)."""
    if not _RESOLVING.get():
        return value
    split = _split_scheme(value) if value else None
    here = resolve_output(value, cwd)
    if split is None or os.path.isabs(os.path.expanduser(split[1])) or _exists(here[len(split[0]):]):
        return here
    bundled = _absolute(split[1], REPO_ROOT)
    return split[0] + bundled if _exists(bundled) else here


def resolve_output(value: str | None, cwd: str | Path | None = None) -> str | None:
    """An output location made absolute against the working directory (URIs untouched)."""
    if value is None or value == "" or not _RESOLVING.get():
        return value
    split = _split_scheme(value)
    if split is None:
        return value
    prefix, path = split
    return prefix + _absolute(path, Path.cwd() if cwd is None else cwd)
