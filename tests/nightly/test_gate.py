"""pipeline_lib.nightly.gate.judge on evaluate metrics as the evaluate stage writes them (report.summary_rows; the
flow around it: tests/flows/test_nightly_gate.py)."""
from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly.gate import judge


def _metrics(promoted: float, candidate: float, items: int | None) -> dict:
    def row(label, accuracy):
        return {"checkpoint": label, "perplexity": 100.0, "reference": {},
                "tasks": {"qa": accuracy}, "task_items": {"qa": items} if items else {}}
    return {"checkpoints": [row("base", promoted), row("pretrained", candidate)]}


def test_a_task_drop_counts_when_over_the_budget_and_beyond_the_noise_of_the_tasks_size():
    cfg = config_from_dict({"nightly": {"gate": {"max_task_drop": 0.02}}})
    one_item = judge(cfg, _metrics(0.30, 0.25, 20))  # one answer of 20 moved: noise, not forgetting
    assert not one_item.regressed
    row = one_item.rows[-1]
    assert row["budget"] > 0.2 and "noise of 20 items" in row["budget_text"]
    assert judge(cfg, _metrics(0.60, 0.10, 20)).regressed  # ten answers of 20 lost
    big = judge(cfg, _metrics(0.30, 0.25, 10_000))  # 500 answers of 10,000: the budget decides
    assert big.regressed and big.rows[-1]["budget"] == 0.02 and "noise" not in big.rows[-1]["budget_text"]
    assert judge(cfg, _metrics(0.30, 0.25, None)).regressed  # no item count known: the budget alone
