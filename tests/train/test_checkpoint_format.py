"""training.checkpoint_format: the yaml keys, the validation, the Checkpoint 2.0 folder readers, and (slow) a real
mindformers run on CPU that saves Checkpoint 2.0 asynchronously, resumes, hands its weights only to a LoRA SFT, and
exports the SFT result to MindIR through the export worker.

The fast tests build safetensors files and folders with known contents; the slow one trains the tiny Llama of
test_train (4 steps, then 2 resumed steps and a 3-step LoRA SFT side by side, ~60-90 s on 2 cores).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train import TINY, finish, start, token_rows, write_mindrecord  # noqa: E402

from pipeline_lib.config import ConfigError, config_from_dict  # noqa: E402
from pipeline_lib.config.validate import validate  # noqa: E402
from pipeline_lib.model.checkpoint_format import (  # noqa: E402
    TRACKER, CheckpointFormatError, checkpoint_files, is_safetensors, iterations, latest_iteration, read_weights,
    write_weights_folder)
from pipeline_lib.train.mindformers_yaml import build_run_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _cfg(**training):
    sections = json.loads(json.dumps(TINY))
    sections["training"].update(training)
    return config_from_dict(sections)


def _monitor(run: dict) -> dict:
    return next(c for c in run["callbacks"] if c["type"] == "CheckpointMonitor")


def test_yaml_keys_per_format(tmp_path):
    legacy = build_run_config(_cfg(), stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path),
                              train_rows=64)
    assert legacy["load_ckpt_format"] == "ckpt" and "use_legacy_format" not in legacy
    assert _monitor(legacy)["checkpoint_format"] == "ckpt" and _monitor(legacy)["async_save"] is False
    v2 = build_run_config(_cfg(checkpoint_format="safetensors", async_save=True), stage="sft",
                          dataset_dir=str(tmp_path), output_dir=str(tmp_path), train_rows=64,
                          load_checkpoint=str(tmp_path))
    assert v2["use_legacy_format"] is False and v2["load_ckpt_format"] == "safetensors"
    mon = _monitor(v2)
    assert (mon["checkpoint_format"], mon["async_save"], mon["save_optimizer"]) == ("safetensors", True, True)


def test_async_save_needs_checkpoint_2():
    with pytest.raises(ConfigError) as err:
        validate(_cfg(async_save=True))
    text = str(err.value)
    assert "training.async_save" in text and "training.checkpoint_format=safetensors" in text
    validate(_cfg(async_save=True, checkpoint_format="safetensors"))  # no issue


def test_unknown_format_names_the_field_and_choices():
    with pytest.raises(Exception) as err:
        _cfg(checkpoint_format="pt")
    text = str(err.value)
    assert "checkpoint_format" in text and "'ckpt'" in text and "'safetensors'" in text


def _iteration(root: Path, step: int, tensors: dict, *, ranks: int = 1, opt: bool = True) -> Path:
    it = root / f"iteration_{step:08d}"
    it.mkdir(parents=True)
    for r in range(ranks):
        save_file(tensors, str(it / f"m-model-{r:07d}-{ranks:07d}.safetensors"))
        if opt:
            save_file({"adam_m.w": np.zeros(2, np.float32)}, str(it / f"m-opt-{r:07d}-{ranks:07d}.safetensors"))
    (it / "common.json").write_text(json.dumps({"step_num": step, "global_step": step}))
    return it


def test_latest_iteration_is_the_trackers_complete_step(tmp_path):
    w = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    _iteration(tmp_path, 2, w)
    _iteration(tmp_path, 4, {"w": w["w"] + 1})
    assert [i.step for i in iterations(tmp_path)] == [2, 4]
    assert latest_iteration(tmp_path) is None  # no tracker: nothing is known to be finished
    (tmp_path / TRACKER).write_text("2")
    assert latest_iteration(tmp_path).step == 2  # the tracker, not the newest folder (4 may be half written)
    (tmp_path / TRACKER).write_text("4")
    (tmp_path / "iteration_00000004" / "common.json").unlink()
    assert latest_iteration(tmp_path) is None  # named but incomplete
    assert is_safetensors(tmp_path) and not is_safetensors(tmp_path / "nothing.ckpt")


def test_weights_folder_drops_optimizer_state_and_reads_back(tmp_path):
    w = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float16)}
    it = _iteration(tmp_path / "checkpoint", 4, w)
    meta = {"state_dict_metadata": {"w": {"chunk": [{"global_offset": [0, 0]}]},
                                    "adam_m.w": {"chunk": [{"global_offset": [0, 0]}]}},
            "storage_data": {str(("w", (0, 0))): [{"file_name": "m-model-0000000-0000001.safetensors"}],
                             str(("adam_m.w", (0, 0))): [{"file_name": "m-opt-0000000-0000001.safetensors"}]}}
    (it / "metadata.json").write_text(json.dumps(meta))
    dest = write_weights_folder(iterations(tmp_path / "checkpoint")[0], tmp_path / "weights")
    assert [p.name for p in checkpoint_files(dest)] == ["m-model-0000000-0000001.safetensors"]
    kept = json.loads((dest / "metadata.json").read_text())
    assert list(kept["state_dict_metadata"]) == ["w"] and len(kept["storage_data"]) == 1
    arrays, dtypes = read_weights(dest)
    assert sorted(arrays) == ["b", "w"] and dtypes == {"b": "float16", "w": "float32"}
    np.testing.assert_array_equal(arrays["w"], w["w"])


MP2_METADATA = Path(__file__).parent / "data" / "checkpoint2_mp2_metadata.json"


def test_mp2_shards_merge_with_mindformers_reshard(tmp_path):
    """Shards as mindformers' Checkpoint 2.0 describes them (metadata.json recorded from its own writer with a
    MindSpore Layout, tests/train/data/record_checkpoint2_mp2.py), merged offline by its online reshard in the
    pipeline's subprocess; a real tensor-parallel run cannot write them on CPU (docs/mindformers-facts.md)."""
    from pipeline_lib.model.checkpoints import local_ckpt_file
    from pipeline_lib.model.llama import read_checkpoint

    folder = tmp_path / "checkpoint" / "iteration_00000002"
    folder.mkdir(parents=True)
    w, b = np.arange(24, dtype=np.float32).reshape(4, 6), np.arange(6, dtype=np.float32)
    for r in range(2):  # the shards data/record_checkpoint2_mp2.py writes; their metadata.json recorded from it
        save_file({"W": w[2 * r:2 * r + 2], "b": b}, str(folder / f"p-model-{r:07d}-0000002.safetensors"))
        save_file({"adam_m.W": np.zeros((2, 6), np.float32)}, str(folder / f"p-opt-{r:07d}-0000002.safetensors"))
    shutil.copyfile(MP2_METADATA, folder / "metadata.json")
    with pytest.raises(CheckpointFormatError, match="merge them first"):
        read_weights(folder)
    merged = local_ckpt_file(str(folder), tmp_path / "scratch", "base")
    assert merged.name == "base.unsharded.safetensors"
    arrays, _ = read_checkpoint(merged)
    assert sorted(arrays) == ["W", "b"]  # the weights; the optimizer's shards stay out
    np.testing.assert_array_equal(arrays["W"], np.arange(24, dtype=np.float32).reshape(4, 6))
    np.testing.assert_array_equal(arrays["b"], np.arange(6, dtype=np.float32))


def test_sharded_folder_is_refused_with_the_way_out(tmp_path):
    it = _iteration(tmp_path, 2, {"w": np.zeros((2, 3), np.float32)}, ranks=2)
    (it / "metadata.json").write_text(json.dumps({"state_dict_metadata": {
        "w": {"chunk": [{"global_offset": [0, 0]}, {"global_offset": [1, 0]}]}}, "storage_data": {}}))
    with pytest.raises(CheckpointFormatError, match="merge them first"):
        read_weights(it)


def test_bfloat16_tensor_reads_as_float32(tmp_path):
    import mindspore as ms

    want = np.array([[1.5, -2.0, 3.25]], np.float32)
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(want).astype(ms.bfloat16)}], str(tmp_path / "w.safetensors"),
                       format="safetensors")
    arrays, dtypes = read_weights(tmp_path / "w.safetensors")
    assert dtypes == {"w": "bfloat16"}
    np.testing.assert_array_equal(arrays["w"], want)


def test_checkpoint_files_skips_temporaries(tmp_path):
    for name in ("a.ckpt", "b.safetensors", "c.tmp.ckpt", "d.ckpt.tmp", "e.json"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in checkpoint_files(tmp_path)] == ["a.ckpt", "b.safetensors"]


@pytest.mark.slow
@pytest.mark.train
def test_checkpoint_2_trains_resumes_hands_off_and_exports(tmp_path):
    from safetensors import safe_open

    data = {"pretrain": write_mindrecord(tmp_path / "data" / "pretrain", token_rows(64)),
            "sft": write_mindrecord(tmp_path / "data" / "sft", token_rows(32, prompt_len=20))}
    fmt = {"checkpoint_format": "safetensors", "async_save": True}
    pre = finish(start(tmp_path, "pre", "pretrain", data["pretrain"],
                       {"training": {"steps": 4, "save_steps": 2, **fmt}}))
    ckpt = pre.output_dir / "checkpoint"
    assert sorted(pre.losses) == [1, 2, 3, 4]
    assert [i.step for i in iterations(ckpt)] == [2, 4]
    last = latest_iteration(ckpt)
    assert last is not None and last.step == 4 and last.common()["global_step"] == 4
    with safe_open(str(last.model_files[0]), framework="np") as fh:
        model_keys = set(fh.keys())
    with safe_open(str(last.opt_files[0]), framework="np") as fh:
        opt_keys = set(fh.keys())
    # weights and optimizer state apart: the model file is the weights-only hand-off as written
    assert "lm_head.weight" in model_keys and not any(k.startswith("adam_") for k in model_keys)
    assert {f"adam_m.{k}" for k in model_keys} | {f"adam_v.{k}" for k in model_keys} <= opt_keys
    # the planner's disk figures (weights + 2 fp32 moments; weights only) hold for Checkpoint 2.0's two files
    from pipeline_lib.train.checkpoints import estimate_checkpoint_bytes

    n = sum(a.size for a in read_weights(last.model_files[0])[0].values())
    model_bytes, opt_bytes = last.model_files[0].stat().st_size, last.opt_files[0].stat().st_size
    assert abs(model_bytes - 4 * n) / (4 * n) < 0.01
    assert abs(model_bytes + opt_bytes - estimate_checkpoint_bytes(n)) / estimate_checkpoint_bytes(n) < 0.01

    # resume (copy of the folder, budget 6) and a LoRA SFT from the weights only, side by side
    out = tmp_path / "resume" / "out"
    shutil.copytree(ckpt, out / "checkpoint")
    resume = start(tmp_path, "resume", "pretrain", data["pretrain"], {"training": {"steps": 6, "save_steps": 2, **fmt}},
                   output_dir=out, load_checkpoint=str(out / "checkpoint"), resume=True)
    base = write_weights_folder(last, tmp_path / "handoff")
    sft = start(tmp_path, "sft", "sft", data["sft"], {"training": fmt}, load_checkpoint=str(base))
    resumed, tuned = finish(resume), finish(sft)
    assert sorted(resumed.losses) == [5, 6]
    assert latest_iteration(out / "checkpoint").common()["global_step"] == 6
    assert sorted(tuned.losses) == [1, 2, 3]
    assert tuned.losses[1] < pre.losses[1] - 0.5  # the handed-off weights were loaded, not a random init
    sft_last = latest_iteration(tuned.output_dir / "checkpoint")
    handed, _ = read_weights(base)
    trained, _ = read_weights(tuned.output_dir / "checkpoint")
    np.testing.assert_array_equal(trained["model.layers.1.attention.wq.weight"],
                                  handed["model.layers.1.attention.wq.weight"])  # frozen base
    with safe_open(str(sft_last.opt_files[0]), framework="np") as fh:
        sft_opt = [k for k in fh.keys() if k.startswith("adam_")]
    # Checkpoint 2.0 keeps the optimizer state of what LoRA trains only
    assert sft_opt and all("mindpet_delta_lora" in k for k in sft_opt)

    # export: base = the hand-off folder, adapter = the SFT's checkpoint folder -> LoRA merge check + MindIR check
    work = tmp_path / "export"
    (work / "out").mkdir(parents=True)
    cfg = _cfg(**fmt)
    request = {"config": cfg.model_dump(mode="json"), "target": "CPU", "base": str(base),
               "adapter": str(tuned.output_dir / "checkpoint"), "tokenizer": None,
               "out_dir": str(work / "out"), "work_dir": str(work)}
    (work / "request.json").write_text(json.dumps(request))
    proc = subprocess.run([sys.executable, "-m", "pipeline_lib.export.worker", "--request", str(work / "request.json"),
                           "--result", str(work / "result.json")], cwd=work, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    checks = json.loads((work / "out" / "checks.json").read_text())
    assert checks["lora_check"]["ok"] and checks["mindir_check"]["ok"]
    assert checks["lora"]["modules"] and (work / "out" / "serving" / "model.mindir").is_file()


def _mf_step(ckpt: Path, step: int, w: np.ndarray) -> None:
    """One step as mindformers' Checkpoint 2.0 writes it for one rank (names from checkpoint/utils.py)."""
    it = ckpt / f"iteration_{step:08d}"
    it.mkdir(parents=True)
    save_file({"w": w}, str(it / "tiny-model-0000000-0000001.safetensors"))
    save_file({"adam_m.w": np.zeros_like(w), "adam_v.w": np.zeros_like(w),
               "global_step": np.array([step], np.int32)}, str(it / "tiny-opt-0000000-0000001.safetensors"))
    (it / "common.json").write_text(json.dumps({"step_num": step, "epoch_num": 1, "global_step": step}))
    (ckpt / TRACKER).write_text(str(step))


def test_checkpoint_manager_verifies_prunes_and_resumes_checkpoint_2(tmp_path):
    from pipeline_lib.train.checkpoints import CheckpointManager
    from pipeline_lib.train.runner import resume_fields

    ckpt = tmp_path / "checkpoint"
    _mf_step(ckpt, 2, np.ones((2, 2), np.float32))
    _mf_step(ckpt, 4, np.full((2, 2), 2, np.float32))
    (ckpt / "iteration_00000006").mkdir()  # being written: the tracker does not name it yet
    save_file({"w": np.zeros((2, 2), np.float32)}, str(ckpt / "iteration_00000006" / "tiny-model-0000000-0000001.safetensors"))
    manager = CheckpointManager(tmp_path, keep=1, log=lambda _: None)
    results = manager.sync()
    assert [Path(r.path).parent.name for r in results] == ["iteration_00000002", "iteration_00000004"]
    assert all(r.ok and r.params == 4 for r in results)  # w + adam_m.w + adam_v.w + global_step
    latest = manager.latest()
    assert (latest["step"], latest["global_step"]) == (4, 4)
    assert not (ckpt / "iteration_00000002").exists()  # pruned as a whole folder (keep=1)
    assert (ckpt / "iteration_00000006").exists()  # never touched
    fields = resume_fields(latest["path"])
    assert fields == {"load_checkpoint": str(ckpt), "resume_training": True}
    assert (ckpt / TRACKER).read_text() == "4"


def test_non_finite_checkpoint_2_step_is_rejected(tmp_path):
    from pipeline_lib.train.checkpoints import CheckpointManager

    ckpt = tmp_path / "checkpoint"
    _mf_step(ckpt, 2, np.array([[1.0, np.nan]], np.float32))
    manager = CheckpointManager(tmp_path, log=lambda _: None)
    [res] = manager.sync()
    assert not res.ok and "non-finite" in res.error  # MindSpore's own load, told the format
    assert manager.latest() is None
    assert (tmp_path / "checkpoint_rejected" / "rank_0" / "tiny-model-0000000-0000001.safetensors").is_file()


def test_rollback_moves_the_data_position_of_a_checkpoint_2_step(tmp_path):
    from pipeline_lib.train.runner import resume_fields, rollback_checkpoint

    ckpt = tmp_path / "checkpoint"
    _mf_step(ckpt, 4, np.full((2, 2), 2, np.float32))
    model = ckpt / "iteration_00000004" / "tiny-model-0000000-0000001.safetensors"
    latest = {"ranks": {"0": {"path": str(model)}}}
    start = rollback_checkpoint(latest, tmp_path / "rollback", step_num=7, steps_per_epoch=3)
    common = json.loads((start.parent / "common.json").read_text())
    assert (common["step_num"], common["epoch_num"], common["global_step"]) == (7, 3, 4)
    assert json.loads((model.parent / "common.json").read_text())["step_num"] == 4  # the original is untouched
    assert resume_fields(start)["load_checkpoint"] == str(tmp_path / "rollback")
    assert (tmp_path / "rollback" / TRACKER).read_text() == "4"


def test_checkpoint_2_is_not_uploaded_yet():
    with pytest.raises(ConfigError) as err:
        validate(_cfg(checkpoint_format="safetensors", upload_checkpoints=True))
    assert "training.checkpoint_format='safetensors'" in str(err.value) and "Fix: set training.checkpoint_format=ckpt" in str(err.value)


def test_multi_rank_checkpoint_2_is_refused_on_cpu():
    from pipeline_lib.config.validate import check

    cfg = _cfg(checkpoint_format="safetensors", micro_batch_size=1, gradient_accumulation_steps=2,
               global_batch_size=None)
    cfg = cfg.model_copy(update={"parallel": cfg.parallel.model_copy(update={"devices": 2, "data_parallel": 2,
                                                                             "devices_per_node": 2})})
    issues = [i for i in check(cfg) if i.field == "training.checkpoint_format"]
    assert issues and "get_strategy_metadata" in issues[0].problem
    assert not [i for i in check(cfg, for_run=False) if i.field == "training.checkpoint_format"]  # plan: fine


def test_weights_only_hand_off_is_the_model_file(tmp_path):
    from pipeline_lib.model.checkpoint_format import weights_only_copy

    ckpt = tmp_path / "checkpoint"
    _mf_step(ckpt, 2, np.full((2, 2), 3, np.float32))
    model = ckpt / "iteration_00000002" / "tiny-model-0000000-0000001.safetensors"
    dst = weights_only_copy(model, ckpt / "merged", log=lambda _: None)
    assert dst.name == "tiny-model-0000000-0000001-weights.safetensors"
    assert dst.read_bytes() == model.read_bytes() and dst.stat().st_ino != model.stat().st_ino  # a copy, not a link
    assert sorted(read_weights(dst)[0]) == ["w"]


def test_multi_node_checkpoint_2_is_refused():
    cfg = _cfg(checkpoint_format="safetensors")
    cfg = cfg.model_copy(update={"parallel": cfg.parallel.model_copy(update={"devices": 16, "data_parallel": 16,
                                                                             "devices_per_node": 8})})
    from pipeline_lib.config.validate import checkpoint_format_issues

    [issue] = checkpoint_format_issues(cfg)
    assert issue.field == "training.checkpoint_format" and "2 nodes" in issue.problem and "ckpt" in issue.fix


def test_mindformers_base_is_a_folder_for_checkpoint_2_and_the_file_for_ckpt(tmp_path):
    from pipeline_lib.model.checkpoint_format import HANDOFF_NAME, mindformers_base

    src = tmp_path / "night1-weights.safetensors"
    save_file({"w": np.ones(3, np.float32)}, str(src))
    folder = mindformers_base(src, "safetensors", tmp_path / "cache")
    # mindformers loads Checkpoint 2.0 from a folder only; the file is linked in, nothing else lies there
    assert [p.name for p in folder.iterdir()] == [HANDOFF_NAME]
    assert (folder / HANDOFF_NAME).stat().st_ino == src.stat().st_ino
    assert mindformers_base(tmp_path / "base.ckpt", "ckpt", tmp_path / "cache") == tmp_path / "base.ckpt"
    assert mindformers_base(folder, "safetensors", tmp_path / "cache") == folder


def test_planner_disk_knows_checkpoint_2_is_written_split():
    """Measured in this repository's tiny CLI run: a Checkpoint 2.0 LoRA SFT step is a 1,471,576-byte model file (frozen
    weights + LoRA factors) + a 36,644-byte optimizer file (the factors' moments); nothing is split afterwards."""
    from pipeline_lib.planner.disk import checkpoint_disk, sft_checkpoint_disk

    from pipeline_lib.config.load import load_config

    legacy = load_config(ROOT / "configs" / "pipelines" / "tiny-cpu.yaml")
    v2 = load_config(ROOT / "configs" / "pipelines" / "tiny-cpu.yaml", ["training.checkpoint_format=safetensors"])
    assert checkpoint_disk(legacy, [0]).splitting > 0 and checkpoint_disk(v2, [0]).splitting == 0
    assert checkpoint_disk(v2, [0]).per_checkpoint == checkpoint_disk(legacy, [0]).per_checkpoint
    sft = sft_checkpoint_disk(v2, [0])
    assert sft.splitting == 0 and abs(sft.per_checkpoint - (1_471_576 + 36_644)) / 1_508_220 < 0.02
    assert sft_checkpoint_disk(legacy, [0]).per_checkpoint < sft.per_checkpoint / 5  # LoRA-only under ckpt
