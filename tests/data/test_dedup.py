"""Dedup quality on planted pairs of known exact Jaccard, first-seen-wins, and the persistent index."""
from __future__ import annotations

import numpy as np
import pytest
from datagen import jaccard, planted_corpus

from pipeline_lib.config.schema import DedupConfig
from pipeline_lib.data.dedup import EXACT, KEEP, NEAR, Deduplicator
from pipeline_lib.data.dedup_index import PriorIndex
from pipeline_lib.data.minhash import shingle_hashes, signatures
from pipeline_lib.data.text import dedup_form, exact_key


def decide(docs, cfg=None, prior=None, ids=None, sources=None):
    cfg = cfg or DedupConfig()
    dd = Deduplicator(cfg, prior, "run")
    ids = ids or [f"f:{i}" for i in range(len(docs))]
    keys = np.array([exact_key(t) for t in docs], dtype=np.uint64)
    sigs = signatures(*shingle_hashes([dedup_form(t) for t in docs], cfg.ngram), cfg.num_perm)
    decisions, records = dd.process(ids, keys, sigs, sources=sources)
    return dd, decisions, records


def test_near_duplicate_recall_and_precision_against_exact_jaccard():
    docs, pairs = planted_corpus()
    _, decisions, records = decide(docs)
    threshold = DedupConfig().threshold
    positives = [(b, c) for b, c, j in pairs if j >= threshold]
    found = {(r["kept_origin"], r["origin"]) for r in records if r["kind"] == "near"}
    recall = sum((f"f:{b}", f"f:{c}") in found for b, c in positives) / len(positives)
    flagged = [(int(k.split(":")[1]), int(i.split(":")[1])) for k, i in found]
    precision = sum(jaccard(docs[k], docs[i]) >= threshold for k, i in flagged) / len(flagged)
    assert len(positives) >= 50 and len(pairs) - len(positives) >= 25
    assert recall >= 0.9, recall
    assert precision >= 0.95, precision
    # every base document is kept; nothing but planted copies is removed
    assert (decisions[:160] == KEEP).all()


def test_first_seen_wins_and_records_name_the_kept_document():
    docs, pairs = planted_corpus(n_base=12, pairs=((0.95, 3),))
    docs = docs + [docs[0], docs[5].upper() + "  "]
    _, decisions, records = decide(docs)
    assert list(decisions[12:]) == [NEAR, NEAR, NEAR, EXACT, EXACT]
    by_id = {r["id"]: r for r in records}
    assert by_id["f:15"] == {"id": "f:15", "origin": "f:15", "kept_id": "f:0", "kept_origin": "f:0", "kept_run": None,
                             "kind": "exact", "jaccard": 1.0}
    assert by_id["f:12"]["kept_origin"] == "f:0" and 0.8 <= by_id["f:12"]["jaccard"] <= 1.0


def test_records_name_both_source_ids_and_repeated_source_ids_are_harmless():
    docs, _ = planted_corpus(n_base=12, pairs=((0.95, 1),))
    docs = docs + [docs[3]]
    sources = ["doc-a"] * 6 + [17] * 6 + ["doc-a", 17]  # ids from the source system, not unique
    _, decisions, records = decide(docs, sources=sources)
    assert list(decisions) == [KEEP] * 12 + [NEAR, EXACT]
    near, exact = records
    assert (near["id"], near["origin"], near["kept_id"], near["kept_origin"]) == ("doc-a", "f:12", "doc-a", "f:0")
    assert (exact["id"], exact["origin"], exact["kept_id"], exact["kept_origin"]) == (17, "f:13", "doc-a", "f:3")


def test_exact_key_folds_width_and_cjk_punctuation():
    a = "变压器运行正常，油温４２度（正常）！ ABC"
    assert exact_key(a) == exact_key("变压器运行正常,油温42度(正常)! abc")
    assert exact_key(a) != exact_key("变压器运行正常，油温43度（正常）！ ABC")


def test_exact_only_and_near_only():
    docs = ["设备巡视记录第一页，变压器运行正常，油温四十二度，无异常声响。"] * 2
    _, d, _ = decide(docs, DedupConfig(near=False))
    assert list(d) == [KEEP, EXACT]
    _, d, r = decide(docs, DedupConfig(exact=False))
    assert list(d) == [KEEP, NEAR] and r[0]["jaccard"] == 1.0
    _, d, _ = decide(["!!!", "!!!"], DedupConfig(exact=False))  # no shingles: never a near duplicate
    assert list(d) == [KEEP, KEEP]


def test_prior_index_deduplicates_a_second_run_against_the_first():
    docs, pairs = planted_corpus(n_base=30, pairs=((0.93, 6),))
    first, second = docs[:30], docs[30:] + [docs[2], "全新的文档，与之前的内容完全不同。" * 5]
    dd, _, _ = decide(first)
    ids, keys, sigs, sources = dd.segment()
    assert sources == ids  # no source ids given: the origins stand in
    prior = PriorIndex([f"day1/{i}" for i in ids], keys, sigs, dd.bands, dd.rows, ["day1"],
                       [f"src-{i}" for i in range(len(ids))])
    _, decisions, records = decide(second, prior=prior, ids=[f"g:{i}" for i in range(len(second))])
    assert list(decisions) == [NEAR] * 6 + [EXACT, KEEP]
    assert records[-1] == {"id": "g:6", "origin": "g:6", "kept_id": "src-2", "kept_origin": "f:2", "kept_run": "day1",
                           "kind": "exact", "jaccard": 1.0}
    assert all(r["kept_run"] == "day1" for r in records)


def test_empty_prior_index_is_harmless():
    prior = PriorIndex([], np.zeros(0, np.uint64), np.zeros((0, 128), np.uint32), 14, 9, [])
    assert (prior.exact(np.array([1, 2], np.uint64)) == -1).all()
    _, decisions, _ = decide(["一段足够长的中文文本用于测试去重逻辑是否正常。"], prior=prior)
    assert list(decisions) == [KEEP]


@pytest.mark.parametrize("field,value", [("num_perm", 64), ("ngram", 3)])
def test_index_built_with_other_parameters_is_refused(tmp_path, field, value):
    from datagen import make_cfg

    from pipeline_lib.data.dedup_index import commit_segment, index_uri, load_prior, segment_meta, write_segment
    from pipeline_lib.data.errors import DataStageError

    cfg = make_cfg(tmp_path)
    names = write_segment(tmp_path / "seg", segment_meta(cfg, "old", 1, True), ["a:1"],
                          np.array([5], np.uint64), np.zeros((1, 128), np.uint32))
    commit_segment(tmp_path / "seg", names, index_uri(cfg), "old")
    assert len(load_prior(cfg, "new", 14, 9)) == 1 and len(load_prior(cfg, "old", 14, 9)) == 0
    other = make_cfg(tmp_path, dedup={field: value})
    with pytest.raises(DataStageError, match=f"data.dedup.{field}={value}.*built with {field}="):
        load_prior(other, "new", 14, 9)


def test_run_lsh_finds_what_datasketch_minhashlsh_finds():
    """RunLSH (the run's MinHashLSH over our signatures) finds MinHashLSH's candidates: the same candidates for every query, on signatures that
    share some bands and not others."""
    from datasketch import LeanMinHash, MinHashLSH

    from pipeline_lib.data.dedup import RunLSH
    from pipeline_lib.data.minhash import SCHEME, SEED

    rng = np.random.default_rng(3)
    base = rng.integers(0, 2**32, (40, 128), dtype=np.uint64).astype(np.uint32)
    sigs = [base[i % 40].copy() for i in range(200)]
    for s in sigs[40:]:  # copies that keep a random subset of the 14 bands of 9 rows
        for band in rng.choice(14, rng.integers(10, 15), replace=False):
            s[band * 9 + rng.integers(0, 9)] ^= 1
    ours, theirs = RunLSH(14, 9, 128), MinHashLSH(num_perm=128, params=(14, 9))
    hits = 0
    for i, s in enumerate(sigs):
        lean = LeanMinHash(seed=SEED, hashvalues=s, scheme=SCHEME)
        expected = set(theirs.query(lean)) if i else set()
        assert ours.query(s) == expected
        hits += len(expected)
        ours.insert(i, s)
        theirs.insert(i, lean)
    assert hits > 50  # the copies did meet their originals


def test_source_ids_given_as_json_text_are_decoded_only_into_the_records():
    """The dedup step passes the source ids as the JSON text the shards hold: the records carry their values."""
    import json

    docs = ["同一段文字重复出现，用来检查记录里的来源编号。" * 3] * 2 + ["另一段完全不同的文字内容，不会被去重。" * 3]
    sources = [json.dumps(x) for x in (17, {"k": "甲"}, None)]
    cfg = DedupConfig()
    dd = Deduplicator(cfg, None, "run", decode_source=json.loads)
    keys = np.array([exact_key(t) for t in docs], dtype=np.uint64)
    sigs = signatures(*shingle_hashes([dedup_form(t) for t in docs], cfg.ngram), cfg.num_perm)
    decisions, records = dd.process([f"f:{i}" for i in range(3)], keys, sigs, sources=sources)
    assert list(decisions) == [KEEP, EXACT, KEEP]
    assert [(r["id"], r["kept_id"]) for r in records] == [({"k": "甲"}, 17)]
    assert dd.segment()[3] == [17, None]


def test_closing_frees_the_run_lsh_without_a_cyclic_collection():
    """datasketch's MinHashLSH refers to itself (a bound method): without close() its hash tables outlive
    the dedup step until a full cyclic collection (or the interpreter's exit) walks them."""
    import gc
    import weakref

    docs, _ = planted_corpus()
    gc.disable()
    try:
        for close in (False, True):
            dd, _, _ = decide(docs)
            assert len(vars(dd.lsh.lsh)["keys"]) > 0  # documents were inserted
            lsh = weakref.ref(dd.lsh.lsh)
            if close:
                dd.close()
            del dd
            assert (lsh() is None) is close  # freed at once only when closed
            gc.collect()
            assert lsh() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("exact_on", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_collision_flags_with_exact_keys_decide_as_querying_and_inserting_everything(seed, exact_on):
    """Flags leave out bands shared only by exact copies; the decisions and records stay those of
    querying and inserting every document: copies of kept, near-removed and copied-again documents,
    in random order, with exact dedup on (the flags use the keys) and off (they must not)."""
    import random

    from pipeline_lib.data.dedup import collision_flags
    from pipeline_lib.data.minhash import band_keys, is_empty

    docs, pairs = planted_corpus(seed=seed)
    rng = random.Random(seed)
    copies = [docs[rng.randrange(len(docs))] for _ in range(120)]  # of bases, of near copies, of copies
    copies += [c for c in copies[:30]]
    docs = docs + copies
    rng.shuffle(docs)
    cfg = DedupConfig(exact=exact_on)
    keys = np.array([exact_key(t) for t in docs], dtype=np.uint64)
    sigs = signatures(*shingle_hashes([dedup_form(t) for t in docs], cfg.ngram), cfg.num_perm)
    ids = [f"f:{i}" for i in range(len(docs))]
    everything = Deduplicator(cfg, None, "run").process(ids, keys, sigs)
    dd = Deduplicator(cfg, None, "run")
    bands = band_keys(sigs, dd.bands, dd.rows)
    query, insert = collision_flags(bands, is_empty(sigs), keys if exact_on else None)
    flagged = dd.process(ids, keys, sigs, query, insert)
    assert (flagged[0] == everything[0]).all() and flagged[1] == everything[1]
    assert (everything[0] == EXACT).sum() >= 100 * exact_on and (everything[0] == NEAR).sum() >= 50
    plain_query, plain_insert = collision_flags(bands, is_empty(sigs))
    if exact_on:  # exact copies no longer count as collisions
        assert insert.sum() < plain_insert.sum() and query.sum() < plain_query.sum()
    else:
        assert (insert == plain_insert).all() and (query == plain_query).all()
