"""Find the input files of `data.inputs` and split them into shards (the unit of parallel work).

- Inputs: listed by storage.input_files.list_inputs (files, folders, s3:// prefixes and globs, kept by
  suffix, with their labels; the one lister, shared with SFT, config validation and the nightly job).
- Shards are sized by uncompressed bytes (`data.shard_mb`), optionally capped at `data.docs_per_shard`
  records (a shard ends at whichever limit it reaches first):
  - plain jsonl: byte ranges cut at the first line end at or after each limit. One streaming pass
    over the file finds the cuts and numbers the lines (origins are `<file>:<line>`); each shard then
    reads only its own range (a local seek, or one ranged GET on S3).
  - parquet: runs of whole row groups (uncompressed size from the footer; nothing else is read).
  - gzip (.jsonl.gz) larger than shard_mb / 4 (compressed; text gzips ~3-4x): decompressed ONCE by the planner into
    line-aligned plain chunks of that size in the stage's work folder (shards/gunzip/), one shard
    each (`ShardSpec.source`). A gzip stream cannot be entered in the middle, and Python's zlib
    cannot resume inflating at a bit offset, so decompressor checkpoints are out of reach; plain
    chunks reuse the byte-range reader and cost only temporary disk (removed with shards/). A
    smaller gzip file stays one shard, decompressed as it streams (many small files keep
    decompressing in parallel, in the shard tasks).
  Shards never span files, and depend only on the data, shard_mb and docs_per_shard, never on
  the number of workers; the stage's outputs (but the count of cleaned/part files) do not depend
  on the shards at all.
Raises: DataStageError when an entry matches no supported file.
"""
from __future__ import annotations

import gzip
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..storage import store_for
from ..storage.input_files import NoInputFiles, kind_of, open_parquet
from ..storage.input_files import list_inputs as _list_inputs
from .errors import DataStageError

READ_CHUNK = 8 << 20
GZIP_RATIO = 4  # text gzips ~3-4x: a file above shard_mb / 4 compressed likely holds more than one shard


@dataclass(frozen=True)
class ShardSpec:
    """One unit of work. jsonl: bytes [start, end), first = 1-based line number of its first line;
    jsonl.gz: the whole file (end None), first = 1; parquet: row groups [start, end), first =
    0-based index of its first row. source: where the bytes are read from when not `uri` itself
    (a decompressed chunk of a split gzip file; kind is then jsonl)."""

    index: int
    uri: str
    label: str
    kind: str
    start: int
    end: int | None
    first: int
    source: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# Where the planner writes the plain chunks of a split gzip file: chunk number -> (local path to write,
# then a callable publishing it and returning the URI the shard reads).
ChunkSink = Callable[[int], tuple[Path, Callable[[], str]]]


def list_inputs(inputs: list[str], endpoint_url: str | None = None,
                field: str = "data.inputs", follow_symlinks: bool = False) -> list[tuple[str, str]]:
    """[(uri, label)] of every input file (storage.input_files.list_inputs); a DataStageError names `field`[i]."""
    try:
        return _list_inputs(inputs, endpoint_url, field=field, follow_symlinks=follow_symlinks)
    except NoInputFiles as err:
        raise DataStageError(err.field, err.value, err.problem, err.fix) from None


class LineCutter:
    """Cuts a byte stream fed in chunks into line-aligned pieces: a piece ends at the first line end
    at or after `max_bytes` bytes or at its `max_lines`-th line (None: no such limit)."""

    def __init__(self, max_bytes: int | None, max_lines: int | None):
        self.max_bytes, self.max_lines = max_bytes, max_lines
        self.start, self.first, self.lines, self.offset = 0, 1, 0, 0  # the open piece; bytes seen
        self.last_byte = b"\n"

    def feed(self, chunk: bytes) -> list[tuple[int, int, int]]:
        """The pieces (start, end, first line) that end in this chunk."""
        ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10) + (self.offset + 1)
        done, i = [], 0
        while i < len(ends):
            cut = len(ends)
            if self.max_bytes is not None:
                cut = min(cut, i + int(np.searchsorted(ends[i:], self.start + self.max_bytes, side="left")))
            if self.max_lines is not None:
                cut = min(cut, i + self.max_lines - self.lines - 1)
            if cut >= len(ends):
                break
            self.lines += cut - i + 1
            done.append((self.start, int(ends[cut]), self.first))
            self.start, self.first, self.lines = int(ends[cut]), self.first + self.lines, 0
            i = cut + 1
        self.lines += len(ends) - i
        self.offset += len(chunk)
        if chunk:
            self.last_byte = chunk[-1:]
        return done

    def close(self) -> list[tuple[int, int, int]]:
        """The last piece (a final line without newline included), if any bytes are left."""
        return [(self.start, self.offset, self.first)] if self.offset > self.start else []


def _jsonl_ranges(uri: str, max_bytes: int | None, max_lines: int | None,
                  endpoint_url) -> list[tuple[int, int, int]]:
    """[(start byte, end byte, first line)] of the file's shards (one streaming pass)."""
    cutter, out = LineCutter(max_bytes, max_lines), []
    with store_for(uri, endpoint_url).open_read(uri) as fh:
        while chunk := fh.read(READ_CHUNK):
            out += cutter.feed(chunk)
    return out + cutter.close()


class _ChunkWriter:
    """Writes consecutive pieces of a stream to the chunk files a ChunkSink hands out."""

    def __init__(self, sink: ChunkSink, numbers: Iterator[int]):
        self.sink, self.numbers, self.fh, self.publish, self.size = sink, numbers, None, None, 0
        self.chunks: list[tuple[str, int, int]] = []  # (uri to read, size, first line)

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.fh is None:
            path, self.publish = self.sink(next(self.numbers))
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fh, self.size = open(path, "wb"), 0
        self.fh.write(data)
        self.size += len(data)

    def finish(self, first: int) -> None:
        self.fh.close()
        self.fh = None
        self.chunks.append((self.publish(), self.size, first))


def _gunzip_chunks(uri: str, max_bytes: int | None, max_lines: int | None, endpoint_url,
                   sink: ChunkSink, numbers: Iterator[int]) -> list[tuple[str, int, int]]:
    """Decompress a gzip file once into line-aligned plain chunks; [(chunk uri, size, first line)]."""
    cutter, writer, pos = LineCutter(max_bytes, max_lines), _ChunkWriter(sink, numbers), 0
    with store_for(uri, endpoint_url).open_read(uri) as raw, gzip.GzipFile(fileobj=raw) as gz:
        while data := gz.read(READ_CHUNK):
            at = 0  # data[:at] is written
            for _, end, first in cutter.feed(data):
                writer.write(data[at:end - pos])
                writer.finish(first)
                at = end - pos
            writer.write(data[at:])
            pos += len(data)
    for _, _, first in cutter.close():
        writer.finish(first)
    return writer.chunks


def plan_shards(files: list[tuple[str, str]], docs_per_shard: int | None, endpoint_url: str | None = None,
                shard_mb: float | None = None, chunks: ChunkSink | None = None) -> list[ShardSpec]:
    """Shards of every input file, numbered in input order (see the module docstring). chunks: where
    split gzip files go; without it (or without shard_mb) every gzip file is one shard."""
    max_bytes = max(1, int(shard_mb * (1 << 20))) if shard_mb else None
    numbers = iter(range(1 << 62))
    shards: list[ShardSpec] = []

    def add(uri, label, kind, start, end, first, source=None):
        shards.append(ShardSpec(len(shards), uri, label, kind, start, end, first, source))

    for uri, label in files:
        kind = kind_of(uri)
        if kind == "jsonl":
            for start, end, first in _jsonl_ranges(uri, max_bytes, docs_per_shard, endpoint_url) or [(0, 0, 1)]:
                add(uri, label, kind, start, end, first)
        elif kind == "jsonl.gz":
            big = max_bytes is not None and store_for(uri, endpoint_url).size(uri) > max_bytes // GZIP_RATIO
            if chunks is not None and big:
                pieces = _gunzip_chunks(uri, max_bytes, docs_per_shard, endpoint_url, chunks, numbers)
                for source, size, first in pieces or [(None, None, 1)]:
                    if source is None:  # an empty stream: one empty shard, as for an empty plain file
                        add(uri, label, kind, 0, None, 1)
                    else:
                        add(uri, label, "jsonl", 0, size, first, source)
            else:
                add(uri, label, kind, 0, None, 1)
        elif kind == "arrow":  # batches are not addressable without reading the ones before: a file is a shard
            add(uri, label, kind, 0, None, 0)
        else:
            meta = open_parquet(uri, endpoint_url).metadata
            group, rows, size, first = 0, 0, 0, 0
            ranges = []
            for g in range(meta.num_row_groups):
                rows, size = rows + meta.row_group(g).num_rows, size + meta.row_group(g).total_byte_size
                full = ((docs_per_shard is not None and rows - first >= docs_per_shard)
                        or (max_bytes is not None and size >= max_bytes))
                if full or g == meta.num_row_groups - 1:
                    ranges.append((group, g + 1, first))
                    group, first, size = g + 1, rows, 0
            for start, end, first in ranges or [(0, 0, 0)]:
                add(uri, label, kind, start, end, first)
    return shards
