"""checkpoints.py on real MindSpore checkpoint files in mindformers' layout: verify, latest, prune, upload, disk."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.storage import sha256_file, store_for
from pipeline_lib.train.checkpoints import (LATEST_FILE, CheckpointManager, InsufficientDiskError, check_disk,
                                            estimate_checkpoint_bytes, expected_checkpoint_bytes, list_checkpoints,
                                            verify_checkpoints)
from pipeline_lib.runtime.env import subprocess_env

# Weights + two AdamW moments + the step counters mindformers' CheckpointMonitor appends, saved with
# MindSpore's own save_checkpoint (so the files are byte-for-byte what the trainer writes).
_MAKE = """
import sys, numpy as np, mindspore as ms
out = sys.argv[1]
def save(name, step, poison=False):
    rng = np.random.default_rng(step)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    if poison:
        w[3, 5] = np.nan
    params = [{"name": n, "data": ms.Tensor(a)} for n, a in
              (("model.w", w), ("adam_m.model.w", w * 0.1), ("adam_v.model.w", w * w), ("model.b", w[0]))]
    ms.save_checkpoint(params, f"{out}/{name}", append_dict={"global_step": step, "step_num": step, "epoch_num": 1})
for step in (2, 4, 6):
    save(f"good_{step}.ckpt", step)
save("nan_8.ckpt", 8, poison=True)
"""
PARAMS = 64 * 32 + 32  # model.w + model.b


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpts")
    subprocess.run([sys.executable, "-c", _MAKE, str(out)], check=True, env=subprocess_env(), capture_output=True)
    data = (out / "good_6.ckpt").read_bytes()
    (out / "truncated_10.ckpt").write_bytes(data[: len(data) // 2])  # a write cut short by a full disk
    return out


def _place(made: Path, run: Path, rank: int, source: str, step: int) -> Path:
    dest = run / "checkpoint" / f"rank_{rank}" / f"tiny_llama_rank_{rank}-1_{step}.ckpt"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(made / source, dest)
    return dest


def test_layout_is_listed_in_step_order(tmp_path, made):
    for step in (10, 2, 4):
        _place(made, tmp_path, 0, "good_2.ckpt", step)
    _place(made, tmp_path, 1, "good_2.ckpt", 2)
    (tmp_path / "checkpoint" / "rank_0" / "tiny_llama_rank_0-1_6.tmp").write_bytes(b"half")  # being written
    (tmp_path / "checkpoint" / "rank_0" / "meta.json").write_text("{}")
    found = [(c.rank, c.epoch, c.step_in_epoch) for c in list_checkpoints(tmp_path)]
    assert found == [(0, 1, 2), (1, 1, 2), (0, 1, 4), (0, 1, 10)]


def test_sync_verifies_rejects_points_latest_uploads_and_prunes(tmp_path, made):
    run, remote = tmp_path / "run", tmp_path / "remote"
    for step in (2, 4, 6):
        _place(made, run, 0, f"good_{step}.ckpt", step)
    _place(made, run, 0, "nan_8.ckpt", 8)
    _place(made, run, 0, "truncated_10.ckpt", 10)
    for step in (2, 4):  # rank 1 has not written step 6 yet
        _place(made, run, 1, f"good_{step}.ckpt", step)
    logs = []
    mgr = CheckpointManager(run, ranks=[0, 1], keep=2, upload_uri=str(remote), log=logs.append)
    verdicts = {Path(r.path).name: r for r in mgr.sync()}

    assert not verdicts["tiny_llama_rank_0-1_8.ckpt"].ok and "non-finite" in verdicts["tiny_llama_rank_0-1_8.ckpt"].error
    assert set(verdicts["tiny_llama_rank_0-1_8.ckpt"].nonfinite) == {"model.w", "adam_m.model.w", "adam_v.model.w"}
    assert not verdicts["tiny_llama_rank_0-1_10.ckpt"].ok
    rejected = run / "checkpoint_rejected" / "rank_0"
    assert sorted(p.name for p in rejected.iterdir()) == [
        "tiny_llama_rank_0-1_10.ckpt", "tiny_llama_rank_0-1_10.ckpt.reason.json",
        "tiny_llama_rank_0-1_8.ckpt", "tiny_llama_rank_0-1_8.ckpt.reason.json"]
    assert any("REJECTED tiny_llama_rank_0-1_8.ckpt" in line for line in logs)

    latest = json.loads((run / LATEST_FILE).read_text())  # step 6 exists on rank 0 only
    assert latest["step"] == 4 and latest["global_step"] == 4
    assert latest["sha256"] == sha256_file(latest["path"]) and set(latest["ranks"]) == {"0", "1"}
    assert latest["uri"] == str(remote / "rank_0" / "tiny_llama_rank_0-1_4.ckpt")
    assert json.loads((run / LATEST_FILE).read_text()) == json.loads((remote / LATEST_FILE).read_text())

    # keep=2 verified steps (4, 6) here and remotely; step 2 is gone with its sidecar
    assert [(c.rank, c.step_in_epoch) for c in list_checkpoints(run)] == [(0, 4), (1, 4), (0, 6)]
    # each with its optimizer part (split after verification, train.checkpoint_split)
    assert sorted(str(p.relative_to(remote)) for p in remote.rglob("*.ckpt")) == [
        "rank_0/optimizer/tiny_llama_rank_0-1_4.ckpt", "rank_0/optimizer/tiny_llama_rank_0-1_6.ckpt",
        "rank_0/tiny_llama_rank_0-1_4.ckpt", "rank_0/tiny_llama_rank_0-1_6.ckpt",
        "rank_1/optimizer/tiny_llama_rank_1-1_4.ckpt", "rank_1/tiny_llama_rank_1-1_4.ckpt"]
    assert sorted(p.name for p in (run / "checkpoint_optimizer" / "rank_0").iterdir()) == [
        "tiny_llama_rank_0-1_4.ckpt", "tiny_llama_rank_0-1_6.ckpt"]  # step 2's went with its weights
    weights6 = run / "checkpoint" / "rank_0" / "tiny_llama_rank_0-1_6.ckpt"
    assert sha256_file(remote / "rank_0" / "tiny_llama_rank_0-1_6.ckpt") == sha256_file(weights6)
    sidecar = json.loads((run / "checkpoint" / "rank_0" / "tiny_llama_rank_0-1_6.ckpt.verified.json").read_text())
    assert sidecar["step"] == 6 and sidecar["sha256"] == sha256_file(weights6)
    assert sidecar["split"]["optimizer"]["sha256"] == sha256_file(remote / "rank_0" / "optimizer" / weights6.name)

    assert mgr.sync() == []  # nothing new: no verifier process, nothing changes
    _place(made, run, 1, "good_6.ckpt", 6)
    mgr.sync()
    assert mgr.latest()["step"] == 6 and mgr.latest()["ranks"]["1"]["path"].endswith("rank_1-1_6.ckpt")
    assert [(c.rank, c.step_in_epoch) for c in list_checkpoints(run)] == [(0, 4), (1, 4), (0, 6), (1, 6)]


def test_failed_upload_is_retried_and_remote_latest_follows_the_files(tmp_path, made, s3_bucket):
    bucket, endpoint = s3_bucket
    run = tmp_path / "run"
    _place(made, run, 0, "good_4.ckpt", 4)
    with pytest.raises(Exception, match="NoSuchBucket"):  # the store is unreachable during training
        CheckpointManager(run, upload_uri=f"{bucket}-missing/ckpt", endpoint_url=endpoint, log=print).sync()
    assert not (run / LATEST_FILE).exists()  # latest only moves after a complete sync

    uri = f"{bucket}/runs/r1/pretrain/checkpoints"
    mgr = CheckpointManager(run, upload_uri=uri, endpoint_url=endpoint, log=print)
    assert mgr.sync() == []  # already verified: no new verdicts, but the upload is retried
    store = store_for(uri, endpoint)
    assert store.list(uri) == [f"{uri}/latest_checkpoint.json", f"{uri}/rank_0/optimizer/tiny_llama_rank_0-1_4.ckpt",
                               f"{uri}/rank_0/tiny_llama_rank_0-1_4.ckpt",
                               f"{uri}/rank_0/tiny_llama_rank_0-1_4.ckpt.verified.json"]
    remote_latest = json.loads(store.get_bytes(f"{uri}/latest_checkpoint.json"))
    assert remote_latest["uri"] == f"{uri}/rank_0/tiny_llama_rank_0-1_4.ckpt" and remote_latest["step"] == 4
    # the weights part (the file was split into weights + checkpoint_optimizer/ after verification)
    assert remote_latest["sha256"] == sha256_file(run / "checkpoint" / "rank_0" / "tiny_llama_rank_0-1_4.ckpt")
    store.get_file(remote_latest["uri"], tmp_path / "back.ckpt")
    assert sha256_file(tmp_path / "back.ckpt") == remote_latest["sha256"]


def test_verify_reports_a_missing_file_without_crashing(tmp_path):
    [res] = verify_checkpoints([tmp_path / "nope.ckpt"])
    assert not res.ok and res.error


def test_size_estimate_matches_a_real_checkpoint(made):
    # 4 tensors: weights (w, b) + both moments of w; the estimate counts moments for every weight
    real = os.path.getsize(made / "good_2.ckpt")
    moments_of_b = 2 * 32 * 4
    assert abs(estimate_checkpoint_bytes(PARAMS) - moments_of_b - real) / real < 0.02


def test_expected_size_prefers_an_existing_checkpoint(tmp_path, made):
    assert expected_checkpoint_bytes(tmp_path, param_count=1000) == 12_000
    placed = _place(made, tmp_path, 0, "good_2.ckpt", 2)
    assert expected_checkpoint_bytes(tmp_path, param_count=1000) == placed.stat().st_size
    with pytest.raises(ValueError, match="no param_count"):
        expected_checkpoint_bytes(tmp_path / "fresh")


def test_free_disk_check_names_path_needed_free_and_fix(tmp_path):
    assert check_disk(tmp_path / "not" / "yet", 2000, "2 checkpoints", "free space") > 2000
    need = 2 * estimate_checkpoint_bytes(10**15) * 8
    with pytest.raises(InsufficientDiskError) as err:
        check_disk(tmp_path, need, "2 x 12e15 per checkpoint x 8 ranks", "point run.output_root to a larger disk")
    msg = str(err.value)
    assert str(tmp_path) in msg and "need 192,000,000,000,000,000 bytes" in msg and "free" in msg
    assert "output_root" in msg
