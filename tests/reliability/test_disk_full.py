"""Disk full (issue 16): the data stage on a size-limited tmpfs, as the output root and as the work folder.

Space runs out for real (ENOSPC from the kernel, numpy's short write, MindRecord's own free-disk refusal);
the stage must fail with DiskFull naming the path and the bytes, the doctor must say `disk_full`, no manifest
and no partial file under a final name may be left, and after space is freed (the tmpfs remounted bigger)
the rerun with the same run id must complete with outputs equal to a run that never ran out.
A checkpoint filling a tmpfs in training is tests/doctor/test_real_failures.py; not repeated here.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from suite_rules import machine_skip

from pipeline_lib.config import load_config
from pipeline_lib.doctor.classify import diagnose_exception
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths, store_for
from pipeline_lib.storage.disk_space import DiskFull

RELIABILITY_ROW = "disk_full"
ROOT = Path(__file__).resolve().parents[2]
HEAVY = os.environ.get("HYPOTHESIS_PROFILE") == "reliability"


def mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        machine_skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh size-limited tmpfs; grow(size) remounts it bigger (space freed), files kept."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        mount_tmpfs(where, size)
        mounted.append(where)
        return where

    mount.grow = lambda where, size: subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)
    yield mount
    for where in mounted:  # lazy: a writer of the failed run may still hold a file open until it is collected
        subprocess.run(["umount", "--lazy", str(where)], check=False)


def data_cfg(output_root: str, endpoint: str | None = None):
    overrides = [f"run.output_root={output_root}", "data.executor=local"]
    if endpoint:
        overrides.append(f"run.s3_endpoint_url={endpoint}")
    return load_config(str(ROOT / "configs/pipelines/tiny-cpu.yaml"), overrides)


@pytest.fixture(scope="module")
def never_full(tmp_path_factory) -> dict[str, dict]:
    """The data stage's outputs ({path: size + sha256}) of a run that never ran out of space."""
    cfg = data_cfg(str(tmp_path_factory.mktemp("roomy")))
    manifest, _ = run_stage(cfg, RunPaths(cfg.run.output_root, "night"), "data", workers=1)
    return {o["path"]: o for o in manifest.outputs}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_failed_clearly(err: DiskFull, cfg, where: Path) -> None:
    message = str(err)
    assert message.startswith("No space left on device writing "), message
    assert str(where) in message and "bytes free there now" in message and "Fix: " in message, message
    assert "needed" in message or "needs" in message, message
    diag = diagnose_exception(err, cfg, stage="data")
    assert diag.category == "disk_full", (diag, message)
    assert "checkpoint" not in diag.remedies[0]["why"], diag.remedies  # the data stage writes no checkpoints


def check_nothing_corrupt_left_as_done(stage: Path, never_full: dict) -> None:
    assert not (stage / "manifest.json").exists()
    for rel, want in never_full.items():  # a deliverable under its final name is whole, or absent
        path = stage / rel
        if path.exists():
            assert sha256(path) == want["sha256"], f"{rel} is partial under its final name"


# (tmpfs size, where space runs out) -- measured on the tiny corpus: the whole stage writes ~0.9 MB, and the
# MindRecord writer refuses below 10 MB free, so every size below that fails by the MindRecord step at the latest.
OUTPUT_ROOT_SIZES = [("200k", "shard prep (numpy's short write)"), ("500k", "index segment or tokenizer"),
                     ("2m", "MindRecord's free-disk check")]


@pytest.mark.parametrize("size,where", OUTPUT_ROOT_SIZES, ids=[s for s, _ in OUTPUT_ROOT_SIZES])
def test_output_root_fills_mid_data_stage_then_resumes(size, where, tmpfs, never_full, tally):
    root = tmpfs(size)
    cfg = data_cfg(str(root))
    paths = RunPaths(str(root), "night")
    tally.add(RELIABILITY_ROW, runs=1)
    with pytest.raises(DiskFull) as failed:
        run_stage(cfg, paths, "data", workers=1)
    check_failed_clearly(failed.value, cfg, root)
    check_nothing_corrupt_left_as_done(root / "night" / "data", never_full)
    tally.add(RELIABILITY_ROW, failed_clearly=1)

    tmpfs.grow(root, "32m")  # space freed
    manifest, skipped = run_stage(cfg, paths, "data", workers=1)
    assert not skipped
    assert {o["path"]: o for o in manifest.outputs} == never_full
    tally.add(RELIABILITY_ROW, resumed=1)


RUN_IN_SUBPROCESS = """
import sys
from pipeline_lib.config import load_config
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths
cfg = load_config(sys.argv[1], [f"run.output_root={sys.argv[2]}", f"run.s3_endpoint_url={sys.argv[3]}",
                                "data.executor=local"])
try:
    manifest, _ = run_stage(cfg, RunPaths(cfg.run.output_root, "night", cfg.run.s3_endpoint_url), "data", workers=1)
except Exception as err:
    from pipeline_lib.doctor.classify import diagnose_exception
    print("FAILED", type(err).__name__, err, "| doctor:", diagnose_exception(err, cfg, stage="data").category)
    sys.exit(3)
import json
print("OUTPUTS", json.dumps({o["path"]: o for o in manifest.outputs}, sort_keys=True))
"""


def run_with_tmpdir(tmpdir: Path, root: str, endpoint: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", RUN_IN_SUBPROCESS, str(ROOT / "configs/pipelines/tiny-cpu.yaml"),
                           root, endpoint], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def test_work_folder_fills_for_an_s3_run_then_resumes(tmpfs, s3_bucket, never_full, tally):
    """An s3:// run store: the data stage works in a local copy under $TMPDIR; that fills instead."""
    bucket, endpoint = s3_bucket
    work = tmpfs("2m")
    root = f"{bucket}/runs"
    tally.add(RELIABILITY_ROW, runs=1)
    proc = run_with_tmpdir(work, root, endpoint)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("FAILED"))
    assert line.startswith("FAILED DiskFull No space left on device writing ") and str(work) in line, line
    assert "$TMPDIR" in line and line.endswith("doctor: disk_full"), line
    store = store_for(root, endpoint)
    assert not store.exists(f"{root}/night/data/manifest.json")
    for rel, want in never_full.items():  # nothing partial under a final key
        uri = f"{root}/night/data/{rel}"
        if store.exists(uri):
            assert hashlib.sha256(store.get_bytes(uri)).hexdigest() == want["sha256"], rel
    tally.add(RELIABILITY_ROW, failed_clearly=1)

    tmpfs.grow(work, "32m")
    proc = run_with_tmpdir(work, root, endpoint)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    outputs = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("OUTPUTS"))[len("OUTPUTS "):])
    assert outputs == never_full
    tally.add(RELIABILITY_ROW, resumed=1)


def test_a_plain_write_that_hits_enospc_names_the_folder_and_free_bytes(tmpfs):
    """The kernel's ENOSPC (errno 28, no filename on a write()) from any writer of a stage, named the same way."""
    from pipeline_lib.storage.disk_space import named_disk_full

    root = tmpfs("64k")
    with pytest.raises(DiskFull) as failed, named_disk_full({"run.output_root": str(root)}):
        (root / "big.bin").write_bytes(b"x" * 200_000)
    assert failed.value.__cause__.errno == 28
    assert str(failed.value).startswith(f"No space left on device writing {root} (run.output_root): ")
    assert "0 bytes free there now" in str(failed.value)
    with pytest.raises(ValueError), named_disk_full({"run.output_root": str(root)}):  # other errors pass unchanged
        raise ValueError("not a disk problem")


def test_a_parquet_write_that_removes_its_partial_file_still_names_the_full_folder(tmpfs):
    """pyarrow's parquet writer raises errno 28 with no filename and deletes its partial file first: the space is
    free again when the error is named (the data stage's tokenizer sample is such a write), so the fullest written
    folder is named, not '?'."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline_lib.storage.disk_space import named_disk_full

    root, roomy = tmpfs("500k"), tmpfs("8m")
    (root / "filled").write_bytes(b"x" * 300_000)
    table = pa.table({"x": pa.array(range(200_000), pa.int64())})
    with pytest.raises(DiskFull) as failed, named_disk_full({"run.work_dir": str(roomy),
                                                              "run.output_root": str(root)}):
        pq.write_table(table, root / "sample.parquet", compression="none")
    assert failed.value.__cause__.errno == 28 and failed.value.__cause__.filename is None
    assert not (root / "sample.parquet").exists()  # why the free space is back
    assert str(failed.value).startswith(f"No space left on device writing {root} (run.output_root): ")


TRAIN_IN_SUBPROCESS = """
import sys
from pipeline_lib.config import load_config
from pipeline_lib.stages import run_stage
from pipeline_lib.storage import RunPaths
cfg = load_config(sys.argv[1], [f"run.output_root={sys.argv[2]}", f"run.s3_endpoint_url={sys.argv[3]}",
                                "data.executor=local", "training.steps=6", "training.save_steps=3",
                                "training.preflight_steps=0"])
paths = RunPaths(cfg.run.output_root, "night", cfg.run.s3_endpoint_url)
run_stage(cfg, paths, "data", workers=1)
try:
    manifest, _ = run_stage(cfg, paths, "pretrain")
except Exception as err:
    from pipeline_lib.doctor.classify import diagnose_exception
    print("FAILED", type(err).__name__, err, "| doctor:", diagnose_exception(err, cfg, stage="pretrain").category)
    sys.exit(3)
print("TRAINED", sorted(o["path"] for o in manifest.outputs))
"""


@pytest.mark.skipif(not HEAVY, reason="trains a tiny model (about 25 s): runs with HYPOTHESIS_PROFILE=reliability "
                                      "(python bench/reliability.py)")
def test_training_work_folder_fills_for_an_s3_run_then_resumes(tmpfs, s3_bucket, tally):
    """An s3:// run trains in $LLM_PIPELINE_WORK_DIR: on a tmpfs too small for its checkpoints the free-disk check
    refuses before training (path, bytes needed, bytes free); after the tmpfs grows the rerun trains."""
    bucket, endpoint = s3_bucket
    work = tmpfs("2m")
    env = dict(os.environ, LLM_PIPELINE_WORK_DIR=str(work), PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-c", TRAIN_IN_SUBPROCESS, str(ROOT / "configs/pipelines/tiny-cpu.yaml"),
            f"{bucket}/runs", endpoint]
    tally.add(RELIABILITY_ROW, runs=1)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("FAILED"))
    assert str(work) in line and "need" in line and "free" in line and line.endswith("doctor: disk_full"), line
    print(line)  # the refusal as a user reads it (pytest -s)
    store = store_for(f"{bucket}/runs", endpoint)
    assert not store.exists(f"{bucket}/runs/night/pretrain/manifest.json")
    tally.add(RELIABILITY_ROW, failed_clearly=1)

    tmpfs.grow(work, "256m")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert store.exists(f"{bucket}/runs/night/pretrain/manifest.json")
    tally.add(RELIABILITY_ROW, resumed=1)


@pytest.mark.usefixtures("prefect_server")
def test_output_root_fills_under_the_prefect_executor_then_resumes(tmpfs, never_full, tally):
    """data.executor=prefect: the shard steps are Prefect task runs; the flow's failure names the full disk too."""
    from flows.pipeline import llm_pipeline

    root = tmpfs("500k")
    cfg = data_cfg(str(root)).model_copy(deep=True)
    cfg.data.executor = "prefect"
    tally.add(RELIABILITY_ROW, runs=1)
    state = llm_pipeline(config=cfg.model_dump(mode="json"), run_id="night", stages=["data"], return_state=True)
    assert state.is_failed()
    assert f"DiskFull: No space left on device writing {root}" in state.message, state.message
    assert "doctor: disk_full in data" in state.message, state.message
    check_nothing_corrupt_left_as_done(root / "night" / "data", never_full)
    tally.add(RELIABILITY_ROW, failed_clearly=1)

    tmpfs.grow(root, "32m")
    state = llm_pipeline(config=cfg.model_dump(mode="json"), run_id="night", stages=["data"], return_state=True)
    assert state.is_completed(), state.message
    manifest = json.loads((root / "night" / "data" / "manifest.json").read_text())
    assert {o["path"]: o for o in manifest["outputs"]} == never_full
    tally.add(RELIABILITY_ROW, resumed=1)
