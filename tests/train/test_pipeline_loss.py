"""Loss under pipeline parallel: the real PipelineMetrics / LossGuard callbacks fed per-rank step outputs of a
pp2 x mp2 run (4 ranks; on CPU no pipeline runs, so each rank's callback is driven with that rank's outputs).
Only the last stage holds the loss, summed over the micro batches (mindformers 1.9 MFLossMonitor)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline_lib.train.metrics import LossRule, read_metrics
from pipeline_lib.train.preflight import evaluate_preflight

MICRO = 4  # training.gradient_accumulation_steps under pp becomes micro_batch_num
RULE = LossRule(pipeline_stages=2, micro_batch_num=MICRO)


class _Params(dict):
    __getattr__ = dict.get


class _Ctx:
    def __init__(self, params):
        self.params = params

    def original_args(self):
        return self.params


def _drive(cb, monkeypatch, rank: int, losses: list[float]):
    from pipeline_lib.train import callbacks

    monkeypatch.setattr(callbacks, "rank_and_size", lambda: (rank, 4))
    params = _Params(list_callback=[], cur_epoch_num=1, batch_num=len(losses), cur_step_num=0)
    cb.on_train_begin(_Ctx(params))
    for step, loss in enumerate(losses, 1):
        params.update(cur_step_num=step, net_outputs=(np.float32(loss), False, np.float32(1.0)))
        cb.on_train_step_begin(_Ctx(params))
        cb.on_train_step_end(_Ctx(params))
    if hasattr(cb, "on_train_end"):
        cb.on_train_end(_Ctx(params))


def test_rule_matches_mindformers():
    assert RULE.loss_rank(4) == 2 and LossRule().loss_rank(4) == 0 and LossRule(pipeline_stages=4).loss_rank(8) == 6
    assert RULE.normalise(10.0) == 2.5
    assert LossRule(pipeline_stages=2, micro_batch_num=4, calculate_per_token_loss=True).normalise(10.0) == 10.0
    assert LossRule(gradient_accumulation_steps=2, micro_batch_interleave_num=2).normalise(8.0) == 2.0
    run = {"parallel_config": {"pipeline_stage": 2, "micro_batch_num": 4}, "runner_config":
           {"gradient_accumulation_steps": 1}, "micro_batch_interleave_num": 1}
    assert LossRule.from_run_yaml(run) == RULE


def test_recorded_loss_is_the_last_stages_normalised(tmp_path, monkeypatch):
    from pipeline_lib.train.callbacks import PipelineMetrics

    last_stage = [MICRO * x for x in (2.5, 2.4, 2.2, 2.0)]  # summed over the 4 micro batches
    first_stage = [0.0, 0.0, 0.0, 0.0]                      # no loss before the last stage
    for rank, losses in ((0, first_stage), (1, first_stage), (2, last_stage), (3, last_stage)):
        _drive(PipelineMetrics(str(tmp_path), tokens_per_step=64, loss_rule=RULE.to_json()), monkeypatch, rank, losses)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["rank"] for r in records] == [2, 2, 2, 2]
    assert [r["loss"] for r in records] == pytest.approx([2.5, 2.4, 2.2, 2.0])
    assert [r["loss_raw"] for r in records] == pytest.approx(last_stage)
    verdict = evaluate_preflight(records, expected_steps=4)  # the preflight verdict reads the same records
    assert verdict.summary.loss_first == pytest.approx(2.5) and verdict.summary.loss_falling


def test_guard_judges_the_last_stage_only(tmp_path, monkeypatch):
    from pipeline_lib.train.callbacks import LossGuard, LossGuardError
    from pipeline_lib.train.metrics import read_guard_diagnoses

    rule = RULE.to_json()
    _drive(LossGuard(str(tmp_path), window=2, loss_rule=rule), monkeypatch, 0, [0.0, math.nan, 0.0])  # stage 0
    with pytest.raises(LossGuardError, match="step 3 on rank 3"):
        _drive(LossGuard(str(tmp_path), window=2, loss_rule=rule), monkeypatch, 3, [8.0, 8.0, math.nan])
    diag = read_guard_diagnoses(tmp_path)
    assert [d["rank"] for d in diag] == [3]
    _drive(LossGuard(str(tmp_path / "b"), window=2, spike_factor=2, loss_rule=rule), monkeypatch, 2, [8.0, 8.4, 8.0])
    with pytest.raises(LossGuardError) as err:
        _drive(LossGuard(str(tmp_path / "c"), window=2, spike_factor=2, loss_rule=rule), monkeypatch, 2,
               [8.0, 8.0, 40.0])
    assert "loss 10.0000" in str(err.value)  # the diagnosis names the normalised loss
