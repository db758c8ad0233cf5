"""Fuzzed raw records into the data stage's record path (issue 16, "Fuzzed input").

Any bytes per line (any JSON value, records with wrong types in text and id, every Unicode category,
lone surrogates, invalid UTF-8, huge lines, deep nesting) through the reader, the filters and the dedup
keys (the stage's own step functions), and a few whole-stage runs. Properties: nothing crashes; every
line is accounted for exactly once (quarantined with its reason and line number, excluded by a filter,
or a dedup candidate); read = rejected + filtered + duplicates + kept (stats.json for whole runs).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from fuzz_inputs import examples, raw_lines
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib.config import config_from_dict
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.prep import dedup_stage, plan_data_stage, prep_shard, shard_dir
from pipeline_lib.data.readers import parse_record
from pipeline_lib.storage import RunPaths

RELIABILITY_ROW = "fuzz"
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "data" / "tiny_corpus.jsonl"
REASONS = {"empty_line", "bad_utf8", "bad_json", "not_an_object", "missing_text", "text_not_string", "empty_text",
           "lone_surrogate", "non_finite_number", "line_too_long"}


def same_raw(q: dict, line: bytes) -> bool:
    """A quarantine record's raw is the line, or (raw_bytes set: cut at data.max_copy_bytes) its start."""
    whole = line.decode("utf-8", "backslashreplace")
    if "raw_bytes" in q:
        return q["raw_bytes"] == len(line) and whole.startswith(q["raw"]) and len(q["raw"].encode()) <= len(line)
    return q["raw"] == whole


def cfg_for(root: Path, inputs: list[str], **data):
    raw = {"run": {"output_root": str(root / "runs")},
           "data": {"inputs": inputs, "docs_per_shard": 7, "rows_per_mindrecord_shard": 200, "num_workers": 1,
                    "dedup": {"incremental": False}, **data},
           "model": {"seq_length": 64, "vocab_size": 2048}}
    return config_from_dict(raw)


def file_lines(lines: list[bytes]) -> tuple[bytes, list[bytes]]:
    data = b"\n".join(lines) + b"\n"
    return data, data.split(b"\n")[:-1]  # what a line-oriented reader sees, 1-based by position


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").split("\n") if x]  # not splitlines: U+0085 ..


def check_accounting(stage: Path, expected: list[bytes], counts: list[dict], label: str) -> None:
    """Every line exactly once: in the quarantine (reason, line, raw), the exclusions, or the candidates."""
    read = sum(c["read"] for c in counts)
    rejected = sum(sum(c["rejected"].values()) for c in counts)
    filtered = sum(sum(c["filtered"].values()) for c in counts)
    candidates = sum(c["candidates"] for c in counts)
    assert read == len(expected) == rejected + filtered + candidates
    seen: dict[int, str] = {}
    for k in range(len(counts)):
        folder = stage / shard_dir(k)
        for q in _rows(folder / "quarantine.jsonl"):
            assert q["reason"] in REASONS and q["origin"] == f"{label}:{q['line']}"
            assert same_raw(q, expected[q["line"] - 1])
            seen[q["line"]] = "rejected"
        for x in _rows(folder / "excluded.jsonl"):
            assert x["reason"] and x["filter"]
            seen[x["line"]] = "filtered"
        for origin in pq.read_table(folder / "docs.parquet", columns=["origin"]).column("origin").to_pylist():
            seen[int(origin.rsplit(":", 1)[1])] = "candidate"
    assert sorted(seen) == list(range(1, len(expected) + 1))
    assert sum(v == "rejected" for v in seen.values()) == rejected


@settings(max_examples=examples(60, 400))
@given(raw_lines(max_size=40))
def test_prep_and_dedup_account_for_every_fuzzed_line(tally, lines):
    data, expected = file_lines(lines)
    tally.add(RELIABILITY_ROW, records=len(expected))
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "fuzz.jsonl"
        src.write_bytes(data)
        cfg = cfg_for(Path(tmp), [str(src)])
        paths = RunPaths(cfg.run.output_root, "fuzz")
        shards = plan_data_stage(cfg, paths)
        counts = [prep_shard(cfg, paths, k) for k in range(len(shards))]
        stage = Path(paths.stage_uri("data"))
        check_accounting(stage, expected, counts, "fuzz.jsonl")
        try:
            summary = dedup_stage(cfg, paths)
        except DataStageError as err:  # nothing survived cleaning: a refusal that names the field
            assert err.field in ("data.inputs", "data.text_field") and sum(c["candidates"] for c in counts) == 0
            return
        for c, s in zip(counts, summary["shards"]):
            assert c["candidates"] == s["exact_duplicates"] + s["near_duplicates"] + s["kept"]


@settings(max_examples=examples(400, 2000))
@given(st.lists(raw_lines(max_size=20, huge=False), min_size=1, max_size=5).map(lambda xs: [x for y in xs for x in y]))
def test_parse_record_never_raises_and_gives_text_or_a_reason(tally, lines):
    tally.add(RELIABILITY_ROW, records=len(lines))
    for raw in lines:
        text, reason, found = parse_record(raw, "text", ("id", "lang", "url"))
        assert (text is None) != (reason is None)
        assert reason is None or reason in REASONS
        if text is not None:  # what the stage writes is valid UTF-8 (pyarrow, the utf-8 output files)
            text.encode("utf-8")
            json.dumps(found, ensure_ascii=False).encode("utf-8")


@settings(max_examples=examples(3, 20))
@given(raw_lines(max_size=30))
def test_whole_data_stage_on_fuzzed_lines_balances_stats_json(tally, lines):
    """Fuzzed lines among the bundled corpus (enough text for a tokenizer), through the registry as a run
    does: stats.json balances, and every rejected line is in quarantine.jsonl with its reason and line."""
    from pipeline_lib.stages import run_stage

    data, expected = file_lines([*TINY.read_bytes().rstrip(b"\n").split(b"\n")[:150], *lines])
    tally.add(RELIABILITY_ROW, records=len(expected), stage_runs=1)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "mixed.jsonl"
        src.write_bytes(data)
        cfg = cfg_for(Path(tmp), [str(src)], docs_per_shard=60)
        paths = RunPaths(cfg.run.output_root, "fuzz")
        run_stage(cfg, paths, "data", log=lambda msg: None, workers=1)
        stage = Path(paths.stage_uri("data"))
        stats = json.loads((stage / "stats.json").read_text())
        t = stats["total"]
        assert stats["balanced"] and t["read"] == len(expected)
        assert t["read"] == t["rejected_total"] + t["filtered_total"] + t["exact_duplicates"] + \
            t["near_duplicates"] + t["kept"]
        quarantine = _rows(stage / "quarantine.jsonl")
        assert len(quarantine) == t["rejected_total"]
        assert {q["reason"] for q in quarantine} <= REASONS and len({q["line"] for q in quarantine}) == len(quarantine)
        for q in quarantine:
            assert same_raw(q, expected[q["line"] - 1])
        assert len(_rows(stage / "excluded.jsonl")) == t["filtered_total"]
        assert len(_rows(stage / "duplicates.jsonl")) == t["exact_duplicates"] + t["near_duplicates"]


@settings(max_examples=examples(10, 300))
@given(raw_lines(max_size=20, huge=False), st.one_of(st.none(), st.integers(0, 400)), st.binary(max_size=40))
def test_gzip_inputs_whole_truncated_or_junk_are_read_or_refused_naming_the_file(tally, lines, cut, junk):
    """A .jsonl.gz shard: whole (every line accounted for), cut short, or junk: records or a DataStageError
    naming data.inputs and the file, never another exception."""
    import gzip

    data, expected = file_lines(lines)
    blob = gzip.compress(data, mtime=0)
    blob = blob if cut is None else (blob[:cut] + junk)
    tally.add(RELIABILITY_ROW, records=len(expected))
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "fuzz.jsonl.gz"
        src.write_bytes(blob)
        cfg = cfg_for(Path(tmp), [str(src)])
        paths = RunPaths(cfg.run.output_root, "fuzz")
        try:
            counts = [prep_shard(cfg, paths, k) for k in range(len(plan_data_stage(cfg, paths)))]
        except DataStageError as err:
            assert err.field == "data.inputs" and err.value == str(src) and cut is not None
            return
        if cut is None or blob == gzip.compress(data, mtime=0):
            check_accounting(Path(paths.stage_uri("data")), expected, counts, "fuzz.jsonl.gz")
