"""The export stage: merge (shards, LoRA) -> checked standalone checkpoint -> checked MindIR.

What `run_export_stage(run, base_ckpt=None, adapter_ckpt=None, tokenizer_path=None, ...)` does (stage
contract, pipeline_lib.runtime.contract): runs `python -m pipeline_lib.export.worker` (runtime.worker;
MindSpore lives only there; launcher timeout = training.timeout_seconds), which
1. merges a sharded base/adapter (a parallel run's checkpoint folder + its strategy files) into one
   copy with MindSpore's transform_checkpoints (model.shard_merge),
2. folds the LoRA adapter in (model.lora_merge) (W' = W + alpha / rank * B @ A) and checks the merged model's logits
   against base + adapter (mindformers' LoRA graph) on fixed inputs,
3. writes `merged.ckpt` (no LoRA parameters) and the same model as a Hugging Face Llama folder `hf/`
   (model.safetensors + config.json + the tokenizer; read back and checked),
4. exports `serving/model.mindir` (fixed export.batch_size x seq_length), reloads it with
   mindspore.load + nn.GraphCell and checks its logits against the checkpoint model,
5. writes `serving/serving.json` (shapes, dtypes, special ids, decoding note) and copies the tokenizer.
Then `checks.json`; the stage returns its outputs and metrics (inputs, checks) and the registry writes
the manifest. A failed check fails the stage with the numbers.

Inputs left as None come from the upstream manifests `run.upstream` (runtime.upstream): base = the SFT stage's
base checkpoint (else the pretrain checkpoint, else model.base_checkpoint), adapter = the SFT
adapter, tokenizer = the data stage's. Without an adapter the base is exported as is.

Raises InputNotFound, WorkerFailed (error type and message of the worker, e.g. LogitsMismatch,
LoraMergeError, ShardMergeError, CheckpointMismatch) or WorkerTimeout.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from ..config.platform import device_target
from ..config.schema import PipelineConfig
from ..runtime.contract import StageOutput, StageRun
from ..runtime.stage_folder import StageFolder, files_under
from ..model.checkpoint_cache import pretrain_checkpoint
from ..model.tokenizer_lineage import require_same_tokenizer
from ..runtime.upstream import InputNotFound, find_sft, find_tokenizer, localize
from ..runtime.worker import as_log, run_worker
from ..storage import Manifest, RunPaths

STAGE = "export"


def _default_inputs(cfg: PipelineConfig, paths: RunPaths, upstream: dict[str, Manifest]
                    ) -> tuple[str | None, str | None]:
    # a tensor/pipeline-parallel pretrain is merged once and cached (docs/checkpoints.md)
    adapter, base = find_sft(paths, upstream, pretrain_checkpoint)
    base = base or cfg.model.base_checkpoint
    return base, adapter


def run_export_stage(run: StageRun, base_ckpt: str | None = None, adapter_ckpt: str | None = None,
                     tokenizer_path: str | None = None, *, base_strategy: str | None = None,
                     adapter_strategy: str | None = None, timeout_s: float | None = None,
                     lora_scale_override: float | None = None) -> StageOutput:
    """Merge, check, export and check again; returns the outputs and metrics (see the module docstring).

    `lora_scale_override` replaces alpha / rank in the merge: a diagnostic that must make the stage fail
    at the LoRA logits check (tests use it to prove the check works); never set it in a real run.
    """
    cfg, paths, progress = run.cfg, run.paths, run.progress
    emit = as_log(run.log)
    if base_ckpt is None:
        base_ckpt, found_adapter = _default_inputs(cfg, paths, run.upstream)
        adapter_ckpt = adapter_ckpt or found_adapter
    if not base_ckpt:
        raise InputNotFound("no checkpoint to export: pass base_ckpt, or run the pretrain/sft stages "
                            "(or set model.base_checkpoint)")
    tokenizer_path = tokenizer_path or find_tokenizer(cfg, paths, run.upstream)
    if not tokenizer_path:
        emit("export: no tokenizer found; the serving folder will not contain one")
    require_same_tokenizer(base_ckpt, tokenizer_path, paths.endpoint_url, what="the exported base")
    started = time.time()
    with StageFolder(paths, STAGE) as folder, \
            tempfile.TemporaryDirectory(prefix="export-work-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        cache = work / "inputs"
        target = device_target(cfg)
        request = {"config": cfg.model_dump(mode="json"), "target": target,
                   "base": localize(str(base_ckpt), cache, paths.endpoint_url),
                   "adapter": localize(adapter_ckpt, cache, paths.endpoint_url) if adapter_ckpt else None,
                   "base_strategy": localize(base_strategy, cache, paths.endpoint_url),
                   "adapter_strategy": localize(adapter_strategy, cache, paths.endpoint_url),
                   "tokenizer": localize(tokenizer_path, cache, paths.endpoint_url),
                   "out_dir": str(folder.local), "work_dir": str(work), "lora_scale_override": lora_scale_override}
        emit(f"export: {base_ckpt}" + (f" + adapter {adapter_ckpt}" if adapter_ckpt else "") + f" on {target}")
        if progress:
            progress("export", 0, 1)
        result = run_worker("pipeline_lib.export.worker", request, work, timeout_s=timeout_s or
                            cfg.training.timeout_seconds, log=emit, keep_log=folder.local / "worker.log")
        checks = result["checks"]
        checks["seconds"] = round(time.time() - started, 2)
        (folder.local / "checks.json").write_text(json.dumps(checks, indent=1), encoding="utf-8")
        outputs = folder.publish(files_under(folder.local))
        if progress:
            progress("export", 1, 1)
    rows = [{"check": c["what"], "max_abs_diff": c["max_abs"], "same_argmax": c["same_argmax"], "ok": c["ok"]}
            for c in (checks.get("lora_check"), checks.get("mindir_check")) if c]
    inputs = json.loads(json.dumps({"base": base_ckpt, "adapter": adapter_ckpt, "tokenizer": tokenizer_path,
                                    "base_strategy": base_strategy, "adapter_strategy": adapter_strategy},
                                   sort_keys=True, default=str))
    emit(f"export: done in {checks['seconds']} s -> {folder.uri}")
    return StageOutput(outputs, {"inputs": inputs, "merged_checkpoint": "merged.ckpt", "mindir": "serving/model.mindir",
                                 "hf_checkpoint": "hf", "serving_json": "serving/serving.json", "checks": checks,
                                 "tables": {"checks": {"description": "Logits checks of the export", "rows": rows}}})
