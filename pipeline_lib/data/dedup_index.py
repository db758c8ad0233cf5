"""The persistent dedup index of a lineage: what its earlier runs kept, so tonight's data is
deduplicated against it.

Layout at `data.dedup.index_uri` (default <output_root>/_dedup_index/<lineage>, the lineage being
data.dedup.lineage or run.name), one segment per run:
  segments/<run_id>/keys.npy   uint64 exact keys of the kept documents (text.exact_key)
  segments/<run_id>/sigs.npy   uint32 (n, num_perm) MinHash signatures (absent when near dedup was off)
  segments/<run_id>/ids.txt    the kept documents' origins (`<file>:<line>`), one per line
  segments/<run_id>/source_ids.jsonl  their source ids (data.id_field), one JSON value per line
                               (segments written before it existed: the origins stand in)
  segments/<run_id>/meta.json  written last: a segment without it is ignored; holds the run's input
                               files (uri, size, content fingerprint)
About 8 + 4 x num_perm bytes per document (520 B at 128 permutations). Band keys are not stored:
they are recomputed from the signatures, so a changed threshold still works with an old index.
A run commits its segment only when the whole stage succeeded (a failed run leaves no trace),
and a run never loads its own segment (a resumed run is not deduplicated against itself).
The rerun rule: a run does not load a segment whose input files (uri, size, fingerprint) are all
among its own inputs: that run read the same data, it is a rerun, not data seen before (so running
a config twice gives the same dataset twice, while new files are checked against everything).

Limits: every segment is loaded into memory (numpy arrays, sorted for binary search); two runs
committing to one index at the same time are not coordinated. A segment written with another
num_perm, shingle size or shingle version cannot be compared and is refused.
Raises: DataStageError naming data.dedup.* when a segment's parameters differ.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np

from ..storage import join, store_for
from .errors import DataStageError
from .minhash import SCHEME, SEED, SHINGLE_VERSION, band_keys


def lineage(cfg) -> str:
    """data.dedup.lineage, or run.name made safe for a path."""
    return cfg.data.dedup.lineage or re.sub(r"[^A-Za-z0-9._-]", "_", cfg.run.name) or "default"


def index_uri(cfg) -> str:
    return cfg.data.dedup.index_uri or join(cfg.run.output_root, "_dedup_index", lineage(cfg))


def segment_meta(cfg, run_id: str, n: int, has_sigs: bool, inputs: list[dict] | None = None) -> dict:
    """inputs: the run's input files [{uri, size, fingerprint}] (the rerun rule compares them)."""
    d = cfg.data.dedup
    return {"run_id": run_id, "lineage": lineage(cfg), "docs": n, "num_perm": d.num_perm, "ngram": d.ngram,
            "seed": SEED, "scheme": SCHEME, "shingle_version": SHINGLE_VERSION, "has_sigs": has_sigs,
            "inputs": inputs or []}


def _file_ids(inputs) -> set[tuple]:
    return {(f["uri"], f["size"], f.get("fingerprint")) for f in inputs or []}


def is_rerun_of(meta: dict, inputs: list[dict] | None) -> bool:
    """True when every input file of the segment's run (same uri, size, fingerprint) is an input of
    this run too: this run rereads that data, so it is not deduplicated against that run."""
    theirs = _file_ids(meta.get("inputs"))
    return bool(theirs) and all(f[2] for f in theirs) and theirs <= _file_ids(inputs)


def list_segments(cfg, endpoint_url: str | None = None) -> list[dict]:
    """The meta.json of every committed segment of the lineage's index, in commit-name order."""
    uri = index_uri(cfg)
    store = store_for(uri, endpoint_url)
    metas = sorted(u for u in store.list(join(uri, "segments") + "/") if u.endswith("/meta.json"))
    return [json.loads(store.get_bytes(m)) | {"uri": m.rsplit("/", 1)[0]} for m in metas]


def clear_index(cfg, endpoint_url: str | None = None) -> int:
    """Delete the lineage's whole index; returns how many segments it held."""
    n = len(list_segments(cfg, endpoint_url))
    uri = index_uri(cfg)
    store = store_for(uri, endpoint_url)
    if store.exists(uri) or store.list(uri.rstrip("/") + "/"):
        store.delete(uri)
    return n


def write_segment(folder: Path, meta: dict, ids: list[str], keys: np.ndarray, sigs: np.ndarray | None,
                  source_ids: list | None = None) -> list[str]:
    """Write a segment into a local folder; returns the file names, meta.json last."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "keys.npy", np.asarray(keys, dtype=np.uint64))
    names = ["keys.npy", "ids.txt"]
    if source_ids is not None:
        (folder / "source_ids.jsonl").write_text(
            "".join(json.dumps(s, ensure_ascii=False, default=str) + "\n" for s in source_ids), encoding="utf-8")
        names.append("source_ids.jsonl")
    if sigs is not None:
        np.save(folder / "sigs.npy", np.asarray(sigs, dtype=np.uint32))
        names.append("sigs.npy")
    (folder / "ids.txt").write_text("".join(i + "\n" for i in ids), encoding="utf-8")
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return names + ["meta.json"]


def commit_segment(folder: Path, names: list[str], uri: str, run_id: str, endpoint_url: str | None = None) -> str:
    """Upload (or copy) a local segment into the index, meta.json last. Idempotent."""
    store = store_for(uri, endpoint_url)
    target = join(uri, "segments", run_id)
    for name in names:
        store.put_file(folder / name, join(target, name))
    return target


class PriorIndex:
    """The loaded segments of earlier runs: exact-key and LSH-band lookups, vectorized."""

    def __init__(self, ids: list[str], keys: np.ndarray, sigs: np.ndarray, bands: int, rows: int, runs: list[str],
                 source_ids: list | None = None):
        """ids: `<run>/<origin>` per row; source_ids: the kept documents' source ids (default: the origins)."""
        self.ids, self.sigs, self.runs, self.reruns = ids, sigs, runs, []
        self.source_ids = source_ids if source_ids is not None else [i.split("/", 1)[1] for i in ids]
        self.key_order = np.argsort(keys, kind="stable")
        self.sorted_keys = keys[self.key_order]
        has = ~(sigs == np.uint32(0xFFFFFFFF)).all(axis=1) if len(sigs) else np.zeros(0, bool)
        self.near_rows = np.flatnonzero(has)
        bk = band_keys(sigs[self.near_rows], bands, rows) if len(self.near_rows) else np.zeros((0, bands), np.uint64)
        self.band_order = [np.argsort(bk[:, b], kind="stable") for b in range(bands)]
        self.band_sorted = [bk[o, b] for b, o in enumerate(self.band_order)]

    def __len__(self) -> int:
        return len(self.ids)

    def exact(self, keys: np.ndarray) -> np.ndarray:
        """Row of the first earlier document with each key, or -1."""
        pos = np.searchsorted(self.sorted_keys, keys)
        pos = np.minimum(pos, max(len(self.sorted_keys) - 1, 0))
        hit = (self.sorted_keys[pos] == keys) if len(self.sorted_keys) else np.zeros(len(keys), bool)
        return np.where(hit, self.key_order[pos] if len(self.key_order) else -1, -1)

    def candidates(self, qkeys: np.ndarray, cap: int = 64) -> list[np.ndarray]:
        """Per query row (band keys), the earlier rows sharing at least one band (at most `cap` per band)."""
        out: list[list[np.ndarray]] = [[] for _ in range(len(qkeys))]
        for b, (order, keys) in enumerate(zip(self.band_order, self.band_sorted)):
            lo, hi = np.searchsorted(keys, qkeys[:, b], "left"), np.searchsorted(keys, qkeys[:, b], "right")
            for q in np.flatnonzero(hi > lo):
                out[q].append(self.near_rows[order[lo[q]:min(hi[q], lo[q] + cap)]])
        return [np.unique(np.concatenate(c)) if c else np.zeros(0, np.int64) for c in out]


def load_prior(cfg, exclude_run: str, bands: int, rows: int, endpoint_url: str | None = None,
               inputs: list[dict] | None = None) -> PriorIndex:
    """Every committed segment of the index except `exclude_run`'s and those this run reruns
    (is_rerun_of: listed in `.reruns`), in commit-name order."""
    uri, d = index_uri(cfg), cfg.data.dedup
    store = store_for(uri, endpoint_url)
    ids: list[str] = []
    keys, sigs, runs, reruns, sources = [], [], [], [], []
    for meta in list_segments(cfg, endpoint_url):
        if meta["run_id"] == exclude_run:
            continue
        if is_rerun_of(meta, inputs):
            reruns.append(meta["run_id"])
            continue
        for field, mine in (("num_perm", d.num_perm), ("ngram", d.ngram)):
            if meta[field] != mine:
                raise DataStageError(f"data.dedup.{field}", mine, f"the index at {uri} was built with "
                                     f"{field}={meta[field]} (run {meta['run_id']})",
                                     f"set data.dedup.{field}={meta[field]}, or data.dedup.index_uri to a new index")
        if meta["shingle_version"] != SHINGLE_VERSION or meta["seed"] != SEED or meta["scheme"] != SCHEME:
            raise DataStageError("data.dedup.index_uri", uri, f"segment {meta['run_id']} uses another shingle/hash "
                                 "version", "start a new index (set data.dedup.index_uri)")
        base = meta["uri"]
        keys.append(np.load(io.BytesIO(store.get_bytes(join(base, "keys.npy")))))
        n = len(keys[-1])
        sigs.append(np.load(io.BytesIO(store.get_bytes(join(base, "sigs.npy")))) if meta["has_sigs"]
                    else np.full((n, d.num_perm), 0xFFFFFFFF, dtype=np.uint32))
        run_ids = store.get_bytes(join(base, "ids.txt")).decode("utf-8").splitlines()
        ids += [f"{meta['run_id']}/{i}" for i in run_ids]
        if store.exists(join(base, "source_ids.jsonl")):
            sources += [json.loads(x) for x in store.get_bytes(join(base, "source_ids.jsonl")).decode("utf-8").splitlines()]
        else:  # a segment from before source ids were kept
            sources += run_ids
        runs.append(meta["run_id"])
    prior = PriorIndex(ids, np.concatenate(keys) if keys else np.zeros(0, np.uint64),
                       np.concatenate(sigs) if sigs else np.zeros((0, d.num_perm), np.uint32), bands, rows, runs,
                       sources)
    prior.reruns = reruns
    return prior
