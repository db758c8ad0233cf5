"""MindRecord columns: written atomically, the fast row path equal to FileWriter's own, read back."""
from __future__ import annotations

import numpy as np

from pipeline_lib.storage import mindrecord


def test_columns_are_written_atomically_and_read_back_in_order(tmp_path):
    ids = np.arange(4 * 9, dtype=np.int32).reshape(4, 9)
    cols = {"input_ids": ids, "labels": np.where(ids % 2 == 0, ids, -100).astype(np.int32)}
    path = mindrecord.write_mindrecord_columns(tmp_path / "sft" / "rows.mindrecord", cols, "sft")
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.mindrecord", "rows.mindrecord.db"]
    back = mindrecord.read_mindrecord_columns([path], ["input_ids", "labels"])
    assert (back["input_ids"] == cols["input_ids"]).all() and (back["labels"] == cols["labels"]).all()


def test_fast_row_path_writes_the_same_bytes_as_filewriter(tmp_path, monkeypatch):
    """Rows after the first batch bypass FileWriter's per-row schema checks: the file and what
    MindDataset reads back must equal FileWriter's own output, for one column and for several."""
    rng = np.random.RandomState(3)
    cols = {"input_ids": rng.randint(0, 30000, (37, 65)).astype(np.int32),
            "labels": rng.randint(-100, 30000, (37, 65)).astype(np.int32)}
    monkeypatch.setattr(mindrecord, "_BATCH_ROWS", 8)  # 5 batches: 1 public, 4 fast
    for name, columns in (("one", {"input_ids": cols["input_ids"]}), ("two", cols)):
        fast = mindrecord.write_mindrecord_columns(tmp_path / "fast" / name / "f.mindrecord", columns, "t")
        with monkeypatch.context() as m:
            m.setattr(mindrecord, "_BATCH_ROWS", 10 ** 9)
            ref = mindrecord.write_mindrecord_columns(tmp_path / "ref" / name / "f.mindrecord", columns, "t")
        assert fast.read_bytes() == ref.read_bytes(), name
        import mindspore.dataset as ds

        data = ds.MindDataset([str(fast)], columns_list=list(columns), shuffle=False)
        got = list(data.create_dict_iterator(output_numpy=True, num_epochs=1))
        for c in columns:
            assert (np.stack([g[c] for g in got]) == columns[c]).all(), (name, c)


def test_the_command_line_writes_every_array_of_an_npz_as_a_column(tmp_path):
    """What SFT runs in a subprocess (its own process never imports MindSpore)."""
    import subprocess
    import sys

    from pipeline_lib.runtime.env import subprocess_env

    ids = np.arange(3 * 5, dtype=np.int32).reshape(3, 5)
    np.savez(tmp_path / "rows.npz", input_ids=ids, labels=-ids)
    out = tmp_path / "data" / "sft.mindrecord"
    proc = subprocess.run([sys.executable, "-m", "pipeline_lib.storage.mindrecord", str(tmp_path / "rows.npz"),
                           str(out), "sft"], capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    back = mindrecord.read_mindrecord_columns([out], ["input_ids", "labels"])
    assert (back["input_ids"] == ids).all() and (back["labels"] == -ids).all()
