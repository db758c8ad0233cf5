"""data.exclude_from / data.exclude_ids: what the data stage reads to drop documents (the stage's own run with them is
in tests/train/test_pretrain_stage.py, on the guard_diagnosis.json of a real guard trip)."""
from __future__ import annotations

import json

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.exclusions import load_exclusions


def _cfg(**data):
    return config_from_dict({"data": data})


def test_guard_documents_match_by_origin_and_id_lists_by_id(tmp_path):
    diag = tmp_path / "guard_diagnosis.json"
    diag.write_text(json.dumps({"trips": [], "documents": [{"id": "pm-0007", "origin": "corpus.jsonl:7", "steps": [6]}]}))
    ids = tmp_path / "ids.txt"
    ids.write_text('"pm-0100"\n17\nplain id\n\n')
    ex = load_exclusions(_cfg(exclude_from=[str(diag)], exclude_ids=[str(ids)]))
    assert ex.matches("pm-0007", "corpus.jsonl:7")
    assert not ex.matches("pm-0007", "other.jsonl:7")  # the same id elsewhere is another document
    assert ex.matches("pm-0100", "x:1") and ex.matches(17, "x:2") and ex.matches("plain id", "x:3")
    assert not ex.matches("17", "x:4")  # ids compare as their JSON values: 17 is not "17"
    assert not load_exclusions(_cfg())


@pytest.mark.parametrize("text, problem", [("{}", "not a guard_diagnosis.json"),
                                           ('{"documents": [{"id": 1}]}', "not a guard_diagnosis.json")])
def test_a_file_that_is_not_a_guard_diagnosis_is_refused_naming_the_field(tmp_path, text, problem):
    bad = tmp_path / "other.json"
    bad.write_text(text)
    with pytest.raises(DataStageError) as err:
        load_exclusions(_cfg(exclude_from=[str(bad)]))
    assert str(err.value).startswith(f"data.exclude_from={str(bad)!r}: {problem}") and "Fix:" in str(err.value)


def test_a_missing_file_is_refused_naming_the_field(tmp_path):
    with pytest.raises(DataStageError, match=r"data.exclude_ids=.*cannot read it"):
        load_exclusions(_cfg(exclude_ids=[str(tmp_path / "absent.txt")]))


def test_exclusion_files_are_bounded_and_refused_naming_the_field(tmp_path):
    """Issue 45 item 3: exclusion files were read whole (and once per shard)."""
    sparse = tmp_path / "guard_diagnosis.json"
    with open(sparse, "wb") as fh:
        fh.truncate(1 << 30)
    with pytest.raises(DataStageError, match=r"data.exclude_from=.*larger than 16 MiB.*Fix:"):
        load_exclusions(_cfg(exclude_from=[str(sparse)]))
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b'"a"\n' + b"x" * (1 << 20) + b"\n")
    with pytest.raises(DataStageError, match=r"data.exclude_ids=.*line 2 is 1,048,576 bytes: not an id"):
        load_exclusions(_cfg(exclude_ids=[str(ids)]))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(DataStageError, match=r"data.exclude_from=.*not a guard_diagnosis.json \(RecursionError"):
        load_exclusions(_cfg(exclude_from=[str(deep)]))


def test_exclusions_are_read_once_a_run_by_the_plan_step(tmp_path):
    from datagen import make_cfg

    from pipeline_lib.data.prep import plan_data_stage, prep_shard
    from pipeline_lib.storage import RunPaths

    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(json.dumps(f"pm-{i:04d}") for i in range(0, 400, 7)) + "\n")
    cfg = make_cfg(tmp_path, exclude_ids=[str(ids)], docs_per_shard=100, dedup={"incremental": False})
    paths = RunPaths(cfg.run.output_root, "once")
    shards = plan_data_stage(cfg, paths)
    assert len(shards) > 2
    ids.unlink()  # every shard works from what the plan step read: the file is not read again
    counts = [prep_shard(cfg, paths, k) for k in range(len(shards))]
    assert sum(c["filtered"].get("guard", 0) for c in counts) > 0


def test_a_screen_file_gives_its_reason_and_a_guard_file_guard(tmp_path):
    screen = tmp_path / "exclude.json"
    screen.write_text(json.dumps({"reason": "lineage_perplexity", "documents": [{"id": "s-1", "origin": "x.jsonl:3"}]}))
    diag = tmp_path / "guard_diagnosis.json"
    diag.write_text(json.dumps({"documents": [{"id": "g-1", "origin": "x.jsonl:5"}]}))
    ids = tmp_path / "ids.txt"
    ids.write_text('"by-id"\n')
    ex = load_exclusions(_cfg(exclude_from=[str(screen), str(diag)], exclude_ids=[str(ids)]))
    assert ex.reason("s-1", "x.jsonl:3") == "lineage_perplexity"
    assert ex.reason("g-1", "x.jsonl:5") == "guard" and ex.reason("by-id", "y:1") == "guard"
    assert ex.reason("s-1", "x.jsonl:4") is None
    screen.write_text(json.dumps({"reason": "", "documents": []}))
    with pytest.raises(DataStageError, match="reason must be a non-empty string"):
        load_exclusions(_cfg(exclude_from=[str(screen)]))
