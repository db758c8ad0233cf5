"""The promotion gate of a night: is the candidate clearly worse than the promoted model, clearly not, or unclear?

A night's evaluate stage scores, in one run and on the same rows and items, the promoted model (label `base`: the
nightly sets model.base_checkpoint to `latest`, or the configured base on the first night) and tonight's candidate
(label `pretrained`). `judge(cfg, evaluate_metrics, scores)` compares them against `nightly.gate`, with the
per-row and per-item scores (`scores.night_scores`) so that every comparison is paired:
- perplexity of the domain held-out split, of each evaluate.reference_sets file and of each reference_heldout
  split: the candidate/promoted ratio with a paired-bootstrap interval over rows (paired.perplexity_ratio). Over
  budget (`max_perplexity_increase`) at the point AND at the interval's lower bound: regressed; at the point only:
  ambiguous;
- task accuracy: a drop over `max_task_drop` that a one-sided paired test on the same items confirms (McNemar
  mid-p at alpha = 1 - confidence): regressed; a drop over budget the test does not confirm: ambiguous. On a
  20-item task one answer is 0.05: the test is what keeps a one-answer move from holding a night, and what makes
  0.60 -> 0.30 hold (the unpaired budget of the earlier gate let it pass);
- uninformative metrics are reported, with the reason, and never decide: a perplexity set whose promoted-model
  perplexity is above `uniform_fraction` of the tokenizer's vocabulary size (a uniform guess scores the vocabulary
  size: the model has learned nothing there to forget), or whose interval reaches further than the budget on
  either side of its point and holds the budget (half-width > budget: its rows cannot tell "no change" from "over
  budget"; a wide interval wholly above the budget still says "worse", one wholly below it "within"); a task
  whose promoted model is at chance within noise (one-sided binomial mid-p >= alpha).
The `Verdict`'s outcome: `hold` (a regression on an informative metric), `investigate` (ambiguous: a metric over
budget but not confirmed, or no informative metric at all), `promote`. `Verdict.decision(gate)` applies the
policy (on_regression, on_investigate). With nothing promoted to compare with (a first night from scratch) the
candidate passes and the verdict lists the candidate's perplexity per set against the uniform one, naming the
sets that carry no signal at this tokenizer and model size.
Plain Python and numpy: no Prefect, no MindSpore.
"""
from __future__ import annotations

import datetime as dt
import zlib
from dataclasses import dataclass, field

from . import paired
from .scores import heldout_metric, set_metric, task_metric

CANDIDATE, PROMOTED = "pretrained", "base"
PROMOTE, HOLD, INVESTIGATE = "promote", "hold", "investigate"
REGRESSED, AMBIGUOUS, WITHIN, UNINFORMATIVE, FIRST = "regressed", "ambiguous", "within", "uninformative", "first night"


@dataclass
class Verdict:
    outcome: str = PROMOTE
    rows: list[dict] = field(default_factory=list)
    compared: bool = True
    reason: str = ""
    confidence: float = 0.95

    @property
    def regressed(self) -> bool:
        return self.outcome == HOLD

    @property
    def failed(self) -> list[dict]:
        """The metrics that argue against promotion (regressed or ambiguous)."""
        return [r for r in self.rows if not r["ok"]]

    @property
    def question(self) -> str:
        """What the `ask` form asks a person."""
        return ("ambiguous (over budget, not beyond noise): promote it?" if self.outcome == INVESTIGATE else
                "over the regression budget: promote it anyway?")

    def decision(self, gate) -> tuple[str, dict | None]:
        """("promoted" | "held" | "ask", who decided when a default did) under nightly.gate's policy."""
        if self.outcome == PROMOTE:
            return "promoted", None
        if gate.on_regression == "ask":
            return "ask", None
        if self.outcome == HOLD:
            return "held", None
        setting = f"nightly.gate.on_investigate={gate.on_investigate}"
        return ("promoted" if gate.on_investigate == PROMOTE else "held"), {
            "who": f"the default {setting}", "default": setting, "at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "reason": f"ambiguous ({self.reason}); nobody is asked (on_regression: hold)"}

    def message(self, run_id: str) -> str:
        quiet = [r for r in self.rows if not r["informative"]]
        tail = (f"; uninformative, not deciding: {', '.join(r['metric'] for r in quiet)}" if quiet else "")
        if not self.compared:
            return f"{run_id}: nothing promoted to compare with (a first night from scratch): promoted{tail}"
        if self.outcome == HOLD:
            bad = [r for r in self.rows if r["outcome"] == REGRESSED]
            return (f"{run_id}: over the regression budget on {len(bad)} of {len(self.rows)} metric(s), beyond "
                    f"noise: " + "; ".join(_say(r) for r in bad) + tail)
        if self.outcome == INVESTIGATE:
            unclear = [r for r in self.rows if r["outcome"] == AMBIGUOUS]
            what = "; ".join(f"{_say(r)}: {r['reason']}" for r in unclear) or self.reason
            return f"{run_id}: ambiguous, not clearly worse and not clearly within budget: {what}{tail}"
        decided = [r for r in self.rows if r["informative"]]
        worst = max(decided, key=lambda r: r["used"], default=None)
        closest = f" (closest: {_say(worst)})" if worst else ""
        return (f"{run_id}: within the regression budget on {len(decided)} informative metric(s){closest}{tail}: "
                "promoted")

    def markdown(self, run_id: str, decision: str) -> str:
        return "\n".join([f"# {run_id}: {decision}", "", self.message(run_id), "",
                          *table_lines(self.to_json())])

    def to_json(self) -> dict:
        # `regressed` stays for the readers of earlier verdicts (state history, webhooks): True only for `hold`
        return {"regressed": self.regressed, "outcome": self.outcome, "compared": self.compared,
                "reason": self.reason, "confidence": self.confidence, "rows": self.rows}


def table_lines(verdict: dict) -> list[str]:
    """The verdict's metrics as a markdown table (the `nightly-gate` artifact, the night summary), from to_json."""
    rows = verdict.get("rows") or []
    if not rows:
        return []
    pct = f"{verdict.get('confidence', 0.95):.0%}"
    lines = [f"| metric | promoted | candidate | change | {pct} interval | budget | informative | outcome | why |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['metric']} | {_num(r.get('promoted'))} | {_num(r.get('candidate'))} | "
                     f"{r.get('change_text', '–')} | {r.get('interval_text', '–')} | {r.get('budget_text', '–')} | "
                     f"{'yes' if r.get('informative', True) else '**no**'} | {r.get('outcome', '')} | "
                     f"{str(r.get('reason', '')).replace('|', '/')} |")
    lines += ["", "Perplexity: the candidate/promoted ratio on the same rows, its interval a paired bootstrap over "
              "rows; regressed only when the change and the interval's lower bound are both over budget. Tasks: the "
              "accuracy change on the same items, its interval a paired bootstrap over items; regressed only when the "
              "drop is over budget and a one-sided McNemar mid-p test on the items that changed confirms it."]
    return lines


def _num(value) -> str:
    return "–" if value is None else f"{value:.4g}"


def _say(row: dict) -> str:
    return (f"{row['metric']} {_num(row.get('promoted'))} -> {_num(row['candidate'])} ({row['change_text']}, "
            f"budget {row['budget_text']}, interval {row.get('interval_text', '–')})")


def _by_label(metrics: dict) -> dict[str, dict]:
    return {row["checkpoint"]: row for row in metrics.get("checkpoints", [])}


def _seed(cfg, metric: str) -> int:
    return (int(cfg.run.seed) * 1_000_003 + zlib.crc32(metric.encode("utf-8"))) % (2 ** 32)


def _perplexities(row: dict) -> dict[str, float]:
    out = {heldout_metric(): row.get("perplexity")} if row.get("perplexity") is not None else {}
    out.update({set_metric(name): value for name, value in (row.get("reference") or {}).items()})
    return out


def _near_uniform(gate, value: float, vocab: int | None, who: str) -> str | None:
    if vocab and value > gate.uniform_fraction * vocab:
        return (f"the {who} perplexity {value:.4g} is near the uniform {vocab:,} of the tokenizer's pieces (above "
                f"{gate.uniform_fraction:g} x {vocab:,}, nightly.gate.uniform_fraction): nothing learned there to "
                "lose")
    return None


def _perplexity_row(cfg, metric: str, before: float, after: float, cand: dict | None, prom: dict | None,
                    vocab: int | None) -> dict:
    gate = cfg.nightly.gate
    budget = gate.max_perplexity_increase
    row = {"metric": metric, "promoted": before, "candidate": after, "change": after / before - 1,
           "budget": budget, "budget_text": f"+{budget:.1%}", "interval": None, "interval_text": "–"}
    if cand and prom and len(cand["nll"]) == len(prom["nll"]) and cand["tokens"] == prom["tokens"]:
        r = paired.perplexity_ratio(cand["nll"], prom["nll"], prom["tokens"], gate.confidence,
                                    gate.bootstrap_samples, _seed(cfg, metric))
        row.update(change=r.point - 1, interval=[r.low - 1, r.high - 1], rows=r.rows, tokens=r.tokens,
                   interval_text=f"{r.low - 1:+.1%} .. {r.high - 1:+.1%}")
    row["change_text"] = f"{row['change']:+.1%}"
    row["used"] = row["change"] / budget if budget else float(row["change"] > 0)
    low, high = row["interval"] or (None, None)
    why = _near_uniform(gate, before, vocab, "promoted model's")
    if why is None and low is not None and (high - low) / 2 > budget and low <= budget <= high:
        why = (f"its interval ({row['interval_text']} on {row['rows']} rows) reaches further than the budget "
               f"{row['budget_text']} either side of its point: its rows cannot tell no change from over budget")
    if why:
        outcome = UNINFORMATIVE
    elif row["change"] <= budget:
        outcome, why = WITHIN, "within budget"
    elif low is None:
        outcome, why = AMBIGUOUS, "over budget, but no per-row scores to pair: the point estimate alone"
    elif low > budget:
        outcome, why = REGRESSED, f"over budget, and so is the interval's lower bound {low:+.1%}"
    else:
        outcome, why = AMBIGUOUS, f"over budget at the point, but the interval's lower bound {low:+.1%} is not"
    return _finish(row, outcome, why)


def _task_row(cfg, task: str, before: float, after: float, items: int | None, chance: float | None,
              cand: dict | None, prom: dict | None) -> dict:
    gate = cfg.nightly.gate
    alpha = 1 - gate.confidence
    metric = task_metric(task)
    drop = before - after
    row = {"metric": metric, "promoted": before, "candidate": after, "change": -drop, "change_text": f"{-drop:+.3f}",
           "budget": gate.max_task_drop, "budget_text": f"-{gate.max_task_drop:.3f}", "items": items,
           "interval": None, "interval_text": "–"}
    row["used"] = drop / gate.max_task_drop if gate.max_task_drop else float(drop > 0)
    keys = sorted(set(cand) & set(prom)) if cand and prom else []
    if keys:
        c, p = [int(cand[k]) for k in keys], [int(prom[k]) for k in keys]
        losses = sum(1 for a, b in zip(c, p) if b and not a)
        gains = sum(1 for a, b in zip(c, p) if a and not b)
        change, low, high = paired.accuracy_change(c, p, gate.confidence, gate.bootstrap_samples, _seed(cfg, metric))
        row.update(change=change, change_text=f"{change:+.3f}", interval=[low, high], items=len(keys),
                   interval_text=f"{low:+.3f} .. {high:+.3f}", losses=losses, gains=gains,
                   p_value=paired.mcnemar_worse(losses, gains))
        drop = -change
    n = row["items"]
    why = None
    if chance is not None and n:
        p_chance = paired.above_chance(round(before * n), n, chance)
        if p_chance >= alpha:
            why = (f"the promoted model's {before:.3f} on {n} items is at chance ({chance:.3f}) within noise "
                   f"(p = {p_chance:.2g} >= {alpha:.2g}): nothing learned there to lose")
    if why:
        outcome = UNINFORMATIVE
    elif drop <= gate.max_task_drop:
        outcome, why = WITHIN, "within budget"
    elif "p_value" not in row:
        outcome, why = AMBIGUOUS, "over budget, but no per-item answers to pair: no test"
    elif row["p_value"] < alpha:
        outcome, why = REGRESSED, (f"over budget and beyond noise: {row['losses']} item(s) lost, {row['gains']} "
                                   f"gained (McNemar p = {row['p_value']:.2g} < {alpha:.2g})")
    else:
        outcome, why = AMBIGUOUS, (f"over budget, but within noise: {row['losses']} item(s) lost, {row['gains']} "
                                   f"gained (McNemar p = {row['p_value']:.2g} >= {alpha:.2g})")
    return _finish(row, outcome, why)


def _finish(row: dict, outcome: str, why: str) -> dict:
    row.update(outcome=outcome, reason=why, informative=outcome != UNINFORMATIVE,
               ok=outcome not in (REGRESSED, AMBIGUOUS))
    return row


def _first_night(cfg, cand: dict, vocab: int | None) -> Verdict:
    """Nothing to compare with: the candidate's perplexity per set against the uniform one (which sets say nothing)."""
    rows = []
    for metric, value in _perplexities(cand).items():
        why = _near_uniform(cfg.nightly.gate, value, vocab, "candidate's")
        rows.append({"metric": metric, "promoted": None, "candidate": value, "uniform": vocab, "change": None,
                     "change_text": "–", "interval_text": "–", "budget_text": "–", "used": 0.0, "ok": True,
                     "informative": why is None, "outcome": UNINFORMATIVE if why else FIRST,
                     "reason": why or (f"below {cfg.nightly.gate.uniform_fraction:g} x the uniform {vocab:,}" if vocab
                                       else "the tokenizer's vocabulary size is unknown")})
    return Verdict(PROMOTE, rows, compared=False, reason="nothing promoted to compare with",
                   confidence=cfg.nightly.gate.confidence)


def judge(cfg, evaluate_metrics: dict, scores: dict | None = None) -> Verdict:
    """Compare the candidate with the promoted model (see the module docstring). `scores`: scores.night_scores."""
    checkpoints = _by_label(evaluate_metrics)
    scores = scores or {}
    vocab = evaluate_metrics.get("tokenizer_vocab_size")
    if CANDIDATE not in checkpoints:
        raise ValueError(f"the evaluate stage scored no {CANDIDATE!r} checkpoint (it scored "
                         f"{sorted(checkpoints)}): the nightly needs data, pretrain and evaluate to judge a night")
    if PROMOTED not in checkpoints:
        return _first_night(cfg, checkpoints[CANDIDATE], vocab)
    cand, prom = checkpoints[CANDIDATE], checkpoints[PROMOTED]
    cand_rows = (scores.get(CANDIDATE) or {}).get("perplexity") or {}
    prom_rows = (scores.get(PROMOTED) or {}).get("perplexity") or {}
    rows = []
    after_by_metric = _perplexities(cand)
    for metric, before in _perplexities(prom).items():
        after = after_by_metric.get(metric)
        if before is not None and after is not None:
            rows.append(_perplexity_row(cfg, metric, before, after, cand_rows.get(metric), prom_rows.get(metric),
                                        vocab))
    cand_items = (scores.get(CANDIDATE) or {}).get("tasks") or {}
    prom_items = (scores.get(PROMOTED) or {}).get("tasks") or {}
    for task, before in (prom.get("tasks") or {}).items():
        after = (cand.get("tasks") or {}).get(task)
        if after is not None:
            rows.append(_task_row(cfg, task, before, after, (cand.get("task_items") or {}).get(task),
                                  (prom.get("task_chance") or {}).get(task), cand_items.get(task),
                                  prom_items.get(task)))
    outcome, reason = _outcome(rows)
    return Verdict(outcome, rows, reason=reason, confidence=cfg.nightly.gate.confidence)


def _outcome(rows: list[dict]) -> tuple[str, str]:
    regressed = [r["metric"] for r in rows if r["outcome"] == REGRESSED]
    if regressed:
        return HOLD, f"regressed beyond noise: {', '.join(regressed)}"
    unclear = [r["metric"] for r in rows if r["outcome"] == AMBIGUOUS]
    if unclear:
        return INVESTIGATE, f"over budget but not beyond noise: {', '.join(unclear)}"
    if rows and not any(r["informative"] for r in rows):
        return INVESTIGATE, "no informative metric: every metric is uninformative for this lineage"
    return PROMOTE, "within budget on every informative metric"
