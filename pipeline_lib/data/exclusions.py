"""Documents the user asked the data stage to drop: the ones behind a loss spike, the screen's, and id lists.

- `data.exclude_from`: guard_diagnosis.json files the pretrain stage wrote when its loss guard tripped (their
  `documents`: the source documents packed in the bad batches, `{id, origin, steps}`), or the exclusion file the
  nightly's data screen writes (the same `documents`, and a top-level `reason`: `lineage_perplexity`,
  nightly/screen.py); a document is dropped when its origin (`<file label>:<line>`, unique in a run) is listed, so
  documents sharing an id are not dropped with it.
- `data.exclude_ids`: text files of source ids, one per line, each a JSON value (`"doc-17"`, `17`) or else taken as
  a string; a document is dropped when its `data.id_field` value is listed (every document with that id).
prep_shard drops them before the filters, writes them to excluded.jsonl (`filter` and `reason`: the file's `reason`,
"guard" when it names none, as for every id list) and counts them in stats.json under `filtered` by that reason.
Files are read through the store (local or s3://), once per run (the plan step writes what they list to the stage's
work folder, `shards/exclusions.json`; each shard worker loads that once per process), with the bounded reader
(storage.bounded): a guard_diagnosis.json over 16 MiB, an id list over 256 MiB or an id line over 64 KiB is refused.
Raises DataStageError naming the field and the file for a file that is missing, too large or is not what the
field reads.
"""
from __future__ import annotations

import json
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..storage import LongLine
from ..storage.bounded import MAX_JSON_BYTES, MAX_LIST_BYTES, InputTooLarge, bounded_lines, read_capped
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


MAX_ID_LINE = 64 << 10  # an id is a short JSON value


@contextmanager
def _reading(path: str, name: str):
    try:
        yield
    except InputTooLarge as err:
        raise DataStageError(err.field, err.value, err.problem, err.fix) from None
    except (OSError, KeyError, EOFError, zlib.error) as err:
        raise DataStageError(name, path, f"cannot read it ({type(err).__name__}: {err})",
                             "name an existing file, or remove it from the list") from None


def _read(path: str, name: str, endpoint: str | None) -> bytes:
    with _reading(path, name):
        return read_capped(path, endpoint, field=name, max_bytes=MAX_JSON_BYTES,
                           fix="name the guard_diagnosis.json a pretrain stage wrote, or remove it from the list")


def _id_lines(path: str, endpoint: str | None):
    with _reading(path, "data.exclude_ids"):
        for n, line in enumerate(bounded_lines(path, endpoint, field="data.exclude_ids", max_line=MAX_ID_LINE,
                                               max_bytes=MAX_LIST_BYTES, fix="split the id list, or remove it"), 1):
            if isinstance(line, LongLine):
                raise DataStageError("data.exclude_ids", path, f"line {n} is {line.size:,} bytes: not an id (at most "
                                     f"{MAX_ID_LINE:,} bytes)", "write one id per line")
            yield line


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
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
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
        for raw in _id_lines(path, endpoint):
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            try:
                ids.add(id_key(json.loads(line)))
            except (ValueError, RecursionError):
                ids.add(id_key(line))
    return Exclusions(origins, frozenset(ids))


EXCLUSIONS_FILE = "shards/exclusions.json"  # in the data stage's work folder, written by the plan step
_LOADED: dict = {}


def save_exclusions(ex: Exclusions, path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"origins": ex.origins, "ids": sorted(ex.ids)}, fh, ensure_ascii=False, sort_keys=True)


def saved_exclusions(path) -> Exclusions:
    """What the plan step saved, loaded once per process (every shard of a worker shares it)."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _LOADED:
        _LOADED.clear()
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        _LOADED[key] = Exclusions(dict(data["origins"]), frozenset(data["ids"]))
    return _LOADED[key]
