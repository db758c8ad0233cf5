"""The lineage schedule over simulated nights (pure: no training): nightly_overrides reads the promoted night's
`schedule` record from the state, the night's wsd schedule follows from it, and commit_night keeps the new record.
Each night's pretrain manifest is written as the stage writes it (train/stage.py _schedule_metrics), so
schedule_record reads what a real night leaves."""
from __future__ import annotations

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly import (commit_night, deep_update, load_state, lineage_note, nightly_overrides,
                                  schedule_record)
from pipeline_lib.storage import RunPaths
from pipeline_lib.storage.manifest import Manifest, write_manifest
from pipeline_lib.train.lr_schedule import Wsd
from pipeline_lib.train.stage import _schedule_metrics

PEAK, FLOOR = 8e-3, 1e-4


def _cfg(root, lr_schedule="lineage"):
    # 6 steps a night, a warm-up of 3 (the lineage's first night), the last 2 steps of a night decay
    return config_from_dict({"run": {"output_root": str(root)}, "nightly": {"lr_schedule": lr_schedule},
                             "training": {"steps": 6, "warmup_steps": 3, "decay_steps": 2, "learning_rate": PEAK,
                                          "min_lr": FLOOR}})


def _night(cfg, run_id: str, decision: str) -> tuple:
    """One night: tonight's config from the state, its schedule, the pretrain manifest it leaves, the commit."""
    state = load_state(cfg)
    files = {f"/raw/{run_id}.jsonl": 1}
    night = config_from_dict(deep_update(cfg.model_dump(mode="json"), nightly_overrides(cfg, state, files)))
    paths = RunPaths(cfg.run.output_root, run_id)
    stable = f"{paths.stage_uri('pretrain')}/checkpoint/merged/tiny_llama-stable-weights.ckpt"
    write_manifest(paths.stage_uri("pretrain"), Manifest("pretrain", run_id, "h", metrics={
        "lr_schedule": _schedule_metrics(night, 6),
        "stable_checkpoint": {"path": stable, "size": 1, "sha256": "x", "step": 4}}))
    decayed = f"{paths.stage_uri('pretrain')}/checkpoint/merged/decayed-weights.ckpt"
    commit_night(cfg, state, files, run_id, decayed, decision=decision, record=schedule_record(night, run_id))
    return night, Wsd.from_training(night.training, 6), stable, decayed


def test_three_nights_warm_up_once_continue_the_promoted_stable_weights_and_skip_a_held_night(tmp_path):
    cfg = _cfg(tmp_path)
    n1, w1, stable1, decayed1 = _night(cfg, "nightly-1", "promoted")
    assert (n1.training.lr_schedule, n1.training.lineage_steps, n1.training.stable_checkpoint) == ("wsd", 0, None)
    assert n1.training.keep_stable_weights and n1.model.base_checkpoint is None
    assert [w1.lr(s) for s in range(6)] == pytest.approx([0, PEAK / 3, 2 * PEAK / 3, PEAK, FLOOR + (PEAK - FLOOR) / 2,
                                                          FLOOR], abs=1e-15)
    latest = load_state(cfg)["latest"]
    assert latest["checkpoint"] == decayed1  # the decayed weights are handed on and judged against
    assert latest["schedule"] == {"lineage_steps": 4, "stable_checkpoint": stable1, "stable_step": 4,
                                  "decay_steps": 2, "total_steps": 6, "stable_lr": PEAK}

    # night 2 continues night 1's stable weights at lineage step 4 (warmed up: the peak from its first step), judged
    # against night 1's decayed weights; held
    n2, w2, _, _ = _night(cfg, "nightly-2", "held")
    assert (n2.training.lineage_steps, n2.training.stable_checkpoint, n2.model.base_checkpoint) == \
        (4, stable1, decayed1)
    assert [w2.lr(s) for s in range(6)] == [PEAK] * 4 + [FLOOR + (PEAK - FLOOR) / 2, FLOOR]
    state = load_state(cfg)
    assert state["latest"]["run_id"] == "nightly-1" and state["history"][-1]["schedule"]["lineage_steps"] == 8

    # night 3 starts where night 2 did (the held night does not count), from night 1's stable weights; promoted
    n3, w3, stable3, decayed3 = _night(cfg, "nightly-3", "promoted")
    assert (n3.training.lineage_steps, n3.training.stable_checkpoint) == (4, stable1)
    assert [w3.lr(s) for s in range(6)] == [w2.lr(s) for s in range(6)]
    assert load_state(cfg)["latest"]["schedule"]["lineage_steps"] == 8

    # the promoted nights' held rates join into one run's warm-up and plateau (steps 0..7 of a single run)
    one_run = Wsd(PEAK, FLOOR, 3, 100, 1)
    assert [w1.held(s) for s in range(4)] + [w3.held(s) for s in range(4)] == [one_run.lr(s) for s in range(8)]
    # night 4 continues night 3's stable weights at lineage step 8
    n4, w4, _, _ = _night(cfg, "nightly-4", "promoted")
    assert (n4.training.lineage_steps, n4.training.stable_checkpoint, n4.model.base_checkpoint) == \
        (8, stable3, decayed3)
    assert [w4.lr(s) for s in range(6)] == [PEAK] * 4 + [FLOOR + (PEAK - FLOOR) / 2, FLOOR]
    assert lineage_note(n4) == "; lineage schedule: wsd from the lineage's step 8 (warm-up 3), the last 2 of 6 steps " \
        "decay to 0.0001"


def test_per_run_nights_keep_their_own_schedule_and_record_none(tmp_path):
    cfg = _cfg(tmp_path, "per_run")
    state = {"consumed": {}, "latest": {"run_id": "n0", "checkpoint": "/c.ckpt",
                                        "schedule": {"lineage_steps": 40, "stable_checkpoint": "/s.ckpt"}}}
    changes = nightly_overrides(cfg, state, {"/raw/a.jsonl": 1})
    assert "training" not in changes and changes["model"]["base_checkpoint"] == "/c.ckpt"
    assert schedule_record(cfg, "n1") == {} and lineage_note(cfg) == ""


def test_a_held_night_promoted_by_hand_hands_on_its_schedule(tmp_path):
    from pipeline_lib.nightly import promote_held

    cfg = _cfg(tmp_path)
    _night(cfg, "nightly-1", "promoted")
    _, _, stable2, decayed2 = _night(cfg, "nightly-2", "held")
    promote_held(cfg, "nightly-2", "ops", "fine after all")
    latest = load_state(cfg)["latest"]
    assert (latest["run_id"], latest["checkpoint"], latest["schedule"]["stable_checkpoint"]) == \
        ("nightly-2", decayed2, stable2)
    assert "verdict" not in latest
    n3, _, _, _ = _night(cfg, "nightly-3", "promoted")
    assert (n3.training.lineage_steps, n3.training.stable_checkpoint) == (8, stable2)
