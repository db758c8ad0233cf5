"""The promotion gate of a night: did the candidate get worse than the promoted model?

A night's evaluate stage scores, in one run and on the same rows, the promoted model (label `base`: the nightly
sets model.base_checkpoint to `latest`, or the configured base on the first night) and tonight's candidate
(label `pretrained`). `judge(cfg, evaluate_metrics)` compares them against `nightly.gate`:
- perplexity of the domain held-out split and of each evaluate.reference_sets file: the candidate may be at most
  `max_perplexity_increase` (relative) above the promoted model;
- task accuracy (a task's `accuracy` per checkpoint, when the evaluate stage scored tasks): at most
  `max_task_drop` (absolute) below, or within the noise of the task's size when that is larger: twice the
  standard error of the difference of two accuracies on its n items (`task_items`), 2*sqrt((a(1-a)+b(1-b))/n).
  On a 20-item task one answer is 0.05: without it a budget of 0.02 would hold every night whose answers moved
  by one item, which says nothing about the model.
It returns a `Verdict`: `regressed` (any metric over budget), one row per metric with both values, the change and
the budget, and the message the night's state, artifact and webhook carry. With nothing promoted to compare with
(a first night from scratch) the candidate passes and the verdict says so.
Plain Python: no Prefect, no MindSpore.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

CANDIDATE, PROMOTED = "pretrained", "base"


@dataclass
class Verdict:
    regressed: bool
    rows: list[dict] = field(default_factory=list)
    compared: bool = True

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if not r["ok"]]

    def message(self, run_id: str) -> str:
        if not self.compared:
            return f"{run_id}: nothing promoted to compare with (a first night from scratch): promoted"
        if not self.regressed:
            worst = max(self.rows, key=lambda r: r["used"], default=None)
            tail = f" (closest: {_say(worst)})" if worst else ""
            return f"{run_id}: within the regression budget on {len(self.rows)} metric(s){tail}: promoted"
        return (f"{run_id}: over the regression budget on {len(self.failed)} of {len(self.rows)} metric(s): "
                + "; ".join(_say(r) for r in self.failed))

    def markdown(self, run_id: str, decision: str) -> str:
        lines = [f"# {run_id}: {decision}", "", self.message(run_id), ""]
        if self.rows:
            lines += ["| metric | promoted | candidate | change | budget | within |", "|---|---|---|---|---|---|"]
            lines += [f"| {r['metric']} | {r['promoted']:.4g} | {r['candidate']:.4g} | {r['change_text']} | "
                      f"{r['budget_text']} | {'yes' if r['ok'] else '**no**'} |" for r in self.rows]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"regressed": self.regressed, "compared": self.compared, "rows": self.rows}


def _say(row: dict) -> str:
    return (f"{row['metric']} {row['promoted']:.4g} -> {row['candidate']:.4g} ({row['change_text']}, budget "
            f"{row['budget_text']})")


def _by_label(metrics: dict) -> dict[str, dict]:
    return {row["checkpoint"]: row for row in metrics.get("checkpoints", [])}


def judge(cfg, evaluate_metrics: dict) -> Verdict:
    """Compare the candidate with the promoted model in an evaluate manifest's metrics (see the module docstring)."""
    gate, rows = cfg.nightly.gate, []
    checkpoints = _by_label(evaluate_metrics)
    if CANDIDATE not in checkpoints:
        raise ValueError(f"the evaluate stage scored no {CANDIDATE!r} checkpoint (it scored "
                         f"{sorted(checkpoints)}): the nightly needs data, pretrain and evaluate to judge a night")
    if PROMOTED not in checkpoints:
        return Verdict(regressed=False, compared=False)
    cand, prom = checkpoints[CANDIDATE], checkpoints[PROMOTED]
    perplexities = {"held-out perplexity": (prom.get("perplexity"), cand.get("perplexity"))}
    for name, value in (prom.get("reference") or {}).items():
        perplexities[f"{name} perplexity"] = (value, (cand.get("reference") or {}).get(name))
    for metric, (before, after) in perplexities.items():
        if before is None or after is None:
            continue
        change = after / before - 1
        rows.append({"metric": metric, "promoted": before, "candidate": after, "change": change,
                     "change_text": f"{change:+.1%}", "budget": gate.max_perplexity_increase,
                     "budget_text": f"+{gate.max_perplexity_increase:.1%}",
                     "used": change / gate.max_perplexity_increase if gate.max_perplexity_increase else
                     float(change > 0), "ok": change <= gate.max_perplexity_increase})
    for task, before in (prom.get("tasks") or {}).items():
        after = (cand.get("tasks") or {}).get(task)
        if after is None:
            continue
        drop = before - after
        items = (cand.get("task_items") or {}).get(task)
        noise = 2 * math.sqrt((before * (1 - before) + after * (1 - after)) / items) if items else 0.0
        budget = max(gate.max_task_drop, noise)
        rows.append({"metric": f"{task} accuracy", "promoted": before, "candidate": after, "change": -drop,
                     "change_text": f"{-drop:+.3f}", "budget": budget, "noise": noise, "items": items,
                     "budget_text": f"-{budget:.3f}" + (f" (noise of {items} items)" if noise > gate.max_task_drop
                                                         else ""),
                     "used": drop / budget if budget else float(drop > 0), "ok": drop <= budget})
    return Verdict(regressed=any(not r["ok"] for r in rows), rows=rows)
