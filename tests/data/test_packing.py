"""Packing into seq_length + 1 rows, the held-out split, and MindRecord files read by MindDataset."""
from __future__ import annotations

import numpy as np

from pipeline_lib.data.packing import gather_tokens, heldout_mask, read_mindrecord, write_mindrecord
from pipeline_lib.model.packing import count_rows, join_with_eos, rows_from_tokens


def test_documents_are_joined_with_eos_and_packed_into_exact_rows():
    stream = join_with_eos([[5, 6, 7], [], [8, 9]], eos_id=3)
    assert stream.tolist() == [5, 6, 7, 3, 3, 8, 9, 3] and stream.dtype == np.int32
    assert rows_from_tokens(stream, 3, "drop", 0).tolist() == [[5, 6, 7], [3, 3, 8]]
    assert rows_from_tokens(stream, 3, "pad", 0).tolist() == [[5, 6, 7], [3, 3, 8], [9, 3, 0]]
    assert count_rows(8, 3, "drop") == 2 and count_rows(8, 3, "pad") == 3 and count_rows(9, 3, "pad") == 3
    assert rows_from_tokens(stream[:2], 3, "drop", 0).shape == (0, 3)


def test_gather_tokens_spans_parts():
    parts = [(0, np.arange(5)), (5, np.arange(5, 7)), (7, np.arange(7, 12))]
    assert gather_tokens(parts, 3, 9).tolist() == [3, 4, 5, 6, 7, 8]
    assert gather_tokens(parts, 12, 15).tolist() == []


def test_heldout_split_is_a_stable_share_of_the_hash_range():
    keys = np.random.default_rng(0).integers(0, 2**63, 20000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    share = heldout_mask(keys, 0.05).mean()
    assert 0.04 < share < 0.06
    assert not heldout_mask(keys, 0.0).any()
    assert (heldout_mask(keys[:100], 0.05) == heldout_mask(keys[:100], 0.05)).all()


def test_mindrecord_written_atomically_and_read_back(tmp_path):
    rows = np.arange(2 * 65 * 3, dtype=np.int32).reshape(6, 65)
    path = tmp_path / "train" / "shard-00000.mindrecord"
    write_mindrecord(path, rows)
    assert sorted(p.name for p in path.parent.iterdir()) == ["shard-00000.mindrecord", "shard-00000.mindrecord.db"]
    assert (read_mindrecord([path]) == rows).all()
