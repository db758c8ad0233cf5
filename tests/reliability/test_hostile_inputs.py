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
