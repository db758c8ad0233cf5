"""storage.input_files: input files by kind, their labels, and the error for an entry that matches nothing."""
from __future__ import annotations

import pytest

from pipeline_lib.storage.input_files import NoInputFiles, kind_of, list_inputs


def test_kind_is_read_from_the_longest_suffix():
    assert [kind_of(n) for n in ("a.jsonl", "b.JSON.gz", "c.jsonl.gz", "d.parquet", "e.txt")] == \
        ["jsonl", "jsonl.gz", "jsonl.gz", "parquet", None]


def test_files_keep_config_order_without_repeats_and_shortest_unique_labels(tmp_path):
    for rel in ("day1/a.jsonl", "day2/a.jsonl", "day2/b.parquet", "day2/notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    found = list_inputs([str(tmp_path / "day2"), str(tmp_path / "day*" / "*.jsonl")])
    assert [u for u, _ in found] == [str(tmp_path / p) for p in ("day2/a.jsonl", "day2/b.parquet", "day1/a.jsonl")]
    assert [label for _, label in found] == ["day2/a.jsonl", "b.parquet", "day1/a.jsonl"]


def test_an_entry_matching_nothing_names_the_field_the_user_set(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(NoInputFiles) as err:
        list_inputs([str(tmp_path / "notes.txt"), str(tmp_path)], field="sft.inputs")
    assert err.value.field == "sft.inputs[0]" and isinstance(err.value, ValueError)
    assert "matches no .jsonl, .jsonl.gz, .parquet or .arrow file. Fix: check the path" in str(err.value)
