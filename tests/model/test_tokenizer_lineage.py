"""One tokenizer per lineage: the tokenizer travels beside the weights, and weights are never loaded with another.

Real sentencepiece models (the data stage's own trainer) on two different halves of the bundled corpus."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.config.schema import TokenizerConfig
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.tokenizer import lineage_tokenizer_checked, train_tokenizer
from pipeline_lib.model.tokenizer_lineage import (TokenizerMismatch, TokenizerPrint, attach, lineage_tokenizer,
                                                  require_same_tokenizer, tokenizer_beside)

ROOT = Path(__file__).resolve().parents[2]


def _texts() -> list[str]:
    out = []
    for line in (ROOT / "configs/data/tiny_corpus.jsonl").read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            text = json.loads(line).get("text")
        except (ValueError, AttributeError):
            continue
        if isinstance(text, str):
            out.append(text)
    return out


@pytest.fixture(scope="module")
def two_tokenizers(tmp_path_factory) -> tuple[Path, Path]:
    texts, root = _texts(), tmp_path_factory.mktemp("lineage")
    cfg = TokenizerConfig(vocab_size=1200)
    a = train_tokenizer(texts[: len(texts) // 2], cfg, root / "a")
    b = train_tokenizer(texts[len(texts) // 2:], cfg, root / "b")
    return Path(a.model_file), Path(b.model_file)


def _pretrained(root: Path, tokenizer: Path | None) -> Path:
    """A pretrain stage folder as the stage publishes it: rank files, the merged cache, the tokenizer beside."""
    ckpt = root / "pretrain" / "checkpoint"
    for rel in ("rank_0/tiny_rank_0-3_20.ckpt", "rank_1/tiny_rank_1-3_20.ckpt", "merged/0123abcd.ckpt"):
        (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / rel).write_bytes(b"weights")
    if tokenizer:
        attach(tokenizer, ckpt)
    return ckpt


def test_the_tokenizer_is_found_beside_every_reference_to_the_weights(tmp_path, two_tokenizers):
    a, _ = two_tokenizers
    ckpt = _pretrained(tmp_path, a)
    want = str(ckpt / "tokenizer.model")
    assert (ckpt / "tokenizer_config.json").exists()  # the ids travel too
    for ref in (ckpt / "rank_0/tiny_rank_0-3_20.ckpt", ckpt / "merged/0123abcd.ckpt", ckpt,
                {"base": str(ckpt / "rank_1/tiny_rank_1-3_20.ckpt"), "adapter": "/elsewhere/adapter.ckpt"}):
        assert tokenizer_beside(ref if isinstance(ref, dict) else str(ref)) == want, ref
    own = tmp_path / "models" / "base.ckpt"  # a base of the user's own with its tokenizer in its folder
    own.parent.mkdir()
    own.write_bytes(b"w")
    assert tokenizer_beside(str(own)) is None
    attach(a, own.parent)
    assert tokenizer_beside(str(own)) == str(own.parent / "tokenizer.model")
    # a plain folder above a file that is not in rank_N/ or merged/ is never searched
    loose = tmp_path / "loose" / "sub" / "x.ckpt"
    loose.parent.mkdir(parents=True)
    loose.write_bytes(b"w")
    attach(a, loose.parent.parent)
    assert tokenizer_beside(str(loose)) is None


def test_weights_are_refused_with_another_tokenizer_naming_both(tmp_path, two_tokenizers):
    a, b = two_tokenizers
    rank0 = _pretrained(tmp_path, a) / "rank_0/tiny_rank_0-3_20.ckpt"
    same = require_same_tokenizer(str(rank0), str(a))
    assert same.sha256 == TokenizerPrint.of(str(a)).sha256 and same.vocab_size == 1200
    with pytest.raises(TokenizerMismatch) as caught:
        require_same_tokenizer(str(rank0), str(b), what="model.base_checkpoint")
    err, pa, pb = caught.value, TokenizerPrint.of(str(a)), TokenizerPrint.of(str(b))
    assert pa.sha256 != pb.sha256
    assert err.field == "tokenizer.path" and err.value == str(b)
    assert pa.sha256[:16] in str(err) and pb.sha256[:16] in str(err)  # both values
    assert f"tokenizer.path={rank0.parent.parent / 'tokenizer.model'}" in err.fix  # the fix names the right one
    import pickle

    assert str(pickle.loads(pickle.dumps(err))) == str(err)  # survives a pool worker


def test_a_run_that_continues_weights_never_trains_a_tokenizer(tmp_path, two_tokenizers):
    a, b = two_tokenizers
    rank0 = str(_pretrained(tmp_path, a) / "rank_0/tiny_rank_0-3_20.ckpt")
    assert lineage_tokenizer(config_from_dict({})) is None  # from scratch: train one
    continued = config_from_dict({"model": {"base_checkpoint": rank0}})
    assert lineage_tokenizer(continued) == str(Path(rank0).parent.parent / "tokenizer.model")
    assert lineage_tokenizer(config_from_dict({"model": {"base_checkpoint": rank0},
                                               "tokenizer": {"path": str(a)}})) == str(a)
    with pytest.raises(DataStageError, match="tokenizer.path=.*sha256"):
        lineage_tokenizer_checked(config_from_dict({"model": {"base_checkpoint": rank0},
                                                    "tokenizer": {"path": str(b)}}))
    bare = tmp_path / "bare.ckpt"
    bare.write_bytes(b"w")
    with pytest.raises(DataStageError) as caught:
        lineage_tokenizer_checked(config_from_dict({"model": {"base_checkpoint": str(bare)}}))
    assert caught.value.field == "tokenizer.path" and "no tokenizer.model is recorded" in caught.value.problem
    assert "set tokenizer.path" in caught.value.fix


def test_the_tokenizer_travels_on_s3(s3_bucket, two_tokenizers, tmp_path):
    a, b = two_tokenizers
    bucket, endpoint = s3_bucket
    from pipeline_lib.storage import store_for

    store = store_for(bucket, endpoint)
    run = f"{bucket}/runs/n1/pretrain/checkpoint"
    store.put_bytes(f"{run}/rank_0/tiny_rank_0-3_20.ckpt", b"w")
    for name in ("tokenizer.model", "tokenizer_config.json"):
        store.put_file(a.with_name(name), f"{run}/{name}")
    ref = f"{run}/rank_0/tiny_rank_0-3_20.ckpt"
    assert tokenizer_beside(ref, endpoint) == f"{run}/tokenizer.model"
    assert require_same_tokenizer(ref, f"{run}/tokenizer.model", endpoint).vocab_size == 1200
    with pytest.raises(TokenizerMismatch):
        require_same_tokenizer(ref, str(b), endpoint)


def test_a_missing_base_is_named_as_missing(tmp_path):
    with pytest.raises(DataStageError) as caught:
        lineage_tokenizer_checked(config_from_dict({"model": {"base_checkpoint": str(tmp_path / "gone.ckpt")}}))
    assert caught.value.field == "model.base_checkpoint" and caught.value.problem == "no such file or folder"


def test_held_out_rows_of_another_run_are_scored_only_with_the_tokenizer_that_wrote_them(tmp_path, two_tokenizers):
    import shutil

    from pipeline_lib.evaluate.reference import heldout_name
    from pipeline_lib.model.tokenizer_lineage import LineageRefused, require_heldout_tokenizer

    a, b = two_tokenizers
    heldout = tmp_path / "runs" / "nightly-2026-11-01" / "data" / "mindrecord" / "heldout"
    heldout.mkdir(parents=True)
    with pytest.raises(LineageRefused) as unknown:  # no data/tokenizer beside: which ids are these?
        require_heldout_tokenizer(str(heldout), str(a))
    assert "evaluate.reference_heldout=" in str(unknown.value) and "Fix: " in str(unknown.value)
    (heldout.parents[1] / "tokenizer").mkdir()
    shutil.copy(a, heldout.parents[1] / "tokenizer" / "tokenizer.model")
    assert require_heldout_tokenizer(str(heldout), str(a)).sha256 == TokenizerPrint.of(str(a)).sha256
    with pytest.raises(TokenizerMismatch) as other:
        require_heldout_tokenizer(str(heldout), str(b))
    message = str(other.value)
    assert TokenizerPrint.of(str(a)).sha256[:16] in message and TokenizerPrint.of(str(b)).sha256[:16] in message
    assert heldout_name(str(heldout)) == "heldout@nightly-2026-11-01"
    assert heldout_name(str(tmp_path / "mine")) == "heldout@mine"
