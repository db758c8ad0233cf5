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
from pipeline_lib.data import run_data_stage, table_rows
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.packing import read_mindrecord
from pipeline_lib.data.tokenizer import Tokenizer
from pipeline_lib.storage import RunPaths, read_manifest


def run(cfg, run_id="r1", **kw):
    return run_data_stage(cfg, RunPaths(cfg.run.output_root, run_id), **kw)


def stage_dir(cfg, run_id="r1") -> Path:
    return Path(cfg.run.output_root) / run_id / "data"


STEPS = ["prep", "dedup", "tokenizer", "tokenize", "mindrecord", "finalize"]


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
        assert q["id"] == f"tiny_corpus.jsonl:{q['line']}"
        assert raw_lines[q["line"] - 1].decode("utf-8", "backslashreplace") == q["raw"]
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
    ids = [int(d["id"].split(":")[1]) for d in docs]
    assert ids == sorted(ids)  # input order
    for split in ("train", "heldout"):
        files = sorted((folder / "mindrecord" / split).glob("*.mindrecord"))
        rows = read_mindrecord(files)
        assert rows.shape == (stats["total"][f"rows_{split}"], 65) and rows.dtype == np.int32
        want = np.concatenate([np.array(tok.encode(d["text"]) + [3]) for d in docs if d["split"] == split])
        flat = rows.reshape(-1)
        assert (flat[:len(want)] == want).all() and (flat[len(want):] == 0).all()  # padded with pad 0
        assert 0 not in want
    assert len(list((folder / "mindrecord" / "train").glob("*.mindrecord"))) == 2  # 200 rows per file


def test_output_does_not_depend_on_the_number_of_workers(tiny_run, tmp_path):
    cfg, manifest = tiny_run
    other = make_cfg(tmp_path, docs_per_shard=100)
    assert run(other, workers=2).outputs == manifest.outputs


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


def test_nothing_left_after_cleaning_is_an_error_naming_the_inputs(tmp_path):
    path = write_jsonl(tmp_path / "short.jsonl", ["太短", "too short"])
    with pytest.raises(DataStageError, match=r"data.inputs=.*no document survived"):
        run(make_cfg(tmp_path, inputs=[str(path)]), workers=1)


def test_incremental_dedup_against_an_earlier_run_and_failed_runs_leave_no_trace(tmp_path):
    texts = [json.loads(x)["text"] for x in TINY.read_text(errors="replace").splitlines()
             if x.startswith('{"text": "') and '"source": "tiny"' in x]
    day1 = write_jsonl(tmp_path / "in" / "day1.jsonl", texts[:200])
    zh = [t for t in texts[:150] if "，" in t and len(t) > 100]
    day2 = write_jsonl(tmp_path / "in" / "day2.jsonl", texts[150:260] + [zh[0] + "。", zh[1].replace("，", "，并且", 1)])
    run(make_cfg(tmp_path, inputs=[str(day1)]), "night1", workers=1)
    failing = make_cfg(tmp_path, inputs=[str(day2)])
    failing.tokenizer.vocab_size = 50_000
    with pytest.raises(DataStageError, match="tokenizer.vocab_size"):
        run(failing, "night2", workers=1)
    index = tmp_path / "runs" / "_dedup_index" / "segments"
    assert sorted(p.name for p in index.iterdir()) == ["night1"]
    m = run(make_cfg(tmp_path, inputs=[str(day2)]), "night2", workers=1)
    dups = [json.loads(x) for x in (stage_dir(failing, "night2") / "duplicates.jsonl").read_text().splitlines()]
    assert (m.metrics["exact_duplicates"], m.metrics["near_duplicates"], m.metrics["kept"]) == (50, 2, 60)
    assert all(d["kept_run"] == "night1" and d["kept"].startswith("night1/day1.jsonl:") for d in dups)
    assert sorted(p.name for p in index.iterdir()) == ["night1", "night2"]
    meta = json.loads((index / "night2" / "meta.json").read_text())
    assert meta["docs"] == 60 and meta["has_sigs"]
