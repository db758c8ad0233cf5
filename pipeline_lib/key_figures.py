"""The key figures of each stage: the few numbers the run overview shows of how a stage went.

Each function reads a stage's manifest metrics and returns short lines ("tokens 22,345"); the stage
table names the one of each stage (`StageSpec.figures`). Missing metrics give no line, never an error.
`fmt` is how every figure of the overview is written.
"""
from __future__ import annotations


def fmt(value, digits: int = 4) -> str:
    """Numbers a person reads: floats to `digits` significant digits, ints with thousands separators."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def data_figures(m: dict) -> list[str]:
    return [f"{label} {fmt(m[k])}" for k, label in (("tokens", "tokens"), ("kept", "documents kept"),
                                                     ("rows_train", "train rows")) if m.get(k) is not None]


def training_figures(m: dict) -> list[str]:
    """pretrain and sft: steps, the loss from first to last, and only the planner figures that are off."""
    out = []
    if m.get("steps") is not None:
        out.append(f"steps {fmt(m['steps'])}")
    final = m.get("final_loss", m.get("loss_last"))
    if final is not None:
        first = m.get("loss_first")
        out.append(f"loss {fmt(first)} → {fmt(final)}" if first is not None else f"final loss {fmt(final)}")
    for row in (m.get("planner_check") or {}).get("rows") or []:
        if row.get("alert"):
            out.append(f"{row['figure']} {fmt(row['measured'])} {row['unit']} vs planner "
                       f"{fmt(row['predicted'])} {row['unit']} (off)")
    return out


def evaluate_figures(m: dict) -> list[str]:
    return [f"perplexity {row.get('checkpoint')} {fmt(row.get('perplexity'))}" for row in m.get("checkpoints") or []]


def export_figures(m: dict) -> list[str]:
    rows = ((m.get("tables") or {}).get("checks") or {}).get("rows") or []
    if not rows:
        return []
    out = [f"logits checks ok {sum(bool(r.get('ok')) for r in rows)}/{len(rows)}"]
    diffs = [r["max_abs_diff"] for r in rows if isinstance(r.get("max_abs_diff"), (int, float))]
    if diffs:
        out.append(f"max logits diff {fmt(max(diffs), 3)}")
    return out
