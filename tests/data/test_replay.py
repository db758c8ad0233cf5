"""Replay against forgetting (data.replay): a night's train rows hold `fraction` replayed rows of an earlier night
(real MindRecord rows, real tokenizer), none of which reaches the dedup index."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from datagen import make_cfg, write_jsonl
from make_tiny_corpus import make_corpus

from pipeline_lib.config import ConfigError, config_from_dict
from pipeline_lib.data.dedup_index import list_segments
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.packing import read_mindrecord
from pipeline_lib.data.replay import replay_rows_wanted, sample_rows
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths

NIGHT1 = "data-run"  # pretrain_data's run id


def _night_cfg(root: Path, corpus: Path, **data):
    cfg = make_cfg(root, inputs=[str(corpus)], **data)
    cfg.run.name = "pretrain-test"  # the lineage of pretrain_data's dedup index, copied beside it
    cfg.tokenizer.path = str(root / "runs" / NIGHT1 / "data" / "tokenizer" / "tokenizer.model")  # one per lineage
    return cfg


@pytest.fixture(scope="module")
def lineage(pretrain_data, tmp_path_factory):
    """Night 1 (the session's data stage and its dedup index, copied into a fresh output root) and a corpus of new
    documents for night 2."""
    root = tmp_path_factory.mktemp("replay")
    shutil.copytree(pretrain_data.data_dir, root / "runs" / NIGHT1 / "data")
    shutil.copytree(pretrain_data.root / "runs" / "_dedup_index", root / "runs" / "_dedup_index")
    corpus = root / "raw" / "night2.jsonl"
    corpus.parent.mkdir()
    corpus.write_bytes(b"\n".join(make_corpus(n_docs=160, seed=2)) + b"\n")
    return root, corpus


@pytest.fixture(scope="module")
def night2(lineage):
    root, corpus = lineage
    cfg = _night_cfg(root, corpus, replay={"fraction": 0.3, "runs": [NIGHT1]})
    before = {m["run_id"] for m in list_segments(cfg)}  # night 1's, and what other tests of the session added
    manifest = run_stage(cfg, RunPaths(cfg.run.output_root, "night-2"), "data", workers=1)[0]
    return cfg, manifest, root / "runs" / "night-2" / "data", before


def _train_rows(folder: Path) -> tuple[np.ndarray, list[dict]]:
    files = sorted((folder / "mindrecord" / "train").glob("*.mindrecord"))
    rows, side, first = [], [], 0
    for f in files:
        got = read_mindrecord([f])
        for line in f.with_name(f.name.replace(".mindrecord", ".docs.jsonl")).read_text().splitlines():
            rec = json.loads(line)
            side.append({**rec, "row": first + rec["row_start"]})
        rows.append(got)
        first += len(got)
    return np.concatenate(rows), side


@pytest.mark.slow  # the session's data stage (pretrain_data) is built by the first test asking for it
def test_a_night_with_fraction_0_3_holds_30_percent_replay_tokens_copied_from_the_earlier_night(night2):
    cfg, manifest, folder, _ = night2
    rows, side = _train_rows(folder)
    replay = [s for s in side if "replay" in s]
    assert replay and all(s["replay"] == f"run:{NIGHT1}" and s["id"] is None and s["whole"] for s in replay)
    replay_rows = {s["row"] for s in replay}
    assert not replay_rows & {r for s in side if "replay" not in s for r in range(s["row"], s["row"] + 1)}
    share = len(replay_rows) * rows.shape[1] / rows.size  # replay tokens over all tokens of the train rows
    assert abs(share - 0.3) <= 0.02, share
    night1 = Path(cfg.run.output_root) / NIGHT1 / "data"
    for s in replay:  # every replay row is, token for token, the row of night 1 its origin names
        file, row = s["origin"].split(":")
        assert file.startswith(f"{NIGHT1}/data/mindrecord/train/shard-")
        earlier = read_mindrecord([night1 / file.split("/", 2)[2]])
        assert (rows[s["row"]] == earlier[int(row)]).all()
    assert len({s["origin"] for s in replay}) == len(replay)  # the pool sufficed: no row twice
    stats = json.loads((folder / "stats.json").read_text())
    assert stats["replay"]["rows"] == len(replay) == manifest.metrics["replay_rows"]
    assert stats["token_mix"] == manifest.metrics["token_mix"] == {
        "new": stats["total"]["tokens_train"], "replay": {f"run:{NIGHT1}": len(replay) * rows.shape[1]}}
    assert manifest.metrics["rows_train"] == len(rows) == stats["total"]["rows_train"] + len(replay)
    assert stats["balanced"]


@pytest.mark.slow  # the session's data stage (pretrain_data) is built by the first test asking for it
def test_replay_bypasses_the_dedup_index_and_is_never_added_to_it(night2):
    cfg, _, folder, before = night2
    stats = json.loads((folder / "stats.json").read_text())
    segments = {m["run_id"]: m for m in list_segments(cfg)}
    assert NIGHT1 in before and set(segments) - before == {"night-2"}  # one segment more: tonight's, no replay one
    night1 = json.loads((Path(cfg.run.output_root) / NIGHT1 / "data" / "stats.json").read_text())
    assert segments[NIGHT1]["docs"] == night1["total"]["kept"]
    assert segments["night-2"]["docs"] == stats["total"]["kept"]  # tonight's documents only
    assert [i["uri"] for i in segments["night-2"]["inputs"]] == list(cfg.data.inputs)


@pytest.mark.slow  # the session's data stage (pretrain_data) is built by the first test asking for it
def test_general_sources_are_tokenized_once_cached_and_decontaminated(lineage, tmp_path):
    root, corpus = lineage
    general = write_jsonl(tmp_path / "general.jsonl", [
        json.loads(x)["text"] for x in make_corpus(n_docs=160, seed=5) if x.startswith(b'{"id"') and b'"text": "' in x
    ][:60] + ["清晨的公园里，老人们在树下打太极拳，孩子们追着风筝奔跑。"])  # a reference sentence: left out
    cfg = _night_cfg(root, corpus, replay={"fraction": 0.2, "sources": [str(general)]},
                     dedup={"incremental": False})
    manifest = run_stage(cfg, RunPaths(cfg.run.output_root, "with-source"), "data", workers=1)[0]
    (cache,) = (root / "runs" / "_replay_cache").iterdir()
    meta = json.loads((cache / "meta.json").read_text())
    assert meta["contaminated"] == 1 and meta["documents"] == 60 and meta["rows"] > 0
    mix = manifest.metrics["token_mix"]["replay"]
    assert list(mix) == [f"source:{general}"]
    share = manifest.metrics["replay_rows"] / manifest.metrics["rows_train"]
    assert abs(share - 0.2) <= 0.02
    built = (cache / "rows.bin").stat().st_mtime_ns
    cfg.data.replay.seed = 7  # another sample from the same cache
    run_stage(cfg, RunPaths(cfg.run.output_root, "with-source-2"), "data", workers=1)
    assert (cache / "rows.bin").stat().st_mtime_ns == built and len(list(cache.parent.iterdir())) == 1


@pytest.mark.slow  # the session's data stage (pretrain_data) is built by the first test asking for it
def test_bad_replay_settings_are_refused_naming_the_field(lineage, tmp_path):
    root, corpus = lineage
    with pytest.raises(ConfigError, match="data.replay.fraction"):
        config_from_dict({"data": {"replay": {"fraction": 1.0}}})
    with pytest.raises(ConfigError, match="data.replay.runs"):
        config_from_dict({"data": {"replay": {"runs": ["../etc"]}}})
    cfg = _night_cfg(root, corpus, replay={"fraction": 0.3, "runs": ["no-such-night"]}, dedup={"incremental": False})
    with pytest.raises(DataStageError, match=r"data.replay.runs\[0\]='no-such-night'.*no finished data stage"):
        run_stage(cfg, RunPaths(cfg.run.output_root, "bad-run"), "data", workers=1)
    cfg = _night_cfg(root, corpus, replay={"fraction": 0.3, "runs": [NIGHT1]}, dedup={"incremental": False})
    other = tmp_path / "other.model"
    shutil.copy(Path(__file__).resolve().parents[2] / "configs" / "data" / "tiny_corpus.jsonl", other)
    cfg.tokenizer.path = str(other)  # not this lineage's tokenizer (any other file: refused before it is parsed)
    with pytest.raises(DataStageError, match=r"data.replay.runs\[0\]='data-run'.*tokenizer sha256"):
        run_stage(cfg, RunPaths(cfg.run.output_root, "other-tokenizer"), "data", workers=1)
    cfg.tokenizer.path = None  # it would train its own
    with pytest.raises(DataStageError, match=r"data.replay.runs.*trains a new one.*tokenizer.path"):
        run_stage(cfg, RunPaths(cfg.run.output_root, "own-tokenizer"), "data", workers=1)


def test_replay_rows_make_the_fraction_and_repeat_only_when_the_pool_is_short():
    assert replay_rows_wanted(0.3, 700) == 300 and replay_rows_wanted(0.0, 700) == 0
    picks, repeats = sample_rows(1000, 300, seed=1)
    assert len(set(picks.tolist())) == 300 and repeats == 0 and (np.diff(picks) >= 0).all()
    picks, repeats = sample_rows(100, 250, seed=1)
    assert repeats == 150 and set(np.bincount(picks).tolist()) <= {2, 3} and len(picks) == 250
    assert (sample_rows(1000, 300, seed=1)[0] == sample_rows(1000, 300, seed=1)[0]).all()


def test_a_replay_source_line_over_max_line_bytes_is_read_past_not_trained_on(tmp_path):
    """Issue 45 item 3: a 200 KB gzip holding one 200 MB line cost 231 s, 12.8 GB and was trained on."""
    import gzip
    import tracemalloc

    from pipeline_lib.data.replay import source_texts

    path = tmp_path / "general.jsonl.gz"
    with gzip.open(path, "wb", 9) as fh:
        fh.write(b'{"text": "a first document"}\n{"text": "')
        for _ in range(24):
            fh.write(b"b" * (1 << 20))
        fh.write(b'"}\n{"text": "a last document"}\n')
    counts: dict = {}
    tracemalloc.start()
    texts = list(source_texts(str(path), None, "data.replay.sources[0]", "text", 1 << 20, counts))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert texts == ["a first document", "a last document"] and counts["too_long_lines"] == 1
    assert peak < 8 << 20
