"""Stand-in stage engines for orchestration tests: real files, real manifests, controllable failures.

The orchestration under test (Prefect flows, tasks, retries, the manifest skip rule, the
server) is real; only the heavy stage work is replaced so that these tests take seconds.
A failure plan is a file `<stage_uri>/../fail-<stage>` holding the exception to raise and how
many more times: "ConnectionError 1" fails the next attempt only.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from pipeline_lib.runtime.contract import StageOutput, StageRun
from pipeline_lib.storage import describe_outputs


def _maybe_fail(paths, stage: str) -> None:
    plan = Path(paths.run_uri) / f"fail-{stage}"
    if not plan.exists():
        return
    kind, times = plan.read_text().split()
    if int(times) <= 0:
        return
    plan.write_text(f"{kind} {int(times) - 1}")
    raise {"ConnectionError": ConnectionError, "ValueError": ValueError}[kind](f"{stage}: planned {kind}")


def _attempt(paths, stage: str) -> int:
    counter = Path(paths.run_uri) / f"attempts-{stage}"
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.parent.mkdir(parents=True, exist_ok=True)
    counter.write_text(str(n))
    return n


def _stage(stage: str):
    def run(run: StageRun) -> StageOutput:
        paths = run.paths
        _attempt(paths, stage)
        _maybe_fail(paths, stage)
        uri = Path(run.uri)
        uri.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            if run.progress:
                run.progress("work", i + 1, 3)
        (uri / "out.json").write_text(json.dumps({"stage": stage, "steps": run.cfg.training.steps}))
        run.log(f"{stage}: double done")
        return StageOutput(describe_outputs(str(uri), ["out.json"]),
                           metrics={"tables": {"summary": {"description": f"{stage} summary",
                                                           "rows": [{"stage": stage, "ok": True}]}}})

    return run


data = _stage("data")
pretrain = _stage("pretrain")
sft = _stage("sft")
export = _stage("export")


def _row_scores(ppl: float, factor: float, spread: float, rows: int = 20, tokens: int = 10) -> dict:
    """Per-row NLL sums at perplexity `ppl` times `factor`; with `spread`, each row's per-token NLL is off by
    +/-spread (alternating, zero in sum): the gate's paired interval then has a width."""
    swing = [spread if i % 2 == 0 else -spread for i in range(rows)]
    return {"nll": [tokens * (math.log(ppl * factor) + s) for s in swing], "tokens": [tokens] * rows}


def evaluate(run: StageRun) -> StageOutput:
    """The evaluate double scores `pretrained` and, when model.base_checkpoint is set (the promoted model of a
    night), `base`, as the real stage's manifest does (metrics.checkpoints rows) and writes what the real stage
    writes per row (`<label>/perplexity_rows.json`, the folders named in metrics.json). The candidate's perplexities
    are the promoted one's times the factor in `<output_root>/gate-plan` (default 1.0: no change), optionally
    followed by a per-row spread of the candidate's per-token NLL (nats: "1.08 0.09" is +8% give or take)."""
    out = _stage("evaluate")(run)
    plan = Path(run.paths.output_root) / "gate-plan"
    factor, spread = (float(x) for x in (plan.read_text().split() + ["0"])[:2]) if plan.exists() else (1.0, 0.0)
    rows = [{"checkpoint": "pretrained", "perplexity": 20.0 * factor, "reference": {"general_zh": 40.0 * factor}}]
    scores = {"pretrained": (factor, spread)}
    if run.cfg.model.base_checkpoint:
        rows.append({"checkpoint": "base", "perplexity": 20.0, "reference": {"general_zh": 40.0}})
        scores["base"] = (1.0, 0.0)
    uri = Path(run.uri)
    for label, (f, s) in scores.items():
        (uri / label).mkdir(parents=True, exist_ok=True)
        (uri / label / "perplexity_rows.json").write_text(json.dumps(
            {"checkpoint": label, "heldout": _row_scores(20.0, f, s), "reference": {"general_zh": _row_scores(40.0, f, s)}}))
    (uri / "metrics.json").write_text(json.dumps({"checkpoints": [{"label": k, "dir": k} for k in scores]}))
    out.outputs += describe_outputs(str(uri), ["metrics.json", *(f"{k}/perplexity_rows.json" for k in scores)])
    out.metrics["checkpoints"] = rows
    return out


def _slots_now() -> dict:
    """What the server says about this node's training limit while a stage runs."""
    from prefect import get_client

    from tasks.stage_task import node_limit_name

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(node_limit_name())
    return {"limit": limit.limit, "active_slots": limit.active_slots}


def _training_stage(stage: str):
    inner = _stage(stage)

    def run(run: StageRun) -> StageOutput:
        slots = Path(run.paths.run_uri) / f"slots-{stage}.json"
        if os.environ.get("LLM_PIPELINE_TEST_RECORD_SLOTS"):
            slots.parent.mkdir(parents=True, exist_ok=True)
            slots.write_text(json.dumps(_slots_now()))
        return inner(run)

    return run


pretrain = _training_stage("pretrain")
sft = _training_stage("sft")


def pretrain_with_checkpoint(run: StageRun) -> StageOutput:
    """The pretrain double that leaves a checkpoint file the nightly can promote (its manifest names it)."""
    out = pretrain(run)
    ckpt = Path(run.uri) / "checkpoint" / "rank_0" / "double_rank_0-1_1.ckpt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_bytes(b"weights of " + run.paths.run_id.encode())
    out.outputs += describe_outputs(str(run.uri), ["checkpoint/rank_0/double_rank_0-1_1.ckpt"])
    out.metrics["latest_checkpoint"] = str(ckpt)
    return out


def pretrain_with_tokenizer(run: StageRun) -> StageOutput:
    """pretrain_with_checkpoint, with the data stage's tokenizer beside the checkpoint and in the manifest, as the
    real stage leaves it (the next night loads it: one tokenizer per lineage)."""
    import shutil

    out = pretrain_with_checkpoint(run)
    tokenizer = Path(run.uri) / "checkpoint" / "tokenizer.model"
    shutil.copyfile(Path(run.paths.stage_uri("data")) / "tokenizer" / "tokenizer.model", tokenizer)
    out.outputs += describe_outputs(str(run.uri), ["checkpoint/tokenizer.model"])
    out.metrics["tokenizer"] = {"uri": str(tokenizer)}
    return out


def pretrain_preflight_fails(run: StageRun) -> StageOutput:
    """A pretrain whose preflight judged tonight's documents bad (the loss did not fall), as train/preflight.py
    leaves it: preflight.json in the stage folder, then the stage fails."""
    from pipeline_lib.train.preflight import PREFLIGHT_FILE

    uri = Path(run.uri)
    uri.mkdir(parents=True, exist_ok=True)
    problem = "loss did not fall over 8 steps (first-third mean 7.6000, last-third mean 7.6010): raise training.learning_rate"
    (uri / PREFLIGHT_FILE).write_text(json.dumps({"ok": False, "crash": None, "problems": [problem],
                                                  "message": f"preflight failed:\n- {problem}"}))
    raise RuntimeError(f"pretrain preflight failed:\n- {problem}")
