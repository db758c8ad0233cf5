"""The partitioned dedup step decides exactly as dedup.Deduplicator fed every document in input order
(the reference: one process, every signature), whatever the partition count, against an earlier run's
index too; and a step killed between partitions resumes from the finished ones."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from datagen import ROOT, make_cfg, mutate_to, planted_corpus, random_doc, write_jsonl

from pipeline_lib.data.dedup import Deduplicator
from pipeline_lib.data.dedup_index import commit_segment, index_uri, load_prior, segment_meta, write_segment
from pipeline_lib.data.dedup_parts import _BAND_MIX, PART, _pairs_within, _runs, candidate_pairs, shared_buckets
from pipeline_lib.data.minhash import band_keys
from pipeline_lib.data.prep import dedup_stage, plan_data_stage, prep_shard, read_docs, shard_dir
from pipeline_lib.data.workspace import Workspace
from pipeline_lib.storage import RunPaths


def tricky_corpus(seed: int) -> list[str]:
    """Planted near pairs, exact copies (before and after near copies of them), chains a ~ b ~ c where c is
    not like a, clusters of several near copies of one document, in a shuffled order."""
    rng = random.Random(seed)
    docs, _ = planted_corpus(seed=seed, n_base=60, pairs=((0.95, 8), (0.88, 8), (0.8, 6), (0.7, 6)))
    for _ in range(6):  # chains
        a = random_doc(rng, zh=True)
        b, _ = mutate_to(rng, a, 0.84, True)
        c, _ = mutate_to(rng, b, 0.84, True)
        docs += [a, b, c]
    for _ in range(4):  # clusters
        a = random_doc(rng, zh=True)
        docs += [a] + [mutate_to(rng, a, rng.choice([0.97, 0.9, 0.85]), True)[0] for _ in range(4)]
    docs += [rng.choice(docs) for _ in range(40)]  # exact copies (the stage's exact key ignores the padding)
    docs += ["  " + rng.choice(docs) for _ in range(10)]
    rng.shuffle(docs)
    return docs


def _reference(cfg, paths, prior=None) -> tuple[list[np.ndarray], list[dict]]:
    """Decisions and records of the one-process Deduplicator over the prepared shards, every document
    queried and inserted (no collision flags)."""
    ws = Workspace(cfg, paths)
    n = len(ws.read_json("shards/plan.json")["shards"])
    dd = Deduplicator(cfg.data.dedup, prior, paths.run_id, decode_source=json.loads)
    decisions, records = [], []
    for k in range(n):
        t = read_docs(ws, k, ["origin", "source_id", "key"])
        sigs = np.load(ws.fetch(f"{shard_dir(k)}/sigs.npy")) if cfg.data.dedup.near else None
        d, r = dd.process(t.column("origin").to_pylist(), t.column("key").to_numpy(), sigs,
                          sources=t.column("source_id").to_pylist())
        decisions.append(d)
        records += r
    return decisions, records


def _partitioned(cfg, paths) -> tuple[list[np.ndarray], list[dict]]:
    n = len(plan_data_stage(cfg, paths))
    for k in range(n):
        prep_shard(cfg, paths, k)
    dedup_stage(cfg, paths)
    ws = Workspace(cfg, paths)
    decisions = [np.load(ws.fetch(f"{shard_dir(k)}/keep.npy")) for k in range(n)]
    records = [json.loads(x) for x in ws.fetch("duplicates.jsonl").read_text(encoding="utf-8").splitlines()]
    return decisions, records


@pytest.mark.parametrize("partitions,exact", [(1, True), (5, True), (3, False)])
def test_partitioned_decisions_equal_the_one_process_reference(tmp_path, partitions, exact):
    docs = tricky_corpus(3)
    half = len(docs) // 2
    inputs = [write_jsonl(tmp_path / "in" / f"{i}.jsonl", part) for i, part in enumerate((docs[:half], docs[half:]))]
    cfg = make_cfg(tmp_path, inputs=[str(p) for p in inputs], docs_per_shard=37, filters=[])
    cfg.data.dedup.partitions, cfg.data.dedup.exact, cfg.data.dedup.incremental = partitions, exact, False
    paths = RunPaths(cfg.run.output_root, "r")
    got, got_records = _partitioned(cfg, paths)
    want, want_records = _reference(cfg, paths)
    assert [d.tolist() for d in got] == [d.tolist() for d in want]
    assert got_records == want_records
    kinds = {r["kind"] for r in got_records}
    assert len(got_records) > 60 and kinds == ({"exact", "near"} if exact else {"near"})


def test_against_an_earlier_runs_index_too(tmp_path):
    """Tonight's documents: copies and near copies of an earlier run's kept documents, and new ones; the
    partitions look up their own keys in the index, the decisions equal the reference's with load_prior."""
    rng = random.Random(5)
    earlier = tricky_corpus(4)
    tonight = [rng.choice(earlier) for _ in range(30)] + [mutate_to(rng, rng.choice(earlier[:80]), 0.9, True)[0]
                                                          for _ in range(20)] + tricky_corpus(6)[:120]
    rng.shuffle(tonight)
    cfg = make_cfg(tmp_path, inputs=[str(write_jsonl(tmp_path / "in" / "e.jsonl", earlier))], docs_per_shard=50,
                   filters=[])
    cfg.data.dedup.partitions = 4
    first = RunPaths(cfg.run.output_root, "night1")
    got, _ = _partitioned(cfg, first)
    ws = Workspace(cfg, first)
    kept = [(read_docs(ws, k, ["origin", "key"]), np.load(ws.fetch(f"{shard_dir(k)}/sigs.npy")), d == 0)
            for k, d in enumerate(got)]
    ids = [o for t, _, m in kept for o, x in zip(t.column("origin").to_pylist(), m) if x]
    keys = np.concatenate([t.column("key").to_numpy()[m] for t, _, m in kept])
    sigs = np.concatenate([s[m] for _, s, m in kept])
    meta = segment_meta(cfg, "night1", len(ids), True, [{"uri": "e", "size": 1, "fingerprint": "x"}])
    commit_segment(tmp_path / "seg", write_segment(tmp_path / "seg", meta, ids, keys, sigs), index_uri(cfg), "night1")

    cfg.data.inputs = [str(write_jsonl(tmp_path / "in" / "t.jsonl", tonight))]
    second = RunPaths(cfg.run.output_root, "night2")
    got, got_records = _partitioned(cfg, second)
    ws = Workspace(cfg, second)
    n = len(got)
    all_keys = np.concatenate([read_docs(ws, k, ["key"]).column("key").to_numpy() for k in range(n)])
    all_sigs = np.concatenate([np.load(ws.fetch(f"{shard_dir(k)}/sigs.npy")) for k in range(n)])
    dd = Deduplicator(cfg.data.dedup)
    prior = load_prior(cfg, "night2", dd.bands, dd.rows, inputs=ws.read_json("shards/plan.json")["files"],
                       keys=all_keys, band_keys_=band_keys(all_sigs, dd.bands, dd.rows))
    want, want_records = _reference(cfg, second, prior)
    assert [d.tolist() for d in got] == [d.tolist() for d in want]
    assert got_records == want_records
    assert sum(r["kept_run"] == "night1" for r in got_records) >= 40
    assert {r["kind"] for r in got_records if r["kept_run"]} == {"exact", "near"}


def test_pairs_within_runs_are_every_earlier_later_pair():
    values = np.array([4, 9, 1, 2, 3, 7])
    starts, sizes = _runs([np.array([0, 0, 1, 2, 2, 2])])
    assert starts.tolist() == [0, 2, 3] and sizes.tolist() == [2, 1, 3]
    i, j = _pairs_within(values, starts, sizes)
    assert sorted(zip(i.tolist(), j.tolist())) == [(2, 3), (2, 7), (3, 7), (4, 9)]
    # a bucket of copies of one exact key and one other document: with collapse, one pair, not 4 x 1 + 6
    recs = np.zeros(5, PART)
    recs["key"], recs["band"], recs["exact"] = 11, 0, [5, 5, 5, 5, 6]
    gid = np.array([0, 2, 3, 4, 1])
    assert candidate_pairs(gid, recs, collapse=True).tolist() == [[0, 1]]
    assert len(candidate_pairs(gid, recs, collapse=False)) == 10


def _brute_pairs(gid, recs, collapse):
    """Every pair of documents sharing a (band, key), by definition; collapse: per bucket only the first
    document of each exact key takes part."""
    buckets = {}
    for g, r in zip(gid.tolist(), recs.tolist()):
        key, exact, _, band = r
        buckets.setdefault((band, key), {}).setdefault(exact if collapse else (exact, g), []).append(g)
    pairs = set()
    for members in buckets.values():
        docs = sorted(min(gs) for gs in members.values()) if collapse else sorted(g for gs in members.values() for g in gs)
        pairs |= {(a, b) for i, a in enumerate(docs) for b in docs[i + 1:] if a != b}
    return sorted(pairs)


@pytest.mark.parametrize("n", [20, 1000])
def test_candidate_pairs_are_the_pairs_sharing_a_bucket_at_user_sizes(n):
    """Against the definition, on records where most buckets hold one record (what the one-sort prefilter drops)
    and some hold many, with exact copies among them."""
    rng = np.random.default_rng(n)
    recs = np.zeros(n, PART)
    recs["band"] = rng.integers(0, 9, n)
    recs["key"] = rng.integers(0, n, n, dtype=np.uint64)
    recs["exact"] = rng.integers(0, n // 4, n, dtype=np.uint64)
    gid = rng.permutation(n).astype(np.int64)
    for collapse in (True, False):
        want = _brute_pairs(gid, recs, collapse)
        assert 0 < len(want) < n * n // 20  # both kinds of bucket are there
        assert [tuple(p) for p in candidate_pairs(gid, recs, collapse).tolist()] == want


def test_buckets_whose_mixes_collide_stay_apart():
    """Band 0 with key k and band 1 with key k ^ mix(1) have the same one-sort mix: both records pass the
    prefilter, and the exact sort after it still finds no pair between them."""
    k = np.uint64(12345)
    recs = np.zeros(3, PART)
    recs["band"] = [0, 1, 2]
    recs["key"] = [k, k ^ (np.uint64(1) * _BAND_MIX), 7]
    recs["exact"] = [1, 2, 3]
    gid = np.array([0, 1, 2])
    assert shared_buckets(recs["band"], recs["key"]).tolist() == [0, 1]
    assert candidate_pairs(gid, recs, collapse=True).shape == (0, 2)


KILLED = """
import sys
from datagen import make_cfg
from pipeline_lib.data.prep import dedup_stage, plan_data_stage, prep_shard
from pipeline_lib.storage import RunPaths
cfg = make_cfg(__import__("pathlib").Path(sys.argv[1]), docs_per_shard=60)
cfg.data.dedup.partitions = 3
paths = RunPaths(cfg.run.output_root, "r")
for k in range(len(plan_data_stage(cfg, paths))):
    prep_shard(cfg, paths, k)
dedup_stage(cfg, paths)
"""


def test_a_dedup_step_killed_between_partitions_resumes_from_the_finished_ones(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "data")])}
    script = tmp_path / "steps.py"
    script.write_text(KILLED)
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    run = subprocess.run([sys.executable, str(script), str(killed)], env={
        **env, "LLM_PIPELINE_KILL_AT": "data.dedup.between_partitions@2",
        "LLM_PIPELINE_KILL_REPORT": str(tmp_path / "report")}, capture_output=True, text=True, timeout=300)
    assert run.returncode == -9, run.stderr[-2000:]
    shards = killed / "runs" / "r" / "data" / "shards"
    done = sorted(p.name for p in shards.glob("dedup-*.done"))
    assert done == ["dedup-00000.done", "dedup-00001.done"]  # killed after the second, before the third
    before = {p.name: p.stat().st_mtime_ns for p in [*(shards / "dedup").glob("*.npz"), *shards.glob("*.prep.done")]}
    assert not (killed / "runs" / "r" / "data" / "duplicates.jsonl").exists()
    for out in (killed, whole):
        res = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
    after = {p.name: p.stat().st_mtime_ns for p in [*(shards / "dedup").glob("*.npz"), *shards.glob("*.prep.done")]}
    assert {k: after[k] for k in before} == before  # finished shards and partitions were not redone
    assert len(after) == len(before) + 1  # the third partition was
    for rel in ["duplicates.jsonl", *(f"shards/{p.name}/keep.npy" for p in sorted(shards.glob("0*")) if p.is_dir())]:
        a, b = (o / "runs" / "r" / "data" / rel for o in (killed, whole))
        assert a.read_bytes() == b.read_bytes(), rel


def _synthetic_run(tmp_path, shards: list[list[tuple[int, np.ndarray]]], partitions: int):
    """A run's prepared shards written directly from (exact key, signature) rows: what prep_shard leaves."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline_lib.data.dedup_parts import PARTS, PARTS_IDX, shard_parts

    cfg = make_cfg(tmp_path)
    cfg.data.dedup.partitions, cfg.data.dedup.incremental = partitions, False
    paths = RunPaths(cfg.run.output_root, "syn")
    ws = Workspace(cfg, paths)
    ws.write_json("shards/plan.json", {"files": [], "shards": [{}] * len(shards), "dedup_partitions": partitions})
    g = 0
    for k, rows in enumerate(shards):
        origins = [f"f:{g + i}" for i in range(len(rows))]
        g += len(rows)
        keys = np.array([r[0] for r in rows], np.uint64)
        sigs = np.stack([r[1] for r in rows]).astype(np.uint32)
        pq.write_table(pa.table({"origin": origins, "source_id": [json.dumps(o) for o in origins],
                                 "key": pa.array(keys, pa.uint64())}), ws.local(f"{shard_dir(k)}/docs.parquet"))
        np.save(ws.local(f"{shard_dir(k)}/sigs.npy"), sigs)
        parts, offsets = shard_parts(keys, sigs, cfg.data.dedup, partitions)
        np.save(ws.local(f"{shard_dir(k)}/{PARTS}"), parts)
        np.save(ws.local(f"{shard_dir(k)}/{PARTS_IDX}"), offsets)
        ws.write_json(f"{shard_dir(k)}/counts.json", {"candidates": len(rows), "read": len(rows)})
    dedup_stage(cfg, paths)
    decisions = [np.load(ws.fetch(f"{shard_dir(k)}/keep.npy")).tolist() for k in range(len(shards))]
    records = [json.loads(x) for x in ws.fetch("duplicates.jsonl").read_text().splitlines()]
    return cfg, paths, decisions, records


def test_equal_similarities_name_the_earliest_kept_document_and_empty_signatures_are_never_near(tmp_path):
    """C is as similar to A as to B (20 positions each, in other bands), A and B are not alike: C names A,
    the earlier. Empty signatures (texts shorter than a shingle) share every band yet are never compared."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**31, 128)
    c = a.copy()
    c[:20] = rng.integers(0, 2**31, 20)
    b = c.copy()
    b[26:46] = rng.integers(0, 2**31, 20)
    empty = np.full(128, 0xFFFFFFFF)
    rows = [(1, a), (2, empty), (3, b), (4, empty), (5, c), (1, a)]
    for partitions in (1, 4):
        cfg, paths, decisions, records = _synthetic_run(tmp_path / str(partitions), [rows[:3], rows[3:]], partitions)
        assert decisions == [[0, 0, 0], [0, 2, 1]]
        assert [(r["origin"], r["kept_origin"], r["kind"], r["jaccard"]) for r in records] == [
            ("f:4", "f:0", "near", round(108 / 128, 4)), ("f:5", "f:0", "exact", 1.0)]
        want, want_records = _reference(cfg, paths)
        assert [d.tolist() for d in want] == decisions and want_records == records


@pytest.mark.parametrize("with_sigs", [True, False])
def test_a_segment_written_a_part_at_a_time_equals_one_written_whole(tmp_path, with_sigs):
    from pipeline_lib.data.dedup_index import SegmentWriter

    rng = np.random.default_rng(1)
    ids = ["a.jsonl:1", "名字\n带换行.jsonl:2", "b:3", "\u2028x:4", "c:5"]
    sources = [json.dumps(x, ensure_ascii=False) for x in ["s1", 7, None, {"k": "值"}, "s1"]]
    keys = rng.integers(0, 2**63, 5).astype(np.uint64)
    sigs = rng.integers(0, 2**32, (5, 16)).astype(np.uint32) if with_sigs else None
    meta = {"run_id": "r", "has_sigs": with_sigs}
    whole = write_segment(tmp_path / "whole", meta, ids, keys, sigs, source_json=sources)
    out = SegmentWriter(tmp_path / "parts", 5, 16 if with_sigs else None)
    for a, b in ((0, 2), (2, 2), (2, 5)):
        out.add(ids[a:b], keys[a:b], sigs[a:b] if with_sigs else None, sources[a:b])
    assert out.close(meta) == whole
    for name in whole:
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
