"""Tokenizer: trained ids and special tokens, pad never emitted, batch encode, loading checks."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from datagen import TINY

from pipeline_lib.config.schema import TokenizerConfig
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.tokenizer import check_loaded, sample_lines, train_tokenizer
from pipeline_lib.model.token_ids import TokenIds, model_ids
from pipeline_lib.model.tokenizer import Tokenizer

TEXTS = [json.loads(line)["text"] for line in TINY.read_text(encoding="utf-8", errors="replace").splitlines()
         if line.endswith('"source": "tiny"}')]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(TEXTS, TokenizerConfig(vocab_size=1200), tmp_path_factory.mktemp("tok"))


def test_ids_and_special_tokens_are_the_configured_ones(tok):
    assert (tok.vocab_size, tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (1200, 0, 1, 2, 3)
    assert tok.special_ids() == {"<|system|>": 4, "<|user|>": 5, "<|assistant|>": 6, "<|end|>": 7}
    assert tok.sp.is_control(0) and tok.sp.id_to_piece(0) == "<pad>"
    reloaded = Tokenizer(tok.model_file)  # ids and special tokens come back from tokenizer_config.json
    assert reloaded.describe() == tok.describe()


def test_special_tokens_are_never_split_and_text_round_trips(tok):
    text = "<|user|>变压器油温多少度？<|end|>\n<|assistant|>The oil is at 42 °C.<|end|>"
    ids = tok.encode(text)
    assert ids[0] == 5 and ids.count(7) == 2 and 6 in ids
    assert tok.decode(ids) == text
    assert 0 not in ids and 1 not in ids  # pad never emitted; byte fallback instead of unk
    assert tok.decode(tok.encode("罕见字：龘𠀋")) == "罕见字：龘𠀋"
    assert tok.decode([0, 0] + ids + [0]) == text


def test_encode_batch_equals_encode(tok):
    batch = TEXTS[:50]
    assert tok.encode_batch(batch, threads=2) == [tok.encode(t) for t in batch]
    chars_per_token = sum(map(len, batch)) / sum(map(len, tok.encode_batch(batch)))
    assert chars_per_token > 1.2
    arrays = tok.encode_arrays(batch + [""], threads=2)
    assert [a.tolist() for a in arrays] == tok.encode_batch(batch + [""]) and {a.dtype for a in arrays} == {np.dtype(np.int32)}


def test_training_is_deterministic(tok, tmp_path):
    again = train_tokenizer(TEXTS, TokenizerConfig(vocab_size=1200), tmp_path)
    assert open(again.model_file, "rb").read() == open(tok.model_file, "rb").read()


def test_training_takes_a_bounded_reproducible_sample_of_lines(tmp_path):
    """sample_lines of the lines are trained on (the same sample on every run), and the config says so."""
    def train(sample_lines, name):
        t = train_tokenizer(TEXTS, TokenizerConfig(vocab_size=1000, sample_lines=sample_lines), tmp_path / name)
        return open(t.model_file, "rb").read(), json.loads((tmp_path / name / "tokenizer_config.json").read_text())

    first, meta = train(150, "a")
    lines = sum(1 for t in TEXTS for line in t.split("\n") if line.strip())
    assert {k: meta["sample"][k] for k in ("docs", "lines", "lines_trained")} == {
        "docs": len(TEXTS), "lines": lines, "lines_trained": 150} and lines > 150
    assert train(150, "b")[0] == first  # the same sample, the same model
    every, meta = train(10 ** 6, "all")
    assert every != first and meta["sample"]["lines_trained"] == lines  # the bound did cut the input


_TRAIN_IN_A_FRESH_PROCESS = """
import json, sys
from pipeline_lib.config.schema import TokenizerConfig
from pipeline_lib.data.tokenizer import train_tokenizer
texts = json.loads(open(sys.argv[1], encoding="utf-8").read())
train_tokenizer(texts, TokenizerConfig(vocab_size=1000, sample_lines=150), sys.argv[2])
"""


def test_a_sampled_model_is_the_same_in_another_process(tmp_path):
    """sentencepiece's own sampler gave three models in three processes for one corpus (seeded per process);
    the sample is ours now, so two fresh processes train the same model."""
    (tmp_path / "texts.json").write_text(json.dumps(TEXTS), encoding="utf-8")
    models = []
    for name in ("one", "two"):
        subprocess.run([sys.executable, "-c", _TRAIN_IN_A_FRESH_PROCESS, str(tmp_path / "texts.json"),
                        str(tmp_path / name)], check=True, timeout=300)
        models.append((tmp_path / name / "tokenizer.model").read_bytes())
    assert models[0] == models[1]


def test_the_sample_is_uniform_in_input_order_and_whole_when_short():
    lines = [f"line {i}" for i in range(1000)]
    picked = sample_lines(iter(lines), 100)
    assert len(picked) == 100 and picked == sorted(picked, key=lines.index) and picked == sample_lines(lines, 100)
    assert sample_lines(lines, 100, seed=1) != picked
    assert sample_lines(lines[:50], 100) == lines[:50]
    # uniform: over many seeds each line is kept about k/n of the time
    counts = [0] * 1000
    for seed in range(200):
        for line in sample_lines(lines, 100, seed=seed):
            counts[int(line.split()[1])] += 1
    assert 0.08 < sum(counts[:500]) / 200 / 500 < 0.12 and 0.08 < sum(counts[500:]) / 200 / 500 < 0.12


def test_unigram_and_too_large_vocab(tmp_path):
    uni = train_tokenizer(TEXTS, TokenizerConfig(model_type="unigram", vocab_size=800), tmp_path / "u")
    assert uni.vocab_size == 800 and uni.special_ids()["<|end|>"] == 7
    with pytest.raises(DataStageError, match="tokenizer.vocab_size=100000.*lower tokenizer.vocab_size"):
        train_tokenizer(TEXTS[:20], TokenizerConfig(vocab_size=100_000), tmp_path / "big")


def test_loading_checks_ids_special_tokens_and_model_vocab(tok, tmp_path):
    model = tmp_path / "base" / "tokenizer.model"
    model.parent.mkdir()
    shutil.copy(tok.model_file, model)  # no tokenizer_config.json: ids come from the config
    cfg = TokenizerConfig(path=str(model))
    loaded = Tokenizer(model, pad_id=cfg.pad_id, special_tokens=cfg.special_tokens)
    check_loaded(loaded, cfg, 2048)
    with pytest.raises(DataStageError, match="tokenizer.bos_id=1: .* has bos_id=2. Fix: remove tokenizer.bos_id .* or set it to 2"):
        check_loaded(loaded, TokenizerConfig(path=str(model), bos_id=1, pad_id=5), 2048)
    with pytest.raises(DataStageError, match="tokenizer.pad_id=9: .*can emit"):
        check_loaded(Tokenizer(model, pad_id=9), cfg, 2048)
    with pytest.raises(DataStageError, match="tokenizer.special_tokens.*<\\|tool\\|>"):
        check_loaded(Tokenizer(model, pad_id=0, special_tokens=["<|tool|>"]), cfg, 2048)
    with pytest.raises(DataStageError, match="model.vocab_size=1024.*1200 pieces"):
        check_loaded(loaded, cfg, 1024)


def cjk_texts(distinct: int = 3000, docs: int = 400, seed: int = 0) -> list[str]:
    """A small CJK corpus with `distinct` different characters (more than a 2000-piece vocabulary)."""
    import random

    rng = random.Random(seed)
    chars = [chr(0x4E00 + i) for i in range(distinct)]
    return ["".join(rng.choice(chars) for _ in range(200)) for _ in range(docs)]


def test_cjk_corpus_larger_than_the_vocabulary_says_to_raise_it(tmp_path):
    with pytest.raises(DataStageError) as err:
        train_tokenizer(cjk_texts(), TokenizerConfig(vocab_size=2000), tmp_path / "small")
    need = int(err.value.fix.split("at least ")[1].split()[0])
    assert err.value.field == "tokenizer.vocab_size" and need > 3000
    assert "raise tokenizer.vocab_size" in err.value.fix and "character_coverage" in err.value.fix
    assert f"needs {need} pieces" in err.value.problem and "lower tokenizer.vocab_size" not in str(err.value)
    # the number is right: that vocabulary trains
    assert train_tokenizer(cjk_texts(), TokenizerConfig(vocab_size=need), tmp_path / "fits").vocab_size == need


def test_a_llama2_layout_tokenizer_loads_with_pad_equal_to_unk(llama2_tokenizer):
    """Llama-2 has no pad piece: pad = unk = 0 (as mindformers' Llama-2 configs); the ids are the model's."""
    model = llama2_tokenizer
    loaded = Tokenizer(model, special_tokens=[])
    assert (loaded.pad_id, loaded.unk_id, loaded.bos_id, loaded.eos_id) == (0, 0, 1, 2)
    assert model_ids(loaded.sp) == {"pad_id": 0, "unk_id": 0, "bos_id": 1, "eos_id": 2}
    assert TokenIds.read(model) == TokenIds(pad_id=0, unk_id=0, bos_id=1, eos_id=2)
    check_loaded(loaded, TokenizerConfig(path=str(model), special_tokens=[]), 1000)  # unset ids: no complaint
    check_loaded(loaded, TokenizerConfig(path=str(model), special_tokens=[], pad_id=0, bos_id=1), 1000)
    with pytest.raises(DataStageError, match="tokenizer.eos_id=3: .* has eos_id=2. Fix: remove tokenizer.eos_id"):
        check_loaded(loaded, TokenizerConfig(path=str(model), special_tokens=[], eos_id=3), 1000)
    assert 0 not in loaded.encode("罕见字：龘𠀋 and text")  # byte fallback: <unk> (= pad) is never emitted
