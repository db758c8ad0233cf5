"""Perplexity on the held-out MindRecord split.

What: `read_heldout_rows(heldout_dir, seq_length, max_rows)` reads packed rows (`input_ids`, int32,
seq_length + 1 tokens, the training format) in file order; `perplexity(logits_fn, rows, pad_id,
batch_size)` feeds rows[:, :seq_length], scores the next token rows[:, 1:] with a float64
log-softmax, skips targets equal to pad_id (padding, excluded from the loss in training too) and
returns exp(total NLL / scored tokens) with the counts, and per row its NLL sum and scored-token count
(`row_nll`, `row_tokens`: what a paired comparison of two models on the same rows needs, the nightly gate's
bootstrap; `row_scores()` gives them as JSON, `to_json()` the aggregate only).

Limits: reads the first `max_rows` rows (deterministic, no sampling); rows must be exactly
seq_length + 1 long. `read_heldout_rows` imports mindspore.dataset, so it runs in the worker.
Raises ValueError naming the folder or model.seq_length when the split is missing or does not fit.
"""
from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# Beside a checkpoint's generations.jsonl in the evaluate stage folder: {"checkpoint": label, "vocab_size": the
# tokenizer's pieces, "heldout": {"nll": [...], "tokens": [...]} or null, "reference": {set name: {...}}}, one entry
# per scored row in row order (the same rows for every checkpoint of the run).
ROWS_FILE = "perplexity_rows.json"


@dataclass
class PerplexityResult:
    perplexity: float
    nll_per_token: float
    tokens: int
    rows: int
    row_nll: list[float] = field(default_factory=list, repr=False)
    row_tokens: list[int] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("perplexity", "nll_per_token", "tokens", "rows")}

    def row_scores(self) -> dict:
        return {"nll": [round(x, 6) for x in self.row_nll], "tokens": list(self.row_tokens)}


def mindrecord_files(heldout_dir: str) -> list[str]:
    """Data files of a MindRecord folder (index files `*.db` excluded), sorted."""
    if os.path.isfile(heldout_dir):
        return [heldout_dir]
    files = sorted(f for f in glob.glob(os.path.join(heldout_dir, "**", "*.mindrecord*"), recursive=True)
                   if not f.endswith(".db") and os.path.isfile(f))
    if not files:
        raise ValueError(f"heldout_dir={heldout_dir!r}: no MindRecord files; run the data stage with "
                         "data.heldout_fraction > 0 or pass the folder of the held-out split")
    return files


def read_heldout_rows(heldout_dir: str, seq_length: int, max_rows: int) -> np.ndarray:
    """int32 [rows, seq_length + 1] from the MindRecord files (column input_ids)."""
    import mindspore.dataset as ds

    data = ds.MindDataset(dataset_files=mindrecord_files(heldout_dir), columns_list=["input_ids"],
                          shuffle=False, num_parallel_workers=1)
    rows = []
    for (ids,) in data.create_tuple_iterator(output_numpy=True, num_epochs=1):
        ids = np.asarray(ids).reshape(-1)
        if ids.size != seq_length + 1:
            raise ValueError(f"held-out rows hold {ids.size} tokens but model.seq_length={seq_length} needs "
                             f"{seq_length + 1}; evaluate with the seq_length the data stage packed for")
        rows.append(ids.astype(np.int32))
        if len(rows) >= max_rows:
            break
    if not rows:
        raise ValueError(f"heldout_dir={heldout_dir!r}: the MindRecord files hold no rows")
    return np.stack(rows)


def row_nll(logits: np.ndarray, targets: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: sum of -log p(target) over its non-pad targets [B], and their count [B]. logits [B, S, V],
    targets [B, S]."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(x).sum(axis=-1))
    picked = np.take_along_axis(x, targets[..., None].astype(np.int64), axis=-1)[..., 0]
    mask = targets != pad_id
    return ((logz - picked) * mask).sum(axis=-1), mask.sum(axis=-1)


def token_nll(logits: np.ndarray, targets: np.ndarray, pad_id: int) -> tuple[float, int]:
    """Sum of -log p(target) over non-pad targets, and their count (the nightly screen scores documents with it)."""
    nll, count = row_nll(logits, targets, pad_id)
    return float(nll.sum()), int(count.sum())


def perplexity(logits_fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, pad_id: int,
               batch_size: int) -> PerplexityResult:
    """Perplexity of the model behind `logits_fn` (which takes exactly batch_size rows) on `rows`."""
    seq = rows.shape[1] - 1
    nlls, counts = [], []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        n = len(chunk)
        if n < batch_size:  # fill the fixed batch; the filler rows are not scored
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch_size - n, axis=0)])
        logits = np.asarray(logits_fn(chunk[:, :seq]))[:n]
        nll, k = row_nll(logits, chunk[:n, 1:], pad_id)
        nlls.append(nll)
        counts.append(k)
    nll, k = np.concatenate(nlls), np.concatenate(counts)
    total, count = float(nll.sum()), int(k.sum())
    if count == 0:
        raise ValueError("held-out rows hold only padding; nothing to score")
    mean = total / count
    return PerplexityResult(perplexity=math.exp(min(mean, 700.0)), nll_per_token=mean, tokens=count, rows=len(rows),
                            row_nll=[float(x) for x in nll], row_tokens=[int(x) for x in k])
