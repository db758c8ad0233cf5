"""flows/stage_flows.py: the node rank a stage flow hands to the launcher ($LLM_PIPELINE_NODE_RANK)."""
import os

import pytest

import flows.stage_flows as stage_flows
from pipeline_lib.runtime.nodes import NODE_RANK_ENV


@pytest.fixture
def seen(monkeypatch):
    """Replace the stage task by a probe of the environment it would run in."""
    env = {}
    monkeypatch.setattr(stage_flows, "submit_stage",
                        lambda cfg, run_id, stage: env.update(rank=os.environ.get(NODE_RANK_ENV)))
    return env


def test_a_node_started_by_hand_keeps_its_own_node_rank(seen, monkeypatch, tiny_cfg):
    monkeypatch.setenv(NODE_RANK_ENV, "1")
    stage_flows.stage_flow("pretrain").fn(config=tiny_cfg.model_dump(mode="json"), run_id="r")
    assert seen["rank"] == "1"


def test_dispatch_sets_the_node_rank_of_its_child(seen, monkeypatch, tiny_cfg):
    monkeypatch.setenv(NODE_RANK_ENV, "0")
    stage_flows.stage_flow("pretrain").fn(config=tiny_cfg.model_dump(mode="json"), run_id="r", node_rank=1)
    assert seen["rank"] == "1"
