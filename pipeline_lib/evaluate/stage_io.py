"""Stage folder handling shared by the evaluate and export stages.

- `StageFolder(paths, stage)`: a local folder to write into. For a local run store it is the stage
  folder itself, emptied first; for s3:// it is a scratch folder whose files `publish` uploads
  (atomically, one put per file). The old manifest is removed first, so a stage being redone is
  never seen as done.
- `publish` returns the manifest output entries (path, size, sha256) computed from the local files
  (no download back from S3); `finish` writes the manifest last.
- `stage_config_hash` is the registry's identity of the stage (pipeline_lib.stages), so a stage
  called directly and one run by the registry agree on what "done" means.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..storage import Manifest, RunPaths, invalidate, is_s3, join, sha256_file, store_for, write_manifest


class StageFolder:
    def __init__(self, paths: RunPaths, stage: str):
        self.paths, self.stage = paths, stage
        self.uri = paths.stage_uri(stage)
        self.remote = is_s3(self.uri)
        invalidate(self.uri, paths.endpoint_url)
        if self.remote:
            self.local = Path(tempfile.mkdtemp(prefix=f"{stage}-"))
        else:  # a redo starts from an empty folder: no stale file of an earlier run is listed as output
            self.local = Path(self.uri)
            if self.local.exists():
                shutil.rmtree(self.local)
            self.local.mkdir(parents=True, exist_ok=True)

    def publish(self, rels: list[str]) -> list[dict]:
        outputs = []
        store = store_for(self.uri, self.paths.endpoint_url)
        for rel in sorted(rels):
            local = self.local / rel
            if self.remote:
                store.put_file(local, join(self.uri, rel))
            outputs.append({"path": rel, "size": local.stat().st_size, "sha256": sha256_file(local)})
        return outputs

    def finish(self, manifest: Manifest) -> Manifest:
        write_manifest(self.uri, manifest, self.paths.endpoint_url)
        if self.remote:
            shutil.rmtree(self.local, ignore_errors=True)
        return manifest


def stage_config_hash(cfg, stage: str) -> str:
    from ..stages import stage_hash

    return stage_hash(cfg, stage)


def files_under(root: Path, exclude_prefixes: tuple[str, ...] = ("_work",)) -> list[str]:
    """Relative paths of every file under root, minus scratch folders and temp files."""
    rels = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.startswith(exclude_prefixes) and not p.name.startswith(".tmp-") \
                and p.name != "manifest.json":
            rels.append(rel)
    return sorted(rels)
