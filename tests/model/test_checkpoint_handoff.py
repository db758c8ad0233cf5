"""Sharded pretrain checkpoints handed to the consumers: per-rank files + strategy built here (sharding_helpers),
described by the pretrain stage's own checkpoint_layout, read back with CheckpointRef.from_manifest and merged
once into a cached full checkpoint (runtime.checkpoint_cache) whose tensors equal the unsharded originals."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from sharding_helpers import llama_tp_layouts, write_sharded

from pipeline_lib.model.checkpoints import CheckpointRef
from pipeline_lib.model.checkpoint_cache import cache_uri, full_checkpoint, pretrain_checkpoint
from pipeline_lib.runtime.upstream import default_checkpoints, find_sft
from pipeline_lib.storage import Manifest, RunPaths, join, sha256_file, store_for
from pipeline_lib.train.stage import checkpoint_layout

NAME = "llama_rank-1_10.ckpt"


def _params(seed=0):
    rng = np.random.default_rng(seed)
    names = {"model.layers.0.attention.wq.weight": (8, 8), "model.layers.0.attention.wo.weight": (8, 8),
             "model.layers.0.feed_forward.w1.weight": (16, 8), "model.layers.0.feed_forward.w2.weight": (8, 16),
             "model.layers.1.attention.wq.weight": (8, 8), "model.layers.1.feed_forward.w2.weight": (8, 16),
             "model.norm_out.weight": (8,), "lm_head.weight": (32, 8)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in names.items()}


def build_run(stage_dir: Path, dp: int, mp: int, pp: int, optimizer_shard: bool, seed: int):
    """A pretrain stage folder (checkpoint/rank_N + strategy/) and the manifest the stage would write for it."""
    params = _params(seed)
    layouts = llama_tp_layouts(params) if mp > 1 else {k: [-1] * v.ndim for k, v in params.items()}
    dev = [dp, mp] if dp > 1 else [mp]
    stage_of = None
    if pp > 1:  # layer 0 + embedding on stage 0, layer 1 + head on stage 1 (as mindformers splits layers)
        stage_of = {k: 0 if "layers.0." in k else 1 for k in params}
    write_sharded(stage_dir, params, layouts, dev, stage_of, ckpt_name=NAME)
    ranks = sorted(int(p.name[5:]) for p in (stage_dir / "checkpoint").iterdir())
    latest = {"step": 10, "ranks": {str(r): {"path": str(stage_dir / "checkpoint" / f"rank_{r}" / NAME),
                                             "size": (stage_dir / "checkpoint" / f"rank_{r}" / NAME).stat().st_size,
                                             "sha256": sha256_file(stage_dir / "checkpoint" / f"rank_{r}" / NAME)}
                                  for r in ranks}}
    cfg = SimpleNamespace(parallel=SimpleNamespace(data_parallel=dp, model_parallel=mp, pipeline_stage=pp,
                                                   optimizer_shard=optimizer_shard))
    layout = checkpoint_layout(cfg, latest, stage_dir, lambda p: str(Path(p).resolve()))
    return params, layout


def _manifest(layout, stage_uri):
    return Manifest(stage="pretrain", run_id="run", config_hash="x", outputs=[], metrics={
        "latest_checkpoint": layout["ranks"]["0"]["path"], "checkpoint_layout": layout})


def _load(path):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


def _assert_equal(merged_file, params):
    merged = _load(merged_file)
    assert set(merged) == set(params)
    for k, v in params.items():
        assert merged[k].dtype == v.dtype and merged[k].tobytes() == v.tobytes(), k


LAYOUTS = {"mp2": (1, 2, 1, False), "dp1_mp2_pp2 (shipped 7B)": (1, 2, 2, False),
           "dp2_mp2_optimizer_shard (planner 7B)": (2, 2, 1, True)}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_manifest_to_merged_full_checkpoint(tmp_path, name):
    dp, mp, pp, opt = LAYOUTS[name]
    stage = tmp_path / "run" / "pretrain"
    params, layout = build_run(stage, dp, mp, pp, opt, seed=len(name))
    assert layout["world_size"] == dp * mp * pp == len(layout["ranks"])
    assert [Path(s["path"]).name for s in layout["strategy"]] == sorted(
        f"ckpt_strategy_rank_{s * dp * mp}.ckpt" for s in range(pp))
    ref = CheckpointRef.from_manifest(_manifest(layout, str(stage)))
    assert ref.sharded and ref.layout["pipeline_stage"] == pp
    assert CheckpointRef.parse(ref.to_json()) == ref  # the handoff survives json (worker requests, manifests)
    logs = []
    uri = full_checkpoint(ref, tmp_path / "scratch", log=logs.append)
    assert uri == cache_uri(ref) and Path(uri).parent == stage / "checkpoint" / "merged"
    _assert_equal(uri, params)
    # every consumer's default goes through the same lookup: one merge, then the verified cache
    paths, upstream = RunPaths(str(tmp_path), "run"), {"pretrain": _manifest(layout, str(stage))}
    again = pretrain_checkpoint(paths, upstream, logs.append)
    assert again == uri and "sha256 verified" in logs[-1]
    cfg = SimpleNamespace(model=SimpleNamespace(base_checkpoint=None),
                          evaluate=SimpleNamespace(compare_checkpoints={}))
    assert default_checkpoints(cfg, paths, upstream, pretrain_checkpoint) == {"pretrained": uri}  # evaluate
    assert find_sft(paths, upstream, pretrain_checkpoint) == (None, uri)  # export's default base
    from pipeline_lib.train.sft_stage import find_base_checkpoint

    run = SimpleNamespace(paths=paths, upstream=upstream, log=logs.append, cfg=cfg)
    assert find_base_checkpoint(run) == uri  # SFT's base


def test_cache_is_verified_and_rebuilt(tmp_path):
    stage = tmp_path / "pretrain"
    params, layout = build_run(stage, 1, 2, 1, False, seed=5)
    ref = CheckpointRef.from_manifest(_manifest(layout, str(stage)))
    uri = full_checkpoint(ref, tmp_path / "s1")
    Path(uri).chmod(0o600)
    Path(uri).write_bytes(Path(uri).read_bytes()[:-10])  # a truncated cache entry is not reused
    logs = []
    assert full_checkpoint(ref, tmp_path / "s2", log=logs.append) == uri
    assert any("merging" in line for line in logs)
    _assert_equal(uri, params)
    # a shard whose bytes differ from the manifest is refused, naming the rank
    f = Path(layout["ranks"]["1"]["path"])
    f.chmod(0o600)
    f.write_bytes(f.read_bytes()[:-1] + b"\0")
    shutil.rmtree(stage / "checkpoint" / "merged")
    with pytest.raises(ValueError, match="rank 1 file"):
        full_checkpoint(ref, tmp_path / "s3")


def test_full_checkpoint_layouts_need_no_merge(tmp_path):
    stage = tmp_path / "pretrain"
    _, layout = build_run(stage, 2, 1, 1, False, seed=6)  # pure data parallel: every rank a full copy
    ref = CheckpointRef.from_manifest(_manifest(layout, str(stage)))
    assert not ref.sharded and ref.ckpt == layout["ranks"]["0"]["path"]


@pytest.mark.parametrize("name", ["dp1_mp2_pp2 (shipped 7B)", "dp2_mp2_optimizer_shard (planner 7B)"])
def test_s3_round_trip_of_the_run_folder(tmp_path, s3_bucket, name):
    bucket, endpoint = s3_bucket
    dp, mp, pp, opt = LAYOUTS[name]
    stage = tmp_path / "pretrain"
    params, layout = build_run(stage, dp, mp, pp, opt, seed=7)
    store, remote = store_for(bucket, endpoint), join(bucket, "runs", "r1", "pretrain")
    for f in sorted(p for p in stage.rglob("*") if p.is_file()):
        store.put_file(f, join(remote, f.relative_to(stage).as_posix()))
    shutil.rmtree(stage)  # only the run store has it now (an s3 run's work folder is gone)
    to_uri = lambda p: join(remote, Path(p).relative_to(stage).as_posix())  # noqa: E731
    layout["ranks"] = {r: {**i, "path": to_uri(i["path"])} for r, i in layout["ranks"].items()}
    layout["strategy"] = [{**s, "path": to_uri(s["path"])} for s in layout["strategy"]]
    ref = CheckpointRef.from_manifest(_manifest(layout, remote))
    uri = full_checkpoint(ref, tmp_path / "scratch", endpoint)
    assert uri.startswith(join(remote, "checkpoint", "merged"))
    _assert_equal(store.get_file(uri, tmp_path / "merged.ckpt"), params)
    logs = []
    assert full_checkpoint(ref, tmp_path / "scratch2", endpoint, logs.append) == uri
    assert "sha256 verified" in logs[-1]


OPTIMIZER_PREFIXES = ("adam_m.", "adam_v.")  # mindformers AdamW's moments, named after their parameter


def _night_shards(stage: Path):
    """Per-rank files of a dp1 x mp2 x pp2 night under `stage` (weights, AdamW moments sharded like their weight, the
    step counter; per-stage strategies): (weights, every tensor, the ranks' {path, size, sha256})."""
    weights = _params(seed=27)
    params = {**weights, **{p + k: (v * 0.5).astype(np.float32) for p in OPTIMIZER_PREFIXES for k, v in weights.items()}}
    params["global_step"] = np.array([10], np.int32)
    layouts = llama_tp_layouts(weights)
    layouts.update({p + k: layouts[k] for p in OPTIMIZER_PREFIXES for k in weights})
    layouts["global_step"] = [-1]
    # layer 0 + its moments (and the step counter) on stage 0, the rest on stage 1, as in build_run
    stage_of = {k: 0 if "layers.0." in k or k == "global_step" else 1 for k in params}
    write_sharded(stage, params, layouts, [2], stage_of, ckpt_name=NAME)
    ranks = {str(r): {"path": str(stage / "checkpoint" / f"rank_{r}" / NAME),
                      "size": (stage / "checkpoint" / f"rank_{r}" / NAME).stat().st_size,
                      "sha256": sha256_file(stage / "checkpoint" / f"rank_{r}" / NAME)} for r in range(4)}
    return weights, params, ranks


def test_next_base_checkpoint_of_a_mp2_pp2_night(tmp_path):
    """nightly.next_base_checkpoint on a night trained at the shipped 7B layout (dp1 x mp2 x pp2): per-rank files
    that hold what mindformers saves (weights, both AdamW moments sharded like their weight, the step counter) and
    per-stage strategy files, the pretrain manifest the stage writes; tomorrow's base is one full checkpoint whose
    weights equal the unsharded ones bit for bit, and it holds no optimizer or training state (model.weights_only):
    the training checkpoint's moments stay in the per-rank files, for resume."""
    from pipeline_lib.config import load_config
    from pipeline_lib.nightly import next_base_checkpoint
    from pipeline_lib.storage import write_manifest

    cfg = load_config(str(Path(__file__).resolve().parents[2] / "configs/pipelines/tiny-cpu.yaml"),
                      [f"run.output_root={tmp_path}"])
    paths = RunPaths(cfg.run.output_root, "night-1")
    stage = Path(paths.stage_uri("pretrain"))
    weights, _, ranks = _night_shards(stage)
    par = SimpleNamespace(parallel=SimpleNamespace(data_parallel=1, model_parallel=2, pipeline_stage=2,
                                                   optimizer_shard=False))
    layout = checkpoint_layout(par, {"step": 10, "ranks": ranks}, stage, lambda p: str(Path(p).resolve()))
    write_manifest(str(stage), _manifest(layout, str(stage)))
    logs = []
    base = next_base_checkpoint(cfg, "night-1", logs.append)
    assert base is not None and Path(base).parent == stage / "checkpoint" / "merged"
    merged = _load(base)
    for k, v in weights.items():
        assert merged[k].dtype == v.dtype and merged[k].tobytes() == v.tobytes(), k
    assert set(merged) == set(weights)  # no adam_m.*, adam_v.*, global_step
    shards = sum(Path(i["path"]).stat().st_size for i in ranks.values())
    assert Path(base).stat().st_size < shards / 2  # the moments were two thirds of the training files
    # the second night's lookup reuses the verified merge rather than merging again
    assert next_base_checkpoint(cfg, "night-1", logs.append) == base and "sha256 verified" in logs[-1]


def test_a_single_node_sharded_pretrain_lists_its_weights_only_merge(tmp_path):
    """The pretrain stage's own weights_checkpoint for the shipped 7B layout (one node, dp1 x mp2 x pp2): the
    weights-only merge, in checkpoint/merged/ with its sidecar, is the verified cache entry consumers find."""
    from pipeline_lib.config import load_config
    from pipeline_lib.train.stage import _weights_checkpoint

    cfg = load_config(str(Path(__file__).resolve().parents[2] / "configs/pipelines/llama2-7b-4x64gb.yaml"))
    stage = tmp_path / "pretrain"
    weights, _, ranks = _night_shards(stage)
    logs = []
    files = _weights_checkpoint(cfg, stage, {"step": 10, "ranks": ranks}, SimpleNamespace(node_rank=0), logs.append)
    assert [f.parent for f in files] == [stage / "checkpoint" / "merged"] * 2 and files[1].suffix == ".json"
    merged = _load(files[0])
    assert set(merged) == set(weights) and all(merged[k].tobytes() == v.tobytes() for k, v in weights.items())
    layout = checkpoint_layout(cfg, {"step": 10, "ranks": ranks}, stage, lambda p: str(Path(p).resolve()))
    ref = CheckpointRef.from_manifest(_manifest(layout, str(stage)))
    assert full_checkpoint(ref, tmp_path / "scratch", log=logs.append) == str(files[0])
    assert "sha256 verified" in logs[-1]
