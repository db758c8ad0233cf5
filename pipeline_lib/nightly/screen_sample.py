"""The lineage's accepted documents the screen measures tonight against: a sample of each promoted night's.

`keep_accepted(cfg, run_id)` writes <output_root>/_nightly/screen/accepted/<run_id>.jsonl once the night is
promoted: up to nightly.screen.sample_per_night of the documents its data stage kept (cleaned/part-*.jsonl.gz), its
held-out split first (documents the model never trained on: the screen's calibration set), then train-split ones
(what the character n-gram model is built from), each group in the order of a hash of its text (a fixed sample,
whatever the number of shards). `lineage_sample(cfg, state)` reads the samples of the promoted nights, newest first,
at most nightly.screen.max_reference_documents, catching up a promoted night without one (promoted by hand, or a
night before this version) while its data stage folder is still there.
"""
from __future__ import annotations

import gzip
import hashlib
import json

from ..storage import RunPaths, join, store_for
from .state import promoted_nights


def sample_uri(cfg, run_id: str) -> str:
    return join(cfg.run.output_root, "_nightly", "screen", "accepted", f"{run_id}.jsonl")


def _rank(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def accepted_documents(cfg, run_id: str) -> list[dict] | None:
    """{text, split} of every document the night's data stage kept; None when its cleaned parts are gone."""
    endpoint = cfg.run.s3_endpoint_url
    folder = join(RunPaths(cfg.run.output_root, run_id, endpoint).stage_uri("data"), "cleaned")
    store = store_for(folder, endpoint)
    parts = [u for u in store.list(folder) if u.endswith(".jsonl.gz")] if store.exists(folder) or store.remote else []
    if not parts:
        return None
    out = []
    for uri in parts:
        for line in gzip.decompress(store.get_bytes(uri)).decode("utf-8").splitlines():
            rec = json.loads(line)
            out.append({"text": rec["text"], "split": rec.get("split", "train")})
    return out


def choose_sample(docs: list[dict], n: int) -> list[dict]:
    """Held-out documents first, then train-split ones, each by the hash of its text; at most n."""
    held = sorted((d for d in docs if d["split"] == "heldout"), key=lambda d: _rank(d["text"]))
    train = sorted((d for d in docs if d["split"] != "heldout"), key=lambda d: _rank(d["text"]))
    return (held + train)[:n]


def keep_accepted(cfg, run_id: str) -> int:
    """Keep the promoted night's sample (see the module docstring); returns the documents kept (0: nothing to keep)."""
    docs = accepted_documents(cfg, run_id)
    if not docs:
        return 0
    sample = choose_sample(docs, cfg.nightly.screen.sample_per_night)
    uri = sample_uri(cfg, run_id)
    store_for(uri, cfg.run.s3_endpoint_url).put_bytes(uri, "".join(
        json.dumps({**d, "run_id": run_id}, ensure_ascii=False) + "\n" for d in sample).encode("utf-8"))
    return len(sample)


def lineage_sample(cfg, state: dict) -> list[dict]:
    """The kept documents of the promoted nights, newest night first, at most max_reference_documents."""
    endpoint, cap = cfg.run.s3_endpoint_url, cfg.nightly.screen.max_reference_documents
    out: list[dict] = []
    for run_id in reversed(promoted_nights(state)):
        uri = sample_uri(cfg, run_id)
        store = store_for(uri, endpoint)
        if not store.exists(uri) and not keep_accepted(cfg, run_id):
            continue
        out += [json.loads(line) for line in store.get_bytes(uri).decode("utf-8").splitlines() if line.strip()]
        if len(out) >= cap:
            break
    return out[:cap]
