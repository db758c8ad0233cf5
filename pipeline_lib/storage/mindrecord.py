"""MindRecord files of int32 columns (the format mindformers trains from), written and read back.

The data stage writes pretraining shards ({input_ids}, + attention_mask with data.packing.document_mask) and SFT writes its rows ({input_ids, labels})
through `write_mindrecord_columns`. FileWriter writes <name> and <name>.db and records the name inside
both, so a file is written under its final name in a temporary folder and then moved into place, .db
first: a .mindrecord file present means it is complete. `read_mindrecord_columns` reads files back
through mindspore.dataset.MindDataset (for checks). MindSpore is imported inside the functions; a
process that must not import it runs `python -m pipeline_lib.storage.mindrecord ROWS.npz OUT.mindrecord
DESCRIPTION` (every array of the .npz becomes a column).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np

from .. import killpoints


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
        writer.add_schema({name: {"type": "int32", "shape": _row_shape(columns[name])} for name in names}, description)
        _write_rows(writer, columns, n)
        killpoints.reached("data.mindrecord.mid_file")
        writer.commit()
        os.replace(tmp_dir / f"{path.name}.db", path.parent / f"{path.name}.db")
        os.replace(tmp_dir / path.name, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    killpoints.reached("data.mindrecord.between_files")
    return path


def _row_shape(column: np.ndarray) -> list[int]:
    """A column of vectors is stored as int32[-1] (MindDataset reads back their length); a column of
    matrices (the document attention mask) keeps its fixed row shape, which the batch passes on."""
    return [-1] if np.ndim(column) <= 2 else [int(d) for d in np.shape(column)[1:]]


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
        # validate=False: it checks raw (non-blob) fields against the schema, and these rows have none
        if core.write_raw_data({}, blobs, False, False) != 0:  # MSRStatus.SUCCESS
            raise RuntimeError(f"MindRecord: writing rows {i}-{hi} of {writer._file_name} failed")


def read_mindrecord_columns(paths: list[str | Path], columns: list[str]) -> dict[str, np.ndarray]:
    """The named columns of MindRecord files, rows in order, each stacked into one array."""
    os.environ.setdefault("GLOG_v", "3")
    import mindspore.dataset as ds

    data = ds.MindDataset([str(p) for p in paths], columns_list=list(columns), shuffle=False)
    rows = list(data.create_tuple_iterator(output_numpy=True, num_epochs=1))
    return {c: np.stack([r[i] for r in rows]) if rows else np.zeros((0, 0), np.int32) for i, c in enumerate(columns)}


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m pipeline_lib.storage.mindrecord ROWS.npz OUT.mindrecord DESCRIPTION")
    with np.load(sys.argv[1]) as z:
        write_mindrecord_columns(sys.argv[2], {name: z[name] for name in z.files}, sys.argv[3])
