"""Documents the user asked the data stage to drop: the ones behind a loss spike, and id lists.

- `data.exclude_from`: guard_diagnosis.json files the pretrain stage wrote when its loss guard tripped (their
  `documents`: the source documents packed in the bad batches, `{id, origin, steps}`); a document is dropped when
  its origin (`<file label>:<line>`, unique in a run) is listed, so documents sharing an id are not dropped with it.
- `data.exclude_ids`: text files of source ids, one per line, each a JSON value (`"doc-17"`, `17`) or else taken as
  a string; a document is dropped when its `data.id_field` value is listed (every document with that id).
prep_shard drops them before the filters, writes them to excluded.jsonl (`filter` and `reason` "guard") and counts
them in stats.json under `filtered` with reason `guard`. Files are read through the store (local or s3://), once
per run (the plan step writes what they list to the stage's work folder, `shards/exclusions.json`; each shard
worker loads that once per process), with the bounded reader (storage.bounded): a guard_diagnosis.json over
16 MiB, an id list over 256 MiB or an id line over 64 KiB is refused.
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
    origins: frozenset[str] = field(default_factory=frozenset)
    ids: frozenset[str] = field(default_factory=frozenset)  # id_key of each id

    def __bool__(self) -> bool:
        return bool(self.origins or self.ids)

    def matches(self, source_id, origin: str) -> bool:
        return origin in self.origins or (bool(self.ids) and id_key(source_id) in self.ids)


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
    """The `documents` of a guard_diagnosis.json's bytes."""
    try:
        doc = json.loads(data)
        docs = doc["documents"]
        if not isinstance(docs, list) or not all(isinstance(d, dict) and "origin" in d for d in docs):
            raise TypeError("documents must be a list of {id, origin}")
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        raise DataStageError("data.exclude_from", path, f"not a guard_diagnosis.json ({type(err).__name__}: {err})",
                             "name the guard_diagnosis.json a pretrain stage folder holds after its loss guard "
                             "tripped") from None
    return docs


def load_exclusions(cfg, endpoint: str | None = None) -> Exclusions:
    d = cfg.data
    origins, ids = set(), set()
    for path in d.exclude_from:
        origins |= {str(doc["origin"]) for doc in guard_documents(_read(path, "data.exclude_from", endpoint), path)}
    for path in d.exclude_ids:
        for raw in _id_lines(path, endpoint):
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            try:
                ids.add(id_key(json.loads(line)))
            except (ValueError, RecursionError):
                ids.add(id_key(line))
    return Exclusions(frozenset(origins), frozenset(ids))


EXCLUSIONS_FILE = "shards/exclusions.json"  # in the data stage's work folder, written by the plan step
_LOADED: dict = {}


def save_exclusions(ex: Exclusions, path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"origins": sorted(ex.origins), "ids": sorted(ex.ids)}, fh, ensure_ascii=False)


def saved_exclusions(path) -> Exclusions:
    """What the plan step saved, loaded once per process (every shard of a worker shares it)."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _LOADED:
        _LOADED.clear()
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        _LOADED[key] = Exclusions(frozenset(data["origins"]), frozenset(data["ids"]))
    return _LOADED[key]
