"""Held-out split, packing into fixed rows, and MindRecord shards (the mindformers pretraining format).

- Held-out split: a document is held out when its exact key (a content hash) falls in the first
  `heldout_fraction` of the hash range: deterministic, independent of order and workers, and a
  document keeps its split across nightly runs.
- Packing (model.packing, shared with the evaluate stage): each document's tokens + EOS, concatenated in input order, cut into rows of exactly
  seq_length + 1 tokens. The last partial row is dropped (remainder: drop) or filled with the pad
  id (remainder: pad; the tokenizer's pad, = unk for Llama-2). Pretraining rows have no labels column, so
  mindformers masks by id: every position whose *input* equals pad_token_id is out of the loss (the one
  position whose input is the last EOS still has a pad target). A row may start mid-document.
- MindRecord: schema {input_ids: int32[-1]}, files of data.mindrecord_file_mb MB of rows (encode.rows_per_file),
  page sizes fitted to the rows; written atomically by storage.mindrecord (a .mindrecord file present
  means its shard is complete). With data.packing.document_mask a second column, attention_mask:
  int32[1, seq_length, seq_length] per row (model.packing.document_attention_mask), counted in the file size.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..storage.mindrecord import read_mindrecord_columns, write_mindrecord_columns

_HASH_SPAN = float(2 ** 64)


def heldout_mask(keys: np.ndarray, fraction: float) -> np.ndarray:
    """True for documents whose content hash falls in the held-out share of the hash range."""
    keys = np.asarray(keys, dtype=np.uint64)
    return (keys.astype(np.float64) / _HASH_SPAN) < fraction








def gather_tokens(parts: list[tuple[int, np.ndarray]], start: int, stop: int) -> np.ndarray:
    """Tokens [start, stop) of the concatenation of `parts` = [(offset, array)] in order."""
    pieces = []
    for offset, arr in parts:
        lo, hi = max(start, offset), min(stop, offset + len(arr))
        if lo < hi:
            pieces.append(np.asarray(arr[lo - offset:hi - offset], dtype=np.int32))
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)


def _pow2(n: float, lo: int, hi: int) -> int:
    return int(min(max(1 << max(int(n) - 1, 1).bit_length(), lo), hi))


def page_sizes(n_rows: int, row_len: int, extra_row_bytes: int = 0) -> tuple[int, int]:
    """(page size, header size) for a file of n_rows rows of row_len tokens (+ extra_row_bytes of other
    columns). FileWriter's defaults (32 MB pages, 16 MB header) make every file >= 48 MB, mostly holes,
    which an upload sends in full."""
    row_bytes = row_len * 4 + extra_row_bytes
    page = _pow2(64 * row_bytes, 1 << 15, 1 << 26)            # about 64 rows per page
    pages = n_rows * row_bytes * 1.1 / page + 4
    return page, _pow2((1 << 14) + 1024 * pages, 1 << 14, 1 << 27)  # page metadata, generously


def write_mindrecord(path: Path, rows: np.ndarray, description: str = "pretrain",
                     attention_mask: np.ndarray | None = None) -> None:
    """Write rows (and their attention_mask, when given) as one MindRecord file at `path` (+ path.db),
    atomically (see the module docstring)."""
    columns = {"input_ids": rows}
    if attention_mask is not None:
        columns["attention_mask"] = attention_mask
    extra = attention_mask[0].nbytes if attention_mask is not None and len(attention_mask) else 0
    sizes = page_sizes(*rows.shape, extra) if rows.ndim == 2 else (1 << 25, 1 << 24)
    write_mindrecord_columns(path, columns, description, sizes)


def read_mindrecord(paths: list[str | Path]) -> np.ndarray:
    """All input_ids rows of MindRecord files, in order, via mindspore.dataset.MindDataset (for checks)."""
    return read_mindrecord_columns(paths, ["input_ids"])["input_ids"]
