"""The whole data stage on the bundled tiny corpus: accounting, outputs, MindDataset, resume,
determinism across worker counts, and incremental dedup across two nightly runs."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from datagen import TINY, make_cfg, write_jsonl
from make_tiny_corpus import PLANTED, make_corpus

import pipeline_lib.data.prep as prep
from pipeline_lib.data.stats import table_rows
from pipeline_lib.data.dedup_index import index_uri, list_segments
from pipeline_lib.data.errors import DataStageError, NoNewDocuments
from pipeline_lib.data.packing import read_mindrecord
from pipeline_lib.model.tokenizer import Tokenizer
from pipeline_lib.config.identity import stage_hash
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths, read_manifest


def run(cfg, run_id="r1", **kw):
    return run_stage(cfg, RunPaths(cfg.run.output_root, run_id), "data", **kw)[0]


def stage_dir(cfg, run_id="r1") -> Path:
    return Path(cfg.run.output_root) / run_id / "data"


STEPS = ["prep", "dedup-partitions", "dedup", "tokenizer", "tokenize", "mindrecord", "finalize"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    cfg = make_cfg(tmp_path_factory.mktemp("tiny"), docs_per_shard=100)
    seen = []
    manifest = run(cfg, workers=1, progress=lambda step, done, total: seen.append((step, done, total)))
    assert [s for s, d, t in seen if d == t] == STEPS and ("prep", 2, 5) in seen
    return cfg, manifest


def test_bundled_corpus_is_reproducible_and_small():
    data = b"\n".join(make_corpus()) + b"\n"
    assert data == TINY.read_bytes() and len(data) < 300_000


def test_every_record_is_accounted_for(tiny_run):
    cfg, manifest = tiny_run
    stats = json.loads((stage_dir(cfg) / "stats.json").read_text())
    t = stats["total"]
    assert stats["balanced"] and t["balanced"] and stats["files"]["tiny_corpus.jsonl"]["balanced"]
    assert (t["rejected_total"], t["filtered_total"], t["exact_duplicates"], t["near_duplicates"]) == \
        (PLANTED["rejected"], PLANTED["filtered"], PLANTED["exact_duplicates"], PLANTED["near_duplicates"])
    assert t["read"] == t["rejected_total"] + t["filtered_total"] + 6 + t["kept"] == 438
    assert set(t["rejected"]) == {"bad_json", "bad_utf8", "empty_line", "empty_text", "missing_text",
                                  "not_an_object", "text_not_string"}
    assert set(t["filtered"]) == {"too_short", "url_heavy", "low_text_ratio", "dup_lines", "boilerplate"}
    quarantine = [json.loads(x) for x in (stage_dir(cfg) / "quarantine.jsonl").read_text().splitlines()]
    excluded = [json.loads(x) for x in (stage_dir(cfg) / "excluded.jsonl").read_text().splitlines()]
    dups = [json.loads(x) for x in (stage_dir(cfg) / "duplicates.jsonl").read_text().splitlines()]
    assert len(quarantine) == 7 and len(excluded) == 5 and len(dups) == 6
    raw_lines = TINY.read_bytes().split(b"\n")
    for q in quarantine:  # line numbers point at the right lines, raw text kept
        assert q["origin"] == f"tiny_corpus.jsonl:{q['line']}"
        assert raw_lines[q["line"] - 1].decode("utf-8", "backslashreplace") == q["raw"]
        assert q["id"] == (json.loads(q["raw"])["id"] if q["reason"] in ("missing_text", "text_not_string")
                           else q["origin"])  # records that are no JSON object have only their origin
    assert {e["filter"] for e in excluded} == {"length", "url_heavy", "char_ratio", "duplicate_lines"}
    assert manifest.metrics["kept"] == t["kept"] and table_rows(stats)[-1]["file"] == "TOTAL"


def test_outputs_are_listed_in_the_manifest_and_work_files_removed(tiny_run):
    cfg, manifest = tiny_run
    folder = stage_dir(cfg)
    paths = {o["path"] for o in manifest.outputs}
    assert {"stats.json", "tokenizer/tokenizer.model", "quarantine.jsonl", "duplicates.jsonl",
            "mindrecord/train/shard-00000.mindrecord", "mindrecord/heldout/shard-00000.mindrecord.db"} <= paths
    for o in manifest.outputs:
        assert (folder / o["path"]).stat().st_size == o["size"]
    assert read_manifest(str(folder)).config_hash == manifest.config_hash
    assert not (folder / "shards").exists()


def test_minddataset_reads_every_shard_and_rows_hold_the_cleaned_documents(tiny_run):
    cfg, _ = tiny_run
    folder = stage_dir(cfg)
    stats = json.loads((folder / "stats.json").read_text())
    tok = Tokenizer(folder / "tokenizer" / "tokenizer.model")
    docs = [json.loads(line) for part in sorted((folder / "cleaned").glob("part-*.jsonl.gz"))
            for line in gzip.open(part, "rt", encoding="utf-8")]
    assert len(docs) == stats["total"]["kept"]
    lines = [int(d["origin"].split(":")[1]) for d in docs]
    assert lines == sorted(lines)  # input order
    for split in ("train", "heldout"):
        files = sorted((folder / "mindrecord" / split).glob("*.mindrecord"))
        rows = read_mindrecord(files)
        assert rows.shape == (stats["total"][f"rows_{split}"], 65) and rows.dtype == np.int32
        want = np.concatenate([np.array(tok.encode(d["text"]) + [3]) for d in docs if d["split"] == split])
        flat = rows.reshape(-1)
        assert (flat[:len(want)] == want).all() and (flat[len(want):] == 0).all()  # padded with pad 0
        assert 0 not in want
    assert len(list((folder / "mindrecord" / "train").glob("*.mindrecord"))) == 2  # 200 rows per file


@pytest.mark.slow
def test_output_does_not_depend_on_the_number_of_workers(tiny_run, tmp_path, monkeypatch):
    cfg, manifest = tiny_run
    other = make_cfg(tmp_path, docs_per_shard=100)
    import pipeline_lib.data.stage as stage

    monkeypatch.setattr(stage, "_MINDSPORE_IMPORT_S", 0)  # the MindRecord groups go to the pool too
    monkeypatch.setattr(stage, "_SPREAD_MIN_S", 0)
    assert run(other, workers=2).outputs == manifest.outputs


def test_mindrecord_files_spread_over_lanes_only_when_that_saves_more_than_the_imports(tmp_path):
    """The bench's 10x plan (635,109 train rows of 65 tokens, 33,000 held out): in 256 MB files the held-out
    file is all a second lane would take (one group, in the warm writer); in 64 MB files (258,111 rows) two
    lanes, the heaviest group first (the warm writer's, no import); without a warm writer (Dask) every group
    pays one. A night's few files stay in one process. At 30x in 256 MB files the second train file spreads."""
    import pipeline_lib.data.stage as stage
    from pipeline_lib.data.workspace import Workspace

    cfg, paths = make_cfg(tmp_path), RunPaths(str(tmp_path / "out"), "r1")
    pool = object()  # stands for the shard pool: mindrecord_work only decides whether to hand it back

    def decide(train_rows, heldout_rows, per, warm=True):
        plan = {sp: {"rows": n, "rows_per_file": per, "row_len": 65}
                for sp, n in (("train", train_rows), ("heldout", heldout_rows))}
        Workspace(cfg, paths, False).write_json("shards/mindrecord.json", plan)
        items = [(sp, j) for sp in plan for j in range(-(-plan[sp]["rows"] // per))]
        return stage.mindrecord_work(pool, cfg, paths, items, 2, warm=warm)

    mb256, mb64 = 1_032_444, 258_111
    assert decide(635_109, 33_000, mb256) == (None, [[("train", 0), ("heldout", 0)]])
    lanes = [[("train", 0), ("train", 2)], [("train", 1), ("heldout", 0)]]
    assert decide(635_109, 33_000, mb64) == (pool, lanes)
    assert decide(635_109, 33_000, mb64, warm=False) == (pool, lanes)
    assert decide(150_000, 8_000, mb64) == (None, [[("train", 0), ("heldout", 0)]])
    assert decide(1_900_000, 70_000, mb256) == (pool, [[("train", 0)], [("train", 1), ("heldout", 0)]])
    assert stage.mindrecord_work(None, cfg, paths, [("train", 0), ("train", 1), ("heldout", 0)], 2)[0] is None


def test_the_warm_writer_takes_the_first_group_and_the_pool_the_rest():
    """MindRecordLanes: the heaviest group (submitted first) where MindSpore is imported already."""
    import concurrent.futures as cf
    import os

    from pipeline_lib.data.stage import MindRecordLanes

    with cf.ThreadPoolExecutor(1) as writer, cf.ProcessPoolExecutor(1) as pool:
        lanes = MindRecordLanes(writer, pool)
        pids = [f.result() for f in [lanes.submit(os.getpid) for _ in range(3)]]
    assert pids[0] == os.getpid() and pids[1] == pids[2] != os.getpid()


def test_mindrecord_files_are_sized_by_megabytes(tmp_path):
    """Without rows_per_mindrecord_shard, a file holds mindrecord_file_mb of 4-byte tokens in whole rows."""
    cfg = make_cfg(tmp_path, rows_per_mindrecord_shard=None, mindrecord_file_mb=0.02)
    per_file = int(0.02 * (1 << 20)) // (4 * 65)
    m = run(cfg, workers=1).metrics
    files = sorted((stage_dir(cfg) / "mindrecord" / "train").glob("*.mindrecord"))
    sizes = [len(read_mindrecord([f])) for f in files]
    assert len(files) == -(-m["rows_train"] // per_file) >= 3
    assert sizes[:-1] == [per_file] * (len(files) - 1) and sum(sizes) == m["rows_train"]
    stats = json.loads((stage_dir(cfg) / "stats.json").read_text())
    assert stats["mindrecord_files"]["train"] == len(files)
    sample = stats["tokenizer"]["sample"]  # the tokenizer's training sample
    assert 0 < sample["lines_trained"] == min(sample["lines"], cfg.tokenizer.sample_lines)
    assert 0 < sample["chars_trained"] <= cfg.tokenizer.sample_chars


def test_rerun_is_skipped_and_an_interrupted_run_redoes_only_unfinished_shards(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path, docs_per_shard=150)
    paths = RunPaths(cfg.run.output_root, "r1")
    shards = prep.plan_data_stage(cfg, paths)
    assert len(shards) == 3
    prep.prep_shard(cfg, paths, 0)  # ... then the machine dies
    read = []
    real = prep.iter_shard_batches
    monkeypatch.setattr(prep, "iter_shard_batches", lambda spec, *a: (read.append(spec.index), real(spec, *a))[1])
    manifest = run(cfg, workers=1)
    assert read == [1, 2] and manifest.metrics["read"] == 438
    read.clear()
    assert run(cfg, workers=1).outputs == manifest.outputs and read == []


def test_continued_pretraining_keeps_the_base_tokenizer(tiny_run, tmp_path):
    cfg, _ = tiny_run
    base = stage_dir(cfg) / "tokenizer" / "tokenizer.model"
    other = make_cfg(tmp_path, docs_per_shard=100)
    other.tokenizer.path, other.tokenizer.vocab_size = str(base), 500  # vocab_size is ignored when loading
    run(other, workers=1)
    folder = stage_dir(other)
    assert (folder / "tokenizer" / "tokenizer.model").read_bytes() == base.read_bytes()
    meta = json.loads((folder / "tokenizer" / "tokenizer_config.json").read_text())
    assert meta["source"] == f"loaded from {base}" and meta["vocab_size"] == 2000
    other.model.vocab_size = 1024
    with pytest.raises(DataStageError, match="model.vocab_size=1024"):
        run(other, "r2", workers=1)


def test_a_llama2_layout_base_tokenizer_passes_with_its_own_ids(llama2_tokenizer, tmp_path):
    """Llama-2: unk 0, bos 1, eos 2, no pad piece. The data stage keeps those ids (pad = unk = 0, recorded in
    tokenizer_config.json), joins documents with eos 2 and pads the last row with 0."""
    cfg = make_cfg(tmp_path, docs_per_shard=100)
    cfg.tokenizer.path, cfg.model.vocab_size, cfg.sft.template = str(llama2_tokenizer), 1000, "llama2"
    cfg.data.remainder = "pad"
    run(cfg, workers=1)
    folder = stage_dir(cfg)
    meta = json.loads((folder / "tokenizer" / "tokenizer_config.json").read_text())
    assert {k: meta[k] for k in ("pad_id", "unk_id", "bos_id", "eos_id")} == {"pad_id": 0, "unk_id": 0,
                                                                            "bos_id": 1, "eos_id": 2}
    assert meta["special_tokens"] == []  # a base tokenizer has no chat markers; llama2 needs none
    rows = read_mindrecord(sorted((folder / "mindrecord" / "train").glob("*.mindrecord")))
    stats = json.loads((folder / "stats.json").read_text())
    pad = stats["pad_tokens"]["train"]
    assert (rows == 2).sum() >= stats["total"]["kept"] // 2  # documents joined by the base's eos
    assert (rows[-1, rows.shape[1] - pad:] == 0).all() and (rows[:-1] != 0).all()  # only the tail is padding


def test_nothing_left_after_cleaning_is_no_usable_data_with_the_reasons_and_where_the_records_are(tmp_path):
    path = write_jsonl(tmp_path / "short.jsonl", ["太短", "too short"])
    path.write_text(path.read_text() + "not json\n")
    cfg = make_cfg(tmp_path, inputs=[str(path)])
    with pytest.raises(NoNewDocuments, match=r"data.inputs=.*no usable document: all 3 records") as err:
        run(cfg, workers=1)
    found = json.loads((stage_dir(cfg) / "no_new_documents.json").read_text())  # the nightly consumes the file
    assert found == err.value.counts and found["kind"] == "no_usable_documents"
    assert found["rejected"] == {"bad_json": 1} and sum(found["filtered"].values()) == 2
    for uri in found["records"]["quarantine.jsonl"] + found["records"]["excluded.jsonl"]:
        assert Path(uri).exists() and uri in str(err.value)  # the message points at files that exist


def test_no_record_with_the_text_field_is_a_config_error_and_nothing_is_consumed(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text('{"content": "电流互感器的巡视检查应由两名以上持证人员共同完成"}\n' * 3)
    cfg = make_cfg(tmp_path, inputs=[str(path)])
    with pytest.raises(DataStageError, match=r"data.text_field='text': none of the 3 records") as err:
        run(cfg, workers=1)
    assert err.value.field == "data.text_field" and "Fix: set data.text_field" in str(err.value)
    assert not (stage_dir(cfg) / "no_new_documents.json").exists()


@pytest.mark.slow
def test_incremental_dedup_against_an_earlier_run_and_failed_runs_leave_no_trace(tmp_path):
    texts = [json.loads(x)["text"] for x in TINY.read_text(errors="replace").splitlines()
             if x.endswith('"source": "tiny"}')]
    day1 = write_jsonl(tmp_path / "in" / "day1.jsonl", texts[:200])
    zh = [t for t in texts[:150] if "，" in t and len(t) > 100]
    day2 = write_jsonl(tmp_path / "in" / "day2.jsonl", texts[150:260] + [zh[0] + "。", zh[1].replace("，", "，并且", 1)])
    run(make_cfg(tmp_path, inputs=[str(day1)]), "night1", workers=1)
    failing = make_cfg(tmp_path, inputs=[str(day2)])
    failing.model.seq_length, failing.data.remainder = 1_000_000, "drop"  # fails after merging its entries
    parts = tmp_path / "runs" / "_dedup_index" / "tiny-cpu" / "parts"  # the lineage defaults to run.name
    before = sorted(parts.rglob("*.bin"))
    with pytest.raises(DataStageError, match="model.seq_length"):
        run(failing, "night2", workers=2)
    assert sorted(parts.rglob("*.bin")) != before  # ... and no reader sees them without a segment:
    index = tmp_path / "runs" / "_dedup_index" / "tiny-cpu" / "segments"
    assert sorted(p.name for p in index.iterdir()) == ["night1"]
    m = run(make_cfg(tmp_path, inputs=[str(day2)]), "night2", workers=1)
    dups = [json.loads(x) for x in (stage_dir(failing, "night2") / "duplicates.jsonl").read_text().splitlines()]
    assert (m.metrics["exact_duplicates"], m.metrics["near_duplicates"], m.metrics["kept"]) == (50, 2, 60)
    assert all(d["kept_run"] == "night1" and d["kept_origin"].startswith("day1.jsonl:") for d in dups)
    # write_jsonl gives no ids: the kept documents' origins stand in for them, across runs too
    assert all(d["kept_id"] == d["kept_origin"] and d["id"] == d["origin"] for d in dups)
    assert sorted(p.name for p in index.iterdir()) == ["night1", "night2"]
    meta = json.loads((index / "night2" / "meta.json").read_text())
    assert meta["docs"] == 60 and meta["has_sigs"]


def tiny_texts() -> list[str]:
    """The texts of the bundled corpus' well-formed records, in file order."""
    return [r["text"] for r in raw_records(TINY).values() if isinstance(r.get("text"), str) and r["text"].strip()]


def test_the_same_config_twice_with_new_run_ids_gives_the_same_dataset(tmp_path):
    """`llm-pipeline run` of the default twice: the second run rereads the same files, so it is not
    deduplicated against the first (the rerun rule), and both succeed with the same documents."""
    cfg = make_cfg(tmp_path)
    first = run(cfg, "r1", workers=1)
    second = run(cfg, "r2", workers=1)
    for key in ("read", "exact_duplicates", "near_duplicates", "kept", "rows_train"):
        assert second.metrics[key] == first.metrics[key], key
    assert json.loads((stage_dir(cfg, "r2") / "stats.json").read_text())["dedup"]["prior_docs"] == 0
    assert [m["run_id"] for m in list_segments(cfg)] == ["r1", "r2"]
    # a third run reading the same file plus a new one is still checked against nothing it rereads,
    # but a run reading only the new file is checked against the earlier ones
    texts = tiny_texts()
    extra = write_jsonl(tmp_path / "in" / "extra.jsonl", texts[:200])
    both = make_cfg(tmp_path, inputs=[str(TINY), str(extra)])
    assert run(both, "r3", workers=1).metrics["kept"] == first.metrics["kept"]
    assert json.loads((stage_dir(cfg, "r3") / "stats.json").read_text())["dedup"]["prior_docs"] == 0
    with pytest.raises(NoNewDocuments):
        run(make_cfg(tmp_path, inputs=[str(extra)]), "r4", workers=1)


def test_a_run_with_only_earlier_documents_fails_at_dedup_naming_counts_index_and_ways_out(tmp_path):
    texts = tiny_texts()
    day1 = write_jsonl(tmp_path / "in" / "day1.jsonl", texts[:200])
    day2 = write_jsonl(tmp_path / "in" / "day2.jsonl", texts[:120] + texts[:10])  # all seen yesterday
    run(make_cfg(tmp_path, inputs=[str(day1)]), "night1", workers=1)
    cfg = make_cfg(tmp_path, inputs=[str(day2)])
    paths = RunPaths(cfg.run.output_root, "night2")
    prep.plan_data_stage(cfg, paths)
    counts = [prep.prep_shard(cfg, paths, k) for k in range(len(prep.plan_data_stage(cfg, paths)))]
    with pytest.raises(NoNewDocuments) as err:
        prep.dedup_stage(cfg, paths)  # the dedup step itself fails, not the tokenizer after it
    msg, found = str(err.value), err.value.counts
    candidates = sum(c["candidates"] for c in counts)
    assert found["read"] == 130 and found["kept"] == 0
    # the repeats inside day2 also match night1's documents (nothing of day2 is kept to match them)
    assert found["duplicates_of_earlier_runs"] == candidates > 100 and found["earlier_runs"] == ["night1"]
    assert "of 130 read" in msg and f"{found['duplicates_of_earlier_runs']} in earlier runs" in msg
    assert index_uri(cfg) in msg and "data.dedup.lineage=" in msg and "data.dedup.incremental=false" in msg
    assert "llm-pipeline dedup-index list|clear CONFIG --lineage tiny-cpu" in msg
    assert json.loads((stage_dir(cfg, "night2") / "no_new_documents.json").read_text()) == found
    # the ways out work: a fresh lineage sees nothing of night1's index
    fresh = make_cfg(tmp_path, inputs=[str(day2)], dedup={"lineage": "fresh"})
    assert run(fresh, "night2b", workers=1).metrics["kept"] > 0
    assert index_uri(fresh) != index_uri(cfg)


def raw_records(path: Path) -> dict:
    """{line number: record} of the JSON-object lines of a jsonl file."""
    out = {}
    for n, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out[n] = obj
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def cleaned_docs(folder: Path) -> list[dict]:
    return [json.loads(line) for part in sorted((folder / "cleaned").glob("part-*.jsonl.gz"))
            for line in gzip.open(part, "rt", encoding="utf-8")]


def test_every_output_record_names_the_source_id_of_the_bundled_corpus(tiny_run):
    cfg, _ = tiny_run
    folder, raw = stage_dir(cfg), raw_records(TINY)

    def source(origin: str) -> dict:
        label, line = origin.rsplit(":", 1)
        assert label == "tiny_corpus.jsonl"
        return raw[int(line)]

    docs = cleaned_docs(folder)
    assert len(docs) == 420 and len({d["id"] for d in docs}) == 420
    for d in docs:
        rec = source(d["origin"])
        assert d["id"] == rec["id"] and d["id"].startswith("pm-")
        assert d["meta"] == {"lang": rec["lang"], "source": rec["source"]}
    excluded = read_jsonl(folder / "excluded.jsonl")
    assert [e["id"] for e in excluded] == [source(e["origin"])["id"] for e in excluded]
    dups = read_jsonl(folder / "duplicates.jsonl")
    assert len(dups) == 6
    for d in dups:
        assert d["id"] == source(d["origin"])["id"] and d["kept_id"] == source(d["kept_origin"])["id"]
        assert source(d["origin"])["source"] == "dup" and source(d["kept_origin"])["source"] == "tiny"
    quarantined = {q["id"] for q in read_jsonl(folder / "quarantine.jsonl")}
    assert {"pm-x01", "pm-x02"} <= quarantined
    by_id = {d["id"]: d for d in docs}
    for split in ("train", "heldout"):
        sides = sorted((folder / "mindrecord" / split).glob("*.docs.jsonl"))
        spans = [s for side in sides for s in read_jsonl(side)]
        assert {s["id"] for s in spans} == {d["id"] for d in docs if d["split"] == split}
        assert all(by_id[s["id"]]["origin"] == s["origin"] for s in spans)
    assert any("，" in d["text"] for d in docs)


def test_sidecar_maps_every_mindrecord_row_to_the_documents_packed_in_it(tiny_run):
    cfg, manifest = tiny_run
    folder = stage_dir(cfg)
    tok = Tokenizer(folder / "tokenizer" / "tokenizer.model")
    texts = {d["origin"]: d["text"] for d in cleaned_docs(folder)}
    listed = {o["path"] for o in manifest.outputs}
    checked = 0
    for split in ("train", "heldout"):
        for shard in sorted((folder / "mindrecord" / split).glob("*.mindrecord")):
            side = shard.with_name(shard.name.replace(".mindrecord", ".docs.jsonl"))
            assert f"mindrecord/{split}/{side.name}" in listed
            spans, rows = read_jsonl(side), read_mindrecord([shard])
            row_len = rows.shape[1]
            flat = rows.reshape(-1)
            for r in range(len(rows)):
                in_row = [s for s in spans if s["row_start"] <= r <= s["row_end"]]
                lo, hi = r * row_len, (r + 1) * row_len
                covered = sum(min(s["token_end"], hi) - max(s["token_start"], lo) for s in in_row)
                assert covered == row_len or (flat[lo + covered:hi] == 0).all()  # the rest is padding
                for s in in_row:  # this row's tokens of each mapped document decode to part of its text
                    piece = tok.decode(flat[max(s["token_start"], lo):min(s["token_end"], hi)]).strip("\ufffd")
                    assert piece in texts[s["origin"]], (split, shard.name, r, s)
                    checked += 1
    assert checked > 400


def test_source_ids_metadata_and_cjk_punctuation_survive_jsonl_and_parquet_inputs(tmp_path):
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    zh = [json.loads(x)["text"] for x in TINY.read_text(encoding="utf-8", errors="replace").splitlines()
          if x.endswith('"source": "tiny"}') and '"lang": "zh"' in x]
    assert len(zh) >= 200 and all("，" in t for t in zh[:200])
    recs = [{"doc_id": f"J{i % 140}", "text": t, "lang": "zh", "url": f"https://example.com/{i}"}
            for i, t in enumerate(zh[:150])]  # J0..J9 appear twice: ids need not be unique
    del recs[5]["doc_id"]
    recs += [{"doc_id": "DUP", "text": zh[3], "lang": "zh"}, {"doc_id": "SHORT", "text": "太短了，", "lang": "zh"},
             {"doc_id": "NOTEXT", "body": "no text field"}]
    jsonl = tmp_path / "in" / "zh.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    pq.write_table(pa.table({"text": zh[150:200], "doc_id": list(range(1000, 1050)),
                             "date": [datetime.date(2024, 6, 1)] * 50}), tmp_path / "in" / "zh.parquet")
    cfg = make_cfg(tmp_path, inputs=[str(jsonl), str(tmp_path / "in" / "zh.parquet")], id_field="doc_id",
                   keep_fields=["lang", "url", "date"])
    manifest = run(cfg, workers=1)
    folder = stage_dir(cfg)
    docs = {d["origin"]: d for d in cleaned_docs(folder)}
    assert len(docs) == 200 == manifest.metrics["kept"]
    for i, rec in enumerate(recs[:150]):
        d = docs[f"zh.jsonl:{i + 1}"]
        assert d["id"] == rec.get("doc_id", f"zh.jsonl:{i + 1}")
        assert d["meta"] == {"lang": "zh", "url": rec["url"]}
        assert d["text"] == rec["text"]  # the training text keeps its full-width punctuation
    for j in range(50):
        d = docs[f"zh.parquet:{j}"]
        assert (d["id"], d["meta"], d["text"]) == (1000 + j, {"date": "2024-06-01"}, zh[150 + j])
    assert sum(d["id"] == "J3" for d in docs.values()) == 2
    dup, = read_jsonl(folder / "duplicates.jsonl")
    assert (dup["id"], dup["origin"], dup["kept_id"], dup["kept_origin"], dup["kind"]) == \
        ("DUP", "zh.jsonl:151", "J3", "zh.jsonl:4", "exact")
    excluded, = read_jsonl(folder / "excluded.jsonl")
    assert (excluded["id"], excluded["origin"], excluded["meta"]) == ("SHORT", "zh.jsonl:152", {"lang": "zh"})
    quarantined, = read_jsonl(folder / "quarantine.jsonl")
    assert (quarantined["id"], quarantined["origin"], quarantined["reason"]) == ("NOTEXT", "zh.jsonl:153", "missing_text")
    spans = [s for side in sorted((folder / "mindrecord" / "train").glob("*.docs.jsonl")) for s in read_jsonl(side)]
    train = [(d["id"], o) for o, d in docs.items() if d["split"] == "train"]
    assert [(s["id"], s["origin"]) for s in spans] == train  # in packing order, each document once (one file)
    segment = tmp_path / "runs" / "_dedup_index" / "tiny-cpu" / "segments" / "r1" / "source_ids.jsonl"
    assert [json.loads(x) for x in segment.read_text().splitlines()].count("J3") == 2


@pytest.mark.parametrize("field,value", [("id_field", "doc_id"), ("keep_fields", ["url"])])
def test_identity_fields_are_part_of_the_stage_identity(tmp_path, field, value):
    from pipeline_lib.data.workspace import work_hash

    base, other = make_cfg(tmp_path), make_cfg(tmp_path, **{field: value})
    assert stage_hash(base, "data") != stage_hash(other, "data") and work_hash(base) != work_hash(other)


def test_the_work_hash_is_the_data_identity_so_where_the_work_runs_does_not_change_it(tmp_path):
    from pipeline_lib.data.workspace import work_hash

    base = make_cfg(tmp_path, executor="prefect")
    elsewhere = make_cfg(tmp_path, executor="dask", dask_address="tcp://scheduler:8786", num_workers=7)
    assert work_hash(base) == work_hash(elsewhere) == stage_hash(base, "data")


def test_pool_workers_fork_server_and_tracker_end_when_the_stage_process_is_sigkilled(sigkill_parent):
    """Without a watch on the stage process, its forkserver workers wait on their task queue forever."""
    alive, fields = sigkill_parent("""
import os, time
import psutil
from pipeline_lib.data.stage import _make_pool

def nap(seconds):
    time.sleep(seconds)
    return os.getpid()

if __name__ == "__main__":
    pool = _make_pool(2)
    workers = {f.result() for f in [pool.submit(nap, 0.2) for _ in range(4)]}
    pool.submit(nap, 300)  # one busy worker, one idle
    print("READY", *[p.pid for p in psutil.Process().children(recursive=True)], flush=True)
    time.sleep(300)
""", within=10)
    assert len(fields) >= 3 and alive == []  # 2 workers + the fork server (+ the resource tracker)


def test_pool_workers_start_before_the_first_task_and_yield_the_cpu_to_the_stage_process():
    """The workers boot while the inputs are listed, and run at a lower priority: what they do during
    the stage process's own single-threaded steps (dedup, tokenizer training) is not on its critical path."""
    import os
    import time

    import psutil

    from pipeline_lib.data.stage import WORKER_NICE, _make_pool, start_workers

    pool = _make_pool(2)
    try:
        start_workers(pool, 2)
        deadline = time.monotonic() + 60
        while len(pool._processes or {}) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pool._processes) == 2  # no task of ours submitted yet
        assert {pool.submit(os.nice, 0).result() for _ in range(4)} == {os.nice(0) + WORKER_NICE}

        def niced() -> bool:  # a worker lowers its priority in its initializer: a busy machine boots it later
            return all(psutil.Process(pid).nice() == os.nice(0) + WORKER_NICE for pid in pool._processes)
        while not niced() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert niced(), {pid: psutil.Process(pid).nice() for pid in pool._processes}
    finally:
        pool.shutdown(wait=True)


def test_a_staged_index_segment_is_seen_only_once_published(tmp_path):
    """Its entries are merged while the tokenizer trains; a run that fails after that is never
    deduplicated against, and finalizing publishes exactly the documents the dedup step kept."""
    from pipeline_lib.data.dedup_index import load_prior
    from pipeline_lib.data.encode import build_tokenizer, plan_mindrecord, tokenize_shard, write_mindrecord_shard
    from pipeline_lib.data.stage import finalize_data_stage

    cfg = make_cfg(tmp_path, docs_per_shard=100)
    paths = RunPaths(cfg.run.output_root, "r1")
    n = len(prep.plan_data_stage(cfg, paths))
    for k in range(n):
        prep.prep_shard(cfg, paths, k)
    prep.dedup_stage(cfg, paths)
    names = prep.stage_index_segment(cfg, paths)
    assert "meta.json" in names and prep.stage_index_segment(cfg, paths) == names  # marked: not redone

    def prior(run_id):
        return load_prior(cfg, run_id, 14, 9, inputs=[], keys=np.arange(3, dtype=np.uint64))

    assert prior("other").runs == [] and list_segments(cfg) == []
    build_tokenizer(cfg, paths)
    for k in range(n):
        tokenize_shard(cfg, paths, k)
    for split, j in plan_mindrecord(cfg, paths):
        write_mindrecord_shard(cfg, paths, split, j)
    out = finalize_data_stage(cfg, paths)
    assert prior("other").runs == ["r1"] and [m["run_id"] for m in list_segments(cfg)] == ["r1"]
    segment = Path(index_uri(cfg)) / "segments" / "r1"
    kept = cleaned_docs(stage_dir(cfg))
    assert [json.loads(x) for x in (segment / "ids.jsonl").read_text().splitlines()] == [d["origin"] for d in kept]
    assert [json.loads(x) for x in (segment / "source_ids.jsonl").read_text().splitlines()] == [d["id"] for d in kept]
    assert len(np.load(segment / "keys.npy")) == len(np.load(segment / "sigs.npy")) == out.metrics["kept"]


def test_shard_pool_is_shared_and_replaced_when_a_worker_died():
    """The data flow's step tasks share one process pool per worker count (none for one worker); a pool
    whose worker was killed is broken for good, so the task's retry must get a new one."""
    import os
    import signal

    from pipeline_lib.data.stage import shard_pool

    assert shard_pool(1) is None
    pool = shard_pool(2)
    assert shard_pool(2) is pool
    pid = pool.submit(os.getpid).result()
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Exception):
        pool.submit(time_sleep_then_pid).result(timeout=60)
    fresh = shard_pool(2)
    assert fresh is not pool and fresh.submit(os.getpid).result(timeout=60) != pid


def time_sleep_then_pid() -> int:
    import os
    import time

    time.sleep(0.5)
    return os.getpid()


def _outputs(cfg, run_id="r1", rename=("", "")) -> dict:
    """What must not depend on the shards: MindRecord files, tokenizer, sidecars, duplicates and the
    cleaned documents in order (their part files concatenated), stats but the run id and shard count;
    `rename` replaces a file label in origins (a .jsonl.gz input and its plain twin)."""
    import hashlib

    folder = stage_dir(cfg, run_id)
    digest = {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes().replace(*map(str.encode, rename))).hexdigest()
              for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix in (".mindrecord", ".model", ".jsonl")
              and p.name not in ("quarantine.jsonl", "excluded.jsonl")}  # those two name the input file
    cleaned = b"".join(gzip.open(p).read() for p in sorted((folder / "cleaned").glob("part-*.jsonl.gz")))
    stats = json.loads((folder / "stats.json").read_text().replace(*rename))
    for volatile in ("run_id", "shards"):
        stats.pop(volatile)
    for entry in stats["files"].values():
        entry.pop("uri")
    return {"files": digest, "cleaned": hashlib.sha256(cleaned.replace(*map(str.encode, rename))).hexdigest(),
            "stats": stats}


def test_outputs_do_not_depend_on_shard_size_and_a_split_gzip_input_equals_its_plain_twin(tmp_path):
    gz = tmp_path / "in" / "tiny_corpus.jsonl.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(TINY.read_bytes(), mtime=0))
    tiny = make_cfg(tmp_path / "tiny", docs_per_shard=None, shard_mb=0.02)  # ~14 shards of 20 KB
    whole = make_cfg(tmp_path / "whole", docs_per_shard=None, shard_mb=64)  # one shard
    split = make_cfg(tmp_path / "gz", inputs=[str(gz)], docs_per_shard=None, shard_mb=0.02)
    shards = []
    for cfg in (tiny, whole, split):
        run(cfg, workers=1)
        shards.append(json.loads((stage_dir(cfg) / "stats.json").read_text())["shards"])
    assert shards[0] >= 10 and shards[1] == 1 and shards[2] == shards[0]  # the gzip file was split too
    want = _outputs(whole)
    assert any(p.endswith(".mindrecord") for p in want["files"]) and want["stats"]["total"]["read"] == 438
    assert _outputs(tiny) == want
    assert _outputs(split, rename=("tiny_corpus.jsonl.gz", "tiny_corpus.jsonl")) == want
    assert not (stage_dir(split) / "shards").exists()  # the decompressed chunks went with the work files


def test_a_hugging_face_save_to_disk_folder_is_read_as_input_and_its_metadata_is_not(tmp_path):
    """`Dataset.save_to_disk` (the datasets library itself: Arrow IPC stream shards beside state.json and
    dataset_info.json) given as a folder: every row is a record, carried columns kept, the metadata files are not
    read as jsonl input (they were not found at all: .arrow was no input kind)."""
    datasets = pytest.importorskip("datasets")
    zh = [json.loads(x)["text"] for x in TINY.read_text(encoding="utf-8", errors="replace").splitlines()
          if x.endswith('"source": "tiny"}') and '"lang": "zh"' in x][:120]
    folder = tmp_path / "hf"
    datasets.Dataset.from_dict({"text": zh, "doc_id": [f"H{i}" for i in range(len(zh))],
                                "lang": ["zh"] * len(zh)}).save_to_disk(str(folder), num_shards=2)
    assert sorted(p.name for p in folder.iterdir()) == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow",
                                                        "dataset_info.json", "state.json"]
    cfg = make_cfg(tmp_path, inputs=[str(folder)], id_field="doc_id", keep_fields=["lang"])
    manifest = run(cfg, workers=1)
    docs = {d["origin"]: d for d in cleaned_docs(stage_dir(cfg))}
    stats = json.loads((stage_dir(cfg) / "stats.json").read_text())
    assert stats["total"]["read"] == len(zh) and stats["shards"] == 2 and manifest.metrics["kept"] == len(docs) > 100
    first = docs["data-00000-of-00002.arrow:0"]
    assert first["id"] == "H0" and first["text"] == zh[0] and first["meta"] == {"lang": "zh"}
    assert docs["data-00001-of-00002.arrow:0"]["id"] == "H60"  # the second shard's rows, numbered from 0


def test_the_pool_workers_never_import_from_the_folder_the_stage_is_started_in(tmp_path):
    """Started from a shared folder holding a planted `pipeline_lib` (any account can write /tmp), the fork
    server and the workers import this checkout's package, not the planted one (fork_server.py)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    planted = tmp_path / "shared" / "pipeline_lib"
    (planted / "data").mkdir(parents=True)
    marker = tmp_path / "planted-code-ran"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (planted / "data" / "__init__.py").write_text("")
    (planted / "data" / "_warm.py").write_text("")
    probe = ("import pipeline_lib.data.stage as s\n"
             "def where():\n"
             "    import sys\n"
             "    return sys.modules['pipeline_lib'].__file__\n"
             "if __name__ == '__main__':\n"
             "    pool = s._make_pool(1)\n"
             "    print(pool.submit(where).result())\n"
             "    pool.shutdown()\n")
    (tmp_path / "probe.py").write_text(probe)  # as the `llm-pipeline` script: its own folder on sys.path, not cwd
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = str(repo)
    got = subprocess.run([sys.executable, str(tmp_path / "probe.py")], cwd=tmp_path / "shared", env=env,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.strip() == str(repo / "pipeline_lib" / "__init__.py")
    assert not marker.exists()
