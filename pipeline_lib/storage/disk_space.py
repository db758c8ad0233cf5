"""A full disk, said plainly: which path, how many bytes were needed and how many are free.

A stage that fills its filesystem fails deep inside a writer (Python's `OSError: [Errno 28] No space
left on device`, or numpy's `tofile` that reports only "24448 requested and 7136 written" with no
errno and no path). `named_disk_full` turns either into `DiskFull`: the path written (the error's
own filename, else the stage or work folder whose filesystem is full, or the fullest of them when the
writer freed its partial file before raising), the bytes the write still needed where the writer said, the
free bytes of that filesystem now, and the fix. The message keeps "No space left on device" so the doctor
classifies it `disk_full` (doctor/patterns.py).
"""
from __future__ import annotations

import errno
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

from .errors import PicklableError

SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")  # numpy ndarray.tofile on a full disk
# MindSpore 2.9's MindRecord ShardWriter refuses to write below 10 MB free (measured on tmpfs: 8 MB free fails, 10
# passes), before any byte is written; MS_FREE_DISK_CHECK=false turns the check off.
MINDRECORD_FREE = re.compile(r"No free disk to be used while writing mindrecord files, available free disk size: (\d+)")
MINDRECORD_MIN_FREE = 10 * 2**20
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(PicklableError, RuntimeError):
    """A write ran out of space; the message names the path, the bytes and the fix."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def _filesystem_of(path: str | Path) -> Path | None:
    probe = Path(path).resolve()
    while not probe.exists():
        if probe.parent == probe:
            return None
        probe = probe.parent
    return probe


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the filesystem holding `path` (its nearest existing parent); None if unknown."""
    probe = _filesystem_of(path)
    return shutil.disk_usage(probe).free if probe is not None else None


def disk_full_error(err: OSError, folders: dict[str, str]) -> DiskFull | None:
    """A DiskFull for `err` when it is a full disk, else None. folders: {what the user sets (e.g.
    "run.output_root"): local folder} written by the failed work, the candidates for the path when
    the error names none (the first whose filesystem has less free than the write needed; for the kernel's
    ENOSPC, else the fullest: a writer that removed its partial file, as pyarrow's parquet writer does, left the
    space free again)."""
    short, mindrecord = SHORT_WRITE.search(str(err)), MINDRECORD_FREE.search(str(err))
    if getattr(err, "errno", None) not in FULL_ERRNOS and not short and not mindrecord:
        return None
    missing = int(short.group(1)) - int(short.group(2)) if short else None
    below = MINDRECORD_MIN_FREE if mindrecord else (missing or 1) + 4096  # a full filesystem has less free than this
    frees = {name: (folder, free_bytes(folder)) for name, folder in folders.items() if folder is not None}
    path, setting = getattr(err, "filename", None), None
    for name, (folder, free) in frees.items():
        inside = path is not None and Path(path).resolve().is_relative_to(Path(folder).resolve())
        if inside or (path is None and free is not None and free < below):
            path, setting = path or folder, name
            break
    if path is None:  # a short write / MindRecord refusal, but no candidate folder is full: some other error
        if short or mindrecord:
            return None
        known = [(free, name, folder) for name, (folder, free) in frees.items() if free is not None]
        _, setting, path = min(known) if known else (None, None, "?")
    free = free_bytes(path) if path != "?" else None
    need = ("MindRecord's writer needs 10 MB (10,485,760 bytes) free before it writes" if mindrecord else
            f"the write needed {missing:,} more bytes" if missing is not None
            else "the write needed more bytes than were free")
    where = f"{path} ({setting})" if setting else path
    fix = (f"free space on that filesystem or point {setting} at a bigger disk" if setting
           else "free space on that filesystem")
    return DiskFull(f"No space left on device writing {where}: {need}; "
                    f"{'unknown' if free is None else f'{free:,}'} bytes free there now. "
                    f"Fix: {fix}, then rerun with the same --run-id (finished work is kept, the failed stage is "
                    "redone from its last completed step)", str(path))


@contextmanager
def named_disk_full(folders: dict[str, str | None]):
    """Re-raise a full-disk OSError of the block as DiskFull (chained); other errors pass unchanged."""
    try:
        yield
    except (OSError, RuntimeError) as err:  # RuntimeError: MindRecord's writer
        if isinstance(err, DiskFull):
            raise
        named = disk_full_error(err, {k: v for k, v in folders.items() if v})
        if named is None:
            raise
        raise named from err
