"""Does the screen separate garbage from good text at the tiny default? (prints a table; not a test)

    python bench/screen_separation.py --runs /tmp/screen-measure/runs [--steps 6 12 30 60]

Expects runs `steps-<N>` under --runs, each `llm-pipeline run configs/pipelines/tiny-cpu.yaml --run-id steps-<N>
--stages data,pretrain training.steps=<N> run.output_root=<runs>` (the bundled corpus). Scores, with each run's model
and tokenizer (nightly.screen_model: the screen's own path) and with the character n-gram model of the run's
accepted train-split documents (nightly.char_ngram): the run's held-out documents (the calibration set: what the
screen's threshold comes from), 200 fresh good documents from the corpus's templates (none a near duplicate of it),
and 100 each of shuffled characters, word salad (2-3 character fragments), random CJK characters and a scraper's
boilerplate (the generators of bench/nightly_month.py). Per scorer and kind: the AUC against the good documents, the
share caught at the threshold that keeps 99% of the good ones, and at the screen's own threshold from the
calibration set (nightly.screen.k, min_spread) with the share of good documents it excludes, and the lowest score of
the kind (the margin to the threshold).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from nightly_month import Corpus, boilerplate, random_chars, shuffled, word_salad  # noqa: E402

from pipeline_lib.config import load_config  # noqa: E402
from pipeline_lib.config.schema import ScreenConfig  # noqa: E402
from pipeline_lib.nightly.char_ngram import CharNgram  # noqa: E402
from pipeline_lib.nightly.screen_model import model_nll_per_char  # noqa: E402
from pipeline_lib.nightly.screen_stats import auc, outside, robust_threshold  # noqa: E402


def cleaned(run: Path) -> dict[str, list[str]]:
    out = {"train": [], "heldout": []}
    for part in sorted((run / "data" / "cleaned").glob("part-*.jsonl.gz")):
        for line in gzip.open(part, "rt", encoding="utf-8"):
            rec = json.loads(line)
            out[rec["split"]].append(rec["text"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--steps", type=int, nargs="+", default=[6, 12, 30, 60])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    corpus = Corpus()
    good = [d["text"] for d in corpus.fresh(200, seed=4401, prefix="good")]
    kinds = {"shuffled": [d["text"] for d in shuffled(corpus.bundled[:100], 44)],
             "word salad": [d["text"] for d in word_salad(corpus.bundled, 100, 44)],
             "random CJK": [d["text"] for d in random_chars(100, 44)],
             "boilerplate": [d["text"] for d in boilerplate(100, 44)]}
    knobs = ScreenConfig()
    rows, raw = [], {}
    for steps in args.steps:
        run = Path(args.runs) / f"steps-{steps}"
        cfg = load_config(ROOT / "configs/pipelines/tiny-cpu.yaml", [f"run.output_root={args.runs}"])
        docs = cleaned(run)
        calib = docs["heldout"]
        texts = calib + good + [t for v in kinds.values() for t in v]
        ckpt = next((run / "pretrain" / "checkpoint" / "merged").glob("*.ckpt"))
        scores = {"model": model_nll_per_char(cfg, str(ckpt), str(run / "pretrain/checkpoint/tokenizer.model"), texts,
                                              knobs.batch_size, print)[0]}
        if steps == args.steps[0]:
            scores["ngram"] = CharNgram.build(docs["train"], knobs.ngram_order).score(texts)
        for scorer, s in scores.items():
            s_cal, s_good = s[:len(calib)], s[len(calib):len(calib) + len(good)]
            at = len(calib) + len(good)
            thr = robust_threshold(s_cal, knobs.k, knobs.min_spread)
            keep99 = np.quantile(s_good, 0.99)
            name = f"{scorer} ({steps} steps)" if scorer == "model" else f"char {knobs.ngram_order}-gram"
            row = {"scorer": name, "good median": float(np.median(s_good)), "good max": float(s_good.max()),
                   "threshold": thr.value,
                   "good excluded": float(outside(s_good, thr).mean())}
            for kind, v in kinds.items():
                s_bad = s[at:at + len(v)]
                at += len(v)
                row[kind] = (auc(s_good, s_bad), float((s_bad > keep99).mean()), float(outside(s_bad, thr).mean()),
                             float(s_bad.min()))
            rows.append(row)
            raw[name] = s.tolist()
    print("| scorer | good median / highest (nats/char) | threshold | good excluded | " +
          " | ".join(f"{k}: AUC / caught@99% keep / caught / lowest" for k in kinds) + " |")
    print("|---|---|---|---|" + "---|" * len(kinds))
    for r in rows:
        cells = [f"{r[k][0]:.3f} / {r[k][1]:.0%} / {r[k][2]:.0%} / {r[k][3]:.2f}" for k in kinds]
        print(f"| {r['scorer']} | {r['good median']:.2f} / {r['good max']:.2f} | {r['threshold']:.2f} | {r['good excluded']:.1%} | "
              + " | ".join(cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "scores": raw}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
