"""A held night is promoted by hand only if its checkpoint is still the one its pretrain stage wrote.

`verify_held_checkpoint(cfg, held)` finds the sha256 the run recorded for the held `checkpoint` (the pretrain
manifest's outputs, its `weights_checkpoint`, or the sidecar of a merged copy) and hashes the file now: days may pass
between the night and `llm-pipeline nightly promote`, and a replaced or truncated file must not become every later
night's base. Raises ValueError naming --run-id, the checkpoint, both hashes and the fix.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..config.schema import PipelineConfig
from ..storage import RunPaths, join, read_manifest, sha256_file, store_for


def recorded_sha256(cfg: PipelineConfig, run_id: str, checkpoint: str) -> str | None:
    """The sha256 the run recorded for `checkpoint` (None: the run recorded none)."""
    endpoint = cfg.run.s3_endpoint_url
    stage = RunPaths(cfg.run.output_root, run_id, endpoint).stage_uri("pretrain")
    m = read_manifest(stage, endpoint)
    if m is not None:
        weights = (m.metrics or {}).get("weights_checkpoint")
        entries = [*m.outputs, *([weights] if isinstance(weights, dict) else [])]
        for entry in entries:
            path = entry.get("path") or ""
            if entry.get("sha256") and checkpoint in (path, join(stage, path)):
                return entry["sha256"]
    store = store_for(checkpoint, endpoint)
    side = checkpoint[:-len(".ckpt")] + ".json"  # a merged copy's sidecar (model.checkpoint_cache)
    if checkpoint.endswith(".ckpt") and store.exists(side):
        return json.loads(store.get_bytes(side)).get("sha256")
    return None


def verify_held_checkpoint(cfg: PipelineConfig, held: dict) -> str:
    """The held night's checkpoint sha256, checked against what its run recorded (see the module docstring)."""
    run_id, checkpoint = held["run_id"], held.get("checkpoint")
    fix = "promote another held night, or rerun the night (its pretrain stage writes the checkpoint again)"
    if not checkpoint:
        raise ValueError(f"--run-id={run_id!r}: the held night names no checkpoint. Fix: {fix}")
    expected = recorded_sha256(cfg, run_id, checkpoint)
    if expected is None:
        raise ValueError(f"--run-id={run_id!r}: its checkpoint {checkpoint} is not recorded with a sha256 in the "
                         f"run's pretrain manifest: it cannot be verified. Fix: {fix}")
    store = store_for(checkpoint, cfg.run.s3_endpoint_url)
    if not store.exists(checkpoint):
        raise ValueError(f"--run-id={run_id!r}: its checkpoint {checkpoint} is gone. Fix: {fix}")
    with tempfile.TemporaryDirectory(prefix="promote-verify-") as tmp:
        local = store.local_path(checkpoint) or store.get_file(checkpoint, Path(tmp) / "held.ckpt")
        found = sha256_file(local)
    if found != expected:
        raise ValueError(f"--run-id={run_id!r}: its checkpoint {checkpoint} has sha256 {found[:16]}..., its run "
                         f"recorded {expected[:16]}...: the file changed after the night. Fix: {fix}")
    return found
