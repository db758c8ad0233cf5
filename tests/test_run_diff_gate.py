"""What changed, agreeing with the gate (issue 48 item 5), on constructed run folders with known answers: the
gate's comparison first (the metric that held the night with both values, the change named against the promoted
model, better / worse), the settings that differ, the rest folded, each relative figure's baseline named; the
terminal gets plain tables. The real runs' diff is tests/test_run_diff.py."""
from __future__ import annotations

import json
import math
from pathlib import Path

from pipeline_lib.config import load_config
from pipeline_lib.nightly.gate import judge
from pipeline_lib.run_diff import diff_runs
from pipeline_lib.terminal_text import terminal_text

PPL = {"a": {"pretrained": 18.0}, "b": {"base": 20.0, "pretrained": 26.0}}  # B's candidate +30% vs the promoted


def _checkpoint(label: str, ppl: float, general: float, acc: float) -> dict:
    return {"label": label, "dir": label, "perplexity": {"perplexity": ppl},
            "reference": {"general_zh": {"perplexity": general}}, "tasks": {"domain_choice": {"accuracy": acc}}}


def _runs(tmp_path: Path):
    root = tmp_path / "runs"
    stats = {"files": {}, "total": {"read": 10, "kept": 8}}
    metrics = {"a": {"checkpoints": [_checkpoint("pretrained", 18.0, 1990.0, 0.5)]},
               "b": {"checkpoints": [_checkpoint("base", 20.0, 1990.0, 0.5),
                                     _checkpoint("pretrained", 26.0, 2100.0, 0.55)]}}
    settings = {"a": {"training.steps": 6, "training.learning_rate": 0.003, "model.num_layers": 2},
                "b": {"training.steps": 200, "training.learning_rate": 0.003, "model.num_layers": 2}}
    for run in ("a", "b"):
        for stage, body in (("data", stats), ("evaluate", metrics[run])):
            (root / f"night-{run}" / stage).mkdir(parents=True)
            (root / f"night-{run}" / stage / ("stats.json" if stage == "data" else "metrics.json")).write_text(
                json.dumps(body))
        (root / f"night-{run}" / "pretrain").mkdir(parents=True)
        (root / f"night-{run}" / "pretrain" / "manifest.json").write_text(json.dumps(
            {"stage": "pretrain", "run_id": f"night-{run}", "config_hash": run, "settings": settings[run]}))
    (root / "night-a" / "data" / "manifest.json").write_text(json.dumps(  # written before manifests had settings
        {"stage": "data", "run_id": "night-a", "config_hash": "x"}))
    (root / "night-b" / "data" / "manifest.json").write_text(json.dumps(
        {"stage": "data", "run_id": "night-b", "config_hash": "y", "settings": {"data.min_chars": 20}}))
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [f"run.output_root={root}"])
    summary = {"tokenizer_vocab_size": 2000, "checkpoints": [
        {"checkpoint": label, "perplexity": ppl, "reference": {}} for label, ppl in PPL["b"].items()]}
    scores = {label: {"perplexity": {"held-out perplexity": {"nll": [10 * math.log(ppl)] * 8, "tokens": [10] * 8}}}
              for label, ppl in PPL["b"].items()}
    return cfg, judge(cfg, summary, scores)


def test_the_metric_that_held_the_night_comes_first_with_both_values_and_its_baseline_named(tmp_path):
    cfg, verdict = _runs(tmp_path)
    assert verdict.outcome == "hold"
    md = diff_runs(cfg, "night-a", "night-b", verdict.to_json()).markdown()
    decided = md.index("## What decided B (the gate: hold): B's candidate vs the promoted model")
    assert decided < md.index("## Settings that differ") < md.index("<details><summary>Data")
    gate = [line for line in md[decided:].splitlines() if line.startswith("|")]
    assert gate[0] == "| metric | promoted | candidate | change vs the promoted | budget |   | gate |"
    assert gate[2] == "| held-out perplexity | 20 | 26 | +30.0% | +5.0% | worse | regressed |"  # the gate's figures
    assert "| training.steps | 6 | 200 |" in md and "learning_rate" not in md  # only what differs
    assert "| (data) | not recorded | recorded |" in md
    # the cross-run table: the baseline named (B vs A), held-out named as each run's own split, marks
    assert ("| pretrained | held-out perplexity (each run's own split) | 18 | 26 | +44.44% | worse |" in md)
    assert "| pretrained | domain_choice accuracy | 0.5 | 0.55 | +0.050 | better |" in md
    assert "| base | held-out perplexity (each run's own split) | not scored | 20 | – | – |" in md
    assert md.count("<details>") == md.count("</details>") == 4


def test_without_a_verdict_the_diff_compares_bs_own_promoted_and_candidate(tmp_path):
    cfg, _ = _runs(tmp_path)
    md = diff_runs(cfg, "night-a", "night-b").markdown()  # no nightly state: B's evaluation of base / pretrained
    assert "## What decided B: B's candidate vs the promoted model" in md
    assert "| general_zh perplexity | 1990 | 2100 | +5.53% | – | worse | – |" in md
    assert "| domain_choice accuracy | 0.5 | 0.55 | +0.050 | – | better | – |" in md


def test_the_terminal_gets_aligned_plain_tables_without_markdown(tmp_path, capsys):
    from pipeline_lib.cli import diff_main

    cfg, _ = _runs(tmp_path)
    args = ["configs/pipelines/tiny-cpu.yaml", f"run.output_root={cfg.run.output_root}", "--run-id", "night-a",
            "--run-id", "night-b"]
    assert diff_main(args) == 0
    text = capsys.readouterr().out
    for raw in ("<br>", "**", "<details>", "</summary>", "|---", "\\|", "`"):
        assert raw not in text, raw
    lines = text.splitlines()
    head = lines.index("Settings that differ")
    assert lines[head + 1] == "-" * len("Settings that differ")
    table = [line for line in lines[head + 2:] if line][:4]
    assert table[0].split() == ["setting", "night-a", "night-b"] and set(table[1]) == {"-", " "}
    assert table[2].split() == ["(data)", "not", "recorded", "recorded"]
    assert table[3].index("6") == table[0].index("night-a")  # columns line up under their headers
    assert diff_main([*args, "--markdown"]) == 0 and "| training.steps | 6 | 200 |" in capsys.readouterr().out


def test_a_quoted_answer_prints_as_indented_lines():
    assert terminal_text("**base, A** (r1)\n\n> line one<br>a \\*star\\* and \\<tag\\>\n") == (
        "base, A (r1)\n\n    line one\n    a *star* and <tag>\n")


def test_a_long_setting_shows_its_paths_last_parts_within_a_cell():
    from pipeline_lib.run_settings import MAX_SHOWN, differing

    rows = differing({"data": {"data.inputs": ["/tmp/pytest-of-root/pytest-231/diff_inputs0/new.jsonl"]}},
                     {"data": {"data.inputs": ["/data/inbox/" + "x" * 80 + ".jsonl"]}})
    assert rows[0]["a"] == '[".../diff_inputs0/new.jsonl"]'
    assert len(rows[0]["b"]) == MAX_SHOWN and rows[0]["b"].endswith("…")
