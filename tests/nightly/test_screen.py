"""The data screen (nightly/screen.py) on real files and a real data stage: excluded documents dropped and counted
per file as lineage_perplexity, a garbage file quarantined, the self-test, a first night with nothing to measure
against; and once through the real model path (its own process, a random-init model)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from garbage import bundled, fresh, jsonl, shuffled, word_salad
from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly.screen import SCREEN_REASON, screen_night
from pipeline_lib.nightly.screen_sample import lineage_sample, sample_uri
from pipeline_lib.nightly.tonight import deep_update
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths

PROMOTED = {"latest": {"run_id": "n1", "checkpoint": None}, "consumed": {},
            "history": [{"run_id": "n1", "decision": "promoted", "checkpoint": None}]}


def _cfg(root: Path, **screen):
    return config_from_dict({"run": {"output_root": str(root / "runs")},
                             "data": {"inputs": [], "rows_per_mindrecord_shard": 200},
                             "model": {"seq_length": 64, "vocab_size": 2048},
                             "nightly": {"screen": {"model": False, **screen}}})


def _promoted_night(cfg, texts: list[str]) -> None:
    """The cleaned parts of a promoted night n1, as its data stage writes them (every 10th document held out)."""
    folder = Path(cfg.run.output_root) / "n1" / "data" / "cleaned"
    folder.mkdir(parents=True)
    with gzip.open(folder / "part-00000.jsonl.gz", "wt", encoding="utf-8") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"id": i, "origin": f"c.jsonl:{i + 1}", "text": t,
                                 "split": "heldout" if i % 10 == 0 else "train", "meta": {}}, ensure_ascii=False) + "\n")


def _tonight(root: Path) -> dict[str, str]:
    """Three files, two of them named x.jsonl (their origins must carry the folder, as the data stage's do)."""
    docs = bundled()
    files = {"a/x.jsonl": jsonl(fresh(40, seed=11), "good"),
             "b/x.jsonl": jsonl(fresh(30, seed=12), "mixed") + '{"text": "broken\n' + jsonl(word_salad(docs, 5, 3), "salad"),
             "c/bad.jsonl": jsonl(shuffled(docs[:30], 5), "shuf")}
    out = {}
    for rel, text in files.items():
        path = root / "in" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        out[rel] = str(path)
    return out


def test_garbage_is_excluded_counted_per_file_and_a_garbage_file_quarantined(tmp_path):
    cfg = _cfg(tmp_path)
    _promoted_night(cfg, bundled())
    files = _tonight(tmp_path)
    screened = screen_night(cfg, PROMOTED, list(files.values()), "n2", log=lambda m: None)
    rec = screened.record
    assert screened.quarantined == [files["c/bad.jsonl"]] and rec["quarantined"] == screened.quarantined
    assert sorted(screened.kept_files) == sorted([files["a/x.jsonl"], files["b/x.jsonl"]])
    assert rec["files"][files["a/x.jsonl"]] == {"screened": 40, "excluded": 0, "share": 0.0}
    assert rec["files"][files["b/x.jsonl"]] == {"screened": 35, "excluded": 5, "share": 5 / 35}
    assert rec["files"][files["c/bad.jsonl"]]["excluded"] == 30
    assert rec["scorers"]["ngram"]["self_test"] == {"documents": 8, "caught": 8} and rec["power"]
    assert "quarantined 1 file(s)" in screened.summary and "bad.jsonl (30/30)" in screened.summary
    assert "no power" not in screened.summary
    listed = json.loads(Path(screened.exclude_file).read_text())
    assert listed["reason"] == SCREEN_REASON
    # line 31 is the broken record (the data stage rejects it); the salad follows it
    assert [d["origin"] for d in listed["documents"]] == [f"b/x.jsonl:{n}" for n in range(32, 37)]
    assert len(Path(rec["records"]).read_text().splitlines()) == 35  # the quarantined file's documents too

    night = config_from_dict(deep_update(cfg.model_dump(mode="json"), screened.overrides(cfg, {})))
    run_stage(night, RunPaths(cfg.run.output_root, "n2"), "data", workers=1)
    stats = json.loads((Path(cfg.run.output_root) / "n2" / "data" / "stats.json").read_text())
    assert set(stats["files"]) == {"a/x.jsonl", "b/x.jsonl"} and stats["balanced"]
    b = stats["files"]["b/x.jsonl"]
    assert b["read"] == 36 and b["filtered"] == {SCREEN_REASON: 5} and b["rejected_total"] == 1 and b["kept"] == 30
    assert stats["files"]["a/x.jsonl"]["filtered"] == {}


def test_a_screen_without_power_says_so(tmp_path):
    cfg = _cfg(tmp_path, k=1000)  # a threshold nothing reaches
    _promoted_night(cfg, bundled())
    files = _tonight(tmp_path)
    screened = screen_night(cfg, PROMOTED, list(files.values()), "n2", log=lambda m: None)
    assert screened.quarantined == [] and screened.exclude_file is None and not screened.record["power"]
    assert "the screen has no power yet (ngram: 0/8 shuffled copies caught)" in screened.summary


def test_a_first_night_without_a_base_model_says_it_did_not_screen(tmp_path):
    cfg = _cfg(tmp_path, model=True)
    files = _tonight(tmp_path)
    screened = screen_night(cfg, {"history": [], "latest": None}, list(files.values()), "n1", log=lambda m: None)
    assert sorted(screened.kept_files) == sorted(files.values()) and screened.exclude_file is None
    assert screened.summary.startswith("Screen: did not screen (nothing to measure against: no promoted model")


def test_every_file_quarantined_is_a_night_with_nothing_usable(tmp_path):
    cfg = _cfg(tmp_path)
    _promoted_night(cfg, bundled())
    bad = tmp_path / "bad.jsonl"
    bad.write_text(jsonl(shuffled(bundled()[:20], 9), "s"), encoding="utf-8")
    screened = screen_night(cfg, PROMOTED, [str(bad)], "n2", log=lambda m: None)
    assert screened.kept_files == [] and screened.quarantined == [str(bad)]
    found = screened.nothing_left()
    assert found["kind"] == "no_usable_documents" and found["filtered"][SCREEN_REASON] == 20
    assert found["records"]["excluded.jsonl"] == [screened.record["records"]]


def test_the_lineage_sample_is_kept_once_held_out_first(tmp_path):
    cfg = _cfg(tmp_path, sample_per_night=50)
    _promoted_night(cfg, bundled())
    sample = lineage_sample(cfg, PROMOTED)
    held = (len(bundled()) + 9) // 10  # every 10th of the night's documents
    assert len(sample) == 50 and [d["split"] for d in sample[:held]] == ["heldout"] * held
    assert Path(sample_uri(cfg, "n1")).exists() and sample == lineage_sample(cfg, PROMOTED)


@pytest.mark.slow
def test_the_model_path_scores_a_document_the_same_in_any_batch(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from random_init import random_llama_params, save_params, tiny_tokenizer
    from pipeline_lib.nightly.screen_model import model_nll_per_char

    cfg = config_from_dict({"run": {"output_root": str(tmp_path / "runs"), "device_target": "CPU"},
                            "model": {"seq_length": 32, "vocab_size": 640, "hidden_size": 32, "num_layers": 2,
                                      "num_heads": 4, "n_kv_heads": 2, "intermediate_size": 64},
                            "training": {"timeout_seconds": 300}})
    tok = tiny_tokenizer(bundled(), tmp_path / "tok", cfg.tokenizer)
    ckpt = save_params(random_llama_params(cfg.model, seed=0), tmp_path / "m.ckpt")
    a, b, c = fresh(3, seed=5)
    long = " ".join(fresh(6, seed=6))  # several windows of 33 tokens
    scores, figures = model_nll_per_char(cfg, str(ckpt), str(tok), [a, b, c, long, c, a], batch_size=2)
    assert np.isfinite(scores).all() and figures["windows"] > 6
    assert scores[0] == pytest.approx(scores[5], rel=1e-5) and scores[2] == pytest.approx(scores[4], rel=1e-5)
    assert len({round(float(s), 4) for s in scores[:4]}) == 4
