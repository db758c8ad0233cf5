"""Upstream-input discovery from manifests (metrics keys first, then an output scan)."""
from __future__ import annotations

from pipeline_lib.config.load import config_from_dict
from pipeline_lib.runtime.upstream import default_checkpoints, find_heldout, find_sft, find_tokenizer
from pipeline_lib.storage import Manifest, RunPaths, write_manifest


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


def test_a_stage_run_reads_only_the_upstream_it_was_given(tmp_path):
    """With run.upstream the manifests come from the registry, not from the store: a stage the
    registry did not pass (not done, or not read by this stage) provides nothing."""
    cfg = config_from_dict({"run": {"output_root": str(tmp_path)}})
    paths = RunPaths(str(tmp_path), "r1")
    write_manifest(paths.stage_uri("pretrain"), Manifest("pretrain", "r1", "h", metrics={"checkpoint": "on-store.ckpt"}))
    given = {"sft": Manifest("sft", "r1", "h", metrics={"adapter_checkpoint": "lora.ckpt", "base_checkpoint": "/b.ckpt"})}
    assert find_sft(paths, given) == (f"{paths.stage_uri('sft')}/lora.ckpt", "/b.ckpt")
    assert default_checkpoints(cfg, paths, given) == {"sft": {"base": "/b.ckpt",
                                                              "adapter": f"{paths.stage_uri('sft')}/lora.ckpt"}}
    assert default_checkpoints(cfg, paths, {}) == {}
    assert find_tokenizer(cfg, paths, {}) is None and find_heldout(paths, {}) is None
    # without `upstream`, the store is read (tools and tests with no StageRun)
    assert default_checkpoints(cfg, paths)["pretrained"] == f"{paths.stage_uri('pretrain')}/on-store.ckpt"
