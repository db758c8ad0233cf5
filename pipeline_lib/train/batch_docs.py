"""The packed rows and source documents of one training batch, found by content: what the loss guard names.

Why by content: with training.shuffle on, MindDataset's order comes from MindSpore's C++ sampler (ShardShuffle,
seeded with run.seed and reshuffled per epoch, then split across data-parallel shards); reproducing it outside
that code would be a copy of it that silently drifts with the next MindSpore version. The batch itself is exact: the
guard holds the token ids the step trained on (`train_dataset_element`), and every packed row of the data stage
is in one MindRecord file of the train folder. `find_rows(dataset_dir, batch)` reads those files in order
(storage.read_mindrecord_columns) and returns, per batch row, the file rows with exactly those tokens (several
when the data hold identical rows; none if the dataset pipeline changed the row). `documents(dataset_dir, rows)`
reads the rows-to-documents sidecars (`shard-N.docs.jsonl`, written by data/encode.py) and returns the documents
packed in those rows: {id, origin, rows, whole}. Costs one read of the train files, at a guard trip only.
Runs in the trainer process (imports MindSpore through storage.mindrecord).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..storage.mindrecord import read_mindrecord_columns

COLUMN = "input_ids"


def _key(row) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(row, dtype=np.int64)).tobytes()).hexdigest()


def train_files(dataset_dir: str | Path) -> list[Path]:
    return sorted(Path(dataset_dir).glob("*.mindrecord"))


def find_rows(dataset_dir: str | Path, batch: np.ndarray) -> list[list[dict]]:
    """Per row of `batch` (rows x tokens), the file rows holding exactly its tokens: [{file, row, global_row}]."""
    wanted: dict[str, list[int]] = {}
    for i, row in enumerate(batch):
        wanted.setdefault(_key(row), []).append(i)
    found: list[list[dict]] = [[] for _ in range(len(batch))]
    offset = 0
    for path in train_files(dataset_dir):
        ids = read_mindrecord_columns([path], [COLUMN])[COLUMN]
        for r, row in enumerate(ids):
            for i in wanted.get(_key(row), ()):
                found[i].append({"file": path.name, "row": r, "global_row": offset + r})
        offset += len(ids)
    return found


def documents(dataset_dir: str | Path, rows: list[dict]) -> list[dict]:
    """The documents packed in `rows` (find_rows entries), from the sidecars, in file and row order, each once (a
    document packed across two files too): {id, origin, rows (the global rows asked for that hold part of it),
    whole (all its tokens are in one file)}."""
    by_file: dict[str, dict[int, int]] = {}
    for r in rows:
        by_file.setdefault(r["file"], {})[int(r["row"])] = int(r["global_row"])
    out: dict[str, dict] = {}
    for name, wanted in sorted(by_file.items()):
        side = Path(dataset_dir) / name.replace(".mindrecord", ".docs.jsonl")
        if not side.is_file():
            raise FileNotFoundError(f"{side}: the rows-to-documents sidecar of {name} is missing (rerun the data "
                                    "stage: it writes one next to each MindRecord file)")
        with open(side, encoding="utf-8") as fh:
            for line in fh:
                span = json.loads(line)
                hit = [g for r, g in wanted.items() if span["row_start"] <= r <= span["row_end"]]
                if hit:
                    doc = out.setdefault(span["origin"], {"id": span["id"], "origin": span["origin"], "rows": [],
                                                          "whole": span["whole"]})
                    doc["rows"] = sorted(set(doc["rows"]) | set(hit))
    return list(out.values())
