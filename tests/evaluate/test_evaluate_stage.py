"""The evaluate stage end to end on the tiny model, run through the stage registry
(pipeline_lib.stages.run_stage): inputs found through the upstream manifests (data: tokenizer +
held-out; pretrain; sft), and a rerun skipped because the manifest matches."""
from __future__ import annotations

import json
import math

import pytest

from pipeline_lib.stages import run_stage
from pipeline_lib.storage import Manifest, RunPaths, read_manifest, write_manifest

FIELDS = {"prompt_id", "set", "checkpoint", "prompt", "text", "tokens", "num_tokens", "prompt_tokens", "truncated",
          "stop_reason", "keywords", "keyword_hits", "time_s", "batch_time_s", "decode_path", "strategy"}


def _upstream(paths: RunPaths, tiny) -> None:
    for stage, metrics in {"data": {"tokenizer_model": str(tiny.tokenizer), "heldout_dir": str(tiny.heldout)},
                           "pretrain": {"checkpoint": str(tiny.pretrained)},
                           "sft": {"adapter_checkpoint": str(tiny.adapter), "base_checkpoint": str(tiny.base)}}.items():
        write_manifest(paths.stage_uri(stage), Manifest(stage=stage, run_id=paths.run_id, config_hash="x",
                                                        metrics=metrics))


@pytest.mark.slow
def test_evaluate_stage_side_by_side(tiny, forward_path_run):  # forward_path_run: started to overlap
    cfg = tiny.cfg.model_copy(deep=True)
    cfg.evaluate.compare_checkpoints = {"sft full ckpt": str(tiny.sft_full), "base": str(tiny.base)}
    paths = RunPaths(cfg.run.output_root, "eval-run")
    _upstream(paths, tiny)
    lines, progress = [], []
    manifest, skipped = run_stage(cfg, paths, "evaluate", log=lines.append, progress=lambda *a: progress.append(a))
    assert not skipped

    stage = paths.stage_uri("evaluate")
    assert read_manifest(stage).outputs == manifest.outputs
    outs = {o["path"] for o in manifest.outputs}
    labels = ["pretrained", "sft", "sft full ckpt", "base"]
    dirs = ["pretrained", "sft", "sft_full_ckpt", "base"]
    assert {f"{d}/generations.jsonl" for d in dirs} | {"metrics.json", "report.md", "report.html"} <= outs

    gens = {}
    for label, d in zip(labels, dirs):
        recs = [json.loads(x) for x in open(f"{stage}/{d}/generations.jsonl", encoding="utf-8")]
        assert [r["prompt_id"] for r in recs] == ["t-en", "t-zh", "t-long"]
        for r in recs:
            assert FIELDS <= set(r) and r["checkpoint"] == label and r["decode_path"] == "forward"
            assert 1 <= r["num_tokens"] <= cfg.evaluate.max_new_tokens or r["stop_reason"] == "eos"
            assert r["prompt_tokens"] + r["num_tokens"] <= cfg.model.seq_length and r["time_s"] > 0
        assert recs[2]["truncated"] and not recs[0]["truncated"]  # the 60-word prompt was cut to fit
        assert {r["prompt_format"] for r in recs} == {"chat" if label.startswith("sft") else "raw"}
        gens[label] = [r["tokens"] for r in recs]
    # An SFT checkpoint holding base + LoRA tensors gives exactly what base + adapter gives.
    assert gens["sft full ckpt"] == gens["sft"]
    assert gens["pretrained"] != gens["base"]

    summary = json.loads(open(f"{stage}/metrics.json", encoding="utf-8").read())
    ppl = {c["label"]: c["perplexity"] for c in summary["checkpoints"]}
    assert all(p["tokens"] == 5 * 32 + 15 and p["perplexity"] > 1 for p in ppl.values())
    assert ppl["sft"]["perplexity"] == pytest.approx(ppl["sft full ckpt"]["perplexity"], rel=1e-6)
    assert ppl["sft"]["perplexity"] != pytest.approx(ppl["base"]["perplexity"], rel=1e-6)

    # the UI tables stay narrow: no answers-per-checkpoint table (the report stacks them), no source paths
    assert set(manifest.metrics["tables"]) == {"checkpoints"}
    table = manifest.metrics["tables"]["checkpoints"]["rows"]
    assert [r["checkpoint"] for r in table] == labels and list(table[0]) == [
        "checkpoint", "perplexity", "general_zh ppl", "keyword hits", "generated tokens", "tokens/s"]
    # the reference set: the same rows for every checkpoint, a perplexity each
    ref = {c["label"]: c["reference"]["general_zh"] for c in summary["checkpoints"]}
    assert len({r["tokens"] for r in ref.values()}) == 1 and all(r["perplexity"] > 1 for r in ref.values())
    assert ref["sft"]["perplexity"] == pytest.approx(ref["sft full ckpt"]["perplexity"], rel=1e-6)
    assert ref["pretrained"]["perplexity"] != pytest.approx(ref["base"]["perplexity"], rel=1e-6)
    # the tasks (the shipped set): accuracy per task and checkpoint, an item record each, read by the nightly gate
    names = ["domain_choice", "domain_classify"]
    assert [t["name"] for t in summary["tasks"]] == names
    for ck in summary["checkpoints"]:
        assert list(ck["tasks"]) == names and [ck["tasks"][n]["items"] for n in names] == [20, 16]
        for n in names:
            r = ck["tasks"][n]
            assert 0 <= r["accuracy"] <= 1 and r["correct"] == round(r["accuracy"] * r["items"])
        recs = [json.loads(x) for x in open(f"{stage}/{dirs[labels.index(ck['label'])]}/tasks.jsonl", encoding="utf-8")]
        assert len(recs) == 36 and sum(r["correct"] for r in recs) == sum(ck["tasks"][n]["correct"] for n in names)
        assert all(r["predicted"] == max(r["loglik"], key=r["loglik"].get) for r in recs)
    assert summary["checkpoints"][0]["tasks"]["domain_classify"]["chance"] == pytest.approx(0.25)
    acc = {c["label"]: c["tasks"]["domain_choice"]["accuracy"] for c in summary["checkpoints"]}
    assert acc["sft"] == acc["sft full ckpt"]
    assert {r["checkpoint"]: r["tasks"] for r in manifest.metrics["checkpoints"]}["pretrained"] == {
        n: summary["checkpoints"][0]["tasks"][n]["accuracy"] for n in names}
    # per row of every perplexity set, per checkpoint: NLL sum and scored tokens, the same rows for every checkpoint
    assert {f"{d}/perplexity_rows.json" for d in dirs} <= outs
    for label, d in zip(labels, dirs):
        rows = json.loads(open(f"{stage}/{d}/perplexity_rows.json", encoding="utf-8").read())
        ck = summary["checkpoints"][labels.index(label)]
        for got, agg in [(rows["heldout"], ck["perplexity"])] + [(rows["reference"][n], r)
                                                               for n, r in ck["reference"].items()]:
            assert len(got["nll"]) == agg["rows"] and sum(got["tokens"]) == agg["tokens"]
            assert math.exp(sum(got["nll"]) / sum(got["tokens"])) == pytest.approx(agg["perplexity"], rel=1e-5)
    assert manifest.metrics["tokenizer_vocab_size"] == rows["vocab_size"] > 1
    from pipeline_lib.nightly.gate import judge
    from pipeline_lib.nightly.scores import night_scores

    # the gate pairs what evaluate wrote: base vs pretrained on the same rows and items, every metric with an interval
    verdict = judge(cfg, manifest.metrics, night_scores(cfg, "eval-run"))
    metrics = {r["metric"]: r for r in verdict.rows}
    assert set(metrics) >= {"held-out perplexity", "general_zh perplexity", "domain_choice accuracy",
                            "domain_classify accuracy"}
    assert all(r["interval"] is not None and r["outcome"] in ("within", "regressed", "ambiguous", "uninformative")
               for r in verdict.rows)
    assert metrics["domain_choice accuracy"]["items"] == 20 and verdict.outcome in ("promote", "hold", "investigate")
    md = open(f"{stage}/report.md", encoding="utf-8").read()
    assert "## Task accuracy" in md and "| task | type | items | pretrained | sft | sft full ckpt | base | chance |" in md
    html = open(f"{stage}/report.html", encoding="utf-8").read()
    # header + checkpoints, header + tasks; the answers are stacked per prompt
    assert html.count("<tr>") == 1 + len(labels) + 1 + len(names)
    assert html.count('class="prompt"') == 3 and html.count('class="answer"') == 3 * len(labels)
    assert manifest.metrics["inputs"]["checkpoints"]["sft"] == {"adapter": str(tiny.adapter), "base": str(tiny.base)}
    assert progress[-1] == ("evaluate", 4, 4) and any("perplexity" in x for x in lines)
    again, skipped = run_stage(cfg, paths, "evaluate", log=lines.append)
    assert skipped and again.outputs == manifest.outputs
