"""The worker launcher (result, failure, crash, timeout kill), upstream-input discovery, and
stage folders on S3. No MindSpore here."""
from __future__ import annotations

import os
import textwrap
import time

import pytest

from pipeline_lib.evaluate.inputs import default_checkpoints, find_heldout, find_sft, find_tokenizer, localize
from pipeline_lib.evaluate.launch import WorkerFailed, WorkerTimeout, run_worker
from pipeline_lib.evaluate.stage_io import StageFolder, files_under
from pipeline_lib.config.load import config_from_dict
from pipeline_lib.storage import Manifest, RunPaths, read_manifest, store_for, write_manifest

FAKE = textwrap.dedent('''
    import os, sys, time
    from pipeline_lib.evaluate.launch import progress, worker_main

    def run(req):
        progress("hello " + req["mode"])
        if req["mode"] == "fail":
            raise KeyError("no such thing")
        if req["mode"] == "crash":
            os._exit(3)
        if req["mode"] == "hang":
            open(req["pidfile"], "w").write(str(os.getpid()))
            time.sleep(60)
        return {"value": 42}

    if __name__ == "__main__":
        raise SystemExit(worker_main(run))
''')


@pytest.fixture
def fake_worker(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fake_worker.py").write_text(FAKE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pkg"))
    return tmp_path


def test_worker_result_failure_and_crash(fake_worker):
    lines = []
    res = run_worker("fake_worker", {"mode": "ok"}, fake_worker / "w1", timeout_s=60, log=lines.append)
    assert res == {"ok": True, "value": 42} and lines == ["hello ok"]
    with pytest.raises(WorkerFailed, match="KeyError: 'no such thing'") as err:
        run_worker("fake_worker", {"mode": "fail"}, fake_worker / "w2", timeout_s=60)
    assert err.value.error_type == "KeyError"
    with pytest.raises(WorkerFailed, match="exited with code 3 .* without a result"):
        run_worker("fake_worker", {"mode": "crash"}, fake_worker / "w3", timeout_s=60)


def test_worker_timeout_kills_the_process(fake_worker):
    pidfile = fake_worker / "pid"
    started = time.time()
    with pytest.raises(WorkerTimeout, match="training.timeout_seconds"):
        run_worker("fake_worker", {"mode": "hang", "pidfile": str(pidfile)}, fake_worker / "w4", timeout_s=3)
    assert time.time() - started < 30
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_worker_ends_when_the_launching_process_is_sigkilled(fake_worker, sigkill_parent):
    pidfile = fake_worker / "pid_orphan"
    alive, _ = sigkill_parent(f"""
import os, threading, time
from pipeline_lib.evaluate.launch import run_worker

def announce():
    while not os.path.exists({str(pidfile)!r}):
        time.sleep(0.05)
    time.sleep(0.1)
    print("READY", open({str(pidfile)!r}).read(), flush=True)

threading.Thread(target=announce, daemon=True).start()
run_worker("fake_worker", {{"mode": "hang", "pidfile": {str(pidfile)!r}}}, {str(fake_worker / "w5")!r}, timeout_s=120)
""", within=10)
    assert alive == []


def test_inputs_from_manifest_metrics_and_output_scan(tmp_path):
    cfg = config_from_dict({"run": {"output_root": str(tmp_path)},
                            "evaluate": {"compare_checkpoints": {"last night (r0)": "/old/night.ckpt"}}})
    paths = RunPaths(str(tmp_path), "r1")
    write_manifest(paths.stage_uri("data"), Manifest("data", "r1", "h", outputs=[
        {"path": "tokenizer/tokenizer.model", "size": 1, "sha256": ""},
        {"path": "mindrecord/heldout/part-00000.mindrecord", "size": 1, "sha256": ""},
        {"path": "mindrecord/heldout/part-00000.mindrecord.db", "size": 1, "sha256": ""}]))
    write_manifest(paths.stage_uri("pretrain"), Manifest("pretrain", "r1", "h", outputs=[
        {"path": f"checkpoint/rank_0/llama-1_{s}.ckpt", "size": 1, "sha256": ""} for s in (20, 100, 60)]))
    write_manifest(paths.stage_uri("sft"), Manifest("sft", "r1", "h", metrics={"adapter_checkpoint": "lora.ckpt"}))
    data = paths.stage_uri("data")
    assert find_tokenizer(cfg, paths) == f"{data}/tokenizer/tokenizer.model"
    assert find_heldout(paths) == f"{data}/mindrecord/heldout"
    pre = f"{paths.stage_uri('pretrain')}/checkpoint/rank_0/llama-1_100.ckpt"
    assert find_sft(paths) == (f"{paths.stage_uri('sft')}/lora.ckpt", pre)
    assert default_checkpoints(cfg, paths) == {
        "pretrained": pre, "sft": {"base": pre, "adapter": f"{paths.stage_uri('sft')}/lora.ckpt"},
        "last night (r0)": "/old/night.ckpt"}


def test_stage_folder_on_s3(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    paths = RunPaths(bucket + "/runs", "r1", endpoint)
    folder = StageFolder(paths, "evaluate")
    assert folder.remote and folder.local.is_dir()
    (folder.local / "a").mkdir()
    (folder.local / "a" / "generations.jsonl").write_text("{}\n")
    (folder.local / "report.md").write_text("# r\n")
    outputs = folder.publish(files_under(folder.local))
    folder.finish(Manifest("evaluate", "r1", "h", outputs=outputs))
    assert not folder.local.exists()
    store = store_for(bucket, endpoint)
    assert store.get_bytes(f"{bucket}/runs/r1/evaluate/a/generations.jsonl") == b"{}\n"
    assert [o["path"] for o in read_manifest(paths.stage_uri("evaluate"), endpoint).outputs] == \
        ["a/generations.jsonl", "report.md"]
    local = localize(f"{bucket}/runs/r1/evaluate/report.md", tmp_path, endpoint)
    assert open(local).read() == "# r\n"
