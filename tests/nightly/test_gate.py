"""pipeline_lib.nightly.gate.judge on constructed cases with known answers: evaluate metrics as the evaluate stage
writes them (report.summary_rows) and the per-row / per-item scores it writes beside them (scores.night_scores).
The flow around it: tests/flows/test_nightly_gate.py."""
from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly import paired
from pipeline_lib.nightly.gate import judge
from pipeline_lib.nightly.scores import night_scores
from pipeline_lib.storage import RunPaths

CFG = config_from_dict({"nightly": {"gate": {"max_task_drop": 0.02, "max_perplexity_increase": 0.05}}})


def _answers(n: int, promoted_right: int, losses: int, gains: int) -> tuple[list[bool], list[bool]]:
    """Per item (promoted correct, candidate correct): `losses` items only the promoted model gets right, `gains`
    only the candidate, the rest of the promoted model's right answers both."""
    assert losses <= promoted_right and gains <= n - promoted_right
    prom = [i < promoted_right for i in range(n)]
    cand = [(i < promoted_right and i >= losses) or (promoted_right <= i < promoted_right + gains) for i in range(n)]
    return prom, cand


def _task_night(n: int, promoted_right: int, losses: int, gains: int, chance: float | None = 0.25,
                paired_items: bool = True, cfg=CFG):
    prom, cand = _answers(n, promoted_right, losses, gains)

    def row(label, answers):
        return {"checkpoint": label, "tasks": {"qa": sum(answers) / n}, "task_items": {"qa": n},
                "task_chance": {"qa": chance} if chance is not None else {}}
    metrics = {"checkpoints": [row("base", prom), row("pretrained", cand)]}
    scores = {label: {"tasks": {"qa": {(f"q{i}", 0): a for i, a in enumerate(answers)}}}
              for label, answers in (("base", prom), ("pretrained", cand))} if paired_items else None
    return judge(cfg, metrics, scores)


@pytest.mark.parametrize("n, right, losses, gains, outcome", [
    (20, 12, 6, 0, "hold"),          # 0.60 -> 0.30: six answers lost, none gained (the old gate let it pass)
    (20, 12, 1, 0, "investigate"),   # 0.60 -> 0.55: one answer of 20, over the 0.02 budget but noise
    (16, 12, 4, 0, "hold"),          # 0.75 -> 0.50 on 16 items (the old gate let it pass)
    (16, 12, 4, 1, "investigate"),   # 0.75 -> 0.5625: 4 lost, 1 gained is within noise at n=16
    (1000, 600, 40, 10, "hold"),     # 0.60 -> 0.57: a 0.03 drop, 40 of 50 changed items lost
    (1000, 600, 330, 300, "investigate"),  # 0.60 -> 0.57 too, but 630 items changed both ways: noise
    (1000, 600, 10, 0, "promote"),   # 0.01: beyond noise but within the 0.02 budget
    (20, 12, 0, 2, "promote"),       # better
])
def test_a_task_regresses_only_when_the_paired_drop_is_over_budget_and_beyond_noise(n, right, losses, gains, outcome):
    verdict = _task_night(n, right, losses, gains)
    row = verdict.rows[0]
    assert verdict.outcome == outcome, row
    assert row["change"] == pytest.approx((gains - losses) / n) and (row["losses"], row["gains"]) == (losses, gains)
    assert row["informative"] and row["items"] == n
    low, high = row["interval"]
    assert low <= row["change"] <= high
    assert verdict.regressed == (outcome == "hold") and row["ok"] == (outcome == "promote")
    if outcome != "promote":
        assert ("beyond noise" if outcome == "hold" else "within noise") in row["reason"]


def test_mcnemar_mid_p_known_values():
    # one-sided mid-p: P(X > b) + P(X = b)/2 for X ~ Binomial(b + c, 1/2)
    assert paired.mcnemar_worse(6, 0) == pytest.approx(0.5 ** 6 / 2)
    assert paired.mcnemar_worse(1, 0) == pytest.approx(0.25)
    assert paired.mcnemar_worse(4, 1) == pytest.approx((1 + 5 / 2) / 32)
    assert paired.mcnemar_worse(0, 0) == 1.0
    assert paired.mcnemar_worse(330, 300) == pytest.approx(0.1162, abs=2e-3)  # the normal approximation's z=1.19
    assert paired.above_chance(5, 20, 0.25) == pytest.approx(0.484, abs=1e-3)


def test_a_task_at_chance_is_uninformative_and_does_not_decide():
    verdict = _task_night(20, 6, 6, 0)  # the promoted model's 0.30 on 4-way items is chance: a drop means nothing
    row = verdict.rows[0]
    assert not row["informative"] and row["outcome"] == "uninformative" and "at chance" in row["reason"]
    assert not verdict.regressed and verdict.outcome == "investigate" and "no informative metric" in verdict.reason


def test_without_per_item_answers_an_over_budget_drop_is_ambiguous_not_held():
    verdict = _task_night(20, 12, 6, 0, paired_items=False)
    assert verdict.outcome == "investigate" and "no per-item answers" in verdict.rows[0]["reason"]


def _ppl_night(sets: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], vocab: int | None = 2000, cfg=CFG):
    """sets: name -> (promoted NLL per row, candidate NLL per row, tokens per row)."""
    def ppl(nll, tok):
        return math.exp(nll.sum() / tok.sum())

    def row(label, which):
        return {"checkpoint": label, "reference": {name: ppl(v[which], v[2]) for name, v in sets.items()}}
    metrics = {"checkpoints": [row("base", 0), row("pretrained", 1)], "tokenizer_vocab_size": vocab}
    scores = {label: {"perplexity": {f"{name} perplexity": {"nll": list(v[which]), "tokens": list(v[2])}
                                     for name, v in sets.items()}}
              for label, which in (("base", 0), ("pretrained", 1))}
    return judge(cfg, metrics, scores)


def _rows(n: int, ratio: float, noise: float, seed: int = 3, base_ppl: float = 200.0):
    """n rows of 40-64 tokens at per-token NLL log(base_ppl) (+/- row difficulty); the candidate's per-token NLL is
    the promoted one's + log(ratio) + a zero-mean row noise of sd `noise` (nats per token)."""
    rng = np.random.default_rng(seed)
    tok = rng.integers(40, 65, n).astype(float)
    prom = (math.log(base_ppl) + rng.normal(0, 0.3, n)) * tok
    shift = rng.normal(0, noise, n)
    shift -= (shift * tok).sum() / tok.sum()  # zero-mean per token: the ratio on all rows is exactly `ratio`
    cand = prom + (math.log(ratio) + shift) * tok
    return prom, cand, tok


@pytest.mark.parametrize("n", [20, 1000])
def test_perplexity_all_rows_ten_percent_worse_holds_and_noise_promotes(n):
    worse = _ppl_night({"domain": _rows(n, 1.10, 0.01)})
    row = worse.rows[0]
    assert worse.outcome == "hold" and row["outcome"] == "regressed", row
    assert row["change"] == pytest.approx(0.10, abs=0.01) and row["interval"][0] > 0.05
    same = _ppl_night({"domain": _rows(n, 1.0, 0.02)})
    row = same.rows[0]
    assert same.outcome == "promote" and row["outcome"] == "within", row
    assert row["interval"][0] < 0 < row["interval"][1] and row["informative"]


def test_perplexity_over_budget_at_the_point_but_not_at_the_bound_is_ambiguous():
    prom, _, tok = _rows(20, 1.0, 0.0)
    swing = np.where(np.arange(20) % 2 == 0, 0.09, -0.09)  # +/-0.09 nats a token around +8%
    verdict = _ppl_night({"domain": (prom, prom + (math.log(1.08) + swing) * tok, tok)})
    row = verdict.rows[0]
    low, high = row["interval"]
    assert row["change"] > 0.05 and low < 0.05 and (high - low) / 2 <= 0.05, row
    assert row["outcome"] == "ambiguous" and verdict.outcome == "investigate" and not verdict.regressed
    assert "lower bound" in row["reason"]


def test_a_set_near_the_uniform_perplexity_is_uninformative_and_does_not_decide():
    verdict = _ppl_night({"general_zh": _rows(1000, 1.12, 0.01, base_ppl=1900),  # +12% on a set at ~1,900 of 2,000
                          "domain": _rows(1000, 0.8, 0.01)})
    near, domain = verdict.rows
    assert near["promoted"] > 1600 and near["change"] > 0.1 and near["interval"][0] > 0.05
    assert not near["informative"] and near["outcome"] == "uninformative" and "uniform 2,000" in near["reason"]
    assert near["ok"] and domain["outcome"] == "within"
    assert verdict.outcome == "promote" and "uninformative, not deciding: general_zh perplexity" in \
        verdict.message("night")
    # the same set with a vocabulary it is far from decides
    assert _ppl_night({"general_zh": _rows(1000, 1.12, 0.01, base_ppl=1900)}, vocab=32000).outcome == "hold"


def test_a_very_noisy_set_is_uninformative_by_the_width_of_its_interval():
    verdict = _ppl_night({"noisy": _rows(20, 1.2, 0.6), "domain": _rows(1000, 1.0, 0.01)})
    noisy = verdict.rows[0]
    low, high = noisy["interval"]
    assert (high - low) / 2 > 0.05 and noisy["outcome"] == "uninformative" and "reaches further" in noisy["reason"]
    assert verdict.outcome == "promote"  # neither holds the night (+20% at the point) nor excuses it


def test_the_bootstrap_is_seeded_and_fast_at_1000_rows():
    prom, cand, tok = _rows(1000, 1.03, 0.05)
    paired.perplexity_ratio(cand, prom, tok, samples=50)  # warm numpy up
    t0 = time.perf_counter()
    first = paired.perplexity_ratio(cand, prom, tok, 0.95, 2000, seed=7)
    seconds = time.perf_counter() - t0
    assert first == paired.perplexity_ratio(cand, prom, tok, 0.95, 2000, seed=7)
    assert first.point == pytest.approx(1.03, rel=1e-9) and first.low < first.point < first.high
    assert seconds < 1.0, seconds


def test_the_policy_hold_ask_and_the_default_of_an_ambiguous_night():
    hold, unclear, good = _task_night(20, 12, 6, 0), _task_night(20, 12, 1, 0), _task_night(20, 12, 0, 0)
    gate = CFG.nightly.gate
    assert hold.decision(gate) == ("held", None) and good.decision(gate) == ("promoted", None)
    decision, by = unclear.decision(gate)
    assert decision == "promoted" and by["default"] == "nightly.gate.on_investigate=promote"
    assert "ambiguous" in by["reason"] and "qa accuracy" in by["reason"]
    assert "ambiguous" in unclear.message("nightly-x")
    held = config_from_dict({"nightly": {"gate": {"on_investigate": "hold"}}}).nightly.gate
    assert unclear.decision(held)[0] == "held"
    ask = config_from_dict({"nightly": {"gate": {"on_regression": "ask"}}}).nightly.gate
    assert hold.decision(ask) == ("ask", None) and unclear.decision(ask) == ("ask", None)
    assert good.decision(ask) == ("promoted", None)
    doc = hold.to_json()  # the readers of earlier verdicts: regressed, rows with ok
    assert doc["regressed"] is True and doc["outcome"] == "hold" and doc["rows"][0]["ok"] is False


def test_the_first_night_names_the_sets_that_carry_no_signal_at_this_tokenizer():
    metrics = {"checkpoints": [{"checkpoint": "pretrained", "perplexity": 600.0,
                                "reference": {"general_zh": 2004.0}}], "tokenizer_vocab_size": 2000}
    verdict = judge(CFG, metrics)
    assert not verdict.compared and verdict.decision(CFG.nightly.gate) == ("promoted", None)
    rows = {r["metric"]: r for r in verdict.rows}
    assert rows["held-out perplexity"]["informative"] and not rows["general_zh perplexity"]["informative"]
    assert "uninformative, not deciding: general_zh perplexity" in verdict.message("nightly-1")
    md = verdict.markdown("nightly-1", "Promoted")
    assert "| general_zh perplexity | – | 2004 |" in md and "**no**" in md


def test_the_gate_reads_the_scores_the_evaluate_stage_writes(tmp_path):
    """night_scores pairs what evaluate wrote per checkpoint folder (perplexity_rows.json, tasks.jsonl)."""
    cfg = config_from_dict({"run": {"output_root": str(tmp_path)}})
    stage = tmp_path / "night" / "evaluate"
    prom, cand, tok = _rows(30, 1.10, 0.01)
    answers = dict(zip(("base", "pretrained"), _answers(20, 12, 6, 0)))
    checkpoints = []
    for label, nll in (("pretrained", cand), ("base", prom)):
        (stage / label).mkdir(parents=True)
        (stage / label / "perplexity_rows.json").write_text(json.dumps({
            "checkpoint": label, "vocab_size": 2000, "heldout": {"nll": list(nll), "tokens": [int(t) for t in tok]},
            "reference": {}}))
        (stage / label / "tasks.jsonl").write_text("".join(
            json.dumps({"task": "qa", "id": "same-id", "correct": a, "checkpoint": label}) + "\n"
            for a in answers[label]))  # ids repeat: paired by position
        checkpoints.append({"checkpoint": label, "perplexity": math.exp(nll.sum() / tok.sum()), "reference": {},
                            "tasks": {"qa": sum(answers[label]) / 20}, "task_items": {"qa": 20},
                            "task_chance": {"qa": 0.25}})
    (stage / "metrics.json").write_text(json.dumps({"checkpoints": [{"label": c["checkpoint"], "dir": c["checkpoint"]}
                                                                    for c in checkpoints]}))
    assert RunPaths(cfg.run.output_root, "night").stage_uri("evaluate") == str(stage)
    scores = night_scores(cfg, "night")
    assert len(scores["base"]["tasks"]["qa"]) == 20 and len(scores["base"]["perplexity"]["held-out perplexity"]["nll"]) == 30
    verdict = judge(cfg, {"checkpoints": checkpoints, "tokenizer_vocab_size": 2000}, scores)
    assert [r["outcome"] for r in verdict.rows] == ["regressed", "regressed"] and verdict.outcome == "hold"
    assert night_scores(cfg, "no-such-night") == {}


def test_a_wide_interval_wholly_over_the_budget_still_holds():
    """Wide (half-width over the budget) but its lower bound over it too: the rows do say worse."""
    prom, _, tok = _rows(20, 1.0, 0.0)
    swing = np.where(np.arange(20) % 2 == 0, 0.3, -0.3)
    row = _ppl_night({"domain": (prom, prom + (math.log(1.6) + swing) * tok, tok)}).rows[0]
    low, high = row["interval"]
    assert (high - low) / 2 > 0.05 and low > 0.05 and row["outcome"] == "regressed", row


def test_the_ask_form_says_whether_the_night_regressed_or_is_ambiguous():
    assert "ambiguous" in _task_night(20, 12, 1, 0).question
    assert "over the regression budget" in _task_night(20, 12, 6, 0).question
