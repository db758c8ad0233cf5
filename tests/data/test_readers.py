"""Inputs and shards: jsonl (plain, gzip) and parquet, line numbers, malformed records, labels."""
from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.readers import iter_shard_batches, parse_line, parse_record
from pipeline_lib.data.sources import list_inputs, plan_shards


def records(shards, field="text", batch=3, fields=()):
    return [r for s in shards for b in iter_shard_batches(s, field, batch, None, fields) for r in b]


@pytest.mark.parametrize("raw,reason", [
    (b"", "empty_line"), (b"  \r", "empty_line"), (b'{"text": "\xff"}', "bad_utf8"), (b'{"text": ', "bad_json"),
    (b"[1, 2]", "not_an_object"), (b'{"body": "x"}', "missing_text"), (b'{"text": null}', "missing_text"),
    (b'{"text": ["x"]}', "text_not_string"), (b'{"text": " \\n "}', "empty_text"), (b'{"text": "ok"}\r', None)])
def test_parse_line_reasons(raw, reason):
    text, why = parse_line(raw, "text")
    assert why == reason and (text == "ok" if reason is None else text is None)


def test_plain_jsonl_shards_are_byte_ranges_with_global_line_numbers(tmp_path):
    lines = [json.dumps({"content": f"doc {i}"}).encode() for i in range(10)]
    lines[4] = b"not json"
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(lines))  # no final newline
    shards = plan_shards(list_inputs([str(path)]), docs_per_shard=4)
    assert [(s.first, s.kind) for s in shards] == [(1, "jsonl"), (5, "jsonl"), (9, "jsonl")]
    recs = records(shards, "content")
    assert [r[0] for r in recs] == list(range(1, 11))
    assert recs[4][2] == "bad_json" and recs[4][3] == b"not json"
    assert recs[9][1] == "doc 9"
    # exact multiple of docs_per_shard with a final newline: no empty extra shard
    path.write_bytes(b"\n".join(lines[:8]) + b"\n")
    assert len(plan_shards(list_inputs([str(path)]), docs_per_shard=4)) == 2


def test_gzip_is_one_streamed_shard(tmp_path):
    path = tmp_path / "b.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(b"\n".join(json.dumps({"text": f"t{i}"}).encode() for i in range(7)) + b"\n\n")
    shards = plan_shards(list_inputs([str(tmp_path / "*.gz")]), docs_per_shard=2)
    assert len(shards) == 1 and shards[0].kind == "jsonl.gz"
    recs = records(shards)
    assert [r[1] for r in recs[:7]] == [f"t{i}" for i in range(7)] and recs[7][2] == "empty_line"


def test_parquet_shards_follow_row_groups(tmp_path):
    path = tmp_path / "c.parquet"
    texts = [f"row {i}" for i in range(10)]
    texts[3], texts[6] = None, "  "
    pq.write_table(pa.table({"text": texts, "n": list(range(10))}), path, row_group_size=3)
    shards = plan_shards(list_inputs([str(tmp_path)]), docs_per_shard=5)
    assert [(s.start, s.end, s.first) for s in shards] == [(0, 2, 0), (2, 4, 6)]
    recs = records(shards)
    assert [r[0] for r in recs] == list(range(10))
    assert recs[3][2] == "missing_text" and recs[6][2] == "empty_text" and recs[9][1] == "row 9"
    with pytest.raises(DataStageError, match="data.text_field='body'.*no such column"):
        records(shards, "body")
    with pytest.raises(DataStageError, match="data.text_field='n'.*not a string"):
        records(shards, "n")


def test_inputs_order_labels_and_errors(tmp_path):
    for sub in ("day1", "day2"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "part.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "day1" / "notes.txt").write_text("ignored")
    found = list_inputs([str(tmp_path / "day2"), str(tmp_path / "day*" / "*.jsonl")])
    assert [lab for _, lab in found] == ["day2/part.jsonl", "day1/part.jsonl"]
    assert list_inputs(["configs/data/tiny_corpus.jsonl"])[0][1] == "tiny_corpus.jsonl"
    with pytest.raises(DataStageError, match=r"data.inputs\[1\]='.*missing\*.jsonl': matches no"):
        list_inputs([str(tmp_path / "day1"), str(tmp_path / "missing*.jsonl")])


def test_records_carry_the_id_and_metadata_fields_jsonl_and_parquet(tmp_path):
    import datetime

    fields = ("id", "lang", "date")
    raw = b'{"id": 7, "text": "ok", "lang": "zh", "date": null, "other": 1}'
    assert parse_record(raw, "text", fields) == ("ok", None, {"id": 7, "lang": "zh"})
    assert parse_record(b'{"id": "a-1", "body": "x"}', "text", fields) == (None, "missing_text", {"id": "a-1"})
    assert parse_record(b"[1]", "text", fields) == (None, "not_an_object", {})
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["row 0", None], "id": ["p-0", "p-1"],
                             "date": [datetime.date(2024, 6, 1), None]}), path)  # no "lang" column
    recs = records(plan_shards(list_inputs([str(path)]), docs_per_shard=5), fields=fields)
    assert recs == [(0, "row 0", None, None, {"id": "p-0", "date": "2024-06-01"}),
                    (1, None, "missing_text", None, {"id": "p-1"})]


def _chunk_sink(folder):
    """A sources.ChunkSink writing split-gzip chunks into `folder` (what the stage's work folder does)."""
    def sink(n):
        path = folder / f"{n:05d}.jsonl"
        return path, lambda: str(path)
    return sink


def test_plain_jsonl_shards_are_sized_by_bytes_on_line_boundaries(tmp_path):
    lines = [json.dumps({"text": "x" * (i % 7 * 50)}).encode() for i in range(300)]
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    mb = 2000 / (1 << 20)  # 2000-byte shards
    shards = plan_shards(list_inputs([str(path)]), None, shard_mb=mb)
    assert len(shards) >= 5
    assert shards[0].start == 0 and shards[-1].end == len(data)
    for a, b in zip(shards, shards[1:]):
        assert a.end == b.start and data[a.end - 1:a.end] == b"\n"  # contiguous, cut after a newline
        assert 2000 <= a.end - a.start < 2000 + max(map(len, lines)) + 1  # the first line end past 2000 bytes
        assert b.first == a.first + data[a.start:a.end].count(b"\n")  # global line numbers
    assert [r[0] for r in records(shards)] == list(range(1, 301))
    capped = plan_shards(list_inputs([str(path)]), 10, shard_mb=mb)  # whichever limit first
    assert len(capped) > len(shards) and all(s.end - s.start <= 2000 + 400 for s in capped)
    assert records(capped) == records(shards)


def test_parquet_shards_are_runs_of_row_groups_sized_by_bytes(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " + "y" * 200 for i in range(40)]}), path, row_group_size=4)
    meta = pq.ParquetFile(path).metadata
    group_bytes = meta.row_group(0).total_byte_size
    shards = plan_shards(list_inputs([str(path)]), None, shard_mb=2.5 * group_bytes / (1 << 20))
    assert [(s.start, s.end, s.first) for s in shards] == [(0, 3, 0), (3, 6, 12), (6, 9, 24), (9, 10, 36)]
    assert [r[0] for r in records(shards)] == list(range(40))


def test_a_big_gzip_file_is_decompressed_once_into_line_aligned_chunk_shards(tmp_path):
    import random

    rnd = random.Random(7)  # text that does not compress much
    lines = [json.dumps({"text": f"doc {i} " + "".join(rnd.choices("abcdefghijklmnopqrstuvwxyz 0123456789",
                                                                   k=i % 5 * 40))}).encode() for i in range(200)]
    lines[17] = b"not json"
    data = b"\n".join(lines)  # no final newline
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "p.jsonl").write_bytes(data)
    with gzip.open(tmp_path / "in" / "g.jsonl.gz", "wb", compresslevel=1) as fh:
        fh.write(data)
    mb = 1500 / (1 << 20)
    plain = plan_shards(list_inputs([str(tmp_path / "in" / "p.jsonl")]), None, shard_mb=mb)
    split = plan_shards(list_inputs([str(tmp_path / "in" / "g.jsonl.gz")]), None, shard_mb=mb,
                        chunks=_chunk_sink(tmp_path / "work"))
    assert len(split) == len(plain) > 3 and all(s.kind == "jsonl" and s.source for s in split)
    assert [(s.first, s.end - s.start) for s in split] == [(s.first, s.end - s.start) for s in plain]
    assert all(s.uri.endswith("g.jsonl.gz") and s.label == "g.jsonl.gz" for s in split)
    assert b"".join(open(s.source, "rb").read() for s in split) == data
    assert records(split) == records(plain)
    assert records(split)[17][2] == "bad_json"
    # without a place for chunks (or when the file is below shard_mb) the gzip file stays one shard
    assert len(plan_shards(list_inputs([str(tmp_path / "in" / "g.jsonl.gz")]), None, shard_mb=mb)) == 1
    assert len(plan_shards(list_inputs([str(tmp_path / "in" / "g.jsonl.gz")]), None, shard_mb=0.1,
                           chunks=_chunk_sink(tmp_path / "work2"))) == 1


@pytest.mark.parametrize("raw,reason", [  # found by tests/reliability/test_fuzz_data_records.py
    (b"[" * 100_000 + b"]" * 100_000, "bad_json"),            # deeper than json.loads goes: was a RecursionError
    (b'{"text": "ok \\ud800 x"}', "lone_surrogate"),           # valid JSON, no Unicode text: crashed pyarrow
    (b'{"text": "ok", "id": "\\udfff"}', "lone_surrogate"),    # in a carried field: crashed the UTF-8 outputs
    (b'{"body": "x", "url": ["\\ud800"]}', "lone_surrogate"),  # in a quarantined record's carried field
    (b'{"text": "pair \\ud83d\\ude00 ok"}', None)])           # a surrogate pair is an ordinary character
def test_fuzz_found_lines_are_quarantined_with_a_reason(raw, reason):
    text, why, found = parse_record(raw, "text", ("id", "url"))
    assert why == reason and (text == "pair \U0001F600 ok" if reason is None else text is None)
    json.dumps(found, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("data", [gzip.compress(b'{"text": "hello world"}\n' * 100, mtime=0)[:-30],  # truncated
                                  b"\x1f\x8b\x08junk", b"not gzip at all"])
def test_a_corrupt_gzip_input_is_named_with_a_fix(tmp_path, data):
    """Was an EOFError / BadGzipFile traceback naming no file."""
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(data)
    with pytest.raises(DataStageError) as err:
        records(plan_shards(list_inputs([str(path)]), 100))
    assert err.value.field == "data.inputs" and err.value.value == str(path) and "gzip -t" in str(err.value)


TRICKY_LINES = [
    b'{"text": "ok", "id": 123456789012345678901234567890}',  # orjson: a float; json: the int
    b'{"text": "ok", "id": 1.5, "url": [2.5e-3, {"x": -0.0}]}', b'{"text": "ok", "id": 1e999999}',
    b'{"text": "ok", "id": NaN}', b'{"text": 1e400}', b'{"text": 12345678901234567890123}',
    b'\xef\xbb\xbf{"text": "bom"}', b'{"text": "tab\there"}', b'{"text": "del\x7f ok"}', b'{"text": "\xed\xa0\x80"}',
    b'{"text": "a", "text": "b"}', b'{"text": "ok", "id": "\\u0000"}', b'{"text": "ok"} trailing', b"null", b"[]",
    b'{"text": "ok", "url": ' + b"[" * 1010 + b"]" * 1010 + b"}",  # json's recursion limit, orjson's 1024
    b'{"text": "ok", "url": ' + b"[" * 600 + b"]" * 600 + b"}", b'{"text": "\\ud83d\\ude00 \\u4e2d"}']


@pytest.mark.parametrize("raw", TRICKY_LINES)
def test_the_orjson_fast_path_gives_what_json_alone_gives(raw, monkeypatch):
    import pipeline_lib.data.readers as readers

    fast = parse_record(raw, "text", ("id", "url"))
    monkeypatch.setattr(readers, "_fast_object", lambda raw, fields: None)
    slow = parse_record(raw, "text", ("id", "url"))
    assert repr(fast) == repr(slow)  # repr: 1 and 1.0, -0.0 and 0.0 differ


def test_the_orjson_fast_path_gives_what_json_alone_gives_on_every_shipped_corpus_line(monkeypatch):
    # the corpus `make demo` reads, malformed lines included: the lines users' files look like
    import pipeline_lib.data.readers as readers
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[2] / "configs/data/tiny_corpus.jsonl").read_bytes().split(b"\n")
    fast = [parse_record(raw, "text", ("id", "meta")) for raw in lines]
    monkeypatch.setattr(readers, "_fast_object", lambda raw, fields: None)
    assert len(lines) > 400 and repr(fast) == repr([parse_record(raw, "text", ("id", "meta")) for raw in lines])
    assert sum(r[1] is not None for r in fast) >= 3  # its planted bad lines keep their reasons
