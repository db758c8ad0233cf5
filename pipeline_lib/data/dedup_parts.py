"""Exact and near-duplicate detection partitioned by key, so no process holds the whole run.

Three steps, each bounded by its own share of the work (dedup.py states the rule they reproduce):
1. `prep_shard` (prep.py) writes per shard `dedup_parts.npy`: one PART record per exact key (band
   EXACT_BAND) and per LSH band key of a non-empty signature, sorted by partition (key mod P), with
   `dedup_parts.idx.npy` the (P + 1) offsets of the partitions in it.
2. `dedup_partition(p)` reads partition p's slice of every shard (memory-mapped): exact keys shared by
   several documents give (document, first document with its key); documents sharing a band key give
   candidate pairs, verified by their signatures' Jaccard (read by row from the shards' sigs.npy) and by
   one band's values being equal (what datasketch's MinHashLSH buckets on). With exact dedup on, only the
   first document of each exact key enters the pairs: its later copies are removed by the exact rule if it
   is kept, and share its signature (so its fate) if not. With an incremental index, the partition's keys
   are looked up in the index's partitions (dedup_index.prior_hits). Writes shards/dedup/pNNNN.npz and
   its marker (written last): a rerun skips finished partitions.
3. `resolve` (called by prep.dedup_stage) walks only the documents some partition named, in input order,
   with the rule of dedup.Deduplicator: memory in proportion to the candidate pairs, the exact copies and
   the index hits, not to the corpus.
"""
from __future__ import annotations

import math

import numpy as np

from .minhash import band_keys, is_empty, lsh_params

PART = np.dtype([("key", "<u8"), ("exact", "<u8"), ("row", "<u4"), ("band", "u1")])
EXACT_BAND = 255          # a PART record of an exact key (band keys have band < 255)
DOCS_PER_PARTITION = 100_000  # ~1.1M key records: a partition task's arrays stay ~150 MB
SHARD_DOCS = 10_000
PARTS, PARTS_IDX = "dedup_parts.npy", "dedup_parts.idx.npy"
FOLDER = "shards/dedup"


def partition_count(cfg, n_shards: int) -> int:
    """data.dedup.partitions, or (0) one per DOCS_PER_PARTITION documents the plan may hold, at least 2
    (shards cut by size count as SHARD_DOCS documents each)."""
    d = cfg.data.dedup
    if d.partitions:
        return d.partitions
    return max(2, math.ceil(n_shards * (cfg.data.docs_per_shard or SHARD_DOCS) / DOCS_PER_PARTITION))


def shard_parts(keys: np.ndarray, sigs: np.ndarray | None, dedup_cfg, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """(PART records sorted by partition, partition offsets) of one shard's documents."""
    keys = np.asarray(keys, np.uint64)
    n = len(keys)
    recs = []
    if dedup_cfg.exact:
        r = np.empty(n, PART)
        r["key"], r["exact"], r["row"], r["band"] = keys, keys, np.arange(n), EXACT_BAND
        recs.append(r)
    if dedup_cfg.near and sigs is not None and n:
        bands, rows = lsh_params(dedup_cfg.threshold, dedup_cfg.num_perm)
        live = np.flatnonzero(~is_empty(sigs))
        bk = band_keys(sigs[live], bands, rows)
        r = np.empty(bk.size, PART)
        r["key"], r["band"] = bk.ravel(), np.tile(np.arange(bands, dtype=np.uint8), len(live))
        r["row"], r["exact"] = np.repeat(live, bands), np.repeat(keys[live], bands)
        recs.append(r)
    allr = np.concatenate(recs) if recs else np.zeros(0, PART)
    part = (allr["key"] % np.uint64(parts)).astype(np.int64)
    order = np.argsort(part, kind="stable")
    return allr[order], np.searchsorted(part[order], np.arange(parts + 1)).astype(np.int64)


def doc_starts(counts: list[dict]) -> np.ndarray:
    """Global row of each shard's first document (n_shards + 1): documents are numbered in input order."""
    return np.concatenate([[0], np.cumsum([c["candidates"] for c in counts])]).astype(np.int64)


class SigReader:
    """Signatures by global row, read from the shards' sigs.npy memory-mapped (never loaded whole). `release`
    unmaps them: every page a map touched stays in the process's RSS until then (at 100x the benchmark corpus
    the shards' signatures are 1.5 GB, and a partition's pairs touch rows all over them)."""

    def __init__(self, fetch, starts: np.ndarray, shard_dir):
        self.fetch, self.starts, self.shard_dir, self.maps = fetch, starts, shard_dir, {}

    def _map(self, k: int) -> np.ndarray:
        if k not in self.maps:
            self.maps[k] = np.load(self.fetch(f"{self.shard_dir(k)}/sigs.npy"), mmap_mode="r")
        return self.maps[k]

    def release(self) -> None:
        self.maps = {}

    def rows(self, gids: np.ndarray) -> np.ndarray:
        gids = np.asarray(gids, np.int64)
        shard = np.searchsorted(self.starts, gids, "right") - 1
        out = None
        for k in np.unique(shard):
            sel = shard == k
            m = self._map(int(k))
            got = m[gids[sel] - self.starts[k]]
            if out is None:
                out = np.empty((len(gids), m.shape[1]), m.dtype)
            out[sel] = got
        return out if out is not None else np.zeros((0, 0), np.uint32)


def _runs(sorted_cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, sizes) of the runs of equal rows over the given sorted columns."""
    n = len(sorted_cols[0])
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    new = np.zeros(n, bool)
    new[0] = True
    for c in sorted_cols:
        new[1:] |= c[1:] != c[:-1]
    starts = np.flatnonzero(new)
    return starts, np.diff(np.concatenate([starts, [n]]))


def _pairs_within(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (earlier, later) pair of `values` inside each run (values sorted ascending inside a run)."""
    keep = sizes >= 2
    starts, sizes = starts[keep], sizes[keep]
    if not len(starts):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pos = np.repeat(starts, sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))
    end = np.repeat(starts + sizes, sizes)
    later = end - pos - 1  # partners after each element in its run
    i = np.repeat(pos, later)
    j = i + 1 + (np.arange(later.sum()) - np.repeat(np.cumsum(later) - later, later))
    return values[i], values[j]


def exact_copies(gid: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(n, 2) int64 (document, first document with its exact key) for every later copy of a key."""
    order = np.lexsort((gid, keys))
    k, g = keys[order], gid[order]
    first, sizes = _runs([k])
    rep = np.repeat(g[first], sizes)
    later = g != rep
    return np.stack([g[later], rep[later]], axis=1)


_BAND_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: per band, key -> key ^ band * _BAND_MIX is one-to-one


def shared_buckets(band: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the records whose (band, key) bucket may hold another record: those alone in theirs
    give no pair. One sort of a 64-bit mix of band and key instead of the four-column lexsort of every record
    (most buckets hold one record); two buckets whose mixes collide both stay, and are told apart after."""
    mix = key ^ (band.astype(np.uint64) * _BAND_MIX)
    order = np.argsort(mix)
    mix = mix[order]
    twin = np.zeros(len(mix), bool)
    same = mix[1:] == mix[:-1]
    twin[1:] |= same
    twin[:-1] |= same
    return np.sort(order[twin])


def candidate_pairs(gid: np.ndarray, recs: np.ndarray, collapse: bool) -> np.ndarray:
    """Unique (i < j) int64 pairs of documents sharing a (band, band key); collapse: only the first
    document of each exact key within a bucket."""
    shared = shared_buckets(recs["band"], recs["key"])
    gid, recs = gid[shared], recs[shared]
    order = np.lexsort((gid, recs["exact"], recs["key"], recs["band"]))
    b, k, e, g = recs["band"][order], recs["key"][order], recs["exact"][order], gid[order]
    if collapse and len(g):
        first = np.ones(len(g), bool)
        first[1:] = (b[1:] != b[:-1]) | (k[1:] != k[:-1]) | (e[1:] != e[:-1])
        b, k, g = b[first], k[first], g[first]
        o = np.lexsort((g, k, b))
        b, k, g = b[o], k[o], g[o]
    starts, sizes = _runs([b, k])
    i, j = _pairs_within(g, starts, sizes)
    if not len(i):
        return np.zeros((0, 2), np.int64)
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    packed = np.unique((lo.astype(np.uint64) << np.uint64(32)) | hi.astype(np.uint64))
    return np.stack([(packed >> np.uint64(32)).astype(np.int64), (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)],
                    axis=1)


def verify(pairs: np.ndarray, sigs: SigReader, dedup_cfg, chunk: int = 1 << 13) -> np.ndarray:
    """(n, 3) int64 (i, j, equal positions) of the pairs whose estimated Jaccard reaches the threshold and
    that share one band's values exactly (a band key is a hash of them: a collision is no LSH candidate)."""
    bands, rows = lsh_params(dedup_cfg.threshold, dedup_cfg.num_perm)
    out = []
    for a in range(0, len(pairs), chunk):
        p = pairs[a:a + chunk]
        eq = sigs.rows(p[:, 0]) == sigs.rows(p[:, 1])
        n_eq = eq.sum(axis=1)
        banded = eq[:, :bands * rows].reshape(len(p), bands, rows).all(axis=2).any(axis=1)
        ok = banded & (n_eq / dedup_cfg.num_perm >= dedup_cfg.threshold)
        out.append(np.concatenate([p[ok], n_eq[ok, None].astype(np.int64)], axis=1))
        sigs.release()  # at most a chunk's pages (2 x 8,192 rows) in this process at once
    return np.concatenate(out) if out else np.zeros((0, 3), np.int64)
