"""Good documents and four kinds of garbage, for the screen's tests (the month's bench, bench/nightly_month.py, has
its own): fresh documents from the bundled corpus's templates, characters shuffled, word salad of 2-3 character
fragments, random CJK characters, a scraper's boilerplate."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from make_tiny_corpus import _doc  # noqa: E402  (the bundled corpus's own templates)


def bundled() -> list[str]:
    out = []
    for raw in (ROOT / "configs/data/tiny_corpus.jsonl").read_bytes().splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("text"), str) and len(rec["text"]) > 40:
            out.append(rec["text"])
    return out


def fresh(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [_doc(rng, zh=rng.random() < 0.65) for _ in range(n)]


def shuffled(texts: list[str], seed: int) -> list[str]:
    rng, out = random.Random(seed), []
    for t in texts:
        chars = list(t)
        rng.shuffle(chars)
        out.append("".join(chars))
    return out


def word_salad(texts: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    frags = [t[i:i + rng.randint(2, 3)] for t in texts if not t.isascii() for i in range(0, len(t) - 3, 3)]
    return ["".join(rng.choice(frags) for _ in range(60)) for _ in range(n)]


def random_cjk(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(150)) for _ in range(n)]


def boilerplate(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    menus = ["首页", "新闻中心", "产品展示", "关于我们", "联系我们", "招聘信息", "网站地图", "客户服务"]
    return [" | ".join(rng.sample(menus, 6) + [f"备案号：{rng.randint(1000, 99999)}", "版权所有"]) + "。点击进入。"
            for _ in range(n)]


def jsonl(texts: list[str], prefix: str) -> str:
    return "".join(json.dumps({"id": f"{prefix}-{i}", "text": t}, ensure_ascii=False) + "\n"
                   for i, t in enumerate(texts))
