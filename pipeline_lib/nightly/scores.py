"""What a night's evaluate stage scored per row and per item: the evidence the gate pairs.

`night_scores(cfg, run_id)` reads, for every checkpoint of the night's evaluate stage (its `metrics.json` names each
label's folder), `<dir>/perplexity_rows.json` (per row of each perplexity set: NLL sum and scored tokens) and
`<dir>/tasks.jsonl` (per task item: correct or not), and returns

    {label: {"perplexity": {metric: {"nll": [...], "tokens": [...]}}, "tasks": {task: {item key: correct}}}}

with the gate's metric names (`held-out perplexity`, `<set> perplexity`). Items are keyed by their id and, when an
id repeats within a task, its occurrence (so a task without unique ids still pairs by position). A checkpoint whose
files are missing (an evaluate run of an earlier version) has no entry: the gate then says the metric had no paired
scores. Plain Python: no Prefect, no MindSpore.
"""
from __future__ import annotations

import json

from ..evaluate.perplexity import ROWS_FILE
from ..storage import RunPaths, join, store_for


def heldout_metric() -> str:
    return "held-out perplexity"


def set_metric(name: str) -> str:
    return f"{name} perplexity"


def task_metric(task: str) -> str:
    return f"{task} accuracy"


def perplexity_rows(doc: dict) -> dict:
    """The gate's metric name -> {"nll", "tokens"} of one perplexity_rows.json."""
    out = {}
    if doc.get("heldout"):
        out[heldout_metric()] = doc["heldout"]
    for name, rows in (doc.get("reference") or {}).items():
        out[set_metric(name)] = rows
    return out


def task_items(records: list[dict]) -> dict[str, dict]:
    """task -> item key -> correct, from tasks.jsonl records."""
    out: dict[str, dict] = {}
    for rec in records:
        items = out.setdefault(rec["task"], {})
        key, n = str(rec.get("id")), 0
        while (key, n) in items:
            n += 1
        items[(key, n)] = bool(rec["correct"])
    return out


def night_scores(cfg, run_id: str) -> dict[str, dict]:
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    stage = paths.stage_uri("evaluate")
    store = store_for(stage, cfg.run.s3_endpoint_url)
    summary_uri = join(stage, "metrics.json")
    if not store.exists(summary_uri):
        return {}
    out: dict[str, dict] = {}
    for ck in json.loads(store.get_bytes(summary_uri)).get("checkpoints", []):
        entry: dict = {"perplexity": {}, "tasks": {}}
        rows_uri, tasks_uri = join(stage, ck["dir"], ROWS_FILE), join(stage, ck["dir"], "tasks.jsonl")
        if store.exists(rows_uri):
            entry["perplexity"] = perplexity_rows(json.loads(store.get_bytes(rows_uri)))
        if store.exists(tasks_uri):
            entry["tasks"] = task_items([json.loads(line) for line in
                                         store.get_bytes(tasks_uri).decode("utf-8").splitlines() if line.strip()])
        out[ck["label"]] = entry
    return out
