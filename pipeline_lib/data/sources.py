"""Find the input files of `data.inputs` and split them into shards (the unit of parallel work).

- Inputs: listed by storage.input_files.list_inputs (files, folders, s3:// prefixes and globs, kept by
  suffix, with their labels; the one lister, shared with SFT, config validation and the nightly job).
- Shards: plain jsonl is split into byte ranges of `docs_per_shard` lines (one streaming pass
  counts lines); parquet into runs of whole row groups of about `docs_per_shard` rows (from the
  footer only); a gzip file is one shard (it cannot be entered in the middle: split big gzip
  files upstream). Shards never span files, and depend only on the data and docs_per_shard,
  never on the number of workers.
Raises: DataStageError when an entry matches no supported file.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..storage import store_for
from ..storage.input_files import NoInputFiles, kind_of, open_parquet
from ..storage.input_files import list_inputs as _list_inputs
from .errors import DataStageError


@dataclass(frozen=True)
class ShardSpec:
    """One unit of work. jsonl: bytes [start, end), first = 1-based line number of its first line;
    jsonl.gz: the whole file (end None), first = 1; parquet: row groups [start, end), first =
    0-based index of its first row."""

    index: int
    uri: str
    label: str
    kind: str
    start: int
    end: int | None
    first: int

    def to_dict(self) -> dict:
        return asdict(self)


def list_inputs(inputs: list[str], endpoint_url: str | None = None,
                field: str = "data.inputs") -> list[tuple[str, str]]:
    """[(uri, label)] of every input file (storage.input_files.list_inputs); a DataStageError names `field`[i]."""
    try:
        return _list_inputs(inputs, endpoint_url, field=field)
    except NoInputFiles as err:
        raise DataStageError(err.field, err.value, err.problem, err.fix) from None


def _jsonl_ranges(uri: str, docs_per_shard: int, endpoint_url) -> list[tuple[int, int, int]]:
    """[(start byte, end byte, first line)] of runs of docs_per_shard lines (one streaming pass)."""
    cuts, lines, offset, last_byte = [0], 0, 0, b"\n"
    with store_for(uri, endpoint_url).open_read(uri) as fh:
        while chunk := fh.read(8 << 20):
            newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
            # line numbers (1-based) ended by these newlines: lines + 1 ... lines + len(newlines)
            k = np.arange(lines + 1, lines + len(newlines) + 1)
            cuts += [offset + int(p) + 1 for p in newlines[k % docs_per_shard == 0]]
            lines, offset, last_byte = lines + len(newlines), offset + len(chunk), chunk[-1:]
    if last_byte != b"\n":
        lines += 1
    if cuts[-1] < offset:
        cuts.append(offset)
    return [(cuts[i], cuts[i + 1], i * docs_per_shard + 1) for i in range(len(cuts) - 1)]


def plan_shards(files: list[tuple[str, str]], docs_per_shard: int, endpoint_url: str | None = None) -> list[ShardSpec]:
    """Shards of every input file, numbered in input order (see the module docstring)."""
    shards: list[ShardSpec] = []
    for uri, label in files:
        kind = kind_of(uri)
        if kind == "jsonl":
            ranges = _jsonl_ranges(uri, docs_per_shard, endpoint_url) or [(0, 0, 1)]
        elif kind == "jsonl.gz":
            ranges = [(0, None, 1)]
        else:
            meta = open_parquet(uri, endpoint_url).metadata
            ranges, group, row, first = [], 0, 0, 0
            for g in range(meta.num_row_groups):
                row += meta.row_group(g).num_rows
                if row - first >= docs_per_shard or g == meta.num_row_groups - 1:
                    ranges.append((group, g + 1, first))
                    group, first = g + 1, row
            ranges = ranges or [(0, 0, 0)]
        for start, end, first in ranges:
            shards.append(ShardSpec(len(shards), uri, label, kind, start, end, first))
    return shards
