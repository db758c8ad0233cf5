"""The partitioned dedup index: same decisions as the whole index in memory, old formats, commits
that race (two processes, local and S3)."""
import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from datagen import make_cfg
from pipeline_lib.data import index_partitions
from pipeline_lib.data.dedup import Deduplicator
from pipeline_lib.data.dedup_index import (commit_segment, index_uri, load_prior, load_prior_in_memory,
                                           migrate_index, repartition_index, segment_meta, write_segment)
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.minhash import EMPTY, band_keys
from pipeline_lib.storage import generations, join, store_for

NUM_PERM = 128


def synthetic_runs(rng, n_runs=3, docs=300):
    """Per run (keys, sigs): random documents plus, in every run, documents sharing their first
    band (more than the per-band-key cap of 64 over all runs), a key repeated across runs, and
    a few empty signatures."""
    runs = []
    for r in range(n_runs):
        keys = rng.integers(0, 2**63, docs, dtype=np.uint64) * np.uint64(2) + np.uint64(r % 2)
        sigs = rng.integers(0, 2**32 - 1, (docs, NUM_PERM), dtype=np.uint32)
        sigs[:40, :32] = 7  # 40 docs per run sharing bands 0..: 120 share band keys > CAP
        keys[5] = 12345    # the same exact key in every run: the earliest run must win
        sigs[-3:] = EMPTY
        runs.append((keys, sigs))
    return runs


def new_batch(rng, runs, n_random=150):
    """New documents: copies (exact), perturbed copies (near), band-sharing ones, random ones."""
    keys, sigs = [], []
    for r, (k, s) in enumerate(runs):
        keys += [k[5], k[10 + r], rng.integers(0, 2**63, dtype=np.uint64)]
        near = s[20 + r].copy()
        near[rng.choice(NUM_PERM, 8, replace=False)] += 1
        sigs += [s[5], s[10 + r], near]
        templ = s[1].copy()
        templ[32:] = rng.integers(0, 2**32 - 1, NUM_PERM - 32, dtype=np.uint32)
        keys.append(rng.integers(0, 2**63, dtype=np.uint64))
        sigs.append(templ)
    keys += list(rng.integers(0, 2**63, n_random, dtype=np.uint64))
    sigs += list(rng.integers(0, 2**32 - 1, (n_random, NUM_PERM), dtype=np.uint32))
    return np.array(keys, np.uint64), np.array(sigs, np.uint32)


def commit_runs(cfg, runs, tmp_path: Path, names=None, inputs=None):
    for i, (keys, sigs) in enumerate(runs):
        run_id = names[i] if names else f"night{i + 1}"
        ids = [f"day{i}.jsonl:{j}" for j in range(len(keys))]
        folder = tmp_path / "segs" / run_id
        meta = segment_meta(cfg, run_id, len(keys), True, inputs[i] if inputs else None)
        files = write_segment(folder, meta, ids, keys, sigs, [f"src-{i}-{j}" for j in range(len(keys))])
        commit_segment(folder, files, index_uri(cfg), run_id, cfg.run.s3_endpoint_url)


def decide(cfg, prior, keys, sigs):
    dd = Deduplicator(cfg.data.dedup, prior, "tonight")
    return dd.process([f"new.jsonl:{i}" for i in range(len(keys))], keys, sigs)


def both_priors(cfg, keys, sigs, exclude="tonight", inputs=None):
    d = cfg.data.dedup
    dd = Deduplicator(d)
    memory = load_prior_in_memory(cfg, exclude, dd.bands, dd.rows, inputs=inputs)
    parted = load_prior(cfg, exclude, dd.bands, dd.rows, inputs=inputs, keys=keys,
                        band_keys_=band_keys(sigs, dd.bands, dd.rows))
    return memory, parted


@pytest.mark.parametrize("block", [None, 7])  # 7: every partition file spans many blocks
def test_partitioned_lookups_decide_exactly_as_the_whole_index_in_memory(tmp_path, monkeypatch, block):
    if block:
        monkeypatch.setattr(index_partitions, "BLOCK", block)
    rng = np.random.default_rng(3)
    cfg = make_cfg(tmp_path)
    runs = synthetic_runs(rng)
    commit_runs(cfg, runs, tmp_path)
    keys, sigs = new_batch(rng, runs)
    memory, parted = both_priors(cfg, keys, sigs)
    assert len(parted) == len(memory) == 900 and parted.runs == memory.runs
    assert len(parted.ids) < 200  # only the documents the batch hit were fetched
    d_mem, r_mem = decide(cfg, memory, keys, sigs)
    d_par, r_par = decide(cfg, parted, keys, sigs)
    assert (d_mem != 0).sum() >= 9 and {r["kind"] for r in r_mem} == {"exact", "near"}
    assert any(r["kept_run"] == "night1" and r["kept_id"] == "src-0-5" for r in r_mem)  # earliest run wins
    assert list(d_par) == list(d_mem) and r_par == r_mem


def test_rerun_rule_and_own_run_are_left_out_as_in_memory(tmp_path):
    rng = np.random.default_rng(4)
    cfg = make_cfg(tmp_path)
    runs = synthetic_runs(rng, n_runs=2, docs=100)
    files = [[{"uri": f"/in/{n}.jsonl", "size": 1, "fingerprint": f"sha256:{n}"}] for n in ("a", "b")]
    commit_runs(cfg, runs, tmp_path, inputs=files)
    keys, sigs = new_batch(rng, runs, n_random=5)
    memory, parted = both_priors(cfg, keys, sigs, exclude="night2", inputs=files[0])
    assert memory.reruns == parted.reruns == ["night1"] and parted.runs == [] and len(parted) == 0
    records = decide(cfg, parted, keys, sigs)[1]
    assert records == decide(cfg, memory, keys, sigs)[1] and all(r["kept_run"] is None for r in records)


def write_old_segment(folder: Path, meta: dict, ids, keys, sigs):
    """A segment as earlier versions wrote it (no line offsets, no format in meta.json)."""
    folder.mkdir(parents=True)
    np.save(folder / "keys.npy", keys)
    np.save(folder / "sigs.npy", sigs)
    (folder / "ids.txt").write_text("".join(i + "\n" for i in ids))
    (folder / "meta.json").write_text(json.dumps({k: v for k, v in meta.items()
                                                  if k not in ("format", "threshold", "bands", "rows")}))


def test_an_old_format_index_is_refused_with_the_fix_and_migrate_keeps_every_document(tmp_path):
    rng = np.random.default_rng(5)
    cfg = make_cfg(tmp_path)
    (keys, sigs), = synthetic_runs(rng, n_runs=1, docs=50)
    ids = [f"old.jsonl:{j}" for j in range(50)]
    write_old_segment(Path(index_uri(cfg)) / "segments" / "old1", segment_meta(cfg, "old1", 50, True), ids, keys, sigs)
    new_keys, new_sigs = keys[:3], sigs[:3]
    with pytest.raises(DataStageError, match="earlier llm-pipeline version.*dedup-index migrate"):
        both_priors(cfg, new_keys, new_sigs)
    assert migrate_index(cfg) == ["old1"] and migrate_index(cfg) == []
    memory, parted = both_priors(cfg, new_keys, new_sigs)
    assert decide(cfg, parted, new_keys, new_sigs)[1] == decide(cfg, memory, new_keys, new_sigs)[1]
    assert [r["kept_origin"] for r in decide(cfg, parted, new_keys, new_sigs)[1]] == ids[:3]


def test_a_threshold_with_another_band_layout_is_refused_naming_it(tmp_path):
    rng = np.random.default_rng(6)
    cfg = make_cfg(tmp_path)
    commit_runs(cfg, synthetic_runs(rng, n_runs=1, docs=20), tmp_path)
    other = make_cfg(tmp_path, dedup={"threshold": 0.5})
    dd = Deduplicator(other.data.dedup)
    with pytest.raises(DataStageError,
                       match=r"data.dedup.threshold=0.5: .*14 bands x 9 rows.*Fix: set data.dedup.threshold=0.8"):
        load_prior(other, "x", dd.bands, dd.rows, keys=np.zeros(1, np.uint64),
                   band_keys_=np.zeros((1, dd.bands), np.uint64))


# --- two runs committing at once ----------------------------------------------------------------

def _commit_in_child(cfg_root: str, endpoint: str | None, run_id: str, seed: int, barrier, uncoordinated: bool):
    """One process: commit a run of 200 documents; its first partition write waits for the other
    process to have read the same partition (so both write on top of the same generation)."""
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.storage import store as store_mod

    cfg = config_from_dict({"run": {"output_root": cfg_root, "s3_endpoint_url": endpoint}})
    if uncoordinated:  # what an unconditional put (the old commits) does: last writer wins
        def put_new(self, uri, data):
            (self.put_bytes(uri, data) if isinstance(data, bytes) else self.put_file(data, uri))
            return True
        store_mod.LocalStore.put_new = put_new
        store_mod.S3Store.put_new = put_new
    waited = []

    def after_read():
        if not waited:
            waited.append(1)
            barrier.wait(60)
    rng = np.random.default_rng(seed)
    (keys, sigs), = synthetic_runs(rng, n_runs=1, docs=200)
    folder = Path(cfg_root if not endpoint else "/tmp") / f"child-{run_id}-{seed}"
    meta = segment_meta(cfg, run_id, 200, True)
    names = write_segment(folder, meta, [f"{run_id}:{j}" for j in range(200)], keys, sigs)
    commit_segment(folder, names, index_uri(cfg), run_id, endpoint, after_read=after_read)


def entries_by_run(cfg) -> dict[str, int]:
    """How many exact-key entries of each run the partitions hold."""
    uri = index_uri(cfg)
    store = store_for(uri, cfg.run.s3_endpoint_url)
    counts: dict[str, int] = {}
    tags = {index_partitions.run_tag(r): r for r in ("a", "b")}
    for p in range(16):
        current = generations.latest(store, join(uri, "parts", "exact", "b04", f"p{p:04x}"))[1]
        for blk in index_partitions.iter_blocks(store, current):
            for t in blk["run"]:
                counts[tags[t]] = counts.get(tags[t], 0) + 1
    return counts


def commit_two_at_once(cfg, uncoordinated: bool) -> dict[str, int]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_commit_in_child, args=(cfg.run.output_root, cfg.run.s3_endpoint_url, run, seed,
                                                        barrier, uncoordinated))
             for run, seed in (("a", 1), ("b", 2))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0, 0]
    return entries_by_run(cfg)


def test_two_processes_committing_at_once_lose_nothing_local(tmp_path):
    cfg = make_cfg(tmp_path)
    assert commit_two_at_once(cfg, uncoordinated=False) == {"a": 200, "b": 200}
    memory = load_prior_in_memory(cfg, "x", 14, 9)
    assert len(memory) == 400 and memory.runs == ["a", "b"]


def test_the_same_race_with_unconditional_writes_loses_entries(tmp_path):
    """The check above has teeth: with the last writer winning (the uncoordinated commit), one
    run's entries of the partition both wrote at once are gone."""
    cfg = make_cfg(tmp_path)
    counts = commit_two_at_once(cfg, uncoordinated=True)
    assert counts.get("a", 0) + counts.get("b", 0) < 400


def test_two_processes_committing_at_once_lose_nothing_s3(s3_bucket, tmp_path):
    from pipeline_lib.config import config_from_dict

    bucket, endpoint = s3_bucket
    cfg = config_from_dict({"run": {"output_root": f"{bucket}/runs", "s3_endpoint_url": endpoint}})
    assert commit_two_at_once(cfg, uncoordinated=False) == {"a": 200, "b": 200}
    rng_keys = np.concatenate([synthetic_runs(np.random.default_rng(s), 1, 200)[0][0] for s in (1, 2)])
    dd = Deduplicator(cfg.data.dedup)
    prior = load_prior(cfg, "x", dd.bands, dd.rows, endpoint, keys=rng_keys[[3, 250]])
    assert len(prior) == 400 and sorted(prior.ids) == ["a/a:3", "b/b:50"]


def test_a_commit_that_keeps_losing_says_what_happened_and_a_retry_lands(tmp_path, monkeypatch):
    rng = np.random.default_rng(8)
    cfg = make_cfg(tmp_path)
    (keys, sigs), = synthetic_runs(rng, n_runs=1, docs=30)
    folder = tmp_path / "seg"
    names = write_segment(folder, segment_meta(cfg, "r1", 30, True), [f"f:{j}" for j in range(30)], keys, sigs)
    store = store_for(index_uri(cfg))
    with monkeypatch.context() as m:
        m.setattr(generations, "ATTEMPTS", 2)
        m.setattr(type(store), "put_new", lambda self, uri, data: uri.endswith("index.json") and
                  store.put_bytes(uri, data) is None)  # every partition write loses
        with pytest.raises(DataStageError, match="data.dedup.index_uri=.*run r1's documents could not be added.*"
                           ": 2 attempts.*Fix: run the stage again"):
            commit_segment(folder, names, index_uri(cfg), "r1")
    assert load_prior_in_memory(cfg, "x", 14, 9).runs == []  # no meta.json: the run is not in the index
    commit_segment(folder, names, index_uri(cfg), "r1")
    dd = Deduplicator(cfg.data.dedup)
    assert len(load_prior(cfg, "x", dd.bands, dd.rows, keys=keys[:1]).ids) == 1


def test_repartition_grows_the_index_even_with_a_commit_landing_in_the_old_layout(tmp_path):
    rng = np.random.default_rng(9)
    cfg = make_cfg(tmp_path)
    runs = synthetic_runs(rng, n_runs=3, docs=200)
    commit_runs(cfg, runs[:2], tmp_path)
    (keys, sigs), switched = runs[2], []

    def repartition_mid_commit():  # night3 has read the 4-bit layout and is about to write it
        if not switched:
            switched.append(repartition_index(cfg, 6))
    folder = tmp_path / "segs" / "night3"
    names = write_segment(folder, segment_meta(cfg, "night3", 200, True), [f"day2.jsonl:{j}" for j in range(200)],
                          keys, sigs, [f"src-2-{j}" for j in range(200)])
    commit_segment(folder, names, index_uri(cfg), "night3", after_read=repartition_mid_commit)
    assert switched == [4] and json.loads((Path(index_uri(cfg)) / "index.json").read_text())["prefix_bits"] == 6
    assert len(list((Path(index_uri(cfg)) / "parts" / "exact" / "b06").iterdir())) == 64
    new_keys, new_sigs = new_batch(rng, runs)
    memory, parted = both_priors(cfg, new_keys, new_sigs)
    d_mem, r_mem = decide(cfg, memory, new_keys, new_sigs)
    assert {r["kept_run"] for r in r_mem} == {"night1", "night2", "night3"}
    assert decide(cfg, parted, new_keys, new_sigs)[1] == r_mem
    with pytest.raises(DataStageError, match="prefix_bits=6; it can only grow"):
        repartition_index(cfg, 5)
