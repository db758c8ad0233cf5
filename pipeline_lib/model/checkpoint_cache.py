"""One full checkpoint for a sharded set (model.checkpoints.CheckpointRef), merged once and cached next to the shards.

`full_checkpoint(ref, scratch, endpoint_url=None, log=None)` returns a .ckpt path or s3:// URI holding the whole
model: `ref.ckpt` itself for a full checkpoint; for a sharded set the cache entry
`<checkpoint folder>/merged/<shard key>-weights.ckpt`, the model's parameters only (model.weights_only: consumers
load weights; resume reads the per-rank training files, never this) (key: sha256 over every rank file's and
strategy file's sha256, so a different set can never hit it; `-weights` keeps an older entry that still held the
optimizer state from being taken) with its sidecar `<shard key>.json` {sha256, size, key, layout}. A cache
entry is used only when its bytes hash to the sidecar's sha256 (a truncated or replaced file is merged again).
Otherwise every rank file and strategy file is fetched into `scratch`, checked against the sha256 the manifest
recorded, merged by `python -m pipeline_lib.model.shard_merge` (MindSpore's transform_checkpoints, in a
subprocess: the orchestrating process never imports MindSpore) and stored: the file first, the sidecar last, so
an entry without its sidecar is never taken as done.

Raises ValueError naming the shard whose bytes differ from the manifest, and ShardMergeFailed with the merge
tool's last output.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..runtime.launcher import launch_module
from ..storage import join, sha256_file, store_for
from .checkpoints import CheckpointRef

MERGED_DIR = "merged"


class ShardMergeFailed(RuntimeError):
    """The merge subprocess failed."""


def cache_uri(ref: CheckpointRef) -> str:
    return join(ref.ckpt, MERGED_DIR, f"{ref.shard_key()[:32]}-weights.ckpt")


def _verified_entry(uri: str, scratch: Path, endpoint_url: str | None) -> bool:
    store, side = store_for(uri, endpoint_url), uri[:-len(".ckpt")] + ".json"
    if not (store.exists(uri) and store.exists(side)):
        return False
    meta = json.loads(store.get_bytes(side))
    local = store.local_path(uri) or store.get_file(uri, scratch / "cached.ckpt")
    return sha256_file(local) == meta["sha256"]


def _fetch(path: str, dest: Path, sha256: str, endpoint_url: str | None, what: str) -> Path:
    store = store_for(path, endpoint_url)
    local = store.local_path(path)
    if local is None:
        local = store.get_file(path, dest)
    elif not Path(local).exists():
        raise FileNotFoundError(f"{what} {path} is missing: the pretrain manifest names it; rerun pretrain")
    if sha256_file(local) != sha256:
        raise ValueError(f"{what} {path} differs from the pretrain manifest (sha256 {sha256[:12]}): the run folder "
                         "was changed after pretraining; rerun pretrain")
    return Path(local)


def full_checkpoint(ref: CheckpointRef, scratch: Path, endpoint_url: str | None = None, log=None) -> str:
    """The path or URI of one full checkpoint for `ref` (see the module docstring)."""
    if not ref.sharded:
        return ref.ckpt
    log = log or (lambda line: None)
    uri = cache_uri(ref)
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    if _verified_entry(uri, scratch, endpoint_url):
        log(f"checkpoint: using the merged copy {uri} of the {len(ref.shards)} rank files (sha256 verified)")
        return uri
    src, strategy = scratch / "shards", scratch / "strategy"
    for rank, info in sorted(ref.shards.items(), key=lambda kv: int(kv[0])):
        name = info["path"].rsplit("/", 1)[-1]
        local = _fetch(info["path"], src / f"rank_{rank}" / name, info["sha256"], endpoint_url, f"rank {rank} file")
        link = src / f"rank_{rank}" / name
        if local.resolve() != link.resolve():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            link.symlink_to(local.resolve())
    for f in ref.strategy_files:
        name = f["path"].rsplit("/", 1)[-1]
        local = _fetch(f["path"], strategy / name, f["sha256"], endpoint_url, "strategy file")
        if local.resolve() != (strategy / name).resolve():
            (strategy / name).parent.mkdir(parents=True, exist_ok=True)
            (strategy / name).unlink(missing_ok=True)
            (strategy / name).symlink_to(local.resolve())
    out = scratch / "merged.ckpt"
    log(f"checkpoint: merging {len(ref.shards)} rank files (layout {ref.layout}) into one checkpoint")
    merged = launch_module("pipeline_lib.model.shard_merge",
                           [str(src), str(out), "--strategy", str(strategy), "--weights-only"], cwd=None, timeout_s=None)
    if not merged.ok or not out.exists():
        raise ShardMergeFailed(f"merging the rank files of {ref.ckpt} failed: " + merged.describe("shard_merge"))
    meta = {"sha256": sha256_file(out), "size": out.stat().st_size, "key": ref.shard_key(), "layout": ref.layout,
            "weights_only": True, "shards": {r: i["sha256"] for r, i in ref.shards.items()}}
    store = store_for(uri, endpoint_url)
    store.put_file(out, uri)
    store.put_bytes(uri[:-len(".ckpt")] + ".json", json.dumps(meta, indent=2).encode())
    log(f"checkpoint: merged copy stored at {uri}")
    return uri


def pretrain_checkpoint(paths, upstream=None, log=None) -> str | None:
    """The pretrain stage's weights as one full .ckpt, what every consumer's default reads: the manifest's
    `weights_checkpoint` (the model's parameters only), else for a tensor/pipeline-parallel run the weights-only merge
    of every rank's file (`full_checkpoint`: merged once, cached next to the shards), else its file. Manifests
    without a checkpoint_layout fall back to runtime.upstream's lookup."""
    import tempfile

    from ..runtime.upstream import _manifest, _resolve, find_pretrain_checkpoint

    m = _manifest(paths, upstream, "pretrain")
    weights = (m.metrics or {}).get("weights_checkpoint") if m is not None else None
    if isinstance(weights, dict) and weights.get("path"):
        return _resolve(paths.stage_uri("pretrain"), weights["path"])
    if m is None or not (m.metrics or {}).get("checkpoint_layout"):
        return find_pretrain_checkpoint(paths, upstream)
    ref = CheckpointRef.from_manifest(m)
    if not ref.sharded:
        return _resolve(paths.stage_uri("pretrain"), ref.ckpt)
    with tempfile.TemporaryDirectory(prefix="ckpt-merge-") as tmp:
        return full_checkpoint(ref, Path(tmp), paths.endpoint_url, log)
