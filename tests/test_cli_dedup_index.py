"""`llm-pipeline dedup-index list|clear CONFIG [--lineage X]` as a user runs it (real subprocess)."""
import subprocess
import sys
from pathlib import Path

import numpy as np

from pipeline_lib.config import load_config
from pipeline_lib.data.dedup_index import FORMAT, commit_segment, index_uri, list_segments, segment_meta, write_segment

ROOT = Path(__file__).resolve().parents[1]
TINY = "configs/pipelines/tiny-cpu.yaml"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "flows.cli", "dedup-index", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def add_segment(cfg, run_id: str, docs: int, tmp_path: Path, uri: str = "/data/day.jsonl") -> None:
    inputs = [{"uri": uri, "size": 10, "fingerprint": f"sha256:{uri}"}]
    names = write_segment(tmp_path / run_id, segment_meta(cfg, run_id, docs, False, inputs),
                          [f"day.jsonl:{i}" for i in range(docs)], np.arange(docs, dtype=np.uint64), None)
    commit_segment(tmp_path / run_id, names, index_uri(cfg), run_id)


def test_list_and_clear_one_lineage_only(tmp_path):
    root = f"run.output_root={tmp_path / 'runs'}"
    mine = load_config(TINY, [root])
    other = load_config(TINY, [root, "data.dedup.lineage=other"])
    add_segment(mine, "r1", 3, tmp_path)
    add_segment(mine, "r2", 4, tmp_path, "/data/night.jsonl")
    add_segment(other, "o1", 5, tmp_path)

    listed = cli("list", TINY, root)
    assert listed.returncode == 0, listed.stderr
    assert f"lineage tiny-cpu: index {index_uri(mine)}" in listed.stdout
    assert "r1" in listed.stdout and "r2" in listed.stdout and "o1" not in listed.stdout
    assert "2 run(s), 7 documents" in listed.stdout and "/data/day.jsonl" in listed.stdout

    cleared = cli("clear", TINY, root, "--lineage", "other")
    assert cleared.returncode == 0, cleared.stderr
    assert "cleared: 1 run(s), 5 documents" in cleared.stdout
    assert list_segments(other) == [] and [m["run_id"] for m in list_segments(mine)] == ["r1", "r2"]


def test_list_counts_the_documents_of_a_rerun_once(tmp_path):
    """`make demo` twice: the second run rereads the first one's file (not deduplicated against it, the rerun rule),
    so the index holds 2 x 420 entries of 420 documents; a third run of a new file adds its own."""
    root = f"run.output_root={tmp_path / 'runs'}"
    cfg = load_config(TINY, [root])
    add_segment(cfg, "demo1", 420, tmp_path, "/data/corpus.jsonl")
    add_segment(cfg, "demo2", 420, tmp_path, "/data/corpus.jsonl")
    listed = cli("list", TINY, root)
    assert listed.returncode == 0, listed.stderr
    assert "2 run(s), 420 documents (840 entries: a run that reread" in listed.stdout, listed.stdout
    assert "(reread by demo2)" in listed.stdout
    add_segment(cfg, "night1", 30, tmp_path, "/data/night.jsonl")
    assert "3 run(s), 450 documents (870 entries" in cli("list", TINY, root).stdout


def test_bad_lineage_name_exits_2():
    res = cli("list", TINY, "--lineage", "../up")
    assert res.returncode == 2 and "data.dedup.lineage" in res.stderr


def test_migrate_converts_an_earlier_format_index_in_place(tmp_path):
    import json

    cfg = load_config(TINY, [f"run.output_root={tmp_path / 'runs'}"])
    old = Path(index_uri(cfg)) / "segments" / "old1"  # as earlier versions wrote a segment
    old.mkdir(parents=True)
    np.save(old / "keys.npy", np.arange(3, dtype=np.uint64))
    (old / "ids.txt").write_text("a:1\na:2\na:3\n")
    meta = {k: v for k, v in segment_meta(cfg, "old1", 3, False).items() if k not in ("format", "bands", "rows")}
    (old / "meta.json").write_text(json.dumps(meta))
    listed = cli("list", TINY, f"run.output_root={tmp_path / 'runs'}")
    assert "earlier format: run `dedup-index migrate`" in listed.stdout
    res = cli("migrate", TINY, f"run.output_root={tmp_path / 'runs'}")
    assert res.returncode == 0 and f"migrated 1 run(s) to the current format {FORMAT} (partitioned, origins as JSON strings): old1" in res.stdout, res.stderr
    assert "earlier format" not in cli("list", TINY, f"run.output_root={tmp_path / 'runs'}").stdout
    assert list_segments(cfg)[0]["format"] == FORMAT and (Path(index_uri(cfg)) / "parts" / "exact").is_dir()


def test_repartition_grows_the_partition_count_and_refuses_to_shrink(tmp_path):
    root = f"run.output_root={tmp_path / 'runs'}"
    cfg = load_config(TINY, [root])
    add_segment(cfg, "r1", 40, tmp_path)
    res = cli("repartition", TINY, root, "--bits", "5")
    assert res.returncode == 0 and "repartitioned: 16 -> 32 partitions per kind" in res.stdout, res.stderr
    shrink = cli("repartition", TINY, root, "--bits", "3")
    assert shrink.returncode == 2 and "prefix_bits=5; it can only grow" in shrink.stderr and "Fix:" in shrink.stderr
    assert "2^N" in cli("repartition", TINY, root).stderr


def test_clear_removes_only_a_folder_that_is_an_index(tmp_path):
    """`index_uri=.` (a typo) used to remove the working directory: only an index folder is removed."""
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "keep.py").write_text("print(1)")
    (work / "notes.txt").write_text("mine")
    res = subprocess.run([sys.executable, "-m", "flows.cli", "dedup-index", "clear", str(ROOT / TINY),
                          "data.dedup.index_uri=.", f"run.output_root={tmp_path / 'runs'}"], cwd=work,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "data.dedup.index_uri" in res.stderr and "not a dedup index folder" in res.stderr and "nothing was deleted" in res.stderr
    assert (work / "src" / "keep.py").exists() and (work / "notes.txt").exists()
    # an index with a stray file in it is not removed either; a real one is
    cfg = load_config(TINY, [f"run.output_root={tmp_path / 'runs'}"])
    add_segment(cfg, "r1", 3, tmp_path)
    (Path(index_uri(cfg)) / "thesis.tex").write_text("not index data")
    assert cli("clear", TINY, f"run.output_root={tmp_path / 'runs'}").returncode == 2
    (Path(index_uri(cfg)) / "thesis.tex").unlink()
    done = cli("clear", TINY, f"run.output_root={tmp_path / 'runs'}")
    assert done.returncode == 0 and "cleared: 1 run(s)" in done.stdout and not Path(index_uri(cfg)).exists()


def test_clear_refuses_while_a_run_reads_the_index_and_not_after(tmp_path):
    """Issue 45 item 10: a clear during a run's dedup step made it fail with a FileNotFoundError traceback."""
    import os
    import sys as _sys

    from pipeline_lib.data.index_lease import live_leases
    from pipeline_lib.data.prep import dedup_stage, plan_data_stage, prep_shard
    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths

    sys_path = str(ROOT / "tests" / "data")
    if sys_path not in _sys.path:
        _sys.path.insert(0, sys_path)
    from datagen import make_cfg

    cfg = make_cfg(tmp_path)
    root = f"run.output_root={cfg.run.output_root}"
    add_segment(cfg, "earlier", 3, tmp_path)
    paths = RunPaths(cfg.run.output_root, "tonight")
    for k in range(len(plan_data_stage(cfg, paths))):
        prep_shard(cfg, paths, k)
    dedup_stage(cfg, paths)  # the run now reads the index: its lease names this process
    assert [(h["run_id"], h["pid"]) for h in live_leases(index_uri(cfg), None)] == [("tonight", os.getpid())]
    refused = cli("clear", TINY, root)
    assert refused.returncode == 2 and "data.dedup.lineage='tiny-cpu'" in refused.stderr
    assert "in use by tonight" in refused.stderr and "nothing was deleted" in refused.stderr and "Fix:" in refused.stderr
    assert [m["run_id"] for m in list_segments(cfg)] == ["earlier"]
    run_stage(cfg, paths, "data", workers=1)  # the stage ends: its lease is dropped
    assert live_leases(index_uri(cfg), None) == []
    cleared = cli("clear", TINY, root)
    assert cleared.returncode == 0 and "cleared: 2 run(s)" in cleared.stdout


def test_the_lease_of_a_run_that_died_does_not_hold_the_index(tmp_path):
    import subprocess as sp

    cfg = load_config(TINY, [f"run.output_root={tmp_path / 'runs'}"])
    add_segment(cfg, "r1", 3, tmp_path)
    gone = sp.Popen([sys.executable, "-c", "from pipeline_lib.data.index_lease import take_lease; "
                     f"take_lease({index_uri(cfg)!r}, 'died', None)"], cwd=ROOT)
    assert gone.wait(60) == 0
    assert cli("clear", TINY, f"run.output_root={tmp_path / 'runs'}").returncode == 0
