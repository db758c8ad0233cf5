"""Helpers of the data-stage tests: configs on temp folders, the bundled tiny corpus, and
generated zh/en corpora with planted near duplicates of known (exact) Jaccard similarity."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from pipeline_lib.config import config_from_dict
from pipeline_lib.data.text import shingles, tokens

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TINY = ROOT / "configs" / "data" / "tiny_corpus.jsonl"
sys.path.insert(0, str(HERE))

ZH_POOL = [chr(c) for c in range(0x4E00, 0x4E00 + 2500)]
_R = random.Random(99)
EN_POOL = sorted({"".join(_R.choice("bcdfghjklmnprstvwz") + _R.choice("aeiou") + _R.choice("bcdfgklmnprstz")
                          for _ in range(2)) for _ in range(4000)})


def make_cfg(root: Path, **data) -> object:
    """The tiny CPU config with output under `root` and data.* overrides."""
    raw = {"run": {"output_root": str(root / "runs")},
           "data": {"inputs": [str(TINY)], "docs_per_shard": 200, "rows_per_mindrecord_shard": 200, **data},
           "model": {"seq_length": 64, "vocab_size": 2048}}
    return config_from_dict(raw)


def shingle_set(text: str, n: int = 5) -> set:
    return set(shingles(tokens(text), n))


def jaccard(a: str, b: str, n: int = 5) -> float:
    x, y = shingle_set(a, n), shingle_set(b, n)
    return len(x & y) / len(x | y) if x | y else 1.0


def random_doc(rng: random.Random, zh: bool) -> str:
    if zh:
        chars = [rng.choice(ZH_POOL) for _ in range(rng.randint(150, 350))]
        for i in range(20, len(chars), 25):
            chars[i] = "，" if i % 50 else "。"
        return "".join(chars)
    return " ".join(rng.choice(EN_POOL) for _ in range(rng.randint(80, 160))) + "."


def mutate_to(rng: random.Random, text: str, target: float, zh: bool) -> tuple[str, float]:
    """Replace random tokens of a copy until its shingle Jaccard with `text` is <= target."""
    units = list(text) if zh else text.split(" ")
    pool = ZH_POOL if zh else EN_POOL
    sep = "" if zh else " "
    copy = list(units)
    while True:
        i = rng.randrange(len(copy))
        copy[i] = rng.choice(pool)
        j = jaccard(text, sep.join(copy))
        if j <= target:
            return sep.join(copy), j


def planted_corpus(seed: int = 7, n_base: int = 160, pairs=((0.97, 14), (0.93, 14), (0.89, 14), (0.86, 14),
                                                          (0.75, 10), (0.65, 10), (0.5, 10))):
    """(docs, pairs): random zh/en documents, then mutated copies of some of them placed after all
    bases; pairs = [(base index, copy index, exact Jaccard)]."""
    rng = random.Random(seed)
    docs = [random_doc(rng, zh=i % 3 != 0) for i in range(n_base)]
    planted = []
    base = 0
    for target, count in pairs:
        for _ in range(count):
            zh = base % 3 != 0
            copy, j = mutate_to(rng, docs[base], target, zh)
            docs.append(copy)
            planted.append((base, len(docs) - 1, j))
            base += 1
    return docs, planted


def write_jsonl(path: Path, texts: list[str], extra_lines: list[bytes] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": t}, ensure_ascii=False).encode() for t in texts] + list(extra_lines)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path
