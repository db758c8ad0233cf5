"""The evaluate stage: fixed prompts, held-out perplexity and task accuracy for several checkpoints, side by side.

What `run_evaluate_stage(run, checkpoints=None, tokenizer_path=None, heldout_dir=None, ...)` does
(stage contract, pipeline_lib.runtime.contract):
1. loads and checks the prompt sets (evaluate.prompt_files) in this process;
2. runs `python -m pipeline_lib.evaluate.worker` (runtime.worker; MindSpore lives only there; launcher
   timeout = training.timeout_seconds), which writes `<label>/generations.jsonl`, `<label>/tasks.jsonl` (per task
   item) and `<label>/perplexity_rows.json` (per perplexity row: NLL and scored tokens) per checkpoint and
   returns perplexity, keyword hits, speed and the accuracy of each task of evaluate.tasks (loglik_tasks.py)
   per checkpoint;
3. writes `metrics.json` (prompts + per-checkpoint results), `report.md` and `report.html`
   (answers side by side per prompt) and returns them as outputs. Its metrics carry the inputs it
   consumed (`inputs`: checkpoints, tokenizer, held-out folder, prompt file digests), the tables
   (`tables.checkpoints`, narrow) and the markdown report for the UI; the registry
   writes the manifest.

Inputs left as None are read from the upstream manifests `run.upstream` (runtime.upstream):
checkpoints = base (model.base_checkpoint), pretrained, sft (base + adapter), plus
evaluate.compare_checkpoints (e.g. last night's). A checkpoint is a .ckpt path, a parallel run's
checkpoint folder, or {"base": ..., "adapter": ...} (model.checkpoints.CheckpointRef). Checkpoints
with a LoRA adapter are prompted with the SFT chat template, the others with the raw prompt;
`prompt_formats` ({label: "chat" | "raw"}) overrides that (e.g. "chat" for an exported, already
merged SFT checkpoint).

Limits: decoding is greedy or seeded sampling without KV cache (see decoding.py); keyword hits are
substring matches. Raises PromptSetError / InputNotFound / WorkerFailed (with the worker's error
type and message, e.g. CheckpointMismatch) / WorkerTimeout.
"""
from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from pathlib import Path

from ..config.platform import device_target
from ..runtime.contract import StageOutput, StageRun
from ..runtime.stage_folder import StageFolder, files_under
from ..model.checkpoint_cache import pretrain_checkpoint
from ..model.tokenizer_lineage import require_heldout_tokenizer, require_same_tokenizer
from ..runtime.upstream import InputNotFound, default_checkpoints, find_heldout, find_tokenizer, localize, localize_ref
from ..runtime.worker import as_log, run_worker
from . import report as rep
from .prompts import load_prompt_sets, resolve_prompt_file
from .reference import heldout_name
from .loglik_tasks import load_task_sets

STAGE = "evaluate"
MARKDOWN_LIMIT = 60_000  # characters of the report kept in the manifest for the UI


def _dir_names(labels: list[str]) -> list[str]:
    out, seen = [], set()
    for label in labels:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "checkpoint"
        name, n = base, 2
        while name in seen:
            name, n = f"{base}_{n}", n + 1
        seen.add(name)
        out.append(name)
    return out


def _sha_files(files: list[str]) -> dict:
    return {f: hashlib.sha256(resolve_prompt_file(f).read_bytes()).hexdigest()[:16] for f in files}


def run_evaluate_stage(run: StageRun, checkpoints: dict | None = None, tokenizer_path: str | None = None,
                       heldout_dir: str | None = None, *, prompt_formats: dict[str, str] | None = None,
                       timeout_s: float | None = None, check_generate: bool = True) -> StageOutput:
    """Evaluate every checkpoint; returns the outputs and metrics (see the module docstring)."""
    cfg, paths, upstream, progress = run.cfg, run.paths, run.upstream, run.progress
    emit = as_log(run.log)
    for label, fmt in (prompt_formats or {}).items():
        if fmt not in ("chat", "raw"):
            raise ValueError(f"prompt_formats[{label!r}]={fmt!r}: use 'chat' (SFT chat template) or 'raw'")
    prompts = load_prompt_sets(cfg.evaluate.prompt_files)
    checkpoints = dict(checkpoints) if checkpoints is not None else default_checkpoints(cfg, paths, upstream, pretrain_checkpoint)
    if not checkpoints:
        raise InputNotFound("no checkpoint to evaluate: pass checkpoints={label: path} or run the pretrain/sft "
                            "stages (or set model.base_checkpoint / evaluate.compare_checkpoints)")
    tokenizer_path = tokenizer_path or find_tokenizer(cfg, paths, upstream)
    if not tokenizer_path:
        raise InputNotFound("no tokenizer: pass tokenizer_path, set tokenizer.path or run the data stage")
    for label, ref in checkpoints.items():  # every compared model must read the ids as the run's tokenizer writes them
        require_same_tokenizer(ref, tokenizer_path, paths.endpoint_url, what=f"evaluate checkpoint {label!r}")
    for folder in cfg.evaluate.reference_heldout:
        require_heldout_tokenizer(folder, tokenizer_path, paths.endpoint_url)
    heldout_dir = heldout_dir if heldout_dir is not None else find_heldout(paths, upstream)
    if heldout_dir is None:
        emit("evaluate: no held-out split found; perplexity is skipped")
    with StageFolder(paths, STAGE) as folder, \
            tempfile.TemporaryDirectory(prefix="evaluate-work-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        cache = work / "inputs"
        labels = list(checkpoints)
        task_files = [localize(t, cache, paths.endpoint_url) for t in cfg.evaluate.tasks]
        tasks = load_task_sets(task_files, cfg.evaluate.tasks)  # checked here, before the worker starts
        items = [{"label": label, "dir": d, "ref": localize_ref(checkpoints[label], cache, paths.endpoint_url)}
                 for label, d in zip(labels, _dir_names(labels))]
        target = device_target(cfg)
        request = {"config": cfg.model_dump(mode="json"), "checkpoints": items,
                   "prompts": [p.to_json() for p in prompts],
                   "tokenizer": localize(tokenizer_path, cache, paths.endpoint_url),
                   "heldout_dir": localize(heldout_dir, cache, paths.endpoint_url),
                   "out_dir": str(folder.local), "work_dir": str(work), "target": target,
                   "formats": prompt_formats or {}, "check_generate": check_generate,
                   "reference_sets": [localize(r, cache, paths.endpoint_url) for r in cfg.evaluate.reference_sets],
                   "reference_heldout": {heldout_name(f): localize(f, cache, paths.endpoint_url)
                                         for f in cfg.evaluate.reference_heldout},
                   "tasks": task_files, "task_names": list(cfg.evaluate.tasks)}
        emit(f"evaluate: {len(items)} checkpoints x {len(prompts)} prompts, {len(tasks)} task(s) on {target}")
        if progress:
            progress("evaluate", 0, len(items))
        started = time.time()
        result = run_worker("pipeline_lib.evaluate.worker", request, work, timeout_s=timeout_s or
                            cfg.training.timeout_seconds, log=emit, keep_log=folder.local / "worker.log")
        summary = {"run_id": paths.run_id, "device": result["device"], "decode_path": result["decode_path"],
                   "generate_error": result.get("generate_error"), "generate_match": result.get("generate_match"),
                   "decoding": cfg.evaluate.decoding, "max_new_tokens": cfg.evaluate.max_new_tokens,
                   "temperature": cfg.evaluate.temperature, "top_k": cfg.evaluate.top_k, "top_p": cfg.evaluate.top_p,
                   "seed": cfg.run.seed, "heldout_dir": heldout_dir, "tokenizer": tokenizer_path,
                   "vocab_size": result.get("vocab_size"),
                   "prompts": [p.to_json() for p in prompts], "tasks": [t.to_json() for t in tasks],
                   "task_batch_size": cfg.evaluate.task_batch_size, "checkpoints": result["checkpoints"],
                   "seconds": round(time.time() - started, 2)}
        (folder.local / "metrics.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8")
        gens = rep.load_generations(folder.local, summary)
        title = f"Evaluation of run {paths.run_id}"
        md = rep.render_markdown(summary, gens, title)
        (folder.local / "report.md").write_text(md, encoding="utf-8")
        (folder.local / "report.html").write_text(rep.render_html(summary, gens, title), encoding="utf-8")
        if progress:
            progress("evaluate", len(items), len(items))
        outputs = folder.publish(files_under(folder.local))
    inputs = {"checkpoints": {i["label"]: checkpoints[i["label"]] for i in items}, "tokenizer": tokenizer_path,
              "heldout_dir": heldout_dir, "prompt_files": _sha_files(cfg.evaluate.prompt_files),
              "reference_sets": _sha_files(cfg.evaluate.reference_sets),
              "reference_heldout": list(cfg.evaluate.reference_heldout), "tasks": _sha_files(cfg.evaluate.tasks)}
    emit(f"evaluate: done in {summary['seconds']} s -> {folder.uri}")
    # the consumed inputs stay in the metrics: the manifest's own `inputs` are the registry's upstream fingerprints
    return StageOutput(outputs, {"checkpoints": rep.summary_rows(summary), "device": summary["device"],
                                 "inputs": json.loads(json.dumps(inputs, sort_keys=True, default=str)),
                                 "decode_path": summary["decode_path"], "seconds": summary["seconds"],
                                 # the uniform perplexity of the tokenizer: the nightly gate's "no signal" line
                                 "tokenizer_vocab_size": summary["vocab_size"],
                                 "report_md": "report.md", "report_html": "report.html",
                                 # the answers are in the report (stacked per prompt: a table with one column
                                 # per checkpoint was wider than a screen); this table stays narrow
                                 "tables": {"checkpoints": {"description": "Perplexity and keyword hits per "
                                                            "checkpoint", "rows": rep.reading_rows(summary)}},
                                 "markdown": {"report": md[:MARKDOWN_LIMIT]}})
