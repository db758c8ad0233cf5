"""Provenance in the dedup index survives any file name: a newline (or \\r, \\x85, \\u2028, a byte that is not
UTF-8) in an input's name split its origin in two and shifted every later row, so later duplicates named the wrong
source. An index of the earlier format is refused with the fix, and `migrate` converts it."""
import json
from pathlib import Path

import numpy as np
import pytest

from datagen import make_cfg
from pipeline_lib.data.dedup import Deduplicator
from pipeline_lib.data.dedup_index import (FORMAT, commit_segment, index_uri, list_segments, load_prior,
                                           load_prior_in_memory, migrate_index, segment_meta, write_segment)
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.minhash import band_keys

NUM_PERM = 128
HOSTILE = ["a\nb.jsonl:1", "c\r\nd.jsonl:2", "e\u2028f\x85g\x0bh.jsonl:3", "\udcff\udcfe.jsonl:4",
           'q"uo\\te.jsonl:5', "\n:6", ""]


def _docs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2**63, n, dtype=np.uint64),
            rng.integers(0, 2**32 - 1, (n, NUM_PERM), dtype=np.uint32))


def _commit(cfg, tmp_path: Path, run_id: str, origins: list[str], keys, sigs) -> Path:
    folder = tmp_path / "segs" / run_id
    names = write_segment(folder, segment_meta(cfg, run_id, len(keys), True), origins, keys, sigs,
                          [f"src-{j}" for j in range(len(keys))])
    return Path(commit_segment(folder, names, index_uri(cfg), run_id))


def _kept_origins(cfg, keys, sigs) -> list[list[str]]:
    """The origin each of `keys` is a duplicate of, by the partitioned lookup and by the whole index in memory."""
    dd = Deduplicator(cfg.data.dedup)
    out = []
    for prior in (load_prior(cfg, "tonight", dd.bands, dd.rows, keys=keys, band_keys_=band_keys(sigs, dd.bands,
                                                                                                 dd.rows)),
                  load_prior_in_memory(cfg, "tonight", dd.bands, dd.rows)):
        _, records = Deduplicator(cfg.data.dedup, prior, "tonight").process(
            [f"new.jsonl:{i}" for i in range(len(keys))], keys, sigs)
        out.append([r["kept_origin"] for r in sorted(records, key=lambda r: int(r["origin"].split(":")[1]))])
    return out


def test_every_origin_survives_whatever_its_file_name_holds(tmp_path):
    cfg = make_cfg(tmp_path)
    origins = [f"plain.jsonl:{j}" for j in range(20)]
    origins[3:3 + len(HOSTILE)] = HOSTILE
    origins = origins[:20]
    keys, sigs = _docs(20, 1)
    segment = _commit(cfg, tmp_path, "night1", origins, keys, sigs)
    assert not (segment / "ids.txt").exists() and list_segments(cfg)[0]["format"] == FORMAT
    parted, memory = _kept_origins(cfg, keys, sigs)  # every new document is a copy of one in the index
    assert parted == memory == origins


def _to_format_2(segment: Path, origins: list[str]) -> None:
    """The segment as the earlier version wrote it: origins as plain lines (ids.txt, ids.idx), meta format 2."""
    text = "".join(o + "\n" for o in origins)
    lengths = [len(o.encode("utf-8")) + 1 for o in origins]
    (segment / "ids.txt").write_text(text, encoding="utf-8")
    (segment / "ids.idx").write_bytes(np.concatenate([[0], np.cumsum(lengths)]).astype("<u8").tobytes())
    (segment / "ids.jsonl").unlink()
    meta = json.loads((segment / "meta.json").read_text())
    (segment / "meta.json").write_text(json.dumps(meta | {"format": 2}))


def test_an_index_of_the_plain_line_format_is_refused_then_migrated(tmp_path):
    cfg = make_cfg(tmp_path)
    origins = [f"old day.jsonl:{j}" for j in range(12)]
    keys, sigs = _docs(12, 2)
    _to_format_2(_commit(cfg, tmp_path, "old1", origins, keys, sigs), origins)
    with pytest.raises(DataStageError, match="origins as plain lines.*dedup-index migrate"):
        _kept_origins(cfg, keys, sigs)
    with pytest.raises(DataStageError, match="dedup-index migrate"):  # a commit is refused too, before it writes
        _commit(cfg, tmp_path, "night2", ["new.jsonl:0"], *_docs(1, 3))
    assert migrate_index(cfg) == ["old1"] and migrate_index(cfg) == []
    segment = Path(index_uri(cfg)) / "segments" / "old1"
    assert not (segment / "ids.txt").exists() and json.loads((segment / "meta.json").read_text())["format"] == FORMAT
    assert _kept_origins(cfg, keys, sigs) == [origins, origins]


@pytest.mark.slow  # two whole data stage runs (~30 s on 2 cores)
def test_a_data_stage_run_names_the_right_source_behind_a_file_name_with_a_newline(tmp_path):
    """The issue's case through the real data stage: night 1 reads a file whose name holds a newline, then another;
    night 2's copies of both must each name the file and line they copy (52 of 54 named the wrong one)."""
    from datagen import TINY, write_jsonl
    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths

    texts = [json.loads(x)["text"] for x in TINY.read_text(errors="replace").splitlines()
             if x.endswith('"source": "tiny"}')][:200]
    odd = write_jsonl(tmp_path / "in" / "day\n1.jsonl", texts[:60])
    plain = write_jsonl(tmp_path / "in" / "day2.jsonl", texts[60:120])
    again = write_jsonl(tmp_path / "in" / "night2.jsonl", texts[:200])  # 120 copies, then new documents

    def run(inputs, run_id):
        cfg = make_cfg(tmp_path, inputs=[str(p) for p in inputs], dedup={"near": False})
        return cfg, run_stage(cfg, RunPaths(cfg.run.output_root, run_id), "data", workers=1)[0]

    run([odd, plain], "night1")
    cfg, _ = run([again], "night2")
    dups = [json.loads(x) for x in (Path(cfg.run.output_root) / "night2" / "data" / "duplicates.jsonl")
            .read_text().splitlines()]
    line = lambda origin: int(origin.rsplit(":", 1)[1])  # noqa: E731 (1-based, as origins count lines)
    first = {}  # a text's first line in night 1: the document night 1 kept of it
    for i, text in enumerate(texts[:120]):
        first.setdefault(text, f"day\n1.jsonl:{i + 1}" if i < 60 else f"day2.jsonl:{i - 59}")
    prior = [d for d in dups if d["kept_run"] == "night1"]
    assert len(prior) == 120 and sorted(line(d["origin"]) for d in prior) == list(range(1, 121))
    for d in prior:  # night2.jsonl line n holds texts[n - 1]
        assert d["kept_origin"] == first[texts[line(d["origin"]) - 1]], d
