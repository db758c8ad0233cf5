"""The partitioned dedup step's two halves (dedup_parts.py says how the work is split):
`dedup_partition` (a task per partition, mapped like prep_shard) and `resolve` (once, in prep.dedup_stage).

resolve takes the decisions of dedup.Deduplicator (first seen in input order wins; only kept documents
index; the most similar kept document, then the earliest, is named; an earlier run's wins ties) walking only
the documents a partition named: a document no partition named shares no exact key, no band with a document
of this run and no key with the index, so it is kept.
"""
from __future__ import annotations

import json

import numpy as np

from .. import killpoints
from .dedup import EXACT, NEAR
from .dedup_index import PriorRuns, index_uri
from .dedup_parts import (EXACT_BAND, FOLDER, PART, PARTS, PARTS_IDX, SigReader, candidate_pairs, doc_starts,
                          exact_copies, verify)
from .index_lease import take_lease
from .minhash import band_keys, is_empty, lsh_params
from .workspace import Workspace, atomic_path


def _counts(ws: Workspace, n_shards: int, shard_dir) -> list[dict]:
    return [ws.read_json(f"{shard_dir(k)}/counts.json") for k in range(n_shards)]


def partition_rel(p: int) -> str:
    return f"{FOLDER}/p{p:05d}.npz"


def dedup_partition(cfg, paths, p: int, *, shared: bool = True) -> None:
    """Partition p of the dedup step: its exact copies, its verified candidate pairs and (incremental index)
    its index hits, in shards/dedup/pNNNNN.npz, then its marker."""
    from .prep import shard_dir, uses_index

    ws, d = Workspace(cfg, paths, shared), cfg.data.dedup
    if ws.is_marked(f"dedup-{p:05d}"):
        return
    plan = ws.read_json("shards/plan.json")
    n_shards = len(plan["shards"])
    starts = doc_starts(_counts(ws, n_shards, shard_dir))
    recs, gids = [np.zeros(0, PART)], [np.zeros(0, np.int64)]
    for k in range(n_shards):  # this partition's slice of every shard
        idx = np.load(ws.fetch(f"{shard_dir(k)}/{PARTS_IDX}"))
        part = np.load(ws.fetch(f"{shard_dir(k)}/{PARTS}"), mmap_mode="r")[idx[p]:idx[p + 1]]
        recs.append(np.array(part))
        gids.append(part["row"].astype(np.int64) + starts[k])
    recs, gid = np.concatenate(recs), np.concatenate(gids)
    exact = recs["band"] == EXACT_BAND
    out = {"copies": exact_copies(gid[exact], recs["key"][exact]) if d.exact else np.zeros((0, 2), np.int64)}
    near = ~exact
    if d.near:
        pairs = candidate_pairs(gid[near], recs[near], collapse=d.exact)
        out["edges"] = verify(pairs, SigReader(ws.fetch, starts, shard_dir), d)
    if uses_index(cfg):
        take_lease(index_uri(cfg), paths.run_id, ws.endpoint)  # `dedup-index clear` refuses until finalize drops it
        bands, rows = lsh_params(d.threshold, d.num_perm)
        prior = PriorRuns(cfg, paths.run_id, ws.endpoint, plan["files"])
        out["prior"], found = prior.hits(bands, rows, recs["key"][exact] if d.exact else None,
                                         recs["key"][near] if d.near else None, recs["band"][near] if d.near else None)
        # the documents that may meet the index: an exact or band key of theirs hit (resolve asks again, exactly)
        out["prior_docs"] = np.unique(gid[np.isin(recs["key"], found)])
    path = ws.local(partition_rel(p))
    tmp = atomic_path(path)
    with open(tmp, "wb") as fh:
        np.savez(fh, **out)
    tmp.replace(path)
    ws.publish(partition_rel(p))
    ws.mark(f"dedup-{p:05d}")
    killpoints.reached("data.dedup.between_partitions")


def resolve(cfg, paths, ws: Workspace, n_shards: int, n_parts: int, shard_dir, read_docs):
    """Decide every document (dedup.py's rule) from the partitions' files: (the PriorIndex or None, an
    iterator of (decisions, duplicate records) per shard, in input order)."""
    from .prep import uses_index

    d = cfg.data.dedup
    bands, rows = lsh_params(d.threshold, d.num_perm)
    starts = doc_starts(_counts(ws, n_shards, shard_dir))
    copies, edges, wanted, prior_docs = [], [], [], []
    for p in range(n_parts):
        with np.load(ws.fetch(partition_rel(p))) as z:
            copies.append(z["copies"])
            if "edges" in z:
                edges.append(z["edges"])
            if "prior" in z:
                wanted.append(z["prior"])
                prior_docs.append(z["prior_docs"])
    copies = np.concatenate(copies) if copies else np.zeros((0, 2), np.int64)
    edges = np.concatenate(edges) if edges else np.zeros((0, 3), np.int64)
    if len(edges):  # a pair found in several partitions (several shared bands) once
        _, first = np.unique(edges[:, 0] * (1 << 32) + edges[:, 1], return_index=True)
        edges = edges[first]
    rep = dict(zip(copies[:, 0].tolist(), copies[:, 1].tolist()))  # a later copy -> first document of its key
    adjacency: dict[int, list[tuple[int, int]]] = {}
    for i, j, eq in edges.tolist():
        adjacency.setdefault(i, []).append((j, eq))
        adjacency.setdefault(j, []).append((i, eq))
    prior = None
    prior_exact, prior_near = {}, {}
    if uses_index(cfg):
        runs = PriorRuns(cfg, paths.run_id, ws.endpoint, ws.read_json("shards/plan.json")["files"])
        want = np.unique(np.concatenate(wanted), axis=0) if wanted else np.zeros((0, 2), np.int64)
        prior = runs.index(want, bands, rows)
        docs = np.unique(np.concatenate(prior_docs)) if prior_docs else np.zeros(0, np.int64)
        if len(prior.ids) and len(docs):
            keys = _column_rows(ws, starts, docs, shard_dir, read_docs, "key")
            hit = prior.exact(np.asarray(keys, np.uint64)) if d.exact else np.full(len(docs), -1)
            prior_exact = {int(g): int(r) for g, r in zip(docs, hit) if r >= 0}
            if d.near:
                sigs = SigReader(ws.fetch, starts, shard_dir).rows(docs)
                cands = prior.candidates(band_keys(sigs, bands, rows))
                live = ~is_empty(sigs)  # an empty signature is never compared (dedup.Deduplicator)
                prior_near = {int(g): (c, sigs[i]) for i, (g, c) in enumerate(zip(docs, cands)) if len(c) and live[i]}
    named = sorted(set(rep) | set(rep.values()) | set(adjacency) | set(prior_exact) | set(prior_near))
    kept: set[int] = set()
    first_kept: dict[int, int] = {}      # first document of an exact key -> the first kept document with it
    removed: dict[int, tuple] = {}       # document -> (kind, kept document or -1 - prior row, jaccard)
    for g in named:
        group = rep.get(g, g)
        if d.exact and group in first_kept:
            removed[g] = (EXACT, first_kept[group], 1.0)
            continue
        if g in prior_exact:
            removed[g] = (EXACT, -1 - prior_exact[g], 1.0)
            continue
        best = None
        if d.near and g in prior_near:
            rows_, sig = prior_near[g]
            sims = (prior.sigs[rows_] == sig).mean(axis=1)
            i = int(np.argmax(sims))  # argmax takes the first (earliest) of equals
            if sims[i] >= d.threshold:
                best = (float(sims[i]), -1 - int(rows_[i]))
        for x, eq in sorted(adjacency.get(group, ())):  # a later copy meets what the first of its key meets
            if x < g and x in kept:
                sim = eq / d.num_perm
                if best is None or sim > best[0]:
                    best = (sim, x)
        if best is not None:
            removed[g] = (NEAR, best[1], round(best[0], 4))
            continue
        kept.add(g)
        if d.exact:
            first_kept.setdefault(group, g)
    del adjacency, rep, kept, first_kept
    return prior, _per_shard(ws, starts, removed, prior, shard_dir, read_docs)


def _per_shard(ws, starts, removed: dict, prior, shard_dir, read_docs):
    # the origins and source ids the records name, one shard's columns at a time
    named = np.asarray(sorted(set(removed) | {v[1] for v in removed.values() if v[1] >= 0}), np.int64)
    names = _names(ws, starts, named, shard_dir, read_docs)
    gone = np.asarray(sorted(removed), np.int64)
    for k in range(len(starts) - 1):
        decisions = np.zeros(starts[k + 1] - starts[k], np.int8)
        records = []
        lo, hi = int(starts[k]), int(starts[k + 1])
        for g in gone[np.searchsorted(gone, lo):np.searchsorted(gone, hi)].tolist():
            kind, other, jac = removed[g]
            decisions[g - lo] = kind
            origin, source = names[g]
            rec = {"id": json.loads(source), "origin": origin}
            if other >= 0:
                k_origin, k_source = names[other]
                rec |= {"kept_id": json.loads(k_source), "kept_origin": k_origin, "kept_run": None}
            else:
                row = -1 - other
                run, k_origin = prior.ids[row].split("/", 1)
                rec |= {"kept_id": prior.source_ids[row], "kept_origin": k_origin, "kept_run": run}
            records.append(rec | {"kind": "exact" if kind == EXACT else "near", "jaccard": jac})
        yield decisions, records


def _shard_groups(starts: np.ndarray, gids: np.ndarray):
    shard = np.searchsorted(starts, gids, "right") - 1
    for k in np.unique(shard):
        yield int(k), gids[shard == k]


def _column_rows(ws, starts, gids, shard_dir, read_docs, column: str) -> np.ndarray:
    out = np.zeros(len(gids), np.uint64)
    pos = {int(g): i for i, g in enumerate(gids)}
    for k, mine in _shard_groups(starts, gids):
        col = read_docs(ws, k, [column]).column(column).to_numpy()
        for g in mine:
            out[pos[int(g)]] = col[int(g) - starts[k]]
    return out


def _names(ws, starts, gids, shard_dir, read_docs) -> dict[int, tuple[str, str]]:
    """global row -> (origin, source id as JSON text) of the given documents."""
    out = {}
    for k, mine in _shard_groups(starts, gids):
        table = read_docs(ws, k, ["origin", "source_id"])
        local = (mine - starts[k]).tolist()
        origins = table.column("origin").take(local).to_pylist()
        sources = table.column("source_id").take(local).to_pylist()
        out.update(zip(mine.tolist(), zip(origins, sources)))
    return out
