"""Batch MinHash signatures: same shingles as text.shingles, bit-identical to datasketch."""
from __future__ import annotations

import random

import numpy as np
import pytest
from datagen import random_doc
from datasketch import MinHash, MinHashLSH

from pipeline_lib.data import minhash as M
from pipeline_lib.data.text import exact_key, shingles, tokens


def test_tokens_split_cjk_per_character_and_latin_per_word():
    assert tokens("变压器 Main-Transformer_2号，OK!") == ["变", "压", "器", "main", "transformer", "2", "号", "ok"]
    assert shingles(tokens("数据清洗"), 5) == ["数 据 清 洗"]
    assert shingles([], 5) == []
    assert exact_key("Hello   World\n") == exact_key("hello world")


def test_signatures_match_datasketch_bit_for_bit():
    rng = random.Random(3)
    texts = [random_doc(rng, zh=i % 2 == 0) for i in range(40)] + ["", "!!!", "中文", "a b c", "一 two 三 four 五 six"]
    flat, counts = M.shingle_hashes(texts, 5)
    sigs = M.signatures(flat, counts, 128)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for i, text in enumerate(texts):
        assert counts[i] == len(shingles(tokens(text), 5))
        ref = MinHash(num_perm=128, seed=M.SEED, hashfunc=int)
        if counts[i]:
            ref.update_batch(list(flat[offsets[i]:offsets[i + 1]]))
        assert (ref.hashvalues == sigs[i]).all(), text[:20]
    assert M.is_empty(sigs[40:42]).all() and not M.is_empty(sigs[:40]).any()


def test_equal_shingles_hash_equal_whatever_the_batch():
    a, _ = M.shingle_hashes(["数据清洗是关键 Hello world"], 5)
    b, _ = M.shingle_hashes(["其他文本", "!!数据清洗是关键 -- hello WORLD"], 5)
    assert set(a.tolist()) <= set(b.tolist())


def test_jaccard_estimate_tracks_exact_jaccard():
    rng = random.Random(5)
    base = random_doc(rng, zh=True)
    other = base[:len(base) // 2] + random_doc(rng, zh=True)[:len(base) // 2]
    x, y = set(shingles(tokens(base), 5)), set(shingles(tokens(other), 5))
    exact = len(x & y) / len(x | y)
    sigs = M.signatures(*M.shingle_hashes([base, other], 5), 256)
    assert abs(M.jaccard_estimate(sigs[0], sigs[1:])[0] - exact) < 0.1


def test_lsh_params_come_from_datasketch_and_band_keys_agree_with_band_equality():
    b, r = M.lsh_params(0.8, 128)
    assert b * r <= 128 and (b, r) == (MinHashLSH(0.8, 128, weights=M.LSH_WEIGHTS).b,
                                       MinHashLSH(0.8, 128, weights=M.LSH_WEIGHTS).r)
    sigs = np.random.default_rng(0).integers(0, 2**32, size=(3, 128), dtype=np.uint64).astype(np.uint32)
    sigs[1, :r] = sigs[0, :r]
    keys = M.band_keys(sigs, b, r)
    assert keys[0, 0] == keys[1, 0] and (keys[0, 1:] != keys[1, 1:]).all() and (keys[2] != keys[0]).all()


@pytest.mark.parametrize("num_perm", [64, 128])
def test_lsh_params_and_permutations_are_datasketchs_without_importing_it(num_perm):
    """Our optimiser picks MinHashLSH's (bands, rows) for every threshold, our permutations are
    MinHash's affine32 ones, and only the dedup step imports datasketch (its LSH is MinHashLSH): the
    shard workers computing signatures do not pay for its import (scipy: ~1-2 s)."""
    import subprocess
    import sys

    for t in (0.5, 0.7, 0.8, 0.9):
        M.lsh_params.cache_clear()
        ref = MinHashLSH(float(t), num_perm, weights=M.LSH_WEIGHTS)
        assert M.lsh_params(float(t), num_perm) == (ref.b, ref.r), t
    a, b = M.permutations(num_perm, 7)
    ref_a, ref_b = MinHash(num_perm=num_perm, seed=7, scheme=M.SCHEME).permutations
    assert (a == ref_a).all() and (b == ref_b).all()
    code = ("import sys; from pipeline_lib.data import _warm, stage; "
            "from pipeline_lib.data.dedup import Deduplicator; from pipeline_lib.config.schema import DedupConfig; "
            "print('datasketch' in sys.modules); d = Deduplicator(DedupConfig()); "
            "print(type(d.lsh.lsh).__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "datasketch.lsh"]
