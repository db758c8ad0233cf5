"""SFT inputs read with the bounded reader (issue 45 item 3): a 2 GB sparse file took 3.2 GB."""
from __future__ import annotations

import gzip
import json
import tracemalloc

from pipeline_lib.train.instructions import iter_instruction_records


def test_an_over_long_sft_line_is_quarantined_as_line_too_long_with_its_head_only(tmp_path):
    path = tmp_path / "sft.jsonl.gz"
    good = json.dumps({"prompt": "p", "response": "r"}).encode()
    with gzip.open(path, "wb", 9) as fh:
        fh.write(good + b"\n" + b'{"prompt": "')
        for _ in range(16):
            fh.write(b"x" * (1 << 20))
        fh.write(b'", "response": "r"}\n' + good + b"\n")
    tracemalloc.start()
    records = list(iter_instruction_records([str(path)], max_line=1 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [r.reason for r in records] == [None, "line_too_long", None]
    assert records[1].line == 2 and len(records[1].raw) < (64 << 10) + 100 and "16,777," in records[1].raw
    assert peak < 8 << 20


def test_a_sparse_sft_file_is_one_line_read_past(tmp_path):
    path = tmp_path / "sparse.jsonl"
    with open(path, "wb") as fh:
        fh.truncate(256 << 20)
    tracemalloc.start()
    records = list(iter_instruction_records([str(path)], max_line=1 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [r.reason for r in records] == ["line_too_long"] and peak < 8 << 20
