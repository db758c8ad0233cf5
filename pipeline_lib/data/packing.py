"""Held-out split, packing into fixed rows, and MindRecord shards (the mindformers pretraining format).

- Held-out split: a document is held out when its exact key (a content hash) falls in the first
  `heldout_fraction` of the hash range: deterministic, independent of order and workers, and a
  document keeps its split across nightly runs.
- Packing: each document's tokens + EOS, concatenated in input order, cut into rows of exactly
  seq_length + 1 tokens. The last partial row is dropped (remainder: drop) or filled with the pad
  id (remainder: pad; the tokenizer's pad, = unk for Llama-2). Pretraining rows have no labels column, so
  mindformers masks by id: every position whose *input* equals pad_token_id is out of the loss (the one
  position whose input is the last EOS still has a pad target). A row may start mid-document.
- MindRecord: schema {input_ids: int32[-1]}, files of data.mindrecord_file_mb MB of rows (encode.rows_per_file).
  FileWriter writes <name> and <name>.db and records the name inside both, so a shard is written
  under its final name in a temporary folder and then moved into place, .db first: a
  .mindrecord file present means its shard is complete.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

_HASH_SPAN = float(2 ** 64)


def heldout_mask(keys: np.ndarray, fraction: float) -> np.ndarray:
    """True for documents whose content hash falls in the held-out share of the hash range."""
    keys = np.asarray(keys, dtype=np.uint64)
    return (keys.astype(np.float64) / _HASH_SPAN) < fraction


def join_with_eos(token_lists: list[list[int]], eos_id: int) -> np.ndarray:
    """Documents' tokens each followed by EOS, as one int32 array."""
    lengths = np.fromiter((len(t) + 1 for t in token_lists), dtype=np.int64, count=len(token_lists))
    out = np.full(int(lengths.sum()), eos_id, dtype=np.int32)
    pos = 0
    for toks, n in zip(token_lists, lengths):
        out[pos:pos + n - 1] = toks
        pos += n
    return out


def count_rows(total_tokens: int, row_len: int, remainder: str) -> int:
    full, rest = divmod(total_tokens, row_len)
    return full + (1 if rest and remainder == "pad" else 0)


def rows_from_tokens(tokens: np.ndarray, row_len: int, remainder: str, pad_id: int) -> np.ndarray:
    """(rows, row_len) int32: whole rows, then a padded last row when remainder is pad."""
    n = count_rows(len(tokens), row_len, remainder)
    out = np.full(n * row_len, pad_id, dtype=np.int32)
    take = min(len(tokens), n * row_len)
    out[:take] = tokens[:take]
    return out.reshape(n, row_len)


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


def page_sizes(n_rows: int, row_len: int) -> tuple[int, int]:
    """(page size, header size) for a file of n_rows rows. FileWriter's defaults (32 MB pages,
    16 MB header) make every file >= 48 MB, mostly holes, which an upload sends in full."""
    page = _pow2(64 * row_len * 4, 1 << 15, 1 << 26)            # about 64 rows per page
    pages = n_rows * row_len * 4 * 1.1 / page + 4
    return page, _pow2((1 << 14) + 1024 * pages, 1 << 14, 1 << 27)  # page metadata, generously


def write_mindrecord_columns(path: str | Path, columns: dict[str, np.ndarray], description: str,
                             page_sizes_: tuple[int, int] | None = None) -> Path:
    """Write equal-length int32 columns as one MindRecord file at `path` (+ path.db), atomically:
    written under its final name in a temp folder (the header records the file name, so a rename
    would break MindDataset), then moved into place, .db first."""
    os.environ.setdefault("GLOG_v", "3")
    from mindspore.mindrecord import FileWriter

    path = Path(path)
    names = list(columns)
    n = len(columns[names[0]])
    tmp_dir = path.parent / f".tmp-{path.name}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    try:
        writer = FileWriter(str(tmp_dir / path.name), shard_num=1, overwrite=True)
        if page_sizes_ is not None:
            writer.set_page_size(page_sizes_[0])
            writer.set_header_size(page_sizes_[1])
        writer.add_schema({name: {"type": "int32", "shape": [-1]} for name in names}, description)
        _write_rows(writer, columns, n)
        writer.commit()
        os.replace(tmp_dir / f"{path.name}.db", path.parent / f"{path.name}.db")
        os.replace(tmp_dir / path.name, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return path


_BATCH_ROWS = 2000


def _write_rows(writer, columns: dict[str, np.ndarray], n: int) -> None:
    """Rows 0..n of `columns` through `writer`. FileWriter.write_raw_data looks the schema up in
    C++ three times per row and checks every row's dtype in Python (a third of the time with
    2049-token rows, more with short ones). Our columns are int32 arrays by construction, so after
    a first batch through the public call (it opens the file and sets the header) the rows go to
    the shard writer as the blobs it would have built itself: one field -> the array's bytes;
    several -> for each field in the schema's blob order, its 8-byte big-endian length + bytes.
    Falls back to the public call when MindSpore's internals differ."""
    def public(lo: int, hi: int) -> None:
        writer.write_raw_data([{name: columns[name][j] for name in columns} for j in range(lo, hi)])

    first = min(n, _BATCH_ROWS)
    if first:
        public(0, first)
    core = getattr(getattr(writer, "_writer", None), "_writer", None)
    header = getattr(getattr(writer, "_writer", None), "_header", None)
    try:
        fields = list(header.blob_fields) if core is not None else None
        raw_fields = set(header.schema) - set(fields) if fields is not None else {"?"}
    except Exception:
        fields, raw_fields = None, {"?"}
    if fields is None or raw_fields or set(fields) != set(columns) or \
            any(np.asarray(c).dtype != np.int32 for c in columns.values()):
        for i in range(first, n, _BATCH_ROWS):
            public(i, min(i + _BATCH_ROWS, n))
        return
    cols = [np.ascontiguousarray(columns[f]) for f in fields]
    for i in range(first, n, _BATCH_ROWS):
        hi = min(i + _BATCH_ROWS, n)
        if len(cols) == 1:
            blobs = [row.tobytes() for row in cols[0][i:hi]]
        else:
            blobs = [b"".join((c[j].nbytes).to_bytes(8, "big") + c[j].tobytes() for c in cols) for j in range(i, hi)]
        if core.write_raw_data({}, blobs, True, False) != 0:  # MSRStatus.SUCCESS
            raise RuntimeError(f"MindRecord: writing rows {i}-{hi} of {writer._file_name} failed")


def write_mindrecord(path: Path, rows: np.ndarray, description: str = "pretrain") -> None:
    """Write rows as one MindRecord file at `path` (+ path.db), atomically (see the module docstring)."""
    sizes = page_sizes(*rows.shape) if rows.ndim == 2 else (1 << 25, 1 << 24)
    write_mindrecord_columns(path, {"input_ids": rows}, description, sizes)


def read_mindrecord(paths: list[str | Path]) -> np.ndarray:
    """All input_ids rows of MindRecord files, in order, via mindspore.dataset.MindDataset (for checks)."""
    os.environ.setdefault("GLOG_v", "3")
    import mindspore.dataset as ds

    data = ds.MindDataset([str(p) for p in paths], columns_list=["input_ids"], shuffle=False)
    rows = [r[0] for r in data.create_tuple_iterator(output_numpy=True, num_epochs=1)]
    return np.stack(rows) if rows else np.zeros((0, 0), np.int32)
