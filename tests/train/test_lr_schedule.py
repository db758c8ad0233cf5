"""The learning-rate schedules: wsd's value at each step (known answers worked by hand), and the yaml's lr_schedule for
cosine and wsd (with the stable-weights callback)."""
from __future__ import annotations

import math

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.train.lr_schedule import Wsd
from pipeline_lib.train.mindformers_yaml import build_run_config, stable_weights_path


def test_wsd_linear_known_answers():
    # peak 1e-3, floor 1e-4, 4 warm-up steps, 10 steps, the last 2 decay: warm-up 0, 1/4, 2/4, 3/4 of the peak; held;
    # decay k=1: 1e-4 + 9e-4 x (1 - 1/2) = 5.5e-4, k=2: the floor
    w = Wsd(1e-3, 1e-4, warmup_steps=4, total_steps=10, decay_steps=2)
    want = [0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 5.5e-4, 1e-4]
    assert [w.lr(s) for s in range(10)] == pytest.approx(want, abs=1e-12)
    assert w.stable_step == 8 and w.held(9) == pytest.approx(1e-3)


def test_wsd_cosine_decay_known_answers():
    # 3 decay steps of a half cosine: f(1/3) = (1 + cos(pi/3)) / 2 = 0.75, f(2/3) = 0.25, f(1) = 0
    w = Wsd(2e-3, 0.0, warmup_steps=0, total_steps=5, decay_steps=3, shape="cosine")
    assert [w.lr(s) for s in range(5)] == pytest.approx([2e-3, 2e-3, 1.5e-3, 0.5e-3, 0.0], abs=1e-12)


def test_wsd_continues_a_lineage_warm_up_and_decays_from_the_rate_reached():
    # the lineage did 3 of 8 warm-up steps: this run warms on from 3/8; its decay starts at step 4 (lineage step 7),
    # from 7/8 of the peak to the floor
    w = Wsd(8e-3, 1e-3, warmup_steps=8, total_steps=6, decay_steps=2, lineage_steps=3)
    assert [w.lr(s) for s in range(6)] == pytest.approx([3e-3, 4e-3, 5e-3, 6e-3, 4e-3, 1e-3], abs=1e-12)
    # held rates of a lineage joined night by night equal one long run's: night 2 starts at lineage step 3 + 4
    one_run = Wsd(8e-3, 1e-3, warmup_steps=8, total_steps=100, decay_steps=1)
    night2 = Wsd(8e-3, 1e-3, warmup_steps=8, total_steps=6, decay_steps=2, lineage_steps=3 + w.stable_step)
    assert [night2.held(s) for s in range(4)] == [one_run.lr(3 + 4 + s) for s in range(4)]


def test_wsd_arguments_are_checked():
    with pytest.raises(ValueError, match="decay_steps=0"):
        Wsd(1e-3, 0, 1, 10, 0)
    with pytest.raises(ValueError, match="shape='square'"):
        Wsd(1e-3, 0, 1, 10, 2, shape="square")


def _cfg(**training):
    return config_from_dict({"run": {"device_target": "CPU"}, "training": {"steps": 30, "learning_rate": 2e-3,
                             "warmup_steps": 4, "min_lr": 1e-5, **training}})


def _run(cfg, out="/tmp/out"):
    return build_run_config(cfg, stage="pretrain", dataset_dir="/tmp/none", output_dir=out, train_rows=400)


def test_cosine_yaml_is_mindformers_cosine_and_keeps_no_stable_weights():
    run = _run(_cfg())
    assert run["lr_schedule"] == {"type": "CosineWithWarmUpLR", "learning_rate": 2e-3, "lr_end": 1e-5,
                                  "warmup_steps": 4, "total_steps": 30}
    assert "SaveWeightsAtStep" not in [c["type"] for c in run["callbacks"]]


def test_wsd_yaml_names_our_class_and_the_stable_weights_callback(tmp_path):
    cfg = _cfg(lr_schedule="wsd", decay_fraction=0.1, decay_shape="cosine", lineage_steps=2, keep_stable_weights=True)
    run = _run(cfg, str(tmp_path))
    assert run["lr_schedule"] == {"type": "LineageWSDLR", "learning_rate": 2e-3, "lr_end": 1e-5, "warmup_steps": 4,
                                  "total_steps": 30, "decay_steps": 3, "lineage_steps": 2, "decay_shape": "cosine"}
    saver = next(c for c in run["callbacks"] if c["type"] == "SaveWeightsAtStep")
    assert saver == {"type": "SaveWeightsAtStep", "step": 27,
                     "path": str(tmp_path / "checkpoint" / "merged" / "tiny_llama-stable-weights.ckpt")}
    assert saver["path"] == str(stable_weights_path(cfg, tmp_path))
    # SFT keeps its own cosine
    sft = build_run_config(cfg, stage="sft", dataset_dir="/tmp/none", output_dir=str(tmp_path), train_rows=400,
                           load_checkpoint="/tmp/base.ckpt")
    assert sft["lr_schedule"]["type"] == "CosineWithWarmUpLR"


def test_wsd_decay_steps_wins_over_the_fraction_and_the_header_names_the_module(tmp_path):
    from pipeline_lib.train.mindformers_yaml import write_run_yaml

    cfg = _cfg(lr_schedule="wsd", decay_steps=5)
    run = _run(cfg, str(tmp_path))
    assert run["lr_schedule"]["decay_steps"] == 5 and run["lr_schedule"]["decay_shape"] == "linear"
    text = write_run_yaml(cfg, tmp_path / "run.yaml", run, stage="pretrain").read_text()
    assert "LineageWSDLR" in text.split("\n# Names ")[1].split("\n")[0] and "pipeline_lib.train.mf_lr" in text
    assert math.isclose(Wsd.from_training(cfg.training, 30).lr(29), 1e-5)
