"""Stage manifests: the record that a stage finished, and of exactly what.

Layout: <output_root>/<run_id>/<stage>/manifest.json, written LAST and atomically, holding
the stage's config hash (only the config fields that matter to that stage), its inputs
(URIs and the manifests they came from) and every output with size and sha256. A stage is
done when its manifest exists, its config hash and inputs match, and its outputs are there
with the recorded sizes; that one rule drives resume, retries and dispatch to other machines.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .store import is_s3, join, store_for
from .names import check_name

MANIFEST = "manifest.json"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass
class RunPaths:
    """<output_root>/<run_id>/<stage>/ for one run."""

    output_root: str
    run_id: str
    endpoint_url: str | None = None

    def __post_init__(self):
        check_name("run_id", self.run_id)  # joined under output_root: a path would leave it (storage.names)

    @property
    def run_uri(self) -> str:
        return join(self.output_root, self.run_id)

    def stage_uri(self, stage: str) -> str:
        return join(self.run_uri, stage)

    def store(self):
        return store_for(self.output_root, self.endpoint_url)


@dataclass
class Manifest:
    stage: str
    run_id: str
    config_hash: str
    inputs: dict = field(default_factory=dict)
    outputs: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    created_at: str = ""
    settings: dict = field(default_factory=dict)  # the stage's identity fields, dotted (pipeline_lib/run_settings.py)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        return cls(**json.loads(text))


def describe_file(path: str | Path, rel: str) -> dict:
    """The manifest entry of one output file: {path (relative to the stage folder), size, sha256}."""
    path = Path(path)
    return {"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path)}


def describe_files(files: list[tuple[str | Path, str]]) -> list[dict]:
    """describe_file for each (path, rel), in that order, hashed on every core: hashlib lets go of the GIL
    while it hashes (a data stage at 100x the benchmark corpus hashes ~2.5 GB of outputs)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda f: describe_file(*f), files))


def describe_local(root: str | Path, rel_paths: list[str]) -> list[dict]:
    """Manifest entries of files under a local folder (the stage folder or its local working copy)."""
    return describe_files([(Path(root) / rel, rel) for rel in sorted(rel_paths)])


def describe_outputs(stage_uri: str, rel_paths: list[str], endpoint_url: str | None = None) -> list[dict]:
    """Size + sha256 of each output, computed from the local copy (stages write locally first)."""
    store = store_for(stage_uri, endpoint_url)
    out = []
    for rel in sorted(rel_paths):
        uri = join(stage_uri, rel)
        local = store.local_path(uri)
        if local is not None:
            out.append(describe_file(local, rel))
        else:
            data = store.get_bytes(uri)
            out.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return out


def write_manifest(stage_uri: str, manifest: Manifest, endpoint_url: str | None = None) -> str:
    manifest.created_at = manifest.created_at or _dt.datetime.now(_dt.timezone.utc).isoformat()
    uri = join(stage_uri, MANIFEST)
    store_for(stage_uri, endpoint_url).put_bytes(uri, manifest.to_json().encode())
    return uri


def read_manifest(stage_uri: str, endpoint_url: str | None = None) -> Manifest | None:
    store = store_for(stage_uri, endpoint_url)
    uri = join(stage_uri, MANIFEST)
    if not store.exists(uri):
        return None
    return Manifest.from_json(store.get_bytes(uri).decode())


def invalidate(stage_uri: str, endpoint_url: str | None = None) -> None:
    """Remove the manifest first, so a stage being redone is never seen as done."""
    store = store_for(stage_uri, endpoint_url)
    uri = join(stage_uri, MANIFEST)
    if store.exists(uri):
        store.delete(uri)


def manifest_matches(stage_uri: str, config_hash: str, inputs: dict | None = None,
                     endpoint_url: str | None = None, verify_checksums: bool = False) -> tuple[bool, str]:
    """(done?, why not). Outputs are checked by size (cheap) or also by sha256."""
    m = read_manifest(stage_uri, endpoint_url)
    if m is None:
        return False, "no manifest"
    if m.config_hash != config_hash:
        return False, f"config changed ({m.config_hash} -> {config_hash})"
    if inputs is not None and m.inputs != json.loads(json.dumps(inputs, sort_keys=True, default=str)):
        return False, "inputs changed"
    store = store_for(stage_uri, endpoint_url)
    for out in m.outputs:
        uri = join(stage_uri, out["path"])
        if not store.exists(uri):
            return False, f"output missing: {out['path']}"
        if store.size(uri) != out["size"]:
            return False, f"output size changed: {out['path']}"
        if verify_checksums and not is_s3(uri) and sha256_file(store.local_path(uri)) != out["sha256"]:
            return False, f"output checksum changed: {out['path']}"
    return True, "complete"
