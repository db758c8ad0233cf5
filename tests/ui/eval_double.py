"""An evaluate stage double for the browser tests: the real report renderer on a fixed summary.

Four checkpoints and long answers (the case that made the old side-by-side table 2,478 px wide),
without training or decoding anything: what the UI shows is the point, not the model.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline_lib.evaluate import report as rep
from pipeline_lib.runtime.contract import StageOutput, StageRun
from pipeline_lib.storage import describe_outputs

LABELS = ("base", "pretrained", "sft", "last night")
PROMPTS = [("p-resume", "How do I resume a failed run?", ["run-id", "resume"]),
           ("p-ckpt", "Where is the latest checkpoint written, and how is it checked?", ["checkpoint", "sha256"]),
           ("p-zh", "检查点如何恢复?", ["检查点"])]


def _answer(label: str, prompt: str, i: int) -> str:
    body = (f"[{label}] To answer '{prompt}': rerun with the same --run-id and resume from the manifest; "
            "the latest checkpoint is verified with its sha256 before training continues. ") * (2 + i)
    return body + "averyveryverylongtokenwithoutanyspacesthatabrowsercannotwrapunlessthepageletsitbreak" * 2


def evaluate(run: StageRun) -> StageOutput:
    out = Path(run.uri)
    out.mkdir(parents=True, exist_ok=True)
    prompts = [{"id": pid, "set": "ops", "prompt": text, "keywords": kws} for pid, text, kws in PROMPTS]
    cks, gens = [], {}
    for n, label in enumerate(LABELS):
        ck_dir = label.replace(" ", "_")
        recs = {}
        for i, p in enumerate(prompts):
            text = _answer(label, p["prompt"], i)
            hits = [k for k in p["keywords"] if k.lower() in text.lower()]
            recs[p["id"]] = {"prompt_id": p["id"], "text": text, "keyword_hits": hits, "keywords": p["keywords"],
                             "num_tokens": len(text.split()), "stop_reason": "max_new_tokens"}
        gens[label] = recs
        cks.append({"label": label, "dir": ck_dir, "ref": {"ckpt": f"{run.paths.run_uri}/pretrain/{ck_dir}.ckpt"},
                    "keyword_hits": 3, "keywords_total": 5, "generated_tokens": 480, "tokens_per_second": 12.3456789,
                    "perplexity": {"perplexity": 80.0 / (n + 1) + 0.123456, "tokens": 175}})
    summary = {"prompts": prompts, "checkpoints": cks, "decoding": "greedy", "max_new_tokens": 64,
               "device": "CPU", "decode_path": "forward"}
    md = rep.render_markdown(summary, gens, f"Evaluation of run {run.paths.run_id}")
    (out / "report.md").write_text(md, encoding="utf-8")
    (out / "report.html").write_text(rep.render_html(summary, gens, "Evaluation"), encoding="utf-8")
    (out / "metrics.json").write_text(json.dumps(summary), encoding="utf-8")
    return StageOutput(describe_outputs(str(out), ["metrics.json", "report.html", "report.md"]),
                       metrics={"checkpoints": rep.summary_rows(summary), "markdown": {"report": md}})
