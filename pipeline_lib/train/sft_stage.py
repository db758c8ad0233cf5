"""The SFT stage: instruction data -> LoRA finetune of the pretrained base -> an adapter kept apart from the base.

What `run_sft_stage(cfg, paths, log=..., progress=..., base_checkpoint=None)` does, in order:
1. inputs: the tokenizer (tokenizer.path, else the data stage's) and the base checkpoint (the argument, else
   the pretrain manifest's `metrics.latest_checkpoint`, else model.base_checkpoint); sha256 of the base.
2. data (data/sft_records.py): sft.inputs -> chat template -> labels -> rows -> `data/sft.mindrecord` (input_ids
   + labels), `quarantine.jsonl`, `excluded.jsonl`, `sft_stats.json` (read = rejected + dropped + kept).
3. train, as the pretrain stage does (train/stage.py: same launcher, work folder, node rank, checkpoint
   manager): `sft.yaml` is the mindformers LoRA finetune (pet_config, run_mode finetune, load_checkpoint = the
   base, then `Trainer.train()`) plus the PipelineMetrics / LossGuard callbacks, run in its own process with
   output_dir `train/`. A preflight of training.preflight_steps runs on a fresh start (`preflight.json`; a bad
   verdict raises SFTPreflightFailed). Checkpoints are verified, pruned and named by
   `train/latest_checkpoint.json`; a rerun of the same run (config, base sha256, rows) resumes from it.
4. adapter (train/adapter.py): `adapter/adapter.ckpt` holds the LoRA factors only, `adapter/adapter_config.json`
   rank, alpha, targets and the base's sha256; extraction checks that only LoRA was trained and every frozen
   weight equals the base bitwise. The base file is only read (its sha256 is checked again at the end).
5. `loss.png` and the manifest (last): metrics `adapter_checkpoint`, `base_checkpoint` (what evaluate and
   export read), losses, counts, a data table and the loss image for the UI.

Limits: the loss guard (sft.guard) stops SFT (its on_failure=rollback is not applied here). Raises SFTStageError (inputs and data, naming the field and fix),
SFTPreflightFailed, AdapterError, InsufficientDiskError and the launcher's GuardTripped / TrainerKilled
(transient) / TrainingTimeout / TrainingLaunchError.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

from ..config.load import config_hash
from ..config.mindformers_yaml import build_run_config
from ..config.platform import device_target
from ..config.schema import sft_accumulation
from ..config.validate import preflight_steps_issues
from ..data.sft_records import STATS_FILE, prepare_sft_data, table_rows
from ..data.tokenizer import TokenIds
from ..stages import stage_hash, stage_inputs
from ..storage import Manifest, RunPaths, invalidate, is_s3, join, read_manifest, sha256_file, store_for, write_manifest
from .adapter import ADAPTER_FILE, CONFIG_FILE, adapter_config, expected_lora_shapes, extract_adapter, write_adapter_config
from .checkpoints import CheckpointManager, check_free_disk
from .launch import GuardTripped, TrainingLaunchError
from .metrics import plot_loss, read_metrics, training_callbacks
from .preflight import evaluate_preflight
from .stage import _launch, _local_ranks, _node_rank, _work_dir, describe_guard

STAGE = "sft"
_NUMBERS = re.compile(r"(\d+)")


class SFTStageError(ValueError):
    """A problem with the SFT stage's inputs or data that a user must fix (not worth a retry)."""


class SFTPreflightFailed(SFTStageError):
    """The preflight's verdict was bad; the message lists each problem with its fix."""


def _upstream(paths: RunPaths, stage: str, keys: tuple[str, ...], suffix: str) -> str | None:
    """A file an upstream manifest names: metrics[key] (str, or dict with uri/path), else its output ending in
    `suffix` with the highest numbers in its path; relative values are resolved in that stage's folder."""
    uri = paths.stage_uri(stage)
    m = read_manifest(uri, paths.endpoint_url)
    if m is None:
        return None
    values = [v.get("uri") or v.get("path") if isinstance(v, dict) else v for v in (m.metrics.get(k) for k in keys)]
    found = [o["path"] for o in m.outputs if o["path"].endswith(suffix) and "trainable" not in o["path"]]
    value = next((str(v) for v in values if v), None) or max(
        found, key=lambda p: [int(x) for x in _NUMBERS.findall(p)], default=None)
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
        return Path(uri).expanduser().resolve()
    store, folder = store_for(uri, endpoint_url), uri.rsplit("/", 1)[0]
    if sidecar and store.exists(f"{folder}/{sidecar}"):
        store.get_file(f"{folder}/{sidecar}", cache / sidecar)
    return Path(store.get_file(uri, cache / uri.rsplit("/", 1)[-1])).resolve()


def _write_yaml(cfg, out_dir: Path, data_dir: Path, base: Path, rows: int, *, resume: Path | None = None,
                steps: int | None = None) -> Path:
    """out_dir/sft.yaml: the LoRA finetune (mindformers_yaml stage 'sft') with the metrics and guard callbacks.

    `resume` (a file of out_dir/checkpoint/rank_N) resumes: mindformers 1.9 wants the checkpoint folder as
    load_checkpoint and the file name as resume_training (it refuses a file path)."""
    import yaml

    s, dp = cfg.sft, cfg.parallel.data_parallel
    on_cpu = device_target(cfg) == "CPU"
    accum = sft_accumulation(cfg)
    batch = s.micro_batch_size * (accum if on_cpu else 1)  # the CPU wrapper splits it into micro batches
    callbacks = training_callbacks(out_dir, tokens_per_step=s.micro_batch_size * accum * dp
                                   * cfg.model.seq_length, batch_size=batch, data_parallel=dp, num_rows=rows,
                                   spike_factor=s.guard.spike_factor, window=s.guard.window,
                                   shuffle_seed=cfg.run.seed if cfg.training.shuffle else None)
    # the tokenizer's special ids, as prepare_sft_data recorded them next to the rows (not cfg.tokenizer.*_id)
    stats = json.loads((data_dir.parent / STATS_FILE).read_text(encoding="utf-8"))
    run = build_run_config(cfg, stage="sft", dataset_dir=str(data_dir), output_dir=str(out_dir),
                           load_checkpoint=str(resume.parent.parent if resume else base), resume=bool(resume),
                           train_rows=rows, steps=steps, extra_callbacks=callbacks,
                           token_ids=TokenIds.from_meta(stats["token_ids"]))
    if resume:
        run["resume_training"] = resume.name
    path = out_dir / "sft.yaml"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# LoRA finetune of {base} ({run['lr_schedule']['total_steps']} steps), written by "
                    "pipeline_lib.train.sft_stage.\n# Run: python -m pipeline_lib.train.entry --yaml <this file>\n"
                    + yaml.safe_dump(run, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def _preflight(cfg, out: Path, base: Path, rows: int, node_rank: int, log) -> dict:
    """training.preflight_steps steps in out/preflight; a crash or a NaN is a verdict, not an exception."""
    steps, pre = cfg.training.preflight_steps, out / "preflight"
    shutil.rmtree(pre, ignore_errors=True)
    log(f"sft: preflight of {steps} steps in {pre}")
    crash = None
    try:
        result = _launch(cfg, _write_yaml(cfg, pre, out / "data", base, rows, steps=steps), pre, node_rank, log)
    except GuardTripped as err:
        result = err.result
    except TrainingLaunchError as err:
        result, crash = err.result, str(err).splitlines()[0]
    verdict = evaluate_preflight(read_metrics(pre / "metrics.jsonl"), expected_steps=steps,
                                 peak_rss_bytes=result.peak_rss_bytes or None)
    s = verdict.summary
    report = {"ok": verdict.ok and crash is None, "message": verdict.message, "problems": verdict.problems,
              "crash": crash, "steps": s.steps, "step_time_ms": s.step_time_ms, "tokens_per_s": s.tokens_per_s,
              "loss_first": s.loss_first, "loss_last": s.loss_last, "peak_rss_bytes": result.peak_rss_bytes,
              "seconds": round(result.duration_s, 1)}
    (out / "preflight.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    shutil.rmtree(pre, ignore_errors=True)
    log(f"sft: {verdict.message}" + (f"; the trainer failed: {crash}" if crash else ""))
    if not report["ok"]:
        raise SFTPreflightFailed(f"sft {verdict.message}" + (f"\n- the trainer failed: {crash}" if crash else "")
                                 + f"\n(see {out / 'preflight.json'})")
    return report


def _train(cfg, out: Path, base: Path, rows: int, identity: str, log, progress, upload, endpoint) -> dict:
    """Preflight, then train or resume in out/train; returns the final checkpoint, losses and resume facts."""
    train_dir, steps, node_rank = out / "train", cfg.sft.steps, _node_rank(cfg)
    ranks, ident_file = _local_ranks(cfg, node_rank), train_dir / "identity.json"
    manager = CheckpointManager(train_dir, ranks=ranks, log=log, keep=cfg.training.keep_checkpoint_max,
                                upload_uri=upload, endpoint_url=endpoint)
    same_run = ident_file.exists() and json.loads(ident_file.read_text())["identity"] == identity
    if same_run:
        manager.sync()  # verify what a killed attempt left behind
    latest = manager.latest() if same_run else None
    if latest is not None and not all(Path(r["path"]).exists() for r in latest["ranks"].values()):
        latest = None
    info: dict = {"resumed_from_step": latest["step"] if latest else None, "preflight": None}
    check_free_disk(out, int(base.stat().st_size * 1.2), copies=2, ranks_on_node=len(ranks))
    if latest is None:
        shutil.rmtree(train_dir, ignore_errors=True)
        if cfg.training.preflight_steps:
            info["preflight"] = _preflight(cfg, out, base, rows, node_rank, log)
        train_dir.mkdir(parents=True)
        ident_file.write_text(json.dumps({"identity": identity}), encoding="utf-8")
    if latest is None or (latest.get("global_step") or 0) < steps:
        start = Path(latest["path"]) if latest else None
        yaml_path = _write_yaml(cfg, train_dir, out / "data", base, rows, resume=start)
        if start is None or not (out / "sft.yaml").exists():  # the stage's yaml is the run from the base
            shutil.copyfile(yaml_path, out / "sft.yaml")
        log(f"sft: training {steps} steps from " + (f"{start.name} (resume)" if start else str(base)))

        def tick():
            manager.sync()
            records = read_metrics(train_dir / "metrics.jsonl")
            if progress and records:
                progress("train", min(max(r["step"] for r in records), steps), steps)

        try:
            _launch(cfg, yaml_path, train_dir, node_rank, log, on_tick=tick)
        except GuardTripped as err:
            manager.sync()
            why = describe_guard(err.diagnoses[0], manager.latest(), stage="sft")
            raise GuardTripped(why.replace("training.learning_rate", "sft.learning_rate") + "; rerun to resume\n"
                               + str(err), err.result, err.diagnoses) from None
        manager.sync()
        latest = manager.latest()
    if latest is None or (latest.get("global_step") or 0) < steps:
        raise SFTStageError(f"sft.steps={steps}: training stopped at optimizer step "
                            f"{latest and latest.get('global_step')} without an error; see {train_dir}/log")
    records = read_metrics(train_dir / "metrics.jsonl")  # each step once, also after a resume
    if records:
        plot_loss(records, out / "loss.png", title=f"SFT loss (LoRA r={cfg.sft.lora_rank})")
    rank = min(latest["ranks"], key=int)
    return {**info, "checkpoint": latest["ranks"][rank]["path"], "steps": latest.get("global_step"),
            "loss_first": records[0]["loss"] if records else None, "loss_last": records[-1]["loss"] if records else None}


def run_sft_stage(cfg, paths: RunPaths, log=print, progress=None, *, base_checkpoint: str | None = None) -> Manifest:
    """Run the SFT stage (see the module docstring); returns the manifest it wrote."""
    log = log or (lambda msg: None)
    started, uri, endpoint = time.time(), paths.stage_uri(STAGE), paths.endpoint_url
    for issue in preflight_steps_issues(cfg):  # the rule `validate` applies
        raise SFTStageError(str(issue))
    base_ref, tok_ref = find_base_checkpoint(cfg, paths, base_checkpoint), find_tokenizer(cfg, paths)
    if not (base_ref and tok_ref):
        raise SFTStageError(f"model.base_checkpoint={base_ref!r}, tokenizer.path={tok_ref!r}: SFT needs both; run the "
                            "data and pretrain stages (their manifests name them) or set these fields")
    invalidate(uri, endpoint)  # a stage being redone is never seen as done
    out = _work_dir(uri)  # the stage folder, or a fixed local folder per s3:// stage (reruns resume there)
    for stale in ("adapter", "_inputs", "loss.png"):  # train/ stays: a rerun resumes from it
        shutil.rmtree(out / stale) if (out / stale).is_dir() else (out / stale).unlink(missing_ok=True)
    base = _local(base_ref, out / "_inputs", endpoint)
    if not base.is_file():
        raise SFTStageError(f"base checkpoint {base_ref!r} is not a file: point model.base_checkpoint (or the pretrain "
                            "stage) at a mindformers .ckpt")
    tok = _local(tok_ref, out / "_inputs", endpoint, sidecar="tokenizer_config.json")
    base_sha = sha256_file(base)
    log(f"sft: base {base_ref} (sha256 {base_sha[:12]}), tokenizer {tok_ref}")
    if progress:
        progress("data", 0, 1)
    stats = prepare_sft_data(cfg, tok, out, endpoint, log)
    training = {k: v for k, v in cfg.training.model_dump(mode="json").items()
                if k not in ("timeout_seconds", "upload_checkpoints", "preflight_steps")}
    identity = config_hash({"stage": stage_hash(cfg, STAGE), "training": training, "base": base_sha,
                            "rows": stats["rows_sha256"]})
    upload = join(uri, "train", "checkpoint") if cfg.training.upload_checkpoints and is_s3(uri) else None
    train = _train(cfg, out, base, stats["total"]["rows"], identity, log, progress, upload, endpoint)

    log(f"sft: extracting the adapter from {Path(train['checkpoint']).name}")
    expected = expected_lora_shapes(cfg.model, list(cfg.sft.target_modules), cfg.sft.lora_rank)
    result = extract_adapter(train["checkpoint"], base, out / "adapter", expected)
    if sha256_file(base) != base_sha:
        raise SFTStageError(f"base checkpoint {base_ref!r} changed on disk during SFT (sha256 {base_sha[:12]} -> "
                            f"{sha256_file(base)[:12]}): something else writes to it; keep the base read-only")
    base_info = {"uri": base_ref, "sha256": base_sha, "size": base.stat().st_size}
    write_adapter_config(out / "adapter", adapter_config(
        cfg, base=base_info, result=result, source=Path(train["checkpoint"]).relative_to(out).as_posix()))
    shutil.rmtree(out / "_inputs", ignore_errors=True)
    rels = [p.relative_to(out).as_posix() for d in (out, out / "adapter", out / "data") for p in sorted(d.iterdir())
            if p.is_file() and p.name != "manifest.json"]
    rels += [r for r in ("train/metrics.jsonl", "train/latest_checkpoint.json") if (out / r).exists()]
    for rel in rels if is_s3(uri) else ():
        store_for(uri, endpoint).put_file(out / rel, join(uri, rel))
    outputs = [{"path": r, "size": (out / r).stat().st_size, "sha256": sha256_file(out / r)} for r in rels]
    t = stats["total"]
    metrics = {
        "adapter_checkpoint": f"adapter/{ADAPTER_FILE}", "adapter_config": f"adapter/{CONFIG_FILE}",
        "base_checkpoint": base_ref, "base_sha256": base_sha, "tokenizer": tok_ref,
        "trainable_params": result["lora_numel"], "steps": train["steps"], "loss_first": train["loss_first"],
        "loss_last": train["loss_last"], "resumed": train["resumed_from_step"] is not None,
        "resumed_from_step": train["resumed_from_step"], "preflight": train["preflight"],
        "samples": {k: t[k] for k in ("read", "rejected_total", "dropped_total", "kept", "rows", "row_trained_tokens")},
        "seconds": round(time.time() - started, 1),
        "tables": {"sft_data": {"description": "SFT samples per input file (read = rejected + dropped + kept)",
                                "rows": table_rows(stats)}},
        "images": {"loss": "loss.png"} if (out / "loss.png").exists() else {},
    }
    manifest = Manifest(stage=STAGE, run_id=paths.run_id, config_hash=stage_hash(cfg, STAGE),
                        inputs=stage_inputs(paths, STAGE), outputs=outputs, metrics=metrics)
    write_manifest(uri, manifest, endpoint)
    log(f"sft: done in {metrics['seconds']} s, loss {train['loss_first']:.4f} -> {train['loss_last']:.4f}, "
        f"{result['lora_numel']:,} LoRA parameters -> {join(uri, 'adapter')}")
    return manifest
