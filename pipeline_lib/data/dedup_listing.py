"""`dedup-index list`'s figures: the documents a lineage's index holds, each counted once.

A run that reads an earlier run's input files again (the rerun rule, dedup_index.is_rerun_of) is not deduplicated
against that run: its segment holds that run's documents a second time (`make demo` twice: 2 x 420 entries, 420
documents). So the documents are the entries of every segment no later segment rereads.
"""
from __future__ import annotations

from .dedup_index import is_rerun_of


def reread_by(segments: list[dict]) -> dict[str, str]:
    """{run id: the later run that reread its input files} over segments in commit order."""
    out = {}
    for i, meta in enumerate(segments):
        for later in segments[i + 1:]:
            if is_rerun_of(meta, later.get("inputs")):
                out[meta["run_id"]] = later["run_id"]
                break
    return out


def distinct_documents(segments: list[dict]) -> int:
    """The documents of the index, a document that later runs reread counted once."""
    again = reread_by(segments)
    return sum(m["docs"] for m in segments if m["run_id"] not in again)


def summary_line(segments: list[dict]) -> str:
    entries = sum(m["docs"] for m in segments)
    documents = distinct_documents(segments)
    if documents == entries:
        return f"{len(segments)} run(s), {documents} documents"
    return (f"{len(segments)} run(s), {documents} documents ({entries} entries: a run that reread an earlier run's "
            "input files holds that run's documents again)")
