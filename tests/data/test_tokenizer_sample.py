"""The tokenizer's sample drawn by the shard workers (tokenizer_sample.py), on constructed shards with known
answers: every kept training line in input order below sample_lines, the exact bottom-k by priority above it
(whatever the quotas), and the main process reading a shard's texts only when its quota fell short."""
from __future__ import annotations

import random

import numpy as np
from datagen import make_cfg

from pipeline_lib.data.packing import heldout_mask
from pipeline_lib.data.tokenizer import _lines, sample_lines
from pipeline_lib.data.tokenizer_sample import merged_sample, shard_lines, write_shard_sample
from pipeline_lib.data.workspace import Workspace
from pipeline_lib.storage import RunPaths


def _shards(n_shards: int, docs: int, seed: int = 3):
    """Documents of 1-4 lines each (one over-long line, cut at 2000 characters), keys spread over the hash range."""
    rng = random.Random(seed)
    shards = []
    for k in range(n_shards):
        texts = ["\n".join(f"s{k} d{i} l{j} " + "字" * rng.randint(5, 40) for j in range(rng.randint(1, 4)))
                 for i in range(docs)]
        texts[0] += "\n" + "长" * 4500 + "\n\n  \n"  # cut into 3 lines; blank lines are no lines
        keys = [rng.getrandbits(64) for _ in range(docs)]
        keep = np.array([rng.random() > 0.2 for _ in range(docs)])  # dedup removed about a fifth
        shards.append((texts, keys, keep))
    return shards


def _stage(tmp_path, shards, sample_lines_k: int, sample_chars: int | None = None):
    cfg = make_cfg(tmp_path, heldout_fraction=0.1)
    cfg.tokenizer.sample_lines = sample_lines_k
    if sample_chars is not None:
        cfg.tokenizer.sample_chars = sample_chars
    ws = Workspace(cfg, RunPaths(cfg.run.output_root, "r"), shared=False)
    ws.write_json("shards/plan.json", {"shards": [{}] * len(shards)})
    for k, (texts, keys, _) in enumerate(shards):
        write_shard_sample(ws, cfg, k, texts, keys)
    reads = []

    def texts_of(k):
        reads.append(k)
        return shards[k][0], shards[k][1]

    sample, seen = merged_sample(ws, cfg, len(shards), lambda k: shards[k][2], texts_of)
    return cfg, sample, seen, reads


def _kept_training_docs(cfg, shards):
    for texts, keys, keep in shards:
        held = heldout_mask(np.asarray(keys, np.uint64), cfg.data.heldout_fraction)
        yield from (t for t, h, kp in zip(texts, held, keep) if kp and not h)


def test_below_sample_lines_every_kept_training_line_in_input_order(tmp_path):
    shards = _shards(4, 60)
    cfg, sample, seen, reads = _stage(tmp_path, shards, 10 ** 6)
    counted = {"docs": 0, "lines": 0}
    expected = sample_lines(_lines(_kept_training_docs(cfg, shards), counted), 10 ** 6)  # the main process's way
    assert sample == expected and seen == counted and reads == []
    assert 0 < counted["docs"] < 240 and any(len(line) == 2000 for line in sample)


def test_above_sample_lines_the_exact_bottom_k_whatever_the_quota(tmp_path):
    shards = _shards(6, 300)
    cfg = make_cfg(tmp_path / "x", heldout_fraction=0.1)
    every = []  # (priority, shard, position, line) of every kept training line
    for k, (texts, keys, keep) in enumerate(shards):
        docs, prio, lines, _ = shard_lines(texts, keys, heldout_mask(np.asarray(keys, np.uint64), 0.1))
        every += [(p, k, i, line) for i, (d, p, line) in enumerate(zip(docs, prio, lines)) if keep[d]]
    k_lines = 600
    best = sorted(every)[:k_lines]
    expected = [line for *_, line in sorted(best, key=lambda t: (t[1], t[2]))]
    _, sample, seen, reads = _stage(tmp_path / "a", shards, k_lines)
    assert sample == expected and seen["lines"] == len(every) > k_lines
    # the quota (1.5 x 600 / 6 = 150 lines a shard, of which ~120 kept) holds the ~100 each shard gives: no shard read again
    assert reads == []

    # one shard of many short lines: its quota falls short, it is read again, the sample is still exact
    texts, keys, keep = shards[2]
    shards[2] = (["\n".join(f"x{i} {j}" for j in range(30)) for i in range(len(texts))], keys, keep)
    every = [t for t in every if t[1] != 2]
    docs, prio, lines, _ = shard_lines(shards[2][0], keys, heldout_mask(np.asarray(keys, np.uint64), 0.1))
    every += [(p, 2, i, line) for i, (d, p, line) in enumerate(zip(docs, prio, lines)) if keep[d]]
    best = sorted(every)[:k_lines]
    expected = [line for *_, line in sorted(best, key=lambda t: (t[1], t[2]))]
    _, sample, _, reads = _stage(tmp_path / "b", shards, k_lines)
    assert sample == expected and reads == [2]


def test_past_sample_chars_the_lowest_priority_lines_up_to_the_character_bound(tmp_path):
    """sentencepiece's memory follows the sample's characters: over tokenizer.sample_chars, the sample is the
    lowest-priority lines whose characters add up to at most the bound (a known answer), in input order."""
    shards = _shards(6, 300)
    every = []
    for k, (texts, keys, keep) in enumerate(shards):
        docs, prio, lines, _ = shard_lines(texts, keys, heldout_mask(np.asarray(keys, np.uint64), 0.1))
        every += [(p, k, i, line) for i, (d, p, line) in enumerate(zip(docs, prio, lines)) if keep[d]]
    best, chars = [], 0
    for t in sorted(every)[:600]:
        if chars + len(t[3]) > 10_000:
            break
        best.append(t)
        chars += len(t[3])
    expected = [line for *_, line in sorted(best, key=lambda t: (t[1], t[2]))]
    _, sample, seen, _ = _stage(tmp_path / "a", shards, 600, sample_chars=10_000)
    assert sample == expected and 9_000 < sum(map(len, sample)) <= 10_000 and 100 < len(sample) < 600
    assert seen["lines"] == len(every)  # what the sample was drawn from, not what it kept
    _, unbounded, _, _ = _stage(tmp_path / "b", shards, 600, sample_chars=10 ** 9)
    assert len(unbounded) == 600 and set(sample) < set(unbounded)


def test_the_sample_does_not_depend_on_how_the_corpus_is_cut_into_shards(tmp_path):
    shards = _shards(6, 120)
    texts = [t for s in shards for t in s[0]]
    keys = [k for s in shards for k in s[1]]
    keep = np.concatenate([s[2] for s in shards])
    for n in (1, 2, 4):  # the same documents, in the same order, cut into n shards
        cut = [round(i * len(texts) / n) for i in range(n + 1)]
        regrouped = [(texts[a:b], keys[a:b], keep[a:b]) for a, b in zip(cut, cut[1:])]
        _, sample, seen, _ = _stage(tmp_path / str(n), regrouped, 300)
        if n == 1:
            first, first_seen = sample, seen
        assert sample == first and seen == first_seen and seen["lines"] > 300


def test_line_priorities_are_uniform_on_consecutive_keys():
    """Keys 0..N-1 (the worst case for a weak mix), first and second lines: each tenth of [0, 1) gets a tenth."""
    from pipeline_lib.data.tokenizer_sample import priorities

    n = 100_000
    for nth in (0, 1):
        p = priorities(np.arange(n, dtype=np.uint64), np.full(n, nth, np.uint64))
        counts = np.bincount((p * 10).astype(int), minlength=10)
        assert p.min() >= 0 and p.max() < 1 and len(counts) == 10
        assert np.abs(counts - n / 10).max() < 5 * np.sqrt(n * 0.1 * 0.9)  # 5 sd of a binomial count
    a = priorities(np.arange(n, dtype=np.uint64), np.zeros(n, np.uint64))
    b = priorities(np.arange(n, dtype=np.uint64), np.ones(n, np.uint64))
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02  # a document's lines are drawn independently
