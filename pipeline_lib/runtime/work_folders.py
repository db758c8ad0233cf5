"""Local work folders of s3:// runs that no other account on the machine can read, plant or steer.

The data stage's local copy and the trainer's output folder of an s3:// run live at stable names (a rerun on the
same machine resumes there), under the shared temp dir unless $LLM_PIPELINE_WORK_DIR says otherwise. A stable name
in a shared folder is one another account can create first: it would then receive the run's cleaned corpus, hold a
link that fails or redirects the run, or control the folder training clears and resumes from. So:

- `work_folder(*parts)`: `<root>/<parts...>`, where root is $LLM_PIPELINE_WORK_DIR (the user's choice, used as
  given) or `<temp dir>/llm-pipeline-<uid>`; the per-user root and every level under it go through
  `private_folder`.
- `private_folder(path)`: creates `path` with mode 0700 (`os.mkdir`: never through a link), or accepts it when it
  already is such a folder: `lstat` (the path itself, not what a link points at) says a directory, owned by this
  process's user, that no other account can write into (one that others could only read, as an earlier version
  left it, is made 0700 first). Anything else (a link, dangling or not; a file; another account's folder; a folder
  others can write into) raises `UnsafeWorkFolder`, naming the folder, what is wrong and the fix, and the folder is
  never used: not read, not written, not cleared. Paths are returned as built, never resolved through a link.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from ..storage.errors import PicklableError

WORK_DIR_ENV = "LLM_PIPELINE_WORK_DIR"


class UnsafeWorkFolder(PicklableError, PermissionError):
    """A work folder that is not ours alone (see the module docstring); `path` is the folder."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"the work folder {path} {problem}: another account could read or steer this run's files "
                         f"there, so it is not used. Fix: remove it if you may (or ask its owner or an administrator), "
                         f"or set {WORK_DIR_ENV} to a folder only you can use")
        self.path, self.problem = str(path), problem


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def private_folder(path: str | Path) -> Path:
    """`path` as a folder only this user can use: created 0700, or checked to be one (see the module docstring).
    Its parent must exist."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)  # does not follow a link at `path`: a link there (even dangling) is FileExistsError
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeWorkFolder(path, f"is a link (to {os.readlink(path)!r}), not a folder")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeWorkFolder(path, "is not a folder")
    if st.st_uid != os.geteuid():
        raise UnsafeWorkFolder(path, f"belongs to {_owner(st.st_uid)}, not to {_owner(os.geteuid())}")
    if st.st_mode & 0o022:  # others could have put files in it: what is there is not known to be ours
        raise UnsafeWorkFolder(path, f"has mode {stat.S_IMODE(st.st_mode):04o}: other accounts may write into it "
                               "(`chmod 700` it if what is in it is yours)")
    if st.st_mode & 0o077:  # ours, only readable by others (an earlier version's umask): made private, then used
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # the folder lstat saw, not a link
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    return path


def work_root() -> Path:
    """$LLM_PIPELINE_WORK_DIR (created if missing, as given), else `<temp dir>/llm-pipeline-<uid>` (private)."""
    chosen = os.environ.get(WORK_DIR_ENV)
    if chosen:
        root = Path(chosen)
        root.mkdir(parents=True, exist_ok=True)
        return root
    return private_folder(Path(tempfile.gettempdir()) / f"llm-pipeline-{os.geteuid()}")


def work_folder(*parts: str, create: bool = True) -> Path:
    """`<work_root()>/<parts...>`, each level a private folder (created 0700 or checked). `create=False`: the last
    level is only checked when it exists, not created (a caller that only looks, e.g. for a running stage's files)."""
    path = work_root()
    for i, part in enumerate(parts):
        path = path / part
        if create or i < len(parts) - 1 or os.path.lexists(path):
            path = private_folder(path)
    return path
