"""Documents the user asked the data stage to drop: the ones behind a loss spike, the screen's, and id lists.

- `data.exclude_from`: guard_diagnosis.json files the pretrain stage wrote when its loss guard tripped (their
  `documents`: the source documents packed in the bad batches, `{id, origin, steps}`), or the exclusion file the
  nightly's data screen writes (the same `documents`, and a top-level `reason`: `lineage_perplexity`,
  nightly/screen.py); a document is dropped when its origin (`<file label>:<line>`, unique in a run) is listed, so
  documents sharing an id are not dropped with it.
- `data.exclude_ids`: text files of source ids, one per line, each a JSON value (`"doc-17"`, `17`) or else taken as
  a string; a document is dropped when its `data.id_field` value is listed (every document with that id).
prep_shard drops them before the filters, writes them to excluded.jsonl (`filter` and `reason`: the file's `reason`,
"guard" when it names none, as for every id list) and counts them in stats.json under `filtered` by that reason. Files are read through the store (local or s3://).
Raises DataStageError naming the field and the file for a file that is missing or is not what the field reads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..storage import store_for
from .errors import DataStageError

GUARD_REASON = "guard"

_json = json.JSONEncoder(ensure_ascii=False, default=str).encode


def id_key(value) -> str:
    """How an id compares: its JSON text (17 and "17" are different ids, as in the source)."""
    return _json(value)


@dataclass(frozen=True)
class Exclusions:
    origins: dict[str, str] = field(default_factory=dict)  # origin -> reason
    ids: frozenset[str] = field(default_factory=frozenset)  # id_key of each id

    def __bool__(self) -> bool:
        return bool(self.origins or self.ids)

    def reason(self, source_id, origin: str) -> str | None:
        """Why the document is dropped (the reason of the file naming its origin, else `guard` for a listed id),
        None when it is not."""
        if origin in self.origins:
            return self.origins[origin]
        return GUARD_REASON if self.ids and id_key(source_id) in self.ids else None

    def matches(self, source_id, origin: str) -> bool:
        return self.reason(source_id, origin) is not None


def _read(path: str, name: str, endpoint: str | None) -> bytes:
    try:
        return store_for(path, endpoint).get_bytes(path)
    except (OSError, KeyError) as err:
        raise DataStageError(name, path, f"cannot read it ({type(err).__name__}: {err})",
                             "name an existing file, or remove it from the list") from None


def guard_documents(data: bytes, path: str) -> list[dict]:
    """The `documents` of a guard_diagnosis.json's (or a screen exclusion file's) bytes."""
    return _documents(data, path)[0]


def _documents(data: bytes, path: str) -> tuple[list[dict], str]:
    """(`documents`, `reason`: `guard` when the file names none)."""
    try:
        doc = json.loads(data)
        docs = doc["documents"]
        if not isinstance(docs, list) or not all(isinstance(d, dict) and "origin" in d for d in docs):
            raise TypeError("documents must be a list of {id, origin}")
        reason = doc.get("reason", GUARD_REASON)
        if not isinstance(reason, str) or not reason:
            raise TypeError("reason must be a non-empty string")
    except (ValueError, KeyError, TypeError) as err:
        raise DataStageError("data.exclude_from", path, f"not a guard_diagnosis.json ({type(err).__name__}: {err})",
                             "name the guard_diagnosis.json a pretrain stage folder holds after its loss guard "
                             "tripped") from None
    return docs, reason


def load_exclusions(cfg, endpoint: str | None = None) -> Exclusions:
    d = cfg.data
    origins, ids = {}, set()
    for path in d.exclude_from:
        docs, reason = _documents(_read(path, "data.exclude_from", endpoint), path)
        origins.update((str(doc["origin"]), reason) for doc in docs)
    for path in d.exclude_ids:
        for line in _read(path, "data.exclude_ids", endpoint).decode("utf-8", "replace").splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                ids.add(id_key(json.loads(line)))
            except ValueError:
                ids.add(id_key(line))
    return Exclusions(origins, frozenset(ids))
