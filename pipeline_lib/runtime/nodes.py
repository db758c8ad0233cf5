"""One stage run spread over several nodes (a multi-node training job): which node this is, and how the
nodes' results become ONE stage manifest.

- `node_rank(cfg)`: this node's rank, from $LLM_PIPELINE_NODE_RANK (the Prefect stage flow sets it from its
  `node_rank` parameter; by hand: `LLM_PIPELINE_NODE_RANK=1 llm-pipeline run ... --stages pretrain`).
- Every node > 0 publishes its own ranks' files into the stage folder and then a node report
  `<stage>/nodes/node_<rank>.json` (its outputs and metrics, under the registry's identity of the run).
  Node 0 trains like a single node, then waits for every other node's report of the same identity
  (`wait_node_reports`), merges them into its own result (`merge_node_outputs`) and the registry writes the one
  manifest: every rank's checkpoint of every node is in it, so a consumer (model.checkpoints) sees a complete set.
Why node 0 and not the dispatching parent: the same rule then holds however the nodes were started (Prefect child
flow runs, or a command per machine), and the manifest is written where the identity is computed, the registry.
"""
from __future__ import annotations

import json
import os
import time

from ..storage import join, store_for

NODE_RANK_ENV = "LLM_PIPELINE_NODE_RANK"
REPORTS = "nodes"


class NodeReportMissing(RuntimeError):
    """Node 0 finished but another node did not report its outputs in time."""


def node_rank(cfg) -> int:
    """This node's rank from $LLM_PIPELINE_NODE_RANK (default 0); ValueError names the variable and the range."""
    text = os.environ.get(NODE_RANK_ENV, "0")
    try:
        rank = int(text)
    except ValueError:
        raise ValueError(f"${NODE_RANK_ENV}={text!r}: must be an integer node rank") from None
    if not 0 <= rank < cfg.parallel.num_nodes:
        raise ValueError(f"${NODE_RANK_ENV}={rank}: must be in [0, {cfg.parallel.num_nodes}) for parallel.devices="
                         f"{cfg.parallel.devices} at parallel.devices_per_node={cfg.parallel.devices_per_node}")
    return rank


def report_uri(stage_uri: str, rank: int) -> str:
    return join(stage_uri, REPORTS, f"node_{rank}.json")


def clear_node_report(stage_uri: str, rank: int, endpoint: str | None = None) -> None:
    """Before node `rank` trains: an earlier attempt's report must not be taken for this one's."""
    store = store_for(stage_uri, endpoint)
    uri = report_uri(stage_uri, rank)
    if store.exists(uri):
        store.delete(uri)


def write_node_report(stage_uri: str, rank: int, identity: str, outputs: list[dict], metrics: dict,
                      endpoint: str | None = None) -> str:
    """Node `rank`'s outputs (paths relative to the stage folder) and metrics; written after its files."""
    uri = report_uri(stage_uri, rank)
    body = {"node_rank": rank, "identity": identity, "outputs": outputs, "metrics": metrics}
    store_for(stage_uri, endpoint).put_bytes(uri, json.dumps(body, indent=2, default=str).encode())
    return uri


def wait_node_reports(stage_uri: str, ranks: list[int], identity: str, timeout_s: float,
                      endpoint: str | None = None, log=print, poll_s: float = 1.0) -> dict[int, dict]:
    """The reports of nodes `ranks` for this `identity`, waiting up to `timeout_s` (the nodes leave training
    together; what is left is their publishing). Raises NodeReportMissing naming the nodes still missing."""
    store = store_for(stage_uri, endpoint)
    found: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        for rank in ranks:
            uri = report_uri(stage_uri, rank)
            if rank not in found and store.exists(uri):
                report = json.loads(store.get_bytes(uri))
                if report.get("identity") == identity:
                    found[rank] = report
        missing = [r for r in ranks if r not in found]
        if not missing:
            return found
        if time.monotonic() >= deadline:
            raise NodeReportMissing(
                f"node rank(s) {missing} did not report their outputs at {report_uri(stage_uri, missing[0])} within "
                f"{timeout_s:g}s after node 0 finished (training.timeout_seconds): see those nodes' logs. Fix: rerun "
                "the stage with the same run id; finished nodes resume from their last checkpoint")
        if not said:
            log(f"waiting for node rank(s) {missing} to publish their outputs")
            said = True
        time.sleep(poll_s)


NODE_SUMMARY = ("node_rank", "ranks", "seconds", "step_time_ms", "tokens_per_s", "final_loss", "steps")


def merge_node_outputs(outputs: list[dict], metrics: dict, reports: dict[int, dict]) -> tuple[list[dict], dict]:
    """Node 0's outputs and metrics with every other node's: their files, their ranks' checkpoints (the
    `checkpoints` map and `checkpoint_layout.ranks` / `.strategy` of the training stages) and a per-node
    summary under `nodes`."""
    by_path = {o["path"]: o for o in outputs}
    metrics = json.loads(json.dumps(metrics, default=str))
    nodes = {"0": {k: metrics.get(k) for k in NODE_SUMMARY if k in metrics}}
    for rank, report in sorted(reports.items()):
        for o in report["outputs"]:
            by_path.setdefault(o["path"], o)
        theirs = report["metrics"]
        if isinstance(theirs.get("checkpoints"), dict):
            metrics.setdefault("checkpoints", {}).update(theirs["checkpoints"])
        layout, their_layout = metrics.get("checkpoint_layout"), theirs.get("checkpoint_layout")
        if isinstance(layout, dict) and isinstance(their_layout, dict):
            layout["ranks"] = dict(sorted({**layout.get("ranks", {}), **their_layout.get("ranks", {})}.items(),
                                          key=lambda kv: int(kv[0])))
            known = {s["path"] for s in layout.get("strategy", [])}
            layout["strategy"] = layout.get("strategy", []) + [s for s in their_layout.get("strategy", [])
                                                                if s["path"] not in known]
        nodes[str(rank)] = {k: theirs.get(k) for k in NODE_SUMMARY if k in theirs}
    metrics["nodes"] = nodes
    return sorted(by_path.values(), key=lambda o: o["path"]), metrics
