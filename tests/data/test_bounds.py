"""Bounds on what a small hostile input can cost (issue 26, item 7): quarantine/exclusion copies capped per
input file and reason (the rest counted in stats.json), over-long lines streamed past (linear time, never
held), record copies cut at data.max_copy_bytes, non-finite JSON numbers quarantined."""
from __future__ import annotations

import gzip
import io
import json
import time
from pathlib import Path

from datagen import TINY, make_cfg

from pipeline_lib.data.prep import plan_data_stage, prep_shard, shard_dir
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import LongLine, RunPaths, iter_lines


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().split(b"\n") if x]


def whole_stage(cfg, run_id="r1") -> Path:
    run_stage(cfg, RunPaths(cfg.run.output_root, run_id), "data", log=lambda msg: None, workers=1)
    return Path(cfg.run.output_root) / run_id / "data"


class Ones(io.RawIOBase):
    """`n` bytes of b"a" then a newline, made as they are read (nothing this size is ever built)."""

    def __init__(self, n: int, tail: bytes = b"\n"):
        self.left, self.tail = n, tail

    def readable(self):
        return True

    def read(self, size=-1):
        size = 1 << 20 if size is None or size < 0 else size
        if self.left > 0:
            k = min(size, self.left)
            self.left -= k
            return b"a" * k
        tail, self.tail = self.tail, b""
        return tail


def test_iter_lines_streams_past_a_line_longer_than_its_bound_in_linear_time():
    started = time.perf_counter()
    out = list(iter_lines(Ones(200 << 20, b'\n{"text": "after"}\n'), max_line=1 << 20, head=100))
    took = time.perf_counter() - started
    assert out[0] == LongLine(b"a" * 100, 200 << 20) and out[1:] == [b'{"text": "after"}']
    assert took < 5, took  # was ~20 s and 644 MB: the pending buffer re-split per chunk


def test_iter_lines_splits_as_before():
    data = b"a\n\nbc\r\n" + b"x" * (3 << 20) + b"\nlast"
    assert list(iter_lines(io.BytesIO(data))) == data.split(b"\n")
    assert list(iter_lines(io.BytesIO(b"a\n"))) == [b"a"] and list(iter_lines(io.BytesIO(b""))) == []
    long = list(iter_lines(io.BytesIO(b"ok\n" + b"y" * 5000 + b"\nok2"), max_line=4096, head=10))
    assert long == [b"ok", LongLine(b"y" * 10, 5000), b"ok2"]


def test_a_line_over_max_line_bytes_is_quarantined_with_its_head_only(tmp_path):
    src = tmp_path / "long.jsonl.gz"
    body = b'{"text": "' + b"\xe7\x94\xb5" * 700_000 + b'"}'  # ~2 MB, one line
    src.write_bytes(gzip.compress(TINY.read_bytes() + body + b"\n", mtime=0))
    cfg = make_cfg(tmp_path, inputs=[str(src)], max_line_bytes=1 << 20, max_copy_bytes=1000)
    stage = whole_stage(cfg)
    q = [r for r in rows(stage / "quarantine.jsonl") if r["reason"] == "line_too_long"]
    assert len(q) == 1 and q[0]["line"] == 439 and q[0]["raw_bytes"] == len(body)
    assert q[0]["raw"] == body[:1000].decode()  # cut at a character boundary, never the whole line
    assert json.loads((stage / "stats.json").read_text())["balanced"]


def test_quarantine_and_exclusion_copies_are_capped_per_file_and_reason(tmp_path):
    """1 KB of gzip holding a million newlines used to write 1,048,576 quarantine records (172 MB)."""
    src = tmp_path / "newlines.jsonl.gz"
    src.write_bytes(gzip.compress(TINY.read_bytes() + b"\n" * 200_000, mtime=0))
    cfg = make_cfg(tmp_path, inputs=[str(src)], max_records_written_per_reason=50, docs_per_shard=None)
    stage = whole_stage(cfg)
    stats = json.loads((stage / "stats.json").read_text())
    entry = stats["files"]["newlines.jsonl.gz"]
    assert stats["balanced"] and entry["read"] == 438 + 200_000
    assert entry["rejected"]["empty_line"] > 200_000
    q = rows(stage / "quarantine.jsonl")
    assert sum(r["reason"] == "empty_line" for r in q) == 50
    assert entry["not_written"]["rejected"]["empty_line"] == entry["rejected"]["empty_line"] - 50
    assert len(q) + sum(entry["not_written"]["rejected"].values()) == entry["rejected_total"]
    assert (stage / "quarantine.jsonl").stat().st_size < 50_000
    assert stats["total"]["not_written"] == entry["not_written"]


def test_the_cap_keeps_the_first_records_of_a_file_whatever_its_shards(tmp_path):
    lines = [b'{"text": "x%d"}' % i if i % 2 else b"" for i in range(300)]
    src = tmp_path / "bad.jsonl"
    src.write_bytes(TINY.read_bytes() + b"\n".join(lines) + b"\n")
    outs = []
    for docs in (40, None):
        cfg = make_cfg(tmp_path / str(docs), inputs=[str(src)], max_records_written_per_reason=20,
                       docs_per_shard=docs)
        stage = whole_stage(cfg)
        outs.append([(r["line"], r["reason"]) for r in rows(stage / "quarantine.jsonl")])
        outs.append([(r["line"], r["reason"]) for r in rows(stage / "excluded.jsonl")])
    assert outs[0] == outs[2] and outs[1] == outs[3]
    empty = [i for i, line in enumerate(src.read_bytes().split(b"\n")[:-1], 1) if not line.strip()]
    assert [x for x in outs[0] if x[1] == "empty_line"] == [(i, "empty_line") for i in empty[:20]]
    assert sum(x[1] == "too_short" for x in outs[1]) == 20


def test_a_huge_excluded_text_is_cut_in_excluded_jsonl(tmp_path):
    src = tmp_path / "big.jsonl"
    text = "power grid " * 300_000  # 3.3 MB: excluded by the length filter (max_chars)
    src.write_bytes(TINY.read_bytes() + json.dumps({"id": "big", "text": text}).encode() + b"\n")
    cfg = make_cfg(tmp_path, inputs=[str(src)], max_copy_bytes=4096)
    stage = whole_stage(cfg)
    big, = [r for r in rows(stage / "excluded.jsonl") if r["id"] == "big"]
    assert big["text"] == text[:4096] and big["text_chars"] == len(text)
    assert (stage / "excluded.jsonl").stat().st_size < 200_000


def test_non_finite_numbers_are_quarantined_never_written_as_infinity(tmp_path):
    hostile = [b'{"id": 1e999999, "text": "a long enough text about the power grid and its transformers"}',
               b'{"id": "n", "lang": NaN, "text": "a long enough text about the power grid and its transformers"}',
               b'{"id": "i", "source": -Infinity, "text": "another long text about substations and their lines"}',
               b'{"id": "deep", "meta": {"score": 1e400}, "text": "yet another text about inspection rounds"}']
    src = tmp_path / "nf.jsonl"
    src.write_bytes(TINY.read_bytes() + b"\n".join(hostile) + b"\n")
    cfg = make_cfg(tmp_path, inputs=[str(src)])
    shards = plan_data_stage(cfg, RunPaths(cfg.run.output_root, "p"))
    paths = RunPaths(cfg.run.output_root, "p")
    for k in range(len(shards)):
        prep_shard(cfg, paths, k)
    stage = Path(paths.stage_uri("data"))
    q = [r for k in range(len(shards)) for r in rows(stage / shard_dir(k) / "quarantine.jsonl")]
    assert sorted(r["line"] for r in q if r["reason"] == "non_finite_number") == [439, 440, 441, 442]
    stage = whole_stage(cfg)
    for part in sorted((stage / "cleaned").glob("*.jsonl.gz")):
        data = gzip.decompress(part.read_bytes())
        assert b"Infinity" not in data and b"NaN" not in data
        for line in data.splitlines():
            json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c)))


def test_a_nan_in_a_carried_parquet_column_is_quarantined(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline_lib.data.readers import iter_shard_batches
    from pipeline_lib.data.sources import plan_shards

    src = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": ["fine text", "more text"], "id": [1.5, float("nan")]}), src)
    spec, = plan_shards([(str(src), "p.parquet")], None)
    recs = [r for b in iter_shard_batches(spec, "text", 10, None, ("id",)) for r in b]
    assert [r[2] for r in recs] == [None, "non_finite_number"]
