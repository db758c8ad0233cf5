"""The data stage folder (local or s3://) seen through a local working copy, plus its markers.

Layout of <output_root>/<run_id>/data/:
  cleaned/part-00000.jsonl.gz         kept documents (id, origin, text, split, meta), one part per shard
  tokenizer/tokenizer.model           + tokenizer_config.json
  mindrecord/{train,heldout}/shard-00000.mindrecord (+ .db, + .docs.jsonl: the documents in its rows)
  quarantine.jsonl excluded.jsonl duplicates.jsonl stats.json
  shards/                             work files and completion markers (removed after success)
  manifest.json                       written last
Every step writes into the local copy and `publish`es: a no-op for a local stage folder, an
atomic upload (storage.put_file) for S3. A marker holds the hash of the config fields the work
depends on (`work_hash`), so a marker left by a run with another config does not count.
With an S3 stage folder, the local copy is `<work root>/data/<hash of the stage URI and work hash>`
(runtime.work_folders: $LLM_PIPELINE_WORK_DIR or `<temp dir>/llm-pipeline-<uid>`, every level created 0700 or
checked to be this user's own, never through a link: another account's folder there is refused with the fix).
`shared=False` keeps the work files and markers in the local copy and uploads only the deliverables:
what one machine running every step wants; a resume on the same machine still skips finished
work. `shared=True` (the default of the step functions) puts them on S3 too, so steps can run on
different machines.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..config.identity import stage_hash
from ..runtime.work_folders import work_folder
from ..storage import join, store_for

DATA_FOLDER = "data"  # under the work root: the local copies of s3:// data stages


def work_hash(cfg) -> str:
    """The data stage's identity hash (config.identity.stage_hash: the fields the schema marks as
    defining the data stage's outputs; not workers, executor or thread counts)."""
    return stage_hash(cfg, "data")


class Workspace:
    """Paths, transfers and markers of one run's data stage folder."""

    def __init__(self, cfg, paths, shared: bool = True):
        self.cfg, self.paths = cfg, paths
        self.uri, self.endpoint = paths.stage_uri("data"), paths.endpoint_url
        self.store = store_for(self.uri, self.endpoint)
        self.remote = self.store.remote
        self.local_work = self.remote and not shared
        self.hash = work_hash(cfg)
        if self.remote:
            key = hashlib.sha256(f"{self.uri}|{self.hash}".encode()).hexdigest()[:16]
            self.root = work_folder(DATA_FOLDER, key)  # private to this user: a failed run's copy stays unreadable
        else:
            self.root = Path(self.uri)
            self.root.mkdir(parents=True, exist_ok=True)

    def uri_of(self, rel: str) -> str:
        return join(self.uri, rel)

    def local(self, rel: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _stays_local(self, rel: str) -> bool:
        return self.local_work and rel.startswith("shards/")

    def publish(self, *rels: str) -> None:
        if self.remote:
            for rel in rels:
                if not self._stays_local(rel):
                    self.store.put_file(self.local(rel), self.uri_of(rel))

    def fetch(self, rel: str) -> Path:
        """Local path of a stage file, downloaded first when the stage is on S3."""
        path = self.local(rel)
        if self.remote and not path.exists() and not self._stays_local(rel):
            self.store.get_file(self.uri_of(rel), path)
        return path

    def exists(self, rel: str) -> bool:
        return self.store.exists(self.uri_of(rel))

    def write_json(self, rel: str, obj) -> None:
        path = self.local(rel)
        tmp = path.with_name(f".tmp-{path.name}")
        tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False, sort_keys=True))
        os.replace(tmp, path)
        self.publish(rel)

    def read_json(self, rel: str):
        return json.loads(self.fetch(rel).read_text())

    def mark(self, name: str) -> None:
        rel = f"shards/{name}.done"
        if self._stays_local(rel):
            self.local(rel).write_text(self.hash)
        else:
            self.store.put_bytes(self.uri_of(rel), self.hash.encode())

    def is_marked(self, name: str) -> bool:
        rel = f"shards/{name}.done"
        if self._stays_local(rel):
            path = self.root / rel
            return path.exists() and path.read_text() == self.hash
        try:
            return self.store.get_bytes(self.uri_of(rel)).decode() == self.hash
        except FileNotFoundError:
            return False
        except Exception as err:  # botocore ClientError: only "no such key" means "not marked"
            if getattr(err, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return False
            raise

    def remove(self, rel: str) -> None:
        if self.store.exists(self.uri_of(rel)):
            self.store.delete(self.uri_of(rel))
        shutil.rmtree(self.root / rel, ignore_errors=True)

    def drop_local_copy(self) -> None:
        if self.remote:
            shutil.rmtree(self.root, ignore_errors=True)


def atomic_path(path: Path) -> Path:
    """A temp name next to `path` (same folder, so os.replace is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".tmp-{path.name}")
