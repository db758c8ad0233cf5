"""Concurrent runs (issue 16): two runs writing to one output root at once, as real processes.

- Two nightlies (two dates) started together: one holds the nightly lock and trains, the other does nothing
  and names the holder (Completed "Busy"), or, if it starts after the first finished, finds nothing new
  (Skipped). No new file is trained on twice; the nightly state holds every file once.
- Two data-stage runs of one dedup lineage (three under HYPOTHESIS_PROFILE=reliability), overlapping inputs: no
  run's index entries are lost or half-merged: a run over all their inputs finds no new document (local and S3).
- The nightly state and lock on S3: two processes commit at once, both changes land; only one holds the lock.
The tally row `concurrent` counts runs and runs whose update was lost or half-merged (must stay 0).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline_lib.config import load_config
from pipeline_lib.data.errors import NoNewDocuments
from pipeline_lib.nightly import load_state
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths, store_for

RELIABILITY_ROW = "concurrent"
ROOT = Path(__file__).resolve().parents[2]
ENTRY = Path(__file__).with_name("concurrent_entry.py")
CORPUS = ROOT / "configs" / "data" / "tiny_corpus.jsonl"
HEAVY = os.environ.get("HYPOTHESIS_PROFILE") == "reliability"


def tiny(output_root: str, inputs: list[str], endpoint: str | None = None, *more: str):
    overrides = [f"run.output_root={output_root}", "data.executor=local", "data.num_workers=1",
                 f"data.inputs={json.dumps(inputs)}", *more]
    if endpoint:
        overrides.append(f"run.s3_endpoint_url={endpoint}")
    return load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml"), overrides)


def start_together(*argvs: list[str]) -> list[dict]:
    """Start every command at once (real processes), wait for all; the RESULT each printed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv in argvs]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        line = next((l for l in out.splitlines() if l.startswith("RESULT ")), None)
        assert line is not None, f"exit {proc.returncode}\n{out[-3000:]}\n{err[-3000:]}"
        results.append(json.loads(line[len("RESULT "):]))
    return results


@pytest.mark.usefixtures("prefect_server")
def test_two_nightlies_at_once_train_each_new_file_once(tmp_path, tally):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "day1.jsonl").write_bytes(CORPUS.read_bytes())
    cfg = tiny(str(tmp_path / "runs"), [str(raw / "*.jsonl")])
    config = json.dumps(cfg.model_dump(mode="json"))
    dates = ["2026-12-01", "2026-12-02"]
    results = start_together(*[[str(ENTRY), "nightly", config, d] for d in dates])
    tally.add(RELIABILITY_ROW, runs=2)

    runs = tmp_path / "runs"
    trained = [d for d in dates if (runs / f"nightly-{d}" / "pretrain" / "out.json").exists()]
    state = load_state(cfg)
    ok = (len(trained) == 1 and state["consumed"] == {str(raw / "day1.jsonl"): len(CORPUS.read_bytes())}
          and len(state["history"]) == 1 and state["latest"]["run_id"] == f"nightly-{trained[0]}")
    tally.add(RELIABILITY_ROW, lost_or_half_merged=int(not ok))
    assert len(trained) == 1, f"both nights trained on day1.jsonl: {results}"
    winner = f"nightly-{trained[0]}"
    assert ok, (state, results)
    for date, result in zip(dates, results):
        if f"nightly-{date}" == winner:
            assert result["state"] == "Promoted", result
        else:  # started while the winner held the lock, or after it finished
            assert result["state"] in ("Busy", "Skipped"), result
            if result["state"] == "Busy":
                assert f"another night holds the nightly lock of {cfg.run.output_root}: {winner}" in \
                    result["message"], result
    assert not (runs / "_nightly" / "lock.json").exists()  # given back


def lines(first: int, last: int) -> bytes:
    return b"".join(CORPUS.read_bytes().splitlines(keepends=True)[first:last])


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_data_runs_of_one_lineage_lose_no_index_entry(where, tmp_path, request, tally):
    if where == "s3":
        bucket, endpoint = request.getfixturevalue("s3_bucket")
        root = f"{bucket}/runs"
    else:
        root, endpoint = str(tmp_path / "runs"), None
    raw = tmp_path / "raw"
    raw.mkdir()
    # Overlapping slices of the corpus, one run each, all started at once (three under the reliability profile).
    slices = [(0, 180), (140, 320), (280, 438)] if HEAVY else [(0, 260), (200, 438)]
    runs = [f"run-{chr(ord('a') + k)}" for k in range(len(slices))]
    for run, (first, last) in zip(runs, slices):
        (raw / f"{run}.jsonl").write_bytes(lines(first, last))
    (raw / "all.jsonl").write_bytes(lines(0, 438))
    configs = {run: json.dumps(tiny(root, [str(raw / f"{run}.jsonl")], endpoint).model_dump(mode="json"))
               for run in runs}
    results = start_together(*[[str(ENTRY), "data", configs[run], run] for run in runs])
    tally.add(RELIABILITY_ROW, runs=len(runs))
    assert [r["state"] for r in results] == ["Completed"] * len(runs), results
    assert max(r["started"] for r in results) < min(r["ended"] for r in results), \
        f"the runs did not all overlap: {results}"

    # Every document of every run is in the index: a run over all their inputs finds nothing new.
    third = tiny(root, [str(raw / "all.jsonl")], endpoint)
    try:
        manifest, _ = run_stage(third, RunPaths(root, "run-all", endpoint), "data", workers=1)
        kept = manifest.metrics.get("kept")
    except NoNewDocuments as none:
        kept = None
        assert sorted(none.counts["earlier_runs"]) == runs, none.counts
    tally.add(RELIABILITY_ROW, lost_or_half_merged=int(kept is not None))
    assert kept is None, f"the run over all of them kept {kept} documents: an index update of {runs} was lost"


STATE_WRITER = textwrap.dedent("""
    import json, sys
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.nightly import NightBusy, commit_night, night_lock
    cfg, name = config_from_dict(json.loads(sys.argv[1])), sys.argv[2]
    for i in range(6):  # six nights' state commits each, no lock: the generations merge them
        commit_night(cfg, {}, {f"{name}-{i}.jsonl": i}, f"{name}-{i}", None)
    try:
        with night_lock(cfg, name):
            print("RESULT " + json.dumps({"state": "held"}), flush=True)
            import time; time.sleep(3)  # hold it while the other process tries
    except NightBusy as busy:
        print("RESULT " + json.dumps({"state": "Busy", "message": str(busy)}), flush=True)
""")


def test_nightly_state_and_lock_on_s3_from_two_processes(s3_bucket, tmp_path, tally):
    bucket, endpoint = s3_bucket
    cfg = tiny(f"{bucket}/runs", [str(tmp_path / "*.jsonl")], endpoint)
    config = json.dumps(cfg.model_dump(mode="json"))
    script = tmp_path / "state_writer.py"
    script.write_text(STATE_WRITER)
    results = start_together([str(script), config, "p"], [str(script), config, "q"])
    tally.add(RELIABILITY_ROW, runs=2)
    state = load_state(cfg)
    want = {f"{n}-{i}.jsonl": i for n in "pq" for i in range(6)}
    lost = state["consumed"] != want or len(state["history"]) != 12
    tally.add(RELIABILITY_ROW, lost_or_half_merged=int(lost))
    assert not lost, state
    # The lock: at most one holds it at a time (if the first released before the second tried, both held it in turn).
    held = [r for r in results if r["state"] == "held"]
    assert held, results
    for r in results:
        if r["state"] == "Busy":
            assert "another night holds the nightly lock" in r["message"], r
    assert not store_for(cfg.run.output_root, endpoint).exists(f"{cfg.run.output_root}/_nightly/lock.json")
