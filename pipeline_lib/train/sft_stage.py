"""The SFT stage: instruction data -> LoRA finetune of the pretrained base -> an adapter kept apart from the base.

`run_sft_stage(run, base_checkpoint=None)` (the stage contract: runtime/contract.py) reads, top to bottom, as its steps:
1. inputs (`_resolve_inputs`, `_fetch_inputs`): the tokenizer (tokenizer.path, else the data manifest's) and the
   base checkpoint (the argument, else the pretrain manifest's `metrics.latest_checkpoint`, else
   model.base_checkpoint), copied locally from an s3:// store; sha256 of the base.
2. data (train/sft_data.py): sft.inputs -> chat template -> labels -> rows -> `data/sft.mindrecord` (input_ids
   + labels), `quarantine.jsonl`, `excluded.jsonl`, `sft_stats.json` (read = rejected + dropped + kept).
3. train on the runner the pretrain stage uses (session.TrainingSession, output_dir `train/`): resume when
   `train/identity.json` is this run's (`run.identity`, the training knobs SFT reuses, the base's sha256, the rows)
   and `train/latest_checkpoint.json` names a verified checkpoint; a preflight of training.preflight_steps on a
   fresh start (`preflight.json`; a bad verdict raises SFTPreflightFailed); `train/sft.yaml` is the mindformers LoRA
   finetune (pet_config, run_mode finetune, load_checkpoint = the base) plus the PipelineMetrics / LossGuard
   callbacks, its fresh start also written as `sft.yaml`; checkpoints verified on ticks within a CPU budget, each
   then cut to the LoRA factors + their optimizer state (train.checkpoint_split; the frozen weights found byte for byte
   in the base, whose path, sha256 and size the sidecar names; not under tensor parallel) and resumed joined. The loss guard (sft.guard)
   stops the stage with the diagnosis naming sft.* knobs (its on_failure=rollback is not applied to SFT).
4. adapter (train/adapter.py): `adapter/adapter.ckpt` holds the LoRA factors only, `adapter/adapter_config.json`
   rank, alpha, targets and the base's sha256; extraction checks that only LoRA was trained and every frozen
   weight equals the base bitwise. The base file is only read (its sha256 is checked again at the end).
5. publish: `loss.png` and the stage's files, described (size, sha256) and uploaded on an s3:// store; the local
   work folder of an s3:// run is removed.
6. summarise: metrics `adapter_checkpoint`, `base_checkpoint` (what evaluate and export read), losses, counts, a
   data table and the loss image for the UI. The registry writes the manifest from the returned StageOutput.

Raises SFTStageError (inputs and data, naming the field and fix), SFTPreflightFailed, AdapterError,
InsufficientDiskError and the launcher's GuardTripped / TrainerKilled (transient) / TrainingTimeout /
TrainingLaunchError.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ..model.checkpoint_format import mindformers_base
from ..config.load import config_hash
from ..config.schema import sft_accumulation
from ..config.validate import preflight_steps_issues
from .sft_data import prepare_sft_data, table_rows
from ..model.token_ids import TokenIds
from ..runtime.contract import StageOutput, StageRun
from ..storage import join, sha256_file, store_for
from .adapter import (ADAPTER_FILE, CONFIG_FILE, adapter_config, expected_lora_shapes, extract_adapter, is_lora_param,
                      write_adapter_config)
from .checkpoint_split import optimizer_file
from ..planner.disk import lora_only_checkpoints, sft_checkpoint_disk
from .mindformers_yaml import sft_base_path_issue
from .session import Batch, StageYaml, TrainingSession, loss_history, tensorboard_dir, work_dir

STAGE = "sft"
SFT_YAML = "sft.yaml"
LOSS_PNG = "loss.png"


class SFTStageError(ValueError):
    """A problem with the SFT stage's inputs or data that a user must fix (not worth a retry)."""


class SFTPreflightFailed(SFTStageError):
    """The preflight's verdict was bad; the message lists each problem with its fix."""


def run_sft_stage(run: StageRun, *, base_checkpoint: str | None = None) -> StageOutput:
    """Run the SFT stage (see the module docstring); returns its outputs and metrics."""
    started, cfg, log = time.time(), run.cfg, run.log or (lambda msg: None)
    # 1. inputs
    for issue in preflight_steps_issues(cfg):  # the rule `validate` applies
        raise SFTStageError(str(issue))
    base_ref, tok_ref = _resolve_inputs(run, base_checkpoint)
    out = work_dir(run.uri, run.node_rank, create=True)  # the stage folder, or a fixed local folder (reruns resume there)
    for stale in ("adapter", "_inputs", LOSS_PNG):  # train/ stays: a rerun resumes from it
        shutil.rmtree(out / stale) if (out / stale).is_dir() else (out / stale).unlink(missing_ok=True)
    base, tok, base_sha = _fetch_inputs(run, base_ref, tok_ref, out / "_inputs")
    # 2. data
    if run.progress:
        run.progress("data", 0, 1)
    stats = prepare_sft_data(cfg, tok, out, run.endpoint, log, stage_uri=run.uri if run.remote else None)
    # 3. train, 4. adapter
    train = _train(run, out, base, base_sha, stats)
    adapter = _extract_adapter(cfg, out, train["checkpoint"], base, base_ref, base_sha, log)
    shutil.rmtree(out / "_inputs", ignore_errors=True)
    # 5. publish, 6. summarise (the registry writes the manifest)
    outputs = _publish(run, out)
    metrics = _metrics(run, out, train, adapter, stats, base_ref=base_ref, base_sha=base_sha, tok_ref=tok_ref,
                       started=started)
    if run.remote or run.node_rank:  # everything is in the run store now
        shutil.rmtree(out, ignore_errors=True)
    log(f"sft: done in {metrics['seconds']} s, loss {train['loss_first']:.4f} -> {train['loss_last']:.4f}, "
        f"{adapter['lora_numel']:,} LoRA parameters -> {join(run.uri, 'adapter')}")
    return StageOutput(outputs, metrics)


# ---------------------------------------------------------------- 1. inputs

def find_base_checkpoint(run: StageRun, explicit: str | None = None) -> str | None:
    """The base .ckpt: `explicit`, else the pretrain stage's latest checkpoint, else model.base_checkpoint."""
    from ..model.checkpoint_cache import pretrain_checkpoint

    # a tensor/pipeline-parallel pretrain hands over the merged copy of its rank files (docs/checkpoints.md)
    return explicit or pretrain_checkpoint(run.paths, run.upstream, run.log) or run.cfg.model.base_checkpoint


def _resolve_inputs(run: StageRun, base_checkpoint: str | None) -> tuple[str, str]:
    from ..model.tokenizer_lineage import TokenizerMismatch, require_same_tokenizer
    from ..runtime.upstream import find_tokenizer

    base_ref, tok_ref = find_base_checkpoint(run, base_checkpoint), find_tokenizer(run.cfg, run.paths, run.upstream)
    if not (base_ref and tok_ref):
        raise SFTStageError(f"model.base_checkpoint={base_ref!r}, tokenizer.path={tok_ref!r}: SFT needs both; run the "
                            "data and pretrain stages (their manifests name them) or set these fields")
    try:  # the base's own tokenizer (a pipeline checkpoint carries it) must be the one SFT encodes with
        require_same_tokenizer(base_ref, tok_ref, run.endpoint, what="the SFT base")
    except TokenizerMismatch as err:
        raise SFTStageError(str(err)) from None
    return base_ref, tok_ref


def _local(uri: str, cache: Path, endpoint_url: str | None, sidecar: str | None = None) -> Path:
    """An absolute local path for a local or s3:// file (downloaded into `cache`, with `sidecar` beside it)."""
    store, folder = store_for(uri, endpoint_url), uri.rsplit("/", 1)[0]
    if not store.remote:
        return store.local_path(uri).expanduser().resolve()
    if sidecar and store.exists(f"{folder}/{sidecar}"):
        store.get_file(f"{folder}/{sidecar}", cache / sidecar)
    return Path(store.get_file(uri, cache / uri.rsplit("/", 1)[-1])).resolve()


def _unranked(base: Path, cache: Path) -> Path:
    """The base under `cache/base/` (a hard link, else a copy): mindformers takes a file with rank_<N> in its path for
    one rank's shard, which a sharded SFT would load after compile (mindformers_yaml.sft_base_path_issue)."""
    dest = cache / "base" / base.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)  # made again each time: a stale copy must never stand in for the base
    try:
        os.link(base, dest)
    except OSError:  # another filesystem
        shutil.copyfile(base, dest)
    return dest


def _fetch_inputs(run: StageRun, base_ref: str, tok_ref: str, cache: Path) -> tuple[Path, Path, str]:
    """(local base .ckpt, local tokenizer.model, the base's sha256)."""
    base = _local(base_ref, cache, run.endpoint)
    if not base.is_file():
        raise SFTStageError(f"base checkpoint {base_ref!r} is not a file: point model.base_checkpoint (or the pretrain "
                            "stage) at a mindformers .ckpt")
    if sft_base_path_issue(run.cfg, str(base)):
        base = _unranked(base, cache)
    tok = _local(tok_ref, cache, run.endpoint, sidecar="tokenizer_config.json")
    base_sha = sha256_file(base)
    run.log(f"sft: base {base_ref} (sha256 {base_sha[:12]}), tokenizer {tok_ref}")
    return base, tok, base_sha


# ---------------------------------------------------------------- 3. train


def _train(run: StageRun, out: Path, base: Path, base_sha: str, stats: dict) -> dict:
    """Preflight, then train or resume in out/train; returns the final checkpoint, losses and resume facts."""
    cfg, rows, train_dir = run.cfg, stats["total"]["rows"], out / "train"
    remote = join(run.uri, "train") if run.remote else None
    session = TrainingSession(cfg, stage=STAGE, out=train_dir, remote=remote, endpoint=run.endpoint, steps=cfg.sft.steps,
                              log=run.log, progress=run.progress, error=SFTStageError, preflight_error=SFTPreflightFailed)
    # run.identity already holds every training.* field the schema marks as shaping SFT's outputs
    if lora_only_checkpoints(cfg):
        # its checkpoints keep what LoRA trains and its optimizer state; the frozen weights are the base's (found
        # there byte for byte at each save: train.checkpoint_split), named with its sha256 and size for resume
        session.manager.keep_weight = is_lora_param
        session.manager.base = {"path": str(base), "sha256": base_sha, "size": base.stat().st_size}
    latest = session.resume_or_start(config_hash({"run": run.identity, "base": base_sha, "rows": stats["rows_sha256"]}))
    # sized from the layout as pretrain's (planner.disk: the LoRA factors and their moments x keep_checkpoint_max + 1,
    # + the whole file until it is split), not from the base file, whose size may count optimizer state
    session.check_disk(sft_checkpoint_disk(cfg, session.ranks))
    # the tokenizer's special ids, as prepare_sft_data recorded them next to the rows (not cfg.tokenizer.*_id)
    yaml = StageYaml(cfg, STAGE, Batch(cfg.sft.micro_batch_size, sft_accumulation(cfg), cfg.sft.guard), out / "data",
                     rows, SFT_YAML, SFT_YAML, load=mindformers_base(base, cfg.training.checkpoint_format, out / "_inputs"),
                     token_ids=TokenIds.from_meta(stats["token_ids"]),
                     tensorboard_dir=tensorboard_dir(cfg, run.paths.run_id, STAGE))
    yaml.write(out / SFT_YAML, train_dir)  # the stage's yaml: the run from the base (attempts write train/sft.yaml)
    trained = session.train(latest, yaml, origin=str(base), preflight_dir=out)
    records = loss_history(train_dir, out / LOSS_PNG, title=f"SFT loss (LoRA r={cfg.sft.lora_rank})")
    rank = min(trained.latest["ranks"], key=int)
    return {"checkpoint": trained.latest["ranks"][rank]["path"], "steps": trained.latest.get("global_step"),
            "resumed_from_step": trained.resumed_from_step, "preflight": trained.preflight,
            "loss_first": records[0]["loss"] if records else None, "loss_last": records[-1]["loss"] if records else None}


# ---------------------------------------------------------------- 4. adapter

def _extract_adapter(cfg, out: Path, checkpoint: str, base: Path, base_ref: str, base_sha: str, log) -> dict:
    """adapter/adapter.ckpt + adapter_config.json from the final checkpoint; the base must be unchanged."""
    log(f"sft: extracting the adapter from {Path(checkpoint).name}")
    expected = expected_lora_shapes(cfg.model, list(cfg.sft.target_modules), cfg.sft.lora_rank)
    split = json.loads(Path(checkpoint + ".verified.json").read_text(encoding="utf-8")).get("split") or {}
    result = extract_adapter(checkpoint, base, out / "adapter", expected,
                             optimizer=str(optimizer_file(checkpoint)) if split else None,
                             frozen_in_base=split.get("frozen_in_base"))
    if sha256_file(base) != base_sha:
        raise SFTStageError(f"base checkpoint {base_ref!r} changed on disk during SFT (sha256 {base_sha[:12]} -> "
                            f"{sha256_file(base)[:12]}): something else writes to it; keep the base read-only")
    base_info = {"uri": base_ref, "sha256": base_sha, "size": base.stat().st_size}
    write_adapter_config(out / "adapter", adapter_config(cfg, base=base_info, result=result,
                                                         source=Path(checkpoint).relative_to(out).as_posix()))
    return result


# ---------------------------------------------------------------- 5. publish

def _publish(run: StageRun, out: Path) -> list[dict]:
    """Describe (size, sha256) the stage's files and upload them to an s3:// stage folder. A node rank > 0 of a
    multi-node SFT publishes nothing: data parallel leaves the same adapter on every node, node 0's is the output."""
    if run.node_rank:
        return []
    rels = [p.relative_to(out).as_posix() for d in (out, out / "adapter", out / "data") for p in sorted(d.iterdir())
            if p.is_file() and p.name != "manifest.json"]
    rels += [r for r in ("train/metrics.jsonl", "train/latest_checkpoint.json") if (out / r).exists()]
    for rel in rels if run.remote else ():
        store_for(run.uri, run.endpoint).put_file(out / rel, join(run.uri, rel))
    return [{"path": r, "size": (out / r).stat().st_size, "sha256": sha256_file(out / r)} for r in rels]


# ---------------------------------------------------------------- 6. summarise

def _metrics(run: StageRun, out: Path, train: dict, adapter: dict, stats: dict, *, base_ref: str, base_sha: str,
             tok_ref: str, started: float) -> dict:
    t = stats["total"]
    return {
        "adapter_checkpoint": f"adapter/{ADAPTER_FILE}", "adapter_config": f"adapter/{CONFIG_FILE}",
        "base_checkpoint": base_ref, "base_sha256": base_sha, "tokenizer": tok_ref,
        "trainable_params": adapter["lora_numel"], "steps": train["steps"], "loss_first": train["loss_first"],
        "loss_last": train["loss_last"], "resumed": train["resumed_from_step"] is not None,
        "resumed_from_step": train["resumed_from_step"], "preflight": train["preflight"],
        "samples": {k: t[k] for k in ("read", "rejected_total", "dropped_total", "kept", "rows", "row_trained_tokens")},
        "seconds": round(time.time() - started, 1),
        "tables": {"sft_data": {"description": "SFT samples per input file (read = rejected + dropped + kept)",
                                "rows": table_rows(stats)}},
        "images": {"loss": LOSS_PNG} if (out / LOSS_PNG).exists() else {},
    }
