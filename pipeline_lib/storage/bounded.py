"""The one bounded reader of every file the product reads besides its own outputs: lines and whole files.

A small hostile file must cost little: a 200 KB gzip holding one 200 MB line, a 2 GB sparse file (one line of
NUL bytes), a million brackets. So:
- `bounded_lines(uri, ...)`: the lines of a jsonl / jsonl.gz file (local or s3://), streamed (storage.iter_lines):
  a line longer than `max_line` bytes comes back as a LongLine (its first `head` bytes and its length) and is read
  past, never held (the data stage's data.max_line_bytes rule, for every reader); with `max_bytes`, a file whose
  (decompressed) bytes go past it is refused as soon as they do.
- `read_capped(uri, ...)`: a whole small file (a list, a json), refused when over `max_bytes` before it is read
  (its size) and while it is read (a gzip or a file that grows), never reading more than max_bytes + 1 bytes.
Every reader counts what it read in READ_BYTES (per process: bench/reliability.py's hostile-inputs row).
Raises InputTooLarge (a ValueError naming the field, the file, the cap and the fix).
"""
from __future__ import annotations

import gzip
from contextlib import contextmanager
from typing import BinaryIO, Iterator

from .errors import PicklableError
from .store import LongLine, iter_lines, store_for

DEFAULT_MAX_LINE = 64 << 20  # data.max_line_bytes' default: no document is that long
HEAD = 64 << 10  # what is kept of an over-long line: enough to see what it was
MAX_LIST_BYTES = 256 << 20  # a list the product holds in memory whole (exclusion ids, evaluation texts)
MAX_JSON_BYTES = 16 << 20  # one json document read whole (a guard diagnosis, a run's stats.json / metrics.json)
READ_BYTES = {"bytes": 0}  # bytes read from files by this module in this process (decompressed)


class InputTooLarge(PicklableError, ValueError):
    def __init__(self, field: str, value: object, problem: str, fix: str):
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n:,} bytes"


class _Capped:
    """A read-only stream that counts what is read through it and refuses to go past `cap` bytes."""

    def __init__(self, fh: BinaryIO, cap: int | None, on_over):
        self.fh, self.cap, self.on_over, self.total = fh, cap, on_over, 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:  # the rest, 1 MiB at a time: refused at the cap, never one unbounded read
            parts = []
            while chunk := self.read(1 << 20):
                parts.append(chunk)
            return b"".join(parts)
        data = self.fh.read(n)
        self.total += len(data)
        READ_BYTES["bytes"] += len(data)
        if self.cap is not None and self.total > self.cap:
            raise self.on_over()
        return data


@contextmanager
def _open(uri: str, endpoint_url: str | None):
    """The file's bytes as a stream, decompressed when its name ends in .gz."""
    with store_for(uri, endpoint_url).open_read(uri) as raw:
        if uri.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw) as fh:
                yield fh
        else:
            yield raw


def bounded_lines(uri: str, endpoint_url: str | None = None, *, field: str, max_line: int | None = DEFAULT_MAX_LINE,
                  max_bytes: int | None = None, head: int = HEAD,
                  fix: str = "split the file, or remove it from the list") -> Iterator[bytes | LongLine]:
    """The lines of a (gzipped) text file, each at most `max_line` bytes held (see the module docstring)."""
    def over() -> InputTooLarge:
        return InputTooLarge(field, uri, f"more than {_mib(max_bytes)} (decompressed): larger than this file is "
                             "read whole", fix)

    with _open(uri, endpoint_url) as fh:
        yield from iter_lines(_Capped(fh, max_bytes, over), max_line, min(head, max_line or head))


def read_capped(uri: str, endpoint_url: str | None = None, *, field: str, max_bytes: int,
                fix: str = "name a smaller file") -> bytes:
    """A whole file of at most `max_bytes` (decompressed for .gz); InputTooLarge naming `field` when larger."""
    def over() -> InputTooLarge:
        return InputTooLarge(field, uri, f"larger than {_mib(max_bytes)}, the most this file is read", fix)

    if not uri.endswith(".gz") and store_for(uri, endpoint_url).size(uri) > max_bytes:
        raise over()
    with _open(uri, endpoint_url) as fh:
        return _Capped(fh, max_bytes, over).read()
