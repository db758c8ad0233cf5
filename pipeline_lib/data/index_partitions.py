"""The partition files of the dedup index: sorted fixed-size records, streamed in blocks.

A partition file is raw little-endian ENTRY records (21 bytes each: key u64, band u8, run u64,
row u32) sorted by key, no header (the count is size / 21). Exact-key entries have band 0 and
live in `exact/b<bits>/p<prefix>`; LSH band entries live in `near-<bands>x<rows>/b<bits>/p<prefix>`,
where the prefix is the key's top `bits` bits (keys are hashes, so partitions fill evenly). `run` is
run_tag(run_id), `row` the document's row in that run's segment.

Reading (`lookup`) and merging (`merge`) go through a file one block (BLOCK records, ~1.4 MB) at a
time, so memory depends on the block and on this run's own keys, never on the partition's size.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import numpy as np

ENTRY = np.dtype([("key", "<u8"), ("band", "u1"), ("run", "<u8"), ("row", "<u4")])
BLOCK = 1 << 16  # 1.4 MB of records: the per-block temporaries are what memory the lookups add


def run_tag(run_id: str) -> np.uint64:
    """64-bit tag of a run id (what a partition entry stores instead of the string)."""
    return np.frombuffer(hashlib.blake2b(run_id.encode(), digest_size=8).digest(), "<u8")[0]


def prefix_of(keys: np.ndarray, bits: int) -> np.ndarray:
    return (np.asarray(keys, np.uint64) >> np.uint64(64 - bits)).astype(np.int64) if bits else \
        np.zeros(len(keys), np.int64)


def entries(keys: np.ndarray, bands: np.ndarray, run: np.uint64, rows: np.ndarray) -> np.ndarray:
    out = np.empty(len(keys), ENTRY)
    out["key"], out["band"], out["run"], out["row"] = keys, bands, run, rows
    return out


def _read_exact(fh, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = fh.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def iter_blocks(store, uri: str | None, block: int | None = None) -> Iterator[np.ndarray]:
    """The records of a partition file, BLOCK at a time (nothing when uri is None)."""
    if uri is None:
        return
    block = block or BLOCK
    with store.open_range(uri, 0) as fh:
        while data := _read_exact(fh, block * ENTRY.itemsize):
            yield np.frombuffer(data, ENTRY)


def merge(store, current: str | None, additions: np.ndarray, out: Path, drop_run) -> int:
    """Write the current partition file plus `additions` to `out`, sorted by key, streaming;
    entries of the run(s) `drop_run` (a tag or an array of tags) already there are dropped first
    (a commit that is retried replaces its own entries instead of doubling them). Returns the
    record count."""
    drop = np.atleast_1d(np.asarray(drop_run, np.uint64))
    additions = additions[np.argsort(additions["key"], kind="stable")]
    n, taken = 0, 0
    with open(out, "wb") as fh:
        for blk in iter_blocks(store, current):
            blk = blk[~np.isin(blk["run"], drop)]
            if not len(blk):
                continue
            upto = int(np.searchsorted(additions["key"], blk["key"][-1], "right"))
            part = np.concatenate([blk, additions[taken:upto]]) if upto > taken else blk
            if upto > taken:
                part = part[np.argsort(part["key"], kind="stable")]
            fh.write(part.tobytes())
            n, taken = n + len(part), upto
        fh.write(additions[taken:].tobytes())
        n += len(additions) - taken
    return n


def lookup(store, uri: str | None, queries: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """Entries of a partition file whose (key, band) is one of `queries` (ENTRY records, only key
    and band used) and whose run is one of `runs` (tags), streaming the file block by block."""
    queries = queries[np.lexsort((queries["band"], queries["key"]))]
    qkeys = np.unique(queries["key"])
    if not len(qkeys) or not len(runs) or uri is None:
        return np.zeros(0, ENTRY)
    found = []
    for blk in iter_blocks(store, uri):
        pos = np.minimum(np.searchsorted(qkeys, blk["key"]), len(qkeys) - 1)
        hit = blk[qkeys[pos] == blk["key"]]
        if len(hit):
            found.append(hit[np.isin(hit["run"], runs)])
    hits = np.concatenate(found) if found else np.zeros(0, ENTRY)
    # the band must match too (band keys of different bands are different hashes, but be exact)
    lo = np.searchsorted(queries["key"], hits["key"], "left")
    hi = np.searchsorted(queries["key"], hits["key"], "right")
    same = [b in queries["band"][a:z] for a, z, b in zip(lo, hi, hits["band"])]
    return hits[np.asarray(same, bool)] if len(hits) else hits
