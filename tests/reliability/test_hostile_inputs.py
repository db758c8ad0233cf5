"""Hostile inputs through the whole data stage (issue 26, item 7): small files that used to cost a lot.

One run of the real data stage (the registry's run_stage, as `llm-pipeline run` does) reads, next to the
bundled corpus: a gzip of newlines (a million under the reliability profile: 1 KB that wrote 172 MB), a
gzip holding one huge line (200 MB there: 20 s and 644 MB; 8 MB over a 4 MiB data.max_line_bytes by default), a record whose text is huge (50 MB there:
copied whole into excluded.jsonl), non-finite numbers (`1e999999`, NaN, Infinity: written as Infinity),
and a `**` glob over a folder with link loops and links leading out of it (never returned; read files
outside the folder). Properties: the stage finishes (no crash), stats.json balances, every file's
quarantine/exclusion copies are bounded (bytes written per input byte, worst file, in the tally), no
`Infinity`/`NaN` in the cleaned output, nothing outside the run root is written, the link targets are
not read. Sizes are small under the default profile (`make test`: ~5 s) and full under
HYPOTHESIS_PROFILE=reliability (bench/reliability.py).
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

from fuzz_inputs import examples

from pipeline_lib.config import config_from_dict
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths
from pipeline_lib.storage.bounded import MAX_JSON_BYTES

RELIABILITY_ROW = "hostile"
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "data" / "tiny_corpus.jsonl"
FULL = examples(0, 1) == 1


def _hostile(folder: Path) -> list[str]:
    """The hostile input files (and a linked folder) under `folder`; returns data.inputs entries."""
    mb = 1 << 20
    newlines = folder / "newlines.jsonl.gz"
    newlines.write_bytes(gzip.compress(b"\n" * (1 << 20 if FULL else 1 << 17), 9, mtime=0))
    long = folder / "oneline.jsonl.gz"
    with gzip.open(long, "wb", 9) as fh:  # one line, never in memory here either
        fh.write(b'{"text": "')
        for _ in range(200 if FULL else 8):
            fh.write(b"a" * mb)
        fh.write(b'"}\n')
    big = folder / "bigtext.jsonl"
    words = "power grid " * ((50 if FULL else 2) * mb // 11)
    big.write_text(json.dumps({"id": "big", "text": words}) + "\n")
    numbers = folder / "numbers.jsonl"
    numbers.write_bytes(b"\n".join([
        b'{"id": 1e999999, "text": "a long enough text about the power grid and its transformers"}',
        b'{"id": "nan", "lang": NaN, "text": "a long enough text about the power grid and its transformers"}',
        b'{"id": "inf", "url": -Infinity, "text": "a long enough text about substations and their lines"}',
        b'{"id": "deep", "meta": [1e400], "text": "a long enough text about inspection rounds at night"}']) + b"\n")
    tree, outside = folder / "tree", folder / "outside"
    (tree / "sub").mkdir(parents=True)
    outside.mkdir()
    (tree / "sub" / "ok.jsonl").write_text(json.dumps({"text": "a record in a folder full of link loops, read once"}) + "\n")
    (outside / "private.jsonl").write_text(json.dumps({"text": "someone else's record, not to be read"}) + "\n")
    os.symlink(outside / "private.jsonl", tree / "private.jsonl")
    os.symlink(outside, tree / "elsewhere")
    for name in ("up1", "up2", "up3"):
        os.symlink(tree, tree / "sub" / name)
    return [str(TINY), str(newlines), str(long), str(big), str(numbers), str(tree / "**" / "*.jsonl")]


def _snapshot(folder: Path, skip: Path) -> dict:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")
            if skip not in p.parents and p != skip}


def test_hostile_inputs_finish_with_bounded_writes_and_nothing_outside_the_root(tally):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "in").mkdir()
        inputs = _hostile(tmp / "in")
        root = tmp / "runs"
        before = _snapshot(tmp, root)
        cfg = config_from_dict({"run": {"output_root": str(root)},
                                "data": {"inputs": inputs, "num_workers": 1, "dedup": {"incremental": False},
                                         "rows_per_mindrecord_shard": 200,
                                         # the default (64 MiB) under the full profile, its 200 MB line over it
                                         **({} if FULL else {"max_line_bytes": 4 << 20})},
                                "model": {"seq_length": 64, "vocab_size": 2048}})
        paths = RunPaths(cfg.run.output_root, "hostile")
        run_stage(cfg, paths, "data", log=lambda msg: None, workers=1)
        assert _snapshot(tmp, root) == before  # nothing written (or touched) outside the run root
        stage = Path(paths.stage_uri("data"))
        stats = json.loads((stage / "stats.json").read_text())
        assert stats["balanced"]
        files = stats["files"]
        assert "private.jsonl" not in files and "ok.jsonl" in files  # links not followed, loops listed once
        assert files["newlines.jsonl.gz"]["not_written"]["rejected"]["empty_line"] > 0
        assert files["oneline.jsonl.gz"]["rejected"] == {"line_too_long": 1}
        assert files["numbers.jsonl"]["rejected"] == {"non_finite_number": 4}
        written: Counter = Counter()  # bytes of quarantine / exclusion copies per input file
        for name in ("quarantine.jsonl", "excluded.jsonl"):
            with open(stage / name, "rb") as fh:
                for line in fh:
                    written[json.loads(line)["file"]] += len(line)
        for part in (stage / "cleaned").glob("*.jsonl.gz"):
            data = gzip.decompress(part.read_bytes())
            assert b"Infinity" not in data and b"NaN" not in data
        sizes = {entry["uri"]: os.path.getsize(entry["uri"]) for entry in files.values()}
        worst = max(sizes, key=lambda u: written[u] / sizes[u])
        bound = cfg.data.max_records_written_per_reason * (cfg.data.max_copy_bytes + 1024)
        assert all(n <= bound * 12 for n in written.values())  # 12 reasons at most, each capped
        assert max(n for u, n in written.items() if u != str(TINY)) < 2 << 20
        tally.add(RELIABILITY_ROW, inputs=len(sizes) - 1, stage_runs=1, input_bytes=sum(sizes.values()),
                  written_bytes=sum(written.values()), worst_input_bytes=sizes[worst],
                  worst_written_bytes=written[worst], outside_writes=0)


def _rchar() -> int:
    """Bytes this process has read through read() so far (/proc/self/io)."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def _readers(folder: Path, one_line: Path, sparse: Path) -> dict:  # noqa: C901 (one entry per reader)
    """Every reader of issue 45 item 3, each given the hostile files as the field it reads: name -> call."""
    from pipeline_lib.checks.inputs import check_inputs, sample_texts
    from pipeline_lib.data.decontaminate import build_eval_ngrams
    from pipeline_lib.data.exclusions import load_exclusions
    from pipeline_lib.data.replay import source_texts
    from pipeline_lib.doctor.logs import read_logs, stage_log_files
    from pipeline_lib.run_diff import read_run
    from pipeline_lib.train.instructions import iter_instruction_records

    max_line = 4 << 20
    cfg = config_from_dict({"run": {"output_root": str(folder / "runs")},
                            "data": {"max_line_bytes": max_line, "inputs": [str(one_line), str(sparse)]},
                            "sft": {"inputs": [str(one_line), str(sparse)]}})
    logs = folder / "runs" / "r1" / "pretrain" / "log"
    logs.mkdir(parents=True)
    for i, src in enumerate((one_line, sparse)):
        os.link(src, logs / f"rank_{i}.log")
    (folder / "runs" / "r1" / "data").mkdir()
    os.link(sparse, folder / "runs" / "r1" / "data" / "stats.json")

    def refused(fn):
        try:
            fn()
        except ValueError as err:  # the reader's clear error (field, value, fix): what a hostile file should get
            assert "Fix" in str(err) or "fix" in str(err), err

    def decontaminate(path):
        c = config_from_dict({"data": {"max_line_bytes": max_line, "decontamination": {"files": [str(path)]}},
                              "evaluate": {"reference_sets": [], "prompt_files": [], "tasks": []}})  # that file only
        refused(lambda: build_eval_ngrams(c, None))

    return {
        "replay sources": lambda: [list(source_texts(str(p), None, "data.replay.sources[0]", "text", max_line, {}))
                                   for p in (one_line, sparse)],
        "SFT inputs": lambda: list(iter_instruction_records([str(one_line), str(sparse)], max_line=max_line)),
        "validate pre-checks": lambda: (sample_texts([str(one_line), str(sparse)], "text", max_line),
                                        check_inputs(cfg, ["sft"])),
        "exclusions": lambda: [refused(lambda p=p: load_exclusions(config_from_dict({"data": {k: [str(p)]}})))
                               for p in (one_line, sparse) for k in ("exclude_ids", "exclude_from")],
        "decontamination": lambda: [decontaminate(p) for p in (one_line, sparse)],
        "doctor logs": lambda: read_logs(stage_log_files(logs)),
        "diff inputs": lambda: refused(lambda: read_run(cfg, "r1")),
    }


def test_every_reader_reads_hostile_files_with_bounded_bytes_and_memory(tally):
    """Issue 45 item 3: a one-line gzip (200 KB holding 200 MB under the reliability profile) and a sparse file
    (2 GB there) through every reader of the product besides the data stage's: bytes read (rchar) and peak Python
    memory (tracemalloc) per input byte (the file's size on disk for the gzip, its length for the sparse file)."""
    import time
    import tracemalloc

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        one_line = folder / "oneline.jsonl.gz"
        with gzip.open(one_line, "wb", 9) as fh:
            fh.write(b'{"text": "')
            for _ in range(200 if FULL else 16):
                fh.write(b"a" * (1 << 20))
            fh.write(b'"}\n')
        sparse = folder / "sparse.jsonl"
        with open(sparse, "wb") as fh:
            fh.truncate((2 << 30) if FULL else (64 << 20))
        inputs = one_line.stat().st_size + sparse.stat().st_size
        worst_peak, worst_read, total_read = 0, 0, 0
        readers = _readers(folder, one_line, sparse)
        for name, call in readers.items():
            started, before = time.time(), _rchar()
            tracemalloc.start()
            call()
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            read = _rchar() - before
            # a few times the larger of data.max_line_bytes and the cap of a json read whole (MAX_JSON_BYTES)
            assert peak < 4 * max(4 << 20, MAX_JSON_BYTES) + (8 << 20), (name, peak)
            assert read < 4 * inputs, (name, read)  # validate reads a file for each check that needs it
            assert time.time() - started < (300 if FULL else 60), name
            worst_peak, worst_read, total_read = max(worst_peak, peak), max(worst_read, read), total_read + read
        tally.add(RELIABILITY_ROW, readers=len(readers), reader_input_bytes=inputs, reader_read_bytes=total_read,
                  reader_worst_read_bytes=worst_read, reader_worst_peak_bytes=worst_peak)
