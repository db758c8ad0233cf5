"""Packing into seq_length + 1 rows, the held-out split, and MindRecord files read by MindDataset."""
from __future__ import annotations

import numpy as np

from pipeline_lib.data.encode import file_rows, mindrecord_groups
from pipeline_lib.data.packing import gather_tokens, heldout_mask, read_mindrecord, write_mindrecord
from pipeline_lib.model.packing import count_rows, join_with_eos, rows_from_tokens


def test_documents_are_joined_with_eos_and_packed_into_exact_rows():
    stream = join_with_eos([[5, 6, 7], [], [8, 9]], eos_id=3)
    assert stream.tolist() == [5, 6, 7, 3, 3, 8, 9, 3] and stream.dtype == np.int32
    assert rows_from_tokens(stream, 3, "drop", 0).tolist() == [[5, 6, 7], [3, 3, 8]]
    assert rows_from_tokens(stream, 3, "pad", 0).tolist() == [[5, 6, 7], [3, 3, 8], [9, 3, 0]]
    assert count_rows(8, 3, "drop") == 2 and count_rows(8, 3, "pad") == 3 and count_rows(9, 3, "pad") == 3
    assert rows_from_tokens(stream[:2], 3, "drop", 0).shape == (0, 3)


def test_token_arrays_join_as_token_lists_do():
    rng = np.random.default_rng(7)
    for n in (20, 1000):  # empty documents among them, first and last included
        lists = [rng.integers(4, 16000, rng.integers(0, 40)).tolist() for _ in range(n)]
        lists[0] = lists[-1] = []
        arrays = [np.asarray(t, dtype=np.int32) for t in lists]
        expect = [t for doc in lists for t in (*doc, 3)]
        assert join_with_eos(arrays, 3).tolist() == expect == join_with_eos(lists, 3).tolist()
    assert join_with_eos([], 3).tolist() == [] and join_with_eos([np.zeros(0, np.int32)] * 2, 3).tolist() == [3, 3]


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


def test_document_mask_allows_only_earlier_tokens_of_the_same_document():
    from pipeline_lib.model.packing import DOCUMENT_MASK_ALLOWED, document_attention_mask

    # a row of 9 tokens: the tail of a document begun earlier (5 6 EOS), a whole one (7 8 EOS), pads; the last
    # token is only a target, so the mask covers the 8 inputs
    rows = np.array([[5, 6, 3, 7, 8, 3, 0, 0, 0], [3, 9, 9, 9, 9, 9, 9, 9, 3]], np.int32)
    mask = document_attention_mask(rows, eos_id=3)
    assert mask.shape == (2, 1, 8, 8) and mask.dtype == np.int32
    want = np.array([[1, 0, 0, 0, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0, 0, 0, 0],
                     [1, 1, 1, 0, 0, 0, 0, 0],
                     [0, 0, 0, 1, 0, 0, 0, 0],
                     [0, 0, 0, 1, 1, 0, 0, 0],
                     [0, 0, 0, 1, 1, 1, 0, 0],
                     [0, 0, 0, 0, 0, 0, 1, 0],
                     [0, 0, 0, 0, 0, 0, 1, 1]])
    np.testing.assert_array_equal(mask[0, 0], want * DOCUMENT_MASK_ALLOWED)
    # a row opening with an EOS: that EOS ends the previous document alone; the final EOS is a target only
    second = np.tril(np.ones((8, 8), int))
    second[1:, 0] = 0
    np.testing.assert_array_equal(mask[1, 0], second * DOCUMENT_MASK_ALLOWED)


def test_mindrecord_with_document_mask_round_trips_and_counts_in_the_file_size(tmp_path):
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.data.encode import rows_per_file
    from pipeline_lib.model.packing import document_attention_mask
    from pipeline_lib.storage.mindrecord import read_mindrecord_columns

    rows = np.random.default_rng(0).integers(3, 9, size=(5, 65)).astype(np.int32)
    mask = document_attention_mask(rows, eos_id=3)
    path = tmp_path / "shard-00000.mindrecord"
    write_mindrecord(path, rows, attention_mask=mask)
    back = read_mindrecord_columns([path], ["input_ids", "attention_mask"])
    np.testing.assert_array_equal(back["input_ids"], rows)
    np.testing.assert_array_equal(back["attention_mask"], mask)
    assert (read_mindrecord([path]) == rows).all()
    # 1 MB files at seq 64: 4,032 rows of 260 bytes, or 62 of 260 + 16,384 bytes with the mask
    off = {"model": {"seq_length": 64}, "data": {"mindrecord_file_mb": 1}}
    on = config_from_dict({**off, "data": {**off["data"], "packing": {"document_mask": True}}})
    off = config_from_dict(off)
    assert (rows_per_file(off), rows_per_file(on)) == ((1 << 20) // 260, (1 << 20) // (260 + 16384))


def test_mindrecord_groups_balance_rows_not_files():
    # the 30x bench's plan (rows of 65 tokens, 256 MB files): cut in input order, one worker wrote both train
    # files (1.90M rows) while the other wrote the held-out file (0.07M) and then idled
    plan = {"train": {"rows": 1_900_000, "rows_per_file": 1_032_000},
            "heldout": {"rows": 70_000, "rows_per_file": 1_032_000}}
    items = [("train", 0), ("train", 1), ("heldout", 0)]
    assert [file_rows(plan, *i) for i in items] == [1_032_000, 868_000, 70_000]
    assert mindrecord_groups(items, 2, plan) == [[("train", 0)], [("train", 1), ("heldout", 0)]]
    # more files than groups: the largest first, each to the group with the fewest rows so far
    plan["train"]["rows"] = 2_700_000
    items = [("train", 0), ("train", 1), ("train", 2), ("heldout", 0)]
    groups = mindrecord_groups(items, 2, plan)
    assert groups == [[("train", 0), ("train", 2)], [("train", 1), ("heldout", 0)]]
    assert [sum(file_rows(plan, *i) for i in g) for g in groups] == [1_668_000, 1_102_000]
    # without a plan every file weighs the same; never more groups than files
    assert mindrecord_groups(items, 8) == [[i] for i in items]
    assert mindrecord_groups(items, 1, plan) == [items]
