"""A stage's output folder seen as a local folder to write into, whether the run store is local or S3.

- `StageFolder(paths, stage)`: `local` is the stage folder itself for a
  local run store (emptied first, so no stale file of an earlier run is listed as an output) or a
  scratch folder for s3:// (files are uploaded by `publish`, one atomic put each).
- `publish(rels)` uploads (S3) and returns the output entries {path, size, sha256}
  (storage.describe_local, computed from the local files: nothing is downloaded back);
  `close()` removes the scratch copy. Use it as a context manager so a failed stage leaves no scratch.
- `files_under(root)`: every file a stage wrote, minus scratch folders, temp files and manifest.json.
The stage registry (pipeline_lib.stages) removed the old manifest before the stage ran and writes
the new one after it returns; this module never touches manifests.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..storage import RunPaths, describe_local, join, store_for


class StageFolder:
    def __init__(self, paths: RunPaths, stage: str):
        self.paths, self.stage = paths, stage
        self.uri = paths.stage_uri(stage)
        self.remote = paths.store().remote
        if self.remote:
            self.local = Path(tempfile.mkdtemp(prefix=f"{self.stage}-"))
        else:  # a redo starts from an empty folder: no stale file of an earlier run is listed as output
            self.local = Path(self.uri)
            if self.local.exists():
                shutil.rmtree(self.local)
            self.local.mkdir(parents=True, exist_ok=True)

    def publish(self, rels: list[str]) -> list[dict]:
        if self.remote:
            store = store_for(self.uri, self.paths.endpoint_url)
            for rel in sorted(rels):
                store.put_file(self.local / rel, join(self.uri, rel))
        return describe_local(self.local, rels)

    def close(self) -> None:
        if self.remote:
            shutil.rmtree(self.local, ignore_errors=True)

    def __enter__(self) -> "StageFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def files_under(root: Path, exclude_prefixes: tuple[str, ...] = ("_work",)) -> list[str]:
    """Relative paths of every file under root, minus scratch folders and temp files."""
    rels = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.startswith(exclude_prefixes) and not p.name.startswith(".tmp-") \
                and p.name != "manifest.json":
            rels.append(rel)
    return sorted(rels)
