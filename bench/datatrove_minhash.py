"""datatrove's MinHash dedup on a jsonl folder, as one whole process (run by bench_data.py with
the python of the separate datatrove venv it builds under its cache folder; never imported by the
product, and it imports nothing of it).

    python bench/datatrove_minhash.py CORPUS_DIR WORK_DIR [--workers 2] [--bands 14] [--rows 9]

datatrove's 4-step pipeline, each a LocalPipelineExecutor with `--workers` processes: signatures
(one task per input file), buckets (one task per band), cluster (one task), filter (one task per
input file, writing the kept documents and the removed ones). Shingles: 5-grams of the same
tokens as the product's (one per CJK character, one per run of other letters/digits), given to
datatrove as its word tokenizer; text normalised by datatrove's default TextNormConfig.
Prints one JSON line: wall seconds from process start (imports included), documents kept and
removed, and the removed documents' ids as <file>:<line> (1-based, as the product names origins).
"""
from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

from datatrove.executor.local import LocalPipelineExecutor  # noqa: E402
from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,  # noqa: E402
                                              MinhashDedupFilter, MinhashDedupSignature)
from datatrove.pipeline.readers import JsonlReader  # noqa: E402
from datatrove.pipeline.writers import JsonlWriter  # noqa: E402
from datatrove.utils.hashing import HashConfig  # noqa: E402
from datatrove.utils.word_tokenizers import WordTokenizer  # noqa: E402

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"
_TOKEN = re.compile(f"[{CJK}]|[^\\W_{CJK}]+")


class CJKCharTokenizer(WordTokenizer):
    """One token per CJK character, one per run of other letters or digits (the product's units)."""

    def word_tokenize(self, text: str) -> list[str]:
        return _TOKEN.findall(text)

    def sent_tokenize(self, text: str) -> list[str]:
        return [text]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [(0, len(text))]


def text_records(self, data: dict, path: str, id_in_file: int) -> dict:
    """Records whose text is not a string are skipped like those without text (datatrove's
    default adapter would crash on {"text": 3}; the product quarantines them)."""
    text = data.get("text")
    return {"text": text if isinstance(text, str) else "", "id": f"{path}/{id_in_file}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("work")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bands", type=int, default=14)
    ap.add_argument("--rows", type=int, default=9)
    args = ap.parse_args()
    work = Path(args.work)
    files = sorted(Path(args.corpus).glob("*.jsonl"))
    config = MinhashConfig(n_grams=5, num_buckets=args.bands, hashes_per_bucket=args.rows,
                           hash_config=HashConfig(precision=64, hash_fc="xxhash"))
    reader = JsonlReader(args.corpus, glob_pattern="*.jsonl", adapter=text_records)
    w, logs = args.workers, work / "logs"
    steps = [
        LocalPipelineExecutor([reader, MinhashDedupSignature(str(work / "sigs"), config=config,
                                                             language=CJKCharTokenizer())],
                              tasks=len(files), workers=w, logging_dir=str(logs / "sigs")),
        LocalPipelineExecutor([MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=config)],
                              tasks=config.num_buckets, workers=w, logging_dir=str(logs / "buckets")),
        LocalPipelineExecutor([MinhashDedupCluster(str(work / "buckets"), str(work / "remove_ids"), config=config)],
                              tasks=1, workers=1, logging_dir=str(logs / "cluster")),
        LocalPipelineExecutor([reader, MinhashDedupFilter(str(work / "remove_ids"),
                                                          exclusion_writer=JsonlWriter(str(work / "removed"))),
                               JsonlWriter(str(work / "kept"))],
                              tasks=len(files), workers=w, logging_dir=str(logs / "filter")),
    ]
    marks = {}
    for name, step in zip(("signatures", "buckets", "cluster", "filter"), steps):
        step.run()
        marks[name] = time.perf_counter() - START
    wall = time.perf_counter() - START

    def ids(folder: str) -> list[str]:
        out = []
        for f in sorted((work / folder).glob("*.jsonl.gz")):
            with gzip.open(f, "rt", encoding="utf-8") as fh:
                for line in fh:
                    doc_id = json.loads(line)["id"]  # "<file>/<0-based line>"
                    name, _, li = doc_id.rpartition("/")
                    out.append(f"{name}:{int(li) + 1}")
        return out
    removed = ids("removed")
    print(json.dumps({"wall": wall, "marks": marks, "kept": len(ids("kept")), "removed": removed}))


if __name__ == "__main__":
    main()
