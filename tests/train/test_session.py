"""train/session.py without a trainer: the work folder, resume or start afresh, the node rank, the yaml of both stages.

The trained paths (attempt loop, ticks, guard, preflight) run in tests/train/test_pretrain_stage.py and
test_sft_stage.py; here the checkpoints are small files with the sidecars CheckpointManager.sync writes after a
verification, so nothing needs MindSpore.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from pipeline_lib.config import config_from_dict
from pipeline_lib.config.schema import sft_accumulation
from pipeline_lib.train.metrics import LossRule
from pipeline_lib.train.session import IDENTITY_FILE, WORK_DIR_ENV, Batch, StageYaml, TrainingSession, work_dir


class Refused(ValueError):
    pass


def _cfg(tmp_path, **over):
    return config_from_dict({"run": {"output_root": str(tmp_path / "runs"), "device_target": "CPU"},
                             "training": {"keep_checkpoint_max": 2}, **over})


def _session(cfg, out, lines=None) -> TrainingSession:
    return TrainingSession(cfg, stage="pretrain", out=out, remote=None, endpoint=None, steps=8,
                           log=(lines if lines is not None else []).append, error=Refused)


def _verified_checkpoint(out, step: int):
    """checkpoint/rank_0/<name>.ckpt of `step` plus the sidecar a verification leaves next to it."""
    path = out / "checkpoint" / "rank_0" / f"m_rank_0-1_{step}.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes([step]) * 64)
    sidecar = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "size": 64,
               "step": step, "global_step": step, "epoch": 1, "params": 1, "verified_at": 0}
    path.with_name(path.name + ".verified.json").write_text(json.dumps(sidecar))
    return path


def test_work_dir_is_the_stage_folder_or_one_local_folder_per_s3_uri(tmp_path, monkeypatch):
    assert work_dir(str(tmp_path / "runs" / "r1" / "pretrain")) == (tmp_path / "runs" / "r1" / "pretrain").resolve()
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "work"))
    a, b = work_dir("s3://bucket/runs/r1/pretrain"), work_dir("s3://bucket/runs/r1/sft")
    assert a.parent == b.parent == (tmp_path / "work").resolve() and a != b
    assert work_dir("s3://bucket/runs/r1/pretrain") == a  # the same folder again: a rerun resumes there


def test_another_identity_starts_afresh_and_keeps_only_what_is_named(tmp_path):
    out = tmp_path / "stage"
    _verified_checkpoint(out, 4)
    (out / IDENTITY_FILE).write_text(json.dumps({"identity": "earlier-config"}))
    (out / "_data").mkdir()
    (out / "_data" / "shard.mindrecord").write_text("rows")
    assert _session(_cfg(tmp_path), out).resume_or_start("this-config", keep=("_data",)) is None
    assert sorted(p.name for p in out.iterdir()) == ["_data", IDENTITY_FILE]
    assert json.loads((out / IDENTITY_FILE).read_text()) == {"identity": "this-config"}


def test_same_identity_resumes_from_the_newest_checkpoint_whose_files_exist(tmp_path):
    out, lines = tmp_path / "stage", []
    (out / "checkpoint").mkdir(parents=True)
    (out / IDENTITY_FILE).write_text(json.dumps({"identity": "run-a"}))
    _verified_checkpoint(out, 4)
    newest = _verified_checkpoint(out, 8)
    latest = _session(_cfg(tmp_path), out, lines).resume_or_start("run-a")
    assert (latest["step"], latest["path"]) == (8, str(newest))
    newest.unlink()  # e.g. removed by hand between attempts: the run resumes from the one before
    latest = _session(_cfg(tmp_path), out, lines).resume_or_start("run-a")
    assert latest["step"] == 4 and (out / "checkpoint" / "rank_0" / "m_rank_0-1_4.ckpt").exists()


def test_a_bad_node_rank_is_the_stage_error_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_PIPELINE_NODE_RANK", "3")
    with pytest.raises(Refused, match=r"\$LLM_PIPELINE_NODE_RANK=3: must be in \[0, 1\)"):
        _session(_cfg(tmp_path), tmp_path / "stage")


def test_one_yaml_recipe_for_both_stages_written_once_per_attempt(tmp_path):
    cfg = _cfg(tmp_path, training={"guard": {"spike_factor": 4.0}, "save_steps": 10},
               sft={"guard": {"spike_factor": 9.0, "window": 7}, "micro_batch_size": 2})
    data, out = tmp_path / "data", tmp_path / "out"
    t = cfg.training
    pre = StageYaml(cfg, "pretrain", Batch(t.micro_batch_size, t.gradient_accumulation_steps, t.guard), data, 400,
                    "run.yaml", "run_resume.yaml")
    start = out / "checkpoint" / "rank_0" / "m_rank_0-1_8.ckpt"
    path = pre.write(out / pre.resume_name, out, resume_from=start, extra_epochs=2)
    text = path.read_text()
    run = yaml.safe_load(text)
    assert "python -m pipeline_lib.train.entry --yaml" in text.splitlines()[1]
    assert run == pre.run_config(out, resume_from=start, extra_epochs=2)  # the dict, written as is
    assert (run["load_checkpoint"], run["resume_training"]) == (str(out / "checkpoint"), start.name)
    fresh = yaml.safe_load(pre.write(out / pre.name, out).read_text())
    assert run["runner_config"]["epochs"] == fresh["runner_config"]["epochs"] + 2
    assert [c["save_checkpoint_steps"] for c in run["callbacks"] if c["type"] == "CheckpointMonitor"] == [10]
    assert [c["save_checkpoint_steps"] for c in fresh["callbacks"] if c["type"] == "CheckpointMonitor"] == [10]
    assert [c["spike_factor"] for c in run["callbacks"] if c["type"] == "LossGuard"] == [4.0]
    assert {c["type"]: c["loss_rule"] for c in fresh["callbacks"] if "loss_rule" in c} == \
        dict.fromkeys(("PipelineMetrics", "LossGuard"), LossRule.from_run_yaml(fresh).to_json())

    sft = StageYaml(cfg, "sft", Batch(cfg.sft.micro_batch_size, sft_accumulation(cfg), cfg.sft.guard), data, 400,
                    "sft.yaml", "sft.yaml", load=tmp_path / "base.ckpt")
    run = yaml.safe_load(sft.write(out / sft.name, out).read_text())
    assert run["load_checkpoint"] == str(tmp_path / "base.ckpt") and run["resume_training"] is False
    guard = next(c for c in run["callbacks"] if c["type"] == "LossGuard")
    assert (guard["spike_factor"], guard["window"]) == (9.0, 7)
    metrics = next(c for c in run["callbacks"] if c["type"] == "PipelineMetrics")
    assert metrics["tokens_per_step"] == 2 * sft_accumulation(cfg) * cfg.model.seq_length


def _rank_file(out, rank: int, step: int):
    """checkpoint/rank_N/<name>.ckpt with bytes of its own (a tensor/pipeline shard) and its verification sidecar."""
    path = out / "checkpoint" / f"rank_{rank}" / f"m_rank_{rank}-1_{step}.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes([rank * 16 + step]) * (64 + rank))
    sidecar = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "size": path.stat().st_size,
               "step": step, "global_step": step, "epoch": 1, "params": 1, "verified_at": 0}
    path.with_name(path.name + ".verified.json").write_text(json.dumps(sidecar))
    return path


def test_tensor_pipeline_resume_restores_every_rank_of_this_node_from_s3(tmp_path, s3_bucket, monkeypatch):
    """mp2 x pp2 on 2 nodes x 2 devices: each node uploads its own ranks and its own latest pointer; a rerun of
    node 1 on another machine gets rank 2's and rank 3's own files back into checkpoint/rank_N/."""
    from pipeline_lib.storage import join, store_for

    bucket, endpoint = s3_bucket
    cfg = _cfg(tmp_path, parallel={"devices": 4, "devices_per_node": 2, "model_parallel": 2, "pipeline_stage": 2},
               training={"keep_checkpoint_max": 2, "upload_checkpoints": True})
    remote = join(bucket, "runs", "r1", "pretrain")
    store = store_for(remote, endpoint)
    sessions, originals = {}, {}
    for node in (0, 1):
        monkeypatch.setenv("LLM_PIPELINE_NODE_RANK", str(node))
        s = TrainingSession(cfg, stage="pretrain", out=tmp_path / f"node{node}", remote=remote, endpoint=endpoint,
                            steps=8, log=[].append, error=Refused)
        assert s.resume_or_start("run-1") is None
        for rank in s.ranks:
            originals[rank] = _rank_file(s.out, rank, 4).read_bytes()
        s.manager.sync()
        sessions[node] = s
    pointers = sorted(u.rsplit("/", 1)[-1] for u in store.list(join(remote, "checkpoint") + "/") if u.endswith(".json")
                      and "latest" in u)
    assert pointers == ["latest_checkpoint.json", "latest_checkpoint_node_1.json"]  # no node overwrote the other
    monkeypatch.setenv("LLM_PIPELINE_NODE_RANK", "1")
    again = TrainingSession(cfg, stage="pretrain", out=tmp_path / "other-machine", remote=remote, endpoint=endpoint,
                            steps=8, log=[].append, error=Refused)
    latest = again.resume_or_start("run-1")
    assert latest is not None and sorted(latest["ranks"], key=int) == ["2", "3"]
    for rank in (2, 3):
        restored = tmp_path / "other-machine" / "checkpoint" / f"rank_{rank}" / f"m_rank_{rank}-1_4.ckpt"
        assert restored.read_bytes() == originals[rank]  # its own shard, not rank 0's


def test_the_sft_disk_check_sizes_from_the_layout(tmp_path):
    """Both stages check the disk through session.check_disk; SFT's need is planner.disk's LoRA SFT arithmetic of the
    shipped 7B layout (not the base file's size), and too little room names the need and the knobs."""
    import shutil

    from pipeline_lib.config import load_config
    from pipeline_lib.planner.disk import CheckpointDisk, sft_checkpoint_disk
    from pipeline_lib.train.checkpoints import InsufficientDiskError

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "configs/pipelines/llama2-7b-4x64gb.yaml"), [f"run.output_root={tmp_path}"])
    lines = []
    s = TrainingSession(cfg, stage="sft", out=tmp_path / "sft", remote=None, endpoint=None, steps=8,
                        log=lines.append, error=Refused)
    need = sft_checkpoint_disk(cfg, s.ranks)
    assert s.ranks == [0, 1, 2, 3] and round(need.total / 1e9, 1) == 109.7  # mp2: frozen shards kept
    free = shutil.disk_usage(tmp_path).free
    small = CheckpointDisk({0: 1000}, 2)
    assert s.check_disk(small) == pytest.approx(free, rel=0.05) and lines[-1].startswith("sft: ")
    with pytest.raises(InsufficientDiskError, match=r"need [\d,]+ bytes \(4 checkpoints .* Fix: lower "
                                                     r"training.keep_checkpoint_max"):
        s.check_disk(CheckpointDisk({r: free for r in s.ranks}, need.copies))


def test_a_hang_is_resumed_once_per_step_and_a_second_at_the_same_step_is_not_retried(tmp_path):
    from pipeline_lib.doctor.retry import should_retry
    from pipeline_lib.runtime.launcher import LaunchResult
    from pipeline_lib.train.launch import TrainingHang
    from pipeline_lib.train.session import HANG_FILE, Trained

    cfg = _cfg(tmp_path)
    lines: list[str] = []
    session = TrainingSession(cfg, stage="pretrain", out=tmp_path / "out", remote=None, endpoint=None, steps=8,
                              log=lines.append)
    done = Trained(None, None)

    def hang(step: int) -> TrainingHang:
        line = f"[watchdog] hang: no training step finished for 9s (limit 8s); stopped first: rank(s) 1 after step {step}"
        result = LaunchResult(["trainer"], -15, False, 1.0, stopped=line, tails={"launcher": [line]})
        return TrainingHang(line, result, {"step": step, "first_ranks": [1], "stacks": "s.txt"})

    done.attempts = 1
    session._after_hang(hang(3), done)  # resumed: nothing raised, said on the terminal (a warning)
    session._say_hang_resume(hang(3).report, {"step": 2}, done)
    assert lines[-1].startswith("pretrain: WARNING training hung after step 3 (ranks [1] stopped first")
    assert "resumes from the checkpoint of step 2. Stacks of every rank: s.txt" in lines[-1]
    assert done.resumed_from_step == 2  # the manifest's resumed_from_step
    done.attempts = 2
    session._after_hang(hang(5), done)  # another step: resumed again
    # a later stage run (the Prefect retry) of the same run reads hang.json: step 5 again is not resumed
    later = Trained(None, None)
    later.attempts = 1
    with pytest.raises(TrainingHang) as err:
        session._after_hang(hang(5), later)
    assert "it hung at step 5 before (attempt 2)" in str(err.value) and err.value.retryable is False
    assert should_retry(err.value, transient=True) is False
    assert should_retry(hang(7), transient=False) is True  # a first hang: the category says retry
    hangs = json.loads((tmp_path / "out" / HANG_FILE).read_text())["hangs"]
    assert [(h["step"], h["attempt"]) for h in hangs] == [(3, 1), (5, 2), (5, 1)]


def test_the_preflight_is_judged_on_the_node_that_records_the_loss(tmp_path, monkeypatch):
    """metrics.jsonl is written where the loss rank runs (rank 0; under pipeline parallel the first rank of the last
    stage): only that node watches the first steps, and a rerun's earlier verdict is not taken for a new one."""
    layouts = {"dp": {"devices": 4, "devices_per_node": 2, "data_parallel": 4},
               "pp": {"devices": 4, "devices_per_node": 2, "data_parallel": 2, "pipeline_stage": 2}}
    judged = {}
    for name, parallel in layouts.items():
        cfg = _cfg(tmp_path, parallel=parallel, training={"preflight_steps": 5})
        for node in (0, 1):
            monkeypatch.setenv("LLM_PIPELINE_NODE_RANK", str(node))
            folder, lines = tmp_path / name / str(node), []
            folder.mkdir(parents=True)
            (folder / "preflight.json").write_text("{}")  # an earlier run's
            watch = _session(cfg, folder, lines)._preflight_watch(folder, memory_check=False, from_trained=False)
            judged[name, node] = watch is not None
            assert (watch is None) == any("judged on the node running rank" in ln for ln in lines)
            assert (folder / "preflight.json").exists() == (watch is None)
            if watch is not None:
                assert watch.steps == 5 and watch.metrics_path == folder / "metrics.jsonl"
    # rank 0 on node 0 for data parallel; rank 2 (first of the last stage) on node 1 under two pipeline stages
    assert judged == {("dp", 0): True, ("dp", 1): False, ("pp", 0): False, ("pp", 1): True}


def test_a_run_short_of_its_optimizer_steps_says_its_updates_overflowed(tmp_path):
    """The metrics.jsonl of the tiny default at training.learning_rate=100000 (tests/doctor/logs/README.md): 76 of 80
    steps overflowed and were skipped, so mindformers ended at optimizer step 4. The message says so and the fix;
    without overflowed steps the cause is the data's epochs."""
    recorded = Path(__file__).parents[1] / "doctor" / "logs" / "nan_overflow_skipped_tiny_cpu.metrics.jsonl"
    out = tmp_path / "pretrain"
    out.mkdir()
    (out / "metrics.jsonl").write_bytes(recorded.read_bytes())
    message = _session(_cfg(tmp_path), out)._short_of_steps(4, 60, out)
    assert "76 of 80 steps overflowed (gradients not finite from step 5" in message
    assert "lower training.learning_rate" in message
    (out / "metrics.jsonl").write_text("")
    assert "too few epochs" in _session(_cfg(tmp_path), out)._short_of_steps(40, 60, out)
