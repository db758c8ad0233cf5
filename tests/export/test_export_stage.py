"""The export stage end to end on the tiny model: a 2-way tensor-parallel base checkpoint (per-rank
files + strategy, Megatron-style split) and a LoRA adapter -> merged, checked, exported to MindIR,
reloaded, checked.
A wrong LoRA scale must fail the stage at its logits check. Run through the stage registry
(pipeline_lib.stages.run_stage), which writes the manifest."""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from sharding_helpers import llama_tp_layouts, write_sharded  # noqa: E402

from pipeline_lib.model.lora_merge import LORA_MARK, merge_lora  # noqa: E402
from pipeline_lib.runtime.worker import WorkerFailed  # noqa: E402
from pipeline_lib.stages import run_stage  # noqa: E402
from pipeline_lib.storage import Manifest, RunPaths, read_manifest, write_manifest  # noqa: E402


def run_export_stage(cfg, paths, base, adapter, tokenizer, **options):
    """The export stage through the registry, its required upstream stages recorded as done (the
    inputs are passed explicitly); returns the manifest."""
    for stage in ("data", "sft"):
        write_manifest(paths.stage_uri(stage), Manifest(stage=stage, run_id=paths.run_id, config_hash="x"))
    manifest, skipped = run_stage(cfg, paths, "export", base_ckpt=base, adapter_ckpt=adapter,
                                  tokenizer_path=tokenizer, **options)
    assert not skipped
    return manifest


def _load(path):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


def _wrong_scale_export(t):
    """The export with alpha instead of alpha / rank in the merge; returns the exception it raised."""
    paths = RunPaths(t.cfg.run.output_root, "export-wrong-scale")
    try:
        run_export_stage(t.cfg, paths, str(t.base), str(t.adapter), str(t.tokenizer),
                         lora_scale_override=t.cfg.sft.lora_alpha)
    except WorkerFailed as err:
        return err, Path(paths.stage_uri("export"))
    return None, Path(paths.stage_uri("export"))


@pytest.fixture(scope="module")
def wrong_scale_run(tiny_export):
    """Started in the background as soon as the first test asks for it: the two export workers are
    independent processes, so on 2 cores they overlap instead of adding up."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_wrong_scale_export, tiny_export)


@pytest.mark.slow
def test_export_stage_sharded_base_plus_lora(tiny_export, wrong_scale_run):
    t = tiny_export
    ckpt_dir, strategy = write_sharded(t.root / "tp_run", t.base_params, llama_tp_layouts(t.base_params), [2])
    paths = RunPaths(t.cfg.run.output_root, "export-ok")
    lines = []
    # One rank's file, as a training stage's latest_checkpoint names it: every rank's shard of that
    # step is merged (strategy found in the run folder) before anything else.
    rank_file = ckpt_dir / "rank_1" / "llama_rank-1_10.ckpt"
    manifest = run_export_stage(t.cfg, paths, str(rank_file), str(t.adapter), str(t.tokenizer), log=lines.append)

    stage = Path(paths.stage_uri("export"))
    assert read_manifest(str(stage)).outputs == manifest.outputs
    outs = {o["path"] for o in manifest.outputs}
    assert {"merged.ckpt", "checks.json", "serving/model.mindir", "serving/serving.json",
            "serving/tokenizer.model"} <= outs

    checks = manifest.metrics["checks"]
    assert checks["lora_check"]["ok"] and checks["lora_check"]["max_abs"] < 1e-4
    assert checks["lora"]["scale"] == 2.0 and checks["lora"]["merged_modules"] == 8
    assert checks["mindir_check"]["ok"] and checks["mindir_check"]["max_abs"] < 1e-4
    assert {"export", "reload", "logits_check", "lora_check"} <= set(checks["timings_s"])

    # The merged checkpoint is standalone (no LoRA tensors, nothing but the model) and equals the
    # numpy merge of the unsharded originals.
    merged = _load(stage / "merged.ckpt")
    assert set(merged) == set(t.base_params) and not any(LORA_MARK in k for k in merged)
    expected, _ = merge_lora(t.base_params, t.adapter_params, alpha=8.0, rank=4)
    for name, arr in expected.items():
        np.testing.assert_allclose(merged[name], arr, rtol=0, atol=1e-6, err_msg=name)

    spec = json.loads((stage / "serving" / "serving.json").read_text())
    assert spec["inputs"][0]["shape"] == [2, 32] and spec["inputs"][0]["dtype"] == "int32"
    assert spec["outputs"][0]["shape"] == [2, 32, 640]
    assert spec["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3} and spec["tokenizer"] == "tokenizer.model"
    assert any("LoRA merge check passed" in x for x in lines)


@pytest.mark.slow
def test_wrong_lora_scale_fails_the_stage(wrong_scale_run):
    err, stage = wrong_scale_run.result(timeout=600)
    assert err is not None, "the export with a wrong LoRA scale passed its checks"
    assert err.error_type == "LogitsMismatch" and "LoRA merge" in str(err)
    checks = json.loads((stage / "checks.json").read_text())
    assert checks["lora_check"]["ok"] is False and checks["lora_check"]["max_abs"] > 1e-2
    assert read_manifest(str(stage)) is None and not (stage / "serving").exists()
