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
