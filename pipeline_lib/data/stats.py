"""stats.json: every input document accounted for, per input file and in total.

Per file and in total: read, rejected (malformed lines, by reason), filtered (by reason),
exact_duplicates, near_duplicates, kept (train + heldout), tokens (documents' tokens + their EOS),
rows (packed rows, each counted for the file holding its first token), `contaminated_by` (where documents were
filtered as `contamination`: how many per evaluation file they overlap, data/decontaminate.py), and `balanced`:
read == rejected + filtered + exact_duplicates + near_duplicates + kept.
`table_rows(stats)` flattens it for a table artifact (one row per file, then the total); `stats_tables`
reads it from a finished stage's folder for the UI (the stage table's `tables` of the data row).
"""
from __future__ import annotations

import json
from collections import Counter

import numpy as np

from ..storage import join

FIELDS = ("read", "rejected", "filtered", "exact_duplicates", "near_duplicates", "kept", "kept_train",
          "kept_heldout", "tokens_train", "tokens_heldout", "rows_train", "rows_heldout")


def _blank(uri: str = "") -> dict:
    out = {f: 0 for f in FIELDS}
    out.update(uri=uri, rejected={}, filtered={})
    return out


def _add(into: dict, shard: dict) -> None:
    for f in FIELDS:
        if f not in ("rejected", "filtered"):
            into[f] += int(shard.get(f, 0))
    for f in ("rejected", "filtered"):
        into[f] = dict(Counter(into[f]) + Counter(shard.get(f, {})))
    if shard.get("contaminated_by"):  # filtered as `contamination`, per evaluation file overlapped
        into["contaminated_by"] = dict(Counter(into.get("contaminated_by", {})) + Counter(shard["contaminated_by"]))


def _finish(entry: dict) -> dict:
    entry["rejected_total"] = sum(entry["rejected"].values())
    entry["filtered_total"] = sum(entry["filtered"].values())
    entry["tokens"] = entry["tokens_train"] + entry["tokens_heldout"]
    entry["rows"] = entry["rows_train"] + entry["rows_heldout"]
    accounted = (entry["rejected_total"] + entry["filtered_total"] + entry["exact_duplicates"]
                 + entry["near_duplicates"] + entry["kept"])
    entry["balanced"] = entry["read"] == accounted and entry["kept"] == entry["kept_train"] + entry["kept_heldout"]
    return entry


def attribute_rows(token_counts: list[int], labels: list[str], row_len: int, n_rows: int) -> Counter:
    """Rows per file label: row j belongs to the shard (hence file) holding its first token."""
    ends = np.cumsum(np.asarray(token_counts, dtype=np.int64))
    starts = np.arange(n_rows, dtype=np.int64) * row_len
    shard = np.minimum(np.searchsorted(ends, starts, side="right"), max(len(labels) - 1, 0))
    return Counter(labels[i] for i in shard) if labels else Counter()


def build_stats(shards: list[dict], extra: dict) -> dict:
    """shards: per shard {label, uri, read, rejected, filtered, exact_duplicates, ...}."""
    files: dict[str, dict] = {}
    total = _blank()
    for s in shards:
        entry = files.setdefault(s["label"], _blank(s["uri"]))
        _add(entry, s)
        _add(total, s)
    files = {k: _finish(v) for k, v in files.items()}
    total = _finish(total)
    total.pop("uri")
    return {"files": files, "total": total, "balanced": all(v["balanced"] for v in files.values()) and total["balanced"],
            "conservation": "read = rejected + filtered + exact_duplicates + near_duplicates + kept", **extra}


def table_rows(stats: dict) -> list[dict]:
    """One row per input file plus a TOTAL row, for a Prefect table artifact."""
    def row(name: str, e: dict) -> dict:
        return {"file": name, "read": e["read"], "rejected": e["rejected_total"], "filtered": e["filtered_total"],
                "exact_dup": e["exact_duplicates"], "near_dup": e["near_duplicates"], "kept": e["kept"],
                "tokens": e["tokens"], "rows": e["rows"], "balanced": e["balanced"]}

    return [row(name, e) for name, e in stats["files"].items()] + [row("TOTAL", stats["total"])]


def stats_tables(stage_uri: str, store) -> dict:
    """The data stage's accounting (per input file and total) from its stats.json, as a UI table."""
    uri = join(stage_uri, "stats.json")
    if not store.exists(uri):
        return {}
    return {"stats": {"description": "data: read = rejected + filtered + duplicates + kept, per input file",
                      "rows": table_rows(json.loads(store.get_bytes(uri)))}}
