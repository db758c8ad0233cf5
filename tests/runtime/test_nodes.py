"""runtime/nodes.py and the registry's multi-node rule: node ranks > 0 report, node 0 writes the one manifest.

The registry test runs a real stage function through `stages.run_stage` twice in this process, node 1 then node 0
($LLM_PIPELINE_NODE_RANK), on a real local run store: node 0 only waits for node 1's report, so the order is safe.
"""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from pipeline_lib import stages
from pipeline_lib.runtime.contract import StageOutput
from pipeline_lib.runtime.nodes import (NODE_RANK_ENV, NodeReportMissing, merge_node_outputs, report_uri,
                                        wait_node_reports, write_node_report)
from pipeline_lib.storage import RunPaths, read_manifest


def _layout(rank: int) -> dict:
    path = f"checkpoint/rank_{rank}/llama_rank_{rank}-6_1.ckpt"
    return {"checkpoints": {str(rank): path},
            "checkpoint_layout": {"world_size": 2, "ranks": {str(rank): {"path": path, "size": 10, "sha256": "x"}},
                                  "strategy": []},
            "node_rank": rank, "ranks": [rank], "seconds": 1.0 + rank}


def test_merge_lists_every_nodes_files_and_checkpoints():
    own = [{"path": "run.yaml", "size": 1, "sha256": "a"},
           {"path": "checkpoint/rank_0/c.ckpt", "size": 2, "sha256": "b"}]
    report = {"outputs": [{"path": "checkpoint/rank_1/c.ckpt", "size": 2, "sha256": "c"}], "metrics": _layout(1)}
    outputs, metrics = merge_node_outputs(own, _layout(0), {1: report})
    assert [o["path"] for o in outputs] == ["checkpoint/rank_0/c.ckpt", "checkpoint/rank_1/c.ckpt", "run.yaml"]
    assert sorted(metrics["checkpoints"]) == ["0", "1"]
    assert list(metrics["checkpoint_layout"]["ranks"]) == ["0", "1"]
    assert metrics["nodes"]["1"]["ranks"] == [1] and metrics["nodes"]["0"]["seconds"] == 1.0


def test_a_report_of_another_run_is_not_taken_and_the_wait_names_the_missing_node(tmp_path):
    stage_uri = str(tmp_path / "pretrain")
    write_node_report(stage_uri, 1, "identity-of-yesterday", [], {})
    with pytest.raises(NodeReportMissing, match=r"node rank\(s\) \[1\] did not report .*nodes/node_1.json"):
        wait_node_reports(stage_uri, [1], "identity-of-today", timeout_s=0.3, poll_s=0.05)
    write_node_report(stage_uri, 1, "identity-of-today", [], {"x": 1})
    assert wait_node_reports(stage_uri, [1], "identity-of-today", timeout_s=0.3)[1]["metrics"] == {"x": 1}


def run_two_rank_double(run, **_):
    """A multi-node stage double: each node writes its own rank file into the stage folder (as pretrain publishes)."""
    rel = f"checkpoint/rank_{run.node_rank}/w.ckpt"
    path = os.path.join(run.uri, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b"w" * (run.node_rank + 1))
    size = run.node_rank + 1
    return StageOutput([{"path": rel, "size": size, "sha256": str(run.node_rank)}],
                       {"checkpoints": {str(run.node_rank): rel}, "node_rank": run.node_rank})


def test_node_ranks_report_and_node_0_writes_one_manifest_listing_both(tiny_two_node, monkeypatch):
    cfg, paths = tiny_two_node
    monkeypatch.setitem(stages.SPECS, "pretrain", dataclasses.replace(
        stages.SPECS["pretrain"], runner="test_nodes:run_two_rank_double", upstream=()))
    monkeypatch.setattr(stages, "stage_inputs", lambda paths, stage: {})
    monkeypatch.setenv(NODE_RANK_ENV, "1")
    stages.run_stage(cfg, paths, "pretrain", log=lambda line: None)
    uri = paths.stage_uri("pretrain")
    assert read_manifest(uri) is None  # node 1 never writes the stage's manifest
    assert json.loads(open(report_uri(uri, 1)).read())["outputs"][0]["path"] == "checkpoint/rank_1/w.ckpt"

    monkeypatch.setenv(NODE_RANK_ENV, "0")
    manifest, skipped = stages.run_stage(cfg, paths, "pretrain", log=lambda line: None)
    assert not skipped
    on_disk = read_manifest(uri)
    assert [o["path"] for o in on_disk.outputs] == ["checkpoint/rank_0/w.ckpt", "checkpoint/rank_1/w.ckpt"]
    assert on_disk.metrics["checkpoints"] == {"0": "checkpoint/rank_0/w.ckpt", "1": "checkpoint/rank_1/w.ckpt"}
    assert sorted(on_disk.metrics["nodes"]) == ["0", "1"]
    # done for both nodes now: a rerun of either skips
    monkeypatch.setenv(NODE_RANK_ENV, "1")
    assert stages.run_stage(cfg, paths, "pretrain", log=lambda line: None)[1] is True


@pytest.fixture
def tiny_two_node(tmp_path, monkeypatch):
    from pipeline_lib.config import load_config

    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [
        f"run.output_root={tmp_path / 'runs'}", "parallel.devices=2", "parallel.data_parallel=2",
        "parallel.devices_per_node=1", "training.micro_batch_size=2", "training.timeout_seconds=5"])
    assert cfg.parallel.num_nodes == 2
    return cfg, RunPaths(cfg.run.output_root, "two-node")


def test_node_ranks_above_0_train_outside_the_shared_stage_folder(tmp_path, monkeypatch):
    from pipeline_lib.train.session import WORK_DIR_ENV, work_dir

    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "work"))
    stage = str(tmp_path / "runs" / "r" / "pretrain")
    assert work_dir(stage) == (tmp_path / "runs" / "r" / "pretrain").resolve()
    node1 = work_dir(stage, 1)
    assert node1.parent == (tmp_path / "work").resolve() and node1.name.endswith("-node1")
    assert work_dir("s3://b/r/pretrain", 1) != work_dir("s3://b/r/pretrain", 0)
