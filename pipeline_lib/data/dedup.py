"""Exact and near-duplicate decisions, first seen wins, in input order.

Documents are fed shard by shard in input order (`Deduplicator.process`), so the decisions do
not depend on how many workers prepared the shards. For each document:
1. exact: its exact key (text.exact_key) was kept before, in this run or an earlier one;
2. near: a kept document shares an LSH band with it (datasketch MinHashLSH for this run,
   `PriorIndex` for earlier runs) and the signatures' estimated Jaccard is >= threshold;
   of several, the most similar one (then the earliest) is recorded;
3. otherwise it is kept and indexed.
Only kept documents are indexed: a chain a ~ b ~ c where c is not similar to a keeps c.
Documents are keyed by their origin (`<file>:<line>`, unique); their source ids (data.id_field)
ride along and need not be unique. Each removed document yields a record (duplicates.jsonl)
{id, origin, kept_id, kept_origin, kept_run, kind, jaccard}: the removed document's source id and
origin, the kept document's source id and origin, the earlier run that kept it (None: this run).

The data stage decides with the same rule partitioned by key (dedup_parts.py, dedup_run.py): `Deduplicator`
is the one-process reference its tests compare with, and what decides a list of documents held in memory.

Speed: `collision_flags` finds, with numpy over the band keys of the whole run, which documents
share a band with an earlier one (only those are queried) or a later one (only those are
inserted), not counting bands shared only by exact copies when exact dedup runs first: in a
corpus of mostly unique documents MinHashLSH handles a small minority, and the decisions are
exactly those of querying and inserting everything. `close()` frees the LSH when the step ends.

The LSH of this run is datasketch's MinHashLSH (`RunLSH`), imported only by the dedup step.

Limits: the signatures of every kept document stay in memory (num_perm x 4 bytes each), and the band
keys of every document (bands x 8 bytes each): the data stage uses the partitioned steps instead.
"""
from __future__ import annotations

import numpy as np
from .minhash import EMPTY, SCHEME, SEED, band_keys, lsh_params

KEEP, EXACT, NEAR = 0, 1, 2


def collision_flags(keys: np.ndarray, empty: np.ndarray, exact: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(has_earlier, has_later): documents sharing at least one band key (columns of `keys`,
    rows in input order) with an earlier / a later document. Empty signatures never collide.

    exact: the documents' exact keys, when exact dedup runs before the LSH (`Deduplicator` with
    exact on). Then a band whose documents all have one exact key is no collision: the copies of a
    kept document are removed by the exact check before they could query, and copies none of which
    is kept are never inserted. Only whole bands of one key are left out, so the flags stay a
    superset of the collisions that matter (in a corpus with many exact copies, most of them)."""
    n = len(keys)
    earlier, later = np.zeros(n, bool), np.zeros(n, bool)
    for b in range(keys.shape[1] if n else 0):
        order = np.argsort(keys[:, b], kind="stable")  # stable: equal keys stay in input order
        same = keys[order[1:], b] == keys[order[:-1], b]
        if exact is not None and same.any():
            starts = np.flatnonzero(np.concatenate([[True], ~same]))  # the bands' groups, in sorted order
            ex = exact[order]
            mixed = np.minimum.reduceat(ex, starts) != np.maximum.reduceat(ex, starts)
            same &= mixed[np.cumsum(np.concatenate([[True], ~same]))[1:] - 1]
        earlier[order[1:][same]] = True
        later[order[:-1][same]] = True
    return earlier & ~empty, later & ~empty


class RunLSH:
    """This run's LSH: datasketch's MinHashLSH (its banding, bucket keys and storage) over our
    signatures, which are bit-identical to datasketch's MinHash, passed as LeanMinHash. datasketch
    is imported here, in the dedup step only: its import pulls in scipy (~1 s), which the shard
    workers computing signatures do not need. `collision_flags` keeps the documents it sees few."""

    def __init__(self, bands: int, rows: int, num_perm: int):
        from datasketch import LeanMinHash, MinHashLSH

        self._lean = LeanMinHash
        self.lsh = MinHashLSH(num_perm=num_perm, params=(bands, rows))

    def _minhash(self, sig: np.ndarray):
        return self._lean(seed=SEED, hashvalues=sig, scheme=SCHEME)

    def insert(self, key, sig: np.ndarray) -> None:
        self.lsh.insert(key, self._minhash(sig), check_duplication=False)

    def query(self, sig: np.ndarray) -> set:
        return set(self.lsh.query(self._minhash(sig)))

    def close(self) -> None:
        """Free the hash tables now. MinHashLSH keeps a bound method of itself (a reference cycle), so
        without this its ~15 sets per inserted document wait for a full cyclic collection, or the
        interpreter's exit (0.3 s for the benchmark corpus), and every collection before it walks them."""
        vars(self.lsh).clear()


class Deduplicator:
    """Stateful decisions over the documents of one run (see the module docstring)."""

    def __init__(self, dedup_cfg, prior=None, run_id: str = "", decode_source=None):
        """decode_source: turns a source id as passed to `process` into its value (the dedup step passes
        them as JSON text: only the few a duplicate record names are decoded)."""
        self.cfg, self.prior, self.run_id = dedup_cfg, prior, run_id
        self.decode = decode_source or (lambda x: x)
        self.bands, self.rows = lsh_params(dedup_cfg.threshold, dedup_cfg.num_perm)
        self.lsh = RunLSH(self.bands, self.rows, dedup_cfg.num_perm)
        self.seen: dict[int, int] = {}        # exact key -> kept index in this run
        self.kept_ids: list[str] = []         # origins
        self.kept_sources: list = []          # source ids
        self.kept_keys: list[int] = []
        self.kept_sigs: list[np.ndarray] = []

    def _prior_exact(self, keys: np.ndarray) -> np.ndarray:
        if self.prior is None or not len(self.prior) or not self.cfg.exact:
            return np.full(len(keys), -1)
        return self.prior.exact(keys)

    def _prior_near(self, sigs: np.ndarray) -> list[np.ndarray]:
        if self.prior is None or not len(self.prior) or not self.cfg.near:
            return [np.zeros(0, np.int64)] * len(sigs)
        return self.prior.candidates(band_keys(sigs, self.bands, self.rows))

    def _removed(self, source, origin: str) -> dict:
        return {"id": self.decode(source), "origin": origin}

    def _kept(self, index: int) -> dict:
        return {"kept_id": self.decode(self.kept_sources[index]), "kept_origin": self.kept_ids[index], "kept_run": None}

    def _prior_kept(self, row: int) -> dict:
        run, origin = self.prior.ids[row].split("/", 1)
        return {"kept_id": self.prior.source_ids[row], "kept_origin": origin, "kept_run": run}

    def _best_near(self, sig: np.ndarray, query: bool, prior_rows: np.ndarray):
        """(jaccard, kept fields) of the most similar kept document >= threshold, else None."""
        best = None
        if len(prior_rows):
            sims = (self.prior.sigs[prior_rows] == sig).mean(axis=1)
            i = int(np.argmax(sims))  # argmax takes the first (earliest) of equals
            if sims[i] >= self.cfg.threshold:
                best = (float(sims[i]), -1, int(prior_rows[i]))
        for key in sorted(self.lsh.query(sig)) if query else ():
            sim = float((self.kept_sigs[key] == sig).mean())
            if sim >= self.cfg.threshold and (best is None or sim > best[0]):
                best = (sim, key, -1)
        if best is None:
            return None
        sim, key, row = best
        return sim, (self._kept(key) if key >= 0 else self._prior_kept(row))

    def process(self, ids: list[str], keys: np.ndarray, sigs: np.ndarray | None,
                query: np.ndarray | None = None, insert: np.ndarray | None = None,
                sources: list | None = None) -> tuple[np.ndarray, list[dict]]:
        """Decide a batch (a shard) of documents in order: (decision per doc, duplicate records).
        ids: origins; sources: source ids (None: the origins).
        query / insert: per document, whether it can meet an earlier / a later document of this
        run in a band (see collision_flags); None means yes for all."""
        sources = list(ids) if sources is None else sources
        decisions = np.zeros(len(ids), dtype=np.int8)
        records: list[dict] = []
        keys = np.asarray(keys, dtype=np.uint64)
        prior_exact = self._prior_exact(keys)
        near = self.cfg.near and sigs is not None
        prior_near = self._prior_near(sigs) if near else None
        query = np.ones(len(ids), bool) if query is None else query
        insert = np.ones(len(ids), bool) if insert is None else insert
        for i, doc_id in enumerate(ids):
            key = int(keys[i])
            if self.cfg.exact and key in self.seen:
                decisions[i] = EXACT
                records.append({**self._removed(sources[i], doc_id), **self._kept(self.seen[key]), "kind": "exact",
                                "jaccard": 1.0})
                continue
            if prior_exact[i] >= 0:
                decisions[i] = EXACT
                records.append({**self._removed(sources[i], doc_id), **self._prior_kept(int(prior_exact[i])),
                                "kind": "exact", "jaccard": 1.0})
                continue
            sig = sigs[i] if sigs is not None else None
            indexed = False
            if near and (query[i] or insert[i] or len(prior_near[i])) and not (sig == EMPTY).all():
                indexed = True
                hit = self._best_near(sig, bool(query[i]), prior_near[i])
                if hit is not None:
                    decisions[i] = NEAR
                    records.append({**self._removed(sources[i], doc_id), **hit[1], "kind": "near",
                                    "jaccard": round(hit[0], 4)})
                    continue
            index = len(self.kept_ids)
            self.seen.setdefault(key, index)
            self.kept_ids.append(doc_id)
            self.kept_sources.append(sources[i])
            self.kept_keys.append(key)
            if near:
                self.kept_sigs.append(sig)
                if indexed and insert[i]:
                    self.lsh.insert(index, sig)
        return decisions, records

    def close(self) -> None:
        """Free this run's LSH (no more `process` calls)."""
        self.lsh.close()

    def segment(self) -> tuple[list[str], np.ndarray, np.ndarray | None, list]:
        """(origins, exact keys, signatures or None, source ids) of everything this run kept: the index segment."""
        sigs = np.stack(self.kept_sigs) if self.kept_sigs else None
        if self.cfg.near and sigs is None:
            sigs = np.zeros((0, self.cfg.num_perm), np.uint32)
        sources = [self.decode(s) for s in self.kept_sources]
        return self.kept_ids, np.asarray(self.kept_keys, dtype=np.uint64), sigs, sources
