"""The one bounded reader (issue 45 item 3): what a small hostile file can cost any reader of the product."""
from __future__ import annotations

import gzip
import os
import time
import tracemalloc

import pytest

from pipeline_lib.storage import LongLine
from pipeline_lib.storage.bounded import READ_BYTES, InputTooLarge, bounded_lines, read_capped

MB = 1 << 20


def one_line_gzip(path, mb: int) -> None:
    with gzip.open(path, "wb", 9) as fh:  # never in memory here either
        fh.write(b'{"text": "')
        for _ in range(mb):
            fh.write(b"a" * MB)
        fh.write(b'"}\n{"text": "after"}\n')


def test_a_small_gzip_holding_one_huge_line_is_read_past_with_bounded_memory(tmp_path):
    path = tmp_path / "one.jsonl.gz"
    one_line_gzip(path, 48)
    assert path.stat().st_size < 100_000
    tracemalloc.start()
    started = time.time()
    lines = list(bounded_lines(str(path), field="x", max_line=1 * MB))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert isinstance(lines[0], LongLine) and lines[0].size > 48 * MB and len(lines[0].head) <= 64 << 10
    assert lines[1] == b'{"text": "after"}'
    assert peak < 8 * MB and time.time() - started < 30  # the line: 48 MB, never held


def test_max_bytes_refuses_a_file_as_soon_as_it_goes_past(tmp_path):
    path = tmp_path / "many.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "x"}\n' * 1_000_000))
    before = READ_BYTES["bytes"]
    with pytest.raises(InputTooLarge) as err:
        list(bounded_lines(str(path), field="data.exclude_ids", max_bytes=2 * MB, fix="split it"))
    assert err.value.field == "data.exclude_ids" and err.value.value == str(path) and "Fix: split it" in str(err.value)
    assert READ_BYTES["bytes"] - before <= 2 * MB + MB  # one chunk past the cap at most


def test_read_capped_refuses_a_sparse_file_without_reading_it(tmp_path):
    path = tmp_path / "sparse.json"
    with open(path, "wb") as fh:
        fh.truncate(2 << 30)  # 2 GB, nothing on disk
    before, started = READ_BYTES["bytes"], time.time()
    with pytest.raises(InputTooLarge, match="larger than 64 MiB"):
        read_capped(str(path), field="--run-id", max_bytes=64 * MB)
    assert READ_BYTES["bytes"] == before and time.time() - started < 1
    small = tmp_path / "small.json"
    small.write_bytes(b"{}")
    assert read_capped(str(small), field="f", max_bytes=64) == b"{}"


def test_read_capped_stops_a_gzip_that_inflates_past_the_cap(tmp_path):
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b" " * (64 * MB)))
    with pytest.raises(InputTooLarge):
        read_capped(str(path), field="f", max_bytes=MB)
    os.remove(path)
