"""Find a stage's inputs in the upstream manifests when the caller does not pass them.

A stage gets the manifests of the stages it reads as `run.upstream` (resolved by the registry) and
passes them here: `find_sft(run.paths, run.upstream)`. With `upstream=None` the manifests are read
from the run store (tools and tests that have no StageRun). A stage absent from `upstream` is not
done (or not read) and provides nothing. Convention (keys of a manifest's
`metrics`, values relative to that stage's folder or absolute / s3:// URIs), with a fallback scan of
its `outputs` when a key is absent:

| stage    | metrics key          | fallback                                                |
|----------|----------------------|---------------------------------------------------------|
| data     | `tokenizer_model`    | the output ending in `tokenizer.model`                  |
| data     | `heldout_dir`        | folder of the first output with `heldout` + `.mindrecord` |
| pretrain | `latest_checkpoint`, `checkpoint` | the output .ckpt with the highest step     |
| sft      | `adapter_checkpoint` | `adapter/adapter.ckpt`, else a .ckpt under `checkpoint_trainable` |
| sft      | `base_checkpoint`    | the pretrain checkpoint                                 |

(A metrics value may also be {"uri": ...} or {"path": ...}. The data stage's `metrics.tokenizer` is
its description dict, hence the separate key `tokenizer_model`.)

`localize` brings an s3:// file (or prefix) into a local cache folder; local paths pass through.
Raises InputNotFound naming what is missing and which argument or stage provides it.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..storage import Manifest, RunPaths, is_absolute, join, read_manifest, store_for

_STEP = re.compile(r"-(\d+)_(\d+)\.ckpt$")


class InputNotFound(FileNotFoundError):
    pass


def _resolve(stage_uri: str, value: str) -> str:
    if is_absolute(value):
        return value
    return join(stage_uri, value)


def _manifest(paths: RunPaths, upstream: dict[str, Manifest] | None, stage: str) -> Manifest | None:
    if upstream is not None:
        return upstream.get(stage)
    return read_manifest(paths.stage_uri(stage), paths.endpoint_url)


def _lookup(paths: RunPaths, upstream: dict[str, Manifest] | None, stage: str, keys: tuple[str, ...], match) -> str | None:
    stage_uri = paths.stage_uri(stage)
    m = _manifest(paths, upstream, stage)
    if m is None:
        return None
    for key in keys:
        value = m.metrics.get(key)
        if isinstance(value, dict):  # {"uri": ...} or {"path": ...}
            value = value.get("uri") or value.get("path")
        if value:
            return _resolve(stage_uri, str(value))
    found = match([o["path"] for o in m.outputs])
    return join(stage_uri, found) if found else None


def _last_ckpt(rels: list[str], want_trainable: bool) -> str | None:
    cands = [r for r in rels if r.endswith(".ckpt") and ("checkpoint_trainable" in r) == want_trainable
             and "strategy" not in r]
    if not cands:
        return None
    def key(r):
        m = _STEP.search(r)
        return (int(m.group(1)), int(m.group(2)), r) if m else (-1, -1, r)
    return max(cands, key=key)


def find_tokenizer(cfg, paths: RunPaths, upstream: dict[str, Manifest] | None = None) -> str | None:
    if cfg.tokenizer.path:
        return cfg.tokenizer.path
    return _lookup(paths, upstream, "data", ("tokenizer_model",),
                   lambda rels: next((r for r in rels if r.endswith("tokenizer.model")), None))


def find_heldout(paths: RunPaths, upstream: dict[str, Manifest] | None = None) -> str | None:
    def match(rels):
        hit = next((r for r in rels if "heldout" in r and ".mindrecord" in r and not r.endswith(".db")), None)
        return str(Path(hit).parent) if hit else None
    return _lookup(paths, upstream, "data", ("heldout_dir",), match)


def find_pretrain_checkpoint(paths: RunPaths, upstream: dict[str, Manifest] | None = None) -> str | None:
    """The file the pretrain manifest names (rank 0's for a parallel run): consumers that need the whole model
    call model.checkpoint_cache.pretrain_checkpoint, passed in as `find_pretrain` below."""
    return _lookup(paths, upstream, "pretrain", ("latest_checkpoint", "checkpoint"), lambda rels: _last_ckpt(rels, False))


def find_sft(paths: RunPaths, upstream: dict[str, Manifest] | None = None, find_pretrain=None
             ) -> tuple[str | None, str | None]:
    """(adapter checkpoint, base checkpoint) of the SFT stage; `find_pretrain(paths, upstream)` finds the
    pretrain checkpoint when the SFT manifest names no base (default find_pretrain_checkpoint)."""
    adapter = _lookup(paths, upstream, "sft", ("adapter_checkpoint",),
                      lambda rels: next((r for r in rels if r.endswith("adapter/adapter.ckpt")), None)
                      or _last_ckpt(rels, True))
    base = _lookup(paths, upstream, "sft", ("base_checkpoint",), lambda rels: None) \
        or (find_pretrain or find_pretrain_checkpoint)(paths, upstream)
    return adapter, base


def default_checkpoints(cfg, paths: RunPaths, upstream: dict[str, Manifest] | None = None, find_pretrain=None
                        ) -> dict[str, object]:
    """label -> checkpoint ref: base (model.base_checkpoint), pretrained, sft, then evaluate.compare_checkpoints.
    `find_pretrain(paths, upstream)`: the pretrain lookup (model.checkpoint_cache.pretrain_checkpoint merges a
    sharded run); default find_pretrain_checkpoint."""
    find_pretrain = find_pretrain or find_pretrain_checkpoint
    out: dict[str, object] = {}
    if cfg.model.base_checkpoint:
        out["base"] = cfg.model.base_checkpoint
    pre = find_pretrain(paths, upstream)
    if pre:
        out["pretrained"] = pre
    adapter, base = find_sft(paths, upstream, find_pretrain)
    if adapter and base:
        out["sft"] = {"base": base, "adapter": adapter}
    out.update(cfg.evaluate.compare_checkpoints)
    return out


def localize(uri: str | None, cache_dir: Path, endpoint_url: str | None = None) -> str | None:
    """A local path for `uri`: downloads an s3:// object, or every object under an s3:// prefix."""
    if uri is None:
        return uri
    store = store_for(uri, endpoint_url)
    if not store.remote:
        return uri
    rel = uri[len("s3://"):].replace("/", "_")[-120:]
    if store.exists(uri) and not store.list(uri.rstrip("/") + "/"):
        return str(store.get_file(uri, cache_dir / rel))
    prefix = uri.rstrip("/") + "/"
    files = store.list(prefix)
    if not files:
        raise InputNotFound(f"{uri} does not exist on the store")
    for f in files:
        store.get_file(f, cache_dir / rel / f[len(prefix):])
    return str(cache_dir / rel)


def localize_ref(ref, cache_dir: Path, endpoint_url: str | None = None):
    """A checkpoint ref (path or dict) with every s3:// path downloaded."""
    if isinstance(ref, dict):
        return {k: localize(v, cache_dir, endpoint_url) if isinstance(v, str) else v for k, v in ref.items()}
    return localize(str(ref), cache_dir, endpoint_url)
