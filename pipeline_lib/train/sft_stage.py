"""The SFT stage: instruction data -> LoRA finetune of the pretrained base -> adapter kept apart from the base.

What `run_sft_stage(cfg, paths, log=..., progress=..., base_checkpoint=None)` does, in order:
1. inputs: the tokenizer from the data stage (tokenizer.path when set); the base checkpoint = the
   `base_checkpoint` argument, else the pretrain manifest's `metrics.latest_checkpoint` (or `checkpoint`,
   or its highest-step .ckpt output), else model.base_checkpoint. Its sha256 is taken before training.
2. data (data/sft_records.py): sft.inputs -> chat template -> labels -> rows of seq_length + 1 ->
   `data/sft.mindrecord` (input_ids + labels); `quarantine.jsonl` (malformed records), `excluded.jsonl`
   (dropped by sft.truncation), `sft_stats.json` (read = rejected + dropped + kept).
3. train: `sft.yaml` (mindformers_yaml stage "sft": pet_config LoRA, run_mode finetune, load_checkpoint =
   the base, plus the PipelineMetrics/LossGuard callbacks) run through the launcher in its own process
   (`python -m pipeline_lib.train.sft_stage --yaml`, which registers the callbacks and runs
   pipeline_lib.train.entry, i.e. `Trainer(cfg).train()`). A preflight of training.preflight_steps
   runs first (in `preflight/`, removed after) and stops the stage when its verdict is bad. Checkpoints
   are verified, pruned and pointed at by `train/latest_checkpoint.json` (CheckpointManager); a rerun
   after a failure resumes from it when the stage identity (config, base sha256, data) is unchanged.
4. adapter: `adapter/adapter.ckpt` (LoRA factors only) + `adapter/adapter_config.json` (train/adapter.py),
   after checking that LoRA alone was trained and the frozen weights equal the base bitwise; the base
   file's sha256 is checked again (it is never written).
5. `loss.png` and the manifest (last): metrics `adapter_checkpoint`, `base_checkpoint`, losses, counts,
   tables and images for the UI.

Limits: resume works from the local stage folder (an s3:// run store trains in a scratch folder; set
training.upload_checkpoints to keep copies). SFT has no gradient accumulation (mindformers_yaml).
Raises SFTStageError (inputs/data, naming the field and fix), AdapterError, and the launcher's
TrainingLaunchError / TrainingTimeout / GuardTripped.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..config.load import config_hash
from ..config.mindformers_yaml import build_run_config
from ..data.sft_records import prepare_sft_data, table_rows
from ..stages import stage_hash
from ..storage import Manifest, RunPaths, invalidate, is_s3, join, read_manifest, sha256_file, store_for, write_manifest
from .checkpoints import CheckpointManager
from .launch import build_command, launch
from .metrics import plot_loss, read_metrics, training_callbacks
from .preflight import evaluate_preflight
from .adapter import ADAPTER_FILE, CONFIG_FILE, adapter_config, expected_lora_shapes, extract_adapter, write_adapter_config

STAGE = "sft"
_STEP = re.compile(r"(\d+)")


class SFTStageError(ValueError):
    """A problem with the SFT stage's inputs or data that a user must fix (not worth a retry)."""


def _upstream(paths: RunPaths, stage: str, keys: tuple[str, ...], suffix: str) -> str | None:
    """A file named by an upstream manifest: metrics[key] (str, or dict with uri/path), else the output
    ending in `suffix` with the highest numbers in its path (steps); relative values resolve in its folder."""
    uri = paths.stage_uri(stage)
    m = read_manifest(uri, paths.endpoint_url)
    if m is None:
        return None
    values = [m.metrics.get(k) for k in keys]
    values = [v.get("uri") or v.get("path") if isinstance(v, dict) else v for v in values]
    found = [o["path"] for o in m.outputs if o["path"].endswith(suffix) and "trainable" not in o["path"]]
    value = next((str(v) for v in values if v), None) or max(
        found, key=lambda p: [int(x) for x in _STEP.findall(p)], default=None)
    if value is None:
        return None
    return value if is_s3(value) or Path(value).is_absolute() else join(uri, value)


def find_base_checkpoint(cfg, paths: RunPaths, explicit: str | None = None) -> str | None:
    """The base .ckpt: `explicit`, else the pretrain stage's latest checkpoint, else model.base_checkpoint."""
    return explicit or _upstream(paths, "pretrain", ("latest_checkpoint", "checkpoint"), ".ckpt") \
        or cfg.model.base_checkpoint


def find_tokenizer(cfg, paths: RunPaths) -> str | None:
    """tokenizer.path, else the data stage's tokenizer.model."""
    return cfg.tokenizer.path or _upstream(paths, "data", ("tokenizer",), "tokenizer.model")


def _local(uri: str, cache: Path, endpoint_url: str | None, sidecar: str | None = None) -> Path:
    """An absolute local path for a local or s3:// file (downloaded into `cache`, with `sidecar` beside it)."""
    if not is_s3(uri):
        return Path(uri).resolve()
    store, folder = store_for(uri, endpoint_url), uri.rsplit("/", 1)[0]
    if sidecar and store.exists(f"{folder}/{sidecar}"):
        store.get_file(f"{folder}/{sidecar}", cache / sidecar)
    return Path(store.get_file(uri, cache / uri.rsplit("/", 1)[-1])).resolve()


def _identity(cfg, base_sha: str, data_sha: str) -> str:
    """What a resumable attempt must share: stage config, training knobs SFT reuses, base and data."""
    training = cfg.training.model_dump(mode="json")
    for knob in ("timeout_seconds", "upload_checkpoints", "preflight_steps"):
        training.pop(knob)
    return config_hash({"stage": stage_hash(cfg, STAGE), "training": training, "base": base_sha, "data": data_sha})


def _write_yaml(cfg, out_dir: Path, data_dir: Path, load: Path, rows: int, *, resume: Path | None = None,
                steps: int | None = None) -> Path:
    """The mindformers LoRA finetune yaml (mindformers_yaml) plus the metrics and loss-guard callbacks.

    `resume` (a checkpoint file of out_dir/checkpoint/rank_N) resumes: mindformers 1.9 wants the checkpoint
    folder as load_checkpoint and the file name as resume_training (a file path is refused)."""
    import yaml

    run = build_run_config(cfg, stage="sft", dataset_dir=str(data_dir), output_dir=str(out_dir),
                           load_checkpoint=str(resume.parent.parent if resume else load), resume=bool(resume),
                           train_rows=rows, steps=steps)
    if resume:
        run["resume_training"] = resume.name
    batch, dp, guard = run["train_dataset"]["batch_size"], cfg.parallel.data_parallel, cfg.training.guard
    run["callbacks"] += training_callbacks(out_dir, tokens_per_step=batch * dp * cfg.model.seq_length,
                                           batch_size=batch, data_parallel=dp, num_rows=rows,
                                           spike_factor=guard.spike_factor, window=guard.window)
    path = out_dir / "sft.yaml"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# LoRA finetune of {load} ({run['lr_schedule']['total_steps']} steps), generated by "
                    "pipeline_lib.train.sft_stage.\n# Run: python -m pipeline_lib.train.sft_stage --yaml <this file>\n"
                    + yaml.safe_dump(run, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def _launch(cfg, yaml_path: Path, out_dir: Path, log, on_tick=None):
    command = build_command(cfg.parallel, yaml_path, log_dir=out_dir / "msrun", entry_module="pipeline_lib.train.sft_stage")
    return launch(command, log=log, cwd=out_dir / "cwd", timeout_s=cfg.training.timeout_seconds,
                  log_dir=out_dir / "msrun", on_tick=on_tick, guard_dir=out_dir)


def _preflight(cfg, out: Path, base: Path, rows: int, log) -> dict:
    steps, pre = cfg.training.preflight_steps, out / "preflight"
    shutil.rmtree(pre, ignore_errors=True)
    result = _launch(cfg, _write_yaml(cfg, pre, out / "data", base, rows, steps=steps), pre, log)
    verdict = evaluate_preflight(read_metrics(pre / "metrics.jsonl"), expected_steps=steps,
                                 peak_rss_bytes=result.peak_rss_bytes)
    shutil.rmtree(pre, ignore_errors=True)
    log(f"sft: {verdict.message}")
    if not verdict.ok:
        raise SFTStageError(f"sft preflight: {verdict.message}")
    return {"message": verdict.message, "loss_first": verdict.summary.loss_first,
            "loss_last": verdict.summary.loss_last, "step_time_ms": verdict.summary.step_time_ms}


def _train(cfg, out: Path, base: Path, rows: int, identity: str, log, progress, upload, endpoint) -> dict:
    """Preflight, then train (or resume) in out/train; returns the final checkpoint and the losses."""
    train_dir, steps = out / "train", cfg.sft.steps
    ident_file = train_dir / "identity.json"
    manager = CheckpointManager(train_dir, ranks=range(cfg.parallel.data_parallel), log=log,
                                keep=cfg.training.keep_checkpoint_max, upload_uri=upload, endpoint_url=endpoint)
    latest = manager.latest() if ident_file.exists() and json.loads(ident_file.read_text())["identity"] == identity \
        else None
    if latest is not None and not Path(latest["path"]).exists():
        latest = None
    info: dict = {"resumed": latest is not None, "preflight": None}
    if latest is None:
        shutil.rmtree(train_dir, ignore_errors=True)
        if cfg.training.preflight_steps:
            info["preflight"] = _preflight(cfg, out, base, rows, log)
        train_dir.mkdir(parents=True)
        ident_file.write_text(json.dumps({"identity": identity}), encoding="utf-8")
    if latest is None or (latest.get("global_step") or 0) < steps:
        load = Path(latest["path"]) if latest else base
        log(f"sft: training {steps} steps from {load.name}" + (" (resume)" if latest else ""))

        def tick():
            manager.sync()
            if progress:
                progress("train", min(len(read_metrics(train_dir / "metrics.jsonl")), steps), steps)

        yaml_path = _write_yaml(cfg, train_dir, out / "data", base, rows, resume=latest and load)
        if latest is None or not (out / "sft.yaml").exists():  # the stage's yaml: the run from the base
            shutil.copyfile(yaml_path, out / "sft.yaml")
        _launch(cfg, yaml_path, train_dir, log, on_tick=tick)
        latest = manager.latest()
    if latest is None:
        raise SFTStageError(f"training left no verified checkpoint in {train_dir}/checkpoint: see the log above; "
                            "check training.save_steps and the disk")
    # a resumed attempt repeats the steps after its checkpoint: keep the last record of each step
    records = sorted({r["step"]: r for r in read_metrics(train_dir / "metrics.jsonl")}.values(), key=lambda r: r["step"])
    if records:
        plot_loss(records, out / "loss.png", title="SFT loss (LoRA)")
    losses = [r.get("loss") for r in records]
    return {**info, "checkpoint": latest["path"], "steps": latest.get("global_step"),
            "loss_first": losses[0] if losses else float("nan"), "loss_last": losses[-1] if losses else float("nan")}


def run_sft_stage(cfg, paths: RunPaths, log=print, progress=None, *, base_checkpoint: str | None = None) -> Manifest:
    """Run the SFT stage (see the module docstring); returns the manifest it wrote."""
    log = log or (lambda msg: None)
    started = time.time()
    base_ref = find_base_checkpoint(cfg, paths, base_checkpoint)
    if not base_ref:
        raise SFTStageError("model.base_checkpoint=None: no base checkpoint; run the pretrain stage (its manifest "
                            "names latest_checkpoint) or set model.base_checkpoint to a mindformers .ckpt")
    tok_ref = find_tokenizer(cfg, paths)
    if not tok_ref:
        raise SFTStageError("tokenizer.path=None: no tokenizer; run the data stage first or set tokenizer.path")
    uri = paths.stage_uri(STAGE)
    invalidate(uri, paths.endpoint_url)  # first: a stage being redone is never seen as done
    out = Path(tempfile.mkdtemp(prefix="sft-")) if is_s3(uri) else Path(uri).resolve()
    for stale in ("adapter", "loss.png", "_work"):  # train/ stays: it is what a rerun resumes from
        shutil.rmtree(out / stale, ignore_errors=True) if (out / stale).is_dir() else (out / stale).unlink(missing_ok=True)
    cache = out / "_work"
    base = _local(base_ref, cache, paths.endpoint_url)
    if not base.is_file():
        raise SFTStageError(f"base checkpoint {base_ref!r} does not exist: point model.base_checkpoint (or the "
                            "pretrain stage) at a mindformers .ckpt file")
    tok = _local(tok_ref, cache, paths.endpoint_url, sidecar="tokenizer_config.json")
    base_sha = sha256_file(base)
    log(f"sft: base {base_ref} (sha256 {base_sha[:12]}), tokenizer {tok_ref}")

    if progress:
        progress("data", 0, 1)
    stats = prepare_sft_data(cfg, tok, out, paths.endpoint_url, log)
    rows = stats["total"]["rows"]
    upload = join(uri, "train_checkpoints") if cfg.training.upload_checkpoints else None
    train = _train(cfg, out, base, rows, _identity(cfg, base_sha, stats["rows_sha256"]), log, progress, upload, paths.endpoint_url)

    log(f"sft: extracting the adapter from {Path(train['checkpoint']).name}")
    expected = expected_lora_shapes(cfg.model, list(cfg.sft.target_modules), cfg.sft.lora_rank)
    result = extract_adapter(train["checkpoint"], base, out / "adapter", expected)
    if sha256_file(base) != base_sha:
        raise SFTStageError(f"base checkpoint {base_ref!r} changed on disk during SFT (sha256 {base_sha[:12]} -> "
                            f"{sha256_file(base)[:12]}): something else writes to it; keep the base read-only")
    base_info = {"uri": base_ref, "sha256": base_sha, "size": base.stat().st_size}
    write_adapter_config(out / "adapter", adapter_config(cfg, base=base_info, result=result,
                                                         source=os.path.relpath(train["checkpoint"], out)))
    shutil.rmtree(cache, ignore_errors=True)
    rels = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    rels = [r for r in rels if not r.startswith(("train/", "preflight/", "_work/")) and r != "manifest.json"]
    rels += [r for r in ("train/metrics.jsonl", "train/latest_checkpoint.json") if (out / r).exists()]
    store = store_for(uri, paths.endpoint_url)
    if is_s3(uri):
        for rel in rels:
            store.put_file(out / rel, join(uri, rel))
    outputs = [{"path": r, "size": (out / r).stat().st_size, "sha256": sha256_file(out / r)} for r in rels]
    t = stats["total"]
    metrics = {
        "adapter_checkpoint": f"adapter/{ADAPTER_FILE}", "adapter_config": f"adapter/{CONFIG_FILE}",
        "base_checkpoint": base_ref, "base_sha256": base_sha, "tokenizer": tok_ref,
        "trainable_params": result["lora_numel"], "steps": train["steps"], "loss_first": train["loss_first"],
        "loss_last": train["loss_last"], "resumed": train["resumed"], "preflight": train.get("preflight"),
        "samples": {k: t[k] for k in ("read", "rejected_total", "dropped_total", "kept", "rows", "row_trained_tokens")},
        "seconds": round(time.time() - started, 1),
        "tables": {"sft_data": {"description": "SFT samples per input file (read = rejected + dropped + kept)",
                                "rows": table_rows(stats)}},
        "images": {"loss": "loss.png"} if (out / "loss.png").exists() else {},
    }
    manifest = Manifest(stage=STAGE, run_id=paths.run_id, config_hash=stage_hash(cfg, STAGE),
                        inputs={"base_checkpoint": base_ref, "base_sha256": base_sha, "tokenizer": tok_ref},
                        outputs=outputs, metrics=metrics)
    log(f"sft: done in {metrics['seconds']} s, loss {train['loss_first']:.4f} -> {train['loss_last']:.4f}, "
        f"{result['lora_numel']:,} LoRA parameters -> {uri}/adapter")
    write_manifest(uri, manifest, paths.endpoint_url)
    if is_s3(uri):
        shutil.rmtree(out, ignore_errors=True)
    return manifest


def _trainer_main(argv: list[str]) -> int:
    """Trainer process: register the pipeline's callbacks, then run pipeline_lib.train.entry."""
    import yaml

    yaml_path = argv[argv.index("--yaml") + 1]
    output_dir = yaml.safe_load(Path(yaml_path).read_text(encoding="utf-8")).get("output_dir") or "./output"
    os.environ.setdefault("LOG_MF_PATH", os.path.join(output_dir, "log"))
    os.environ.setdefault("MS_OM_PATH", os.path.join(output_dir, "om"))
    os.environ.setdefault("GLOG_v", "3")
    import pipeline_lib.train.callbacks  # noqa: F401  (registers PipelineMetrics and LossGuard)
    from pipeline_lib.train import entry

    return entry.main(argv)


if __name__ == "__main__":
    sys.exit(_trainer_main(sys.argv[1:]))
