"""The pretraining stage: packed MindRecord shards (+ optional base weights) -> verified checkpoints and a loss history.

What `run_pretrain_stage(cfg, paths, log=..., progress=...)` does, in order:
1. inputs: the data stage's manifest (its `mindrecord/train` shards and row count) and the base weights:
   `model.base_checkpoint` (a mindformers .ckpt) or `model.hf_checkpoint` (a Hugging Face Llama folder, checked
   against model.* and converted by `model.hf` into `base/hf_import.ckpt`). A missing or mismatched base fails
   here, before anything is launched. Continued pretraining loads the base's weights only: optimizer state, step
   count and LR schedule start afresh (a nightly run is a new run on new data).
2. resume: when the stage folder holds `identity.json` of the same run (stage config hash, data manifest, base)
   and a verified `latest_checkpoint.json`, training continues from that checkpoint with `resume_training`
   (weights, AdamW moments, global step and so the LR position, the data position); otherwise the folder is
   emptied. A finished attempt that died before its manifest is not trained again.
3. free disk: `check_disk` for training.keep_checkpoint_max + 1 checkpoints of this node's rank shards
   (planner.disk: weights in param_init_type + fp32 AdamW moments, per pipeline stage / tensor-parallel shard).
4. preflight (training.preflight_steps > 0, fresh start only): N steps in `preflight/` (its own output_dir);
   step time, tokens/s, peak RSS of the process tree, loss finite and falling, planner prediction vs measured
   memory -> `preflight.json`; a bad verdict stops the stage with what to change (`PreflightFailed`).
5. train: `run.yaml` (mindformers_yaml + the PipelineMetrics / LossGuard callbacks) is exactly the yaml that is
   launched (`python -m pipeline_lib.train.entry --yaml run.yaml`, msrun for several ranks, own process group,
   timeout training.timeout_seconds, node rank from $LLM_PIPELINE_NODE_RANK); a resumed attempt launches
   `run_resume.yaml` (the same plus resume_training/load_checkpoint). Logs stream into `log`; ticks sync
   checkpoints (verify, keep training.keep_checkpoint_max, `latest_checkpoint.json`, upload when
   training.upload_checkpoints; verification takes at most ~5% of the wall time while the trainer runs, and runs
   again after every attempt) and report `progress("train", step, total)` from metrics.jsonl.
6. guard: a NaN/spike stops training at that step (callbacks.LossGuard); the stage raises `GuardTripped` whose
   message names step, loss, lr, loss scale, global norm and the batch's dataset rows. With
   training.guard.on_failure=rollback it instead resumes from the last good checkpoint with the data position
   moved past the bad step (the window last checkpoint+1 .. bad step is skipped), at most guard.max_rollbacks times.
7. outputs: `loss_curve.png`, the manifest (last) with run.yaml, metrics.jsonl, latest_checkpoint.json, the latest
   checkpoint file of each rank, preflight.json; metrics `latest_checkpoint` (absolute path, or URI on s3://),
   final loss, steps, tokens/s, a table of the last steps and the loss-curve image.

An s3:// run store trains in a local work folder ($LLM_PIPELINE_WORK_DIR or the temp dir, one per stage URI, so a
rerun on the same machine resumes; removed once the manifest is written) and uploads the outputs; with
training.upload_checkpoints the checkpoints (with `checkpoint/latest_checkpoint.json` and metrics.jsonl) are
uploaded as they are verified, and a rerun on another machine downloads the latest one to resume.

Limits: resume uses rank 0's checkpoint file for every rank (data parallel: identical weights); tensor/pipeline
parallel resume needs per-rank files (not handled here). Every node writes its own manifest of its ranks.
Raises PretrainStageError (inputs, naming the field and fix), PreflightFailed, HFImportError,
InsufficientDiskError, GuardTripped, TrainingTimeout, TrainerKilled (killed by a signal: transient, a retry
resumes) and TrainingLaunchError.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..config.load import config_hash
from ..config.mindformers_yaml import write_run_yaml
from ..config.platform import device_target
from ..config.validate import base_weights_issues, preflight_steps_issues
from ..stages import stage_hash, stage_inputs
from ..storage import Manifest, RunPaths, invalidate, is_s3, join, read_manifest, sha256_file, store_for, \
    write_manifest
from .checkpoints import LATEST_FILE, CheckpointManager, check_disk
from .launch import GuardTripped, TrainingLaunchError
from .metrics import METRICS_FILE, plot_loss, read_metrics, training_callbacks
from .preflight import GB, evaluate_preflight, summarize_steps
from .runner import TrainerKilled  # noqa: F401  (re-exported: raised by this stage)
from .runner import CheckpointTicker, describe_guard, launch_trainer, local_ranks, resume_fields, rollback_checkpoint
from .runner import node_rank as runner_node_rank

STAGE = "pretrain"
RUN_YAML = "run.yaml"
RESUME_YAML = "run_resume.yaml"
IDENTITY_FILE = "identity.json"
PREFLIGHT_FILE = "preflight.json"
LOSS_PNG = "loss_curve.png"
WORK_DIR_ENV = "LLM_PIPELINE_WORK_DIR"
TABLE_STEPS = 10


class PretrainStageError(ValueError):
    """A problem with the stage's inputs or config that a user must fix (not worth a retry)."""


class PreflightFailed(PretrainStageError):
    """The preflight's verdict was bad; the message lists each problem with its fix."""


# Names the SFT stage imports from this module (kept as they were; new code imports pipeline_lib.train.runner).
_launch = launch_trainer
_local_ranks = local_ranks


def _node_rank(cfg) -> int:
    """This node's rank ($LLM_PIPELINE_NODE_RANK); PretrainStageError names the variable and the valid range."""
    try:
        return runner_node_rank(cfg)
    except ValueError as err:
        raise PretrainStageError(str(err)) from None


# ---------------------------------------------------------------- inputs

def _data_inputs(paths: RunPaths, work: Path, log) -> tuple[Path, int, Manifest]:
    """The local folder of the data stage's train shards, its row count and the data manifest."""
    uri = paths.stage_uri("data")
    m = read_manifest(uri, paths.endpoint_url)
    if m is None:
        raise PretrainStageError(f"no data stage manifest at {uri}: run the data stage first "
                                 "(llm-pipeline run --stages data,pretrain)")
    rels = [o["path"] for o in m.outputs if o["path"].startswith("mindrecord/train/")]
    if not rels:
        raise PretrainStageError(f"the data manifest at {uri} lists no mindrecord/train/ shards: rerun the data stage")
    if is_s3(uri):
        store, local = store_for(uri, paths.endpoint_url), work / "_data" / "train"
        for rel in rels:
            dest = local / Path(rel).name
            size = next(o["size"] for o in m.outputs if o["path"] == rel)
            if not (dest.exists() and dest.stat().st_size == size):
                store.get_file(join(uri, rel), dest)
        log(f"pretrain: downloaded {len(rels)} data files from {uri}")
    else:
        local = Path(uri).resolve() / "mindrecord" / "train"
    rows = m.metrics.get("rows_train")
    if not rows:
        from ..config.mindformers_yaml import count_mindrecord_rows

        rows = count_mindrecord_rows(str(local))
    return local, int(rows), m


def _token_ids(paths: RunPaths):
    """The special ids the data stage recorded (tokenizer/tokenizer_config.json): the tokenizer's, not the config's."""
    from ..data.tokenizer import CONFIG_NAME, TokenIds

    uri = join(paths.stage_uri("data"), "tokenizer", CONFIG_NAME)
    return TokenIds.from_meta(json.loads(store_for(uri, paths.endpoint_url).get_bytes(uri)))


def _base_inputs(cfg) -> tuple[Path | None, dict]:
    """Check the base weights (fast, before any launch); convert an HF folder. Returns (local .ckpt or None, info)."""
    m = cfg.model
    for issue in base_weights_issues(cfg):  # the rule `validate` applies
        raise PretrainStageError(str(issue))
    if m.base_checkpoint:
        if is_s3(m.base_checkpoint):
            return None, {"base_checkpoint": m.base_checkpoint, "remote": True}
        path = Path(m.base_checkpoint).expanduser().resolve()
        if not path.is_file():
            raise PretrainStageError(f"model.base_checkpoint={m.base_checkpoint!r}: no such file (resolved to {path}); "
                                     "point it at a mindformers .ckpt or set it to null to train from scratch")
        st = path.stat()
        return path, {"base_checkpoint": str(path), "size": st.st_size, "mtime": st.st_mtime}
    if m.hf_checkpoint:
        from ..model.hf import check_hf_folder

        folder = Path(m.hf_checkpoint).expanduser().resolve()
        summary = check_hf_folder(folder, m)  # raises HFImportError naming tensor, shapes and field
        return folder, {"hf_checkpoint": str(folder), **summary}
    return None, {}


def _materialize_base(cfg, base: Path | None, info: dict, out: Path, endpoint: str | None, log) -> Path | None:
    """The local mindformers .ckpt the first attempt loads (HF folders are converted, s3 files downloaded)."""
    if info.get("remote"):
        dest = out / "base" / Path(info["base_checkpoint"]).name
        if not dest.exists():
            store_for(info["base_checkpoint"], endpoint).get_file(info["base_checkpoint"], dest)
        return dest
    if info.get("hf_checkpoint"):
        from ..model.hf import convert_hf_to_mindformers

        dest = out / "base" / "hf_import.ckpt"
        if not dest.exists():
            log(f"pretrain: converting {base} (Hugging Face Llama) to {dest}")
            convert_hf_to_mindformers(base, dest, cfg.model)
        return dest
    return base


# ---------------------------------------------------------------- layout and identity

def _work_dir(stage_uri: str) -> Path:
    if not is_s3(stage_uri):
        return Path(stage_uri).resolve()
    root = Path(os.environ.get(WORK_DIR_ENV) or Path(tempfile.gettempdir()) / "llm-pipeline-work")
    return (root / hashlib.sha256(stage_uri.encode()).hexdigest()[:16]).resolve()


def _identity(cfg, paths: RunPaths, base_info: dict) -> str:
    return config_hash({"stage": stage_hash(cfg, STAGE), "inputs": stage_inputs(paths, STAGE),
                        "base": {k: v for k, v in base_info.items() if k != "remote"}})


def total_steps(cfg, rows: int) -> int:
    """Optimizer steps of the run: training.steps, else epochs x (rows // global batch)."""
    t = cfg.training
    if t.steps is not None:
        return t.steps
    return t.epochs * (rows // (t.micro_batch_size * t.gradient_accumulation_steps * cfg.parallel.data_parallel))


def _write_yaml(cfg, path: Path, *, out: Path, data_dir: Path, rows: int, load: Path | None = None,
                resume_from: Path | None = None, steps: int | None = None, extra_epochs: int = 0,
                save_steps: int | None = None, token_ids=None) -> Path:
    """Generate the mindformers yaml (stage 'pretrain') with the metrics and guard callbacks appended.

    `resume_from` is a checkpoint file `<dir>/rank_N/<name>.ckpt`: the yaml gets `load_checkpoint: <dir>` and
    `resume_training: <name>` (runner.resume_fields: mindformers 1.9 resumes only from a folder).
    """
    import yaml

    t, dp = cfg.training, cfg.parallel.data_parallel
    on_cpu = device_target(cfg) == "CPU"
    batch = t.micro_batch_size * (t.gradient_accumulation_steps if on_cpu else 1)
    # tokens per optimizer step across all ranks (rows hold seq_length + 1 tokens, seq_length are predicted)
    tokens = t.micro_batch_size * t.gradient_accumulation_steps * dp * cfg.model.seq_length
    callbacks = training_callbacks(out, tokens_per_step=tokens, batch_size=batch, data_parallel=dp, num_rows=rows,
                                   spike_factor=t.guard.spike_factor, window=t.guard.window,
                                   shuffle_seed=cfg.run.seed if t.shuffle else None)
    if resume_from is not None:
        load = Path(resume_fields(resume_from)["load_checkpoint"])
    write_run_yaml(cfg, path, stage="pretrain", dataset_dir=str(data_dir), output_dir=str(out),
                   load_checkpoint=str(load) if load else None, resume=resume_from is not None, train_rows=rows,
                   steps=steps, extra_callbacks=callbacks, token_ids=token_ids)
    if resume_from is not None or extra_epochs or save_steps:
        text = path.read_text(encoding="utf-8")
        header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
        run = yaml.safe_load(text)
        if resume_from is not None:
            run["resume_training"] = resume_fields(resume_from)["resume_training"]
        # a rollback skips data: the run needs more epochs to reach the same optimizer-step budget
        run["runner_config"]["epochs"] += extra_epochs
        for cb in run["callbacks"]:
            if cb["type"] == "CheckpointMonitor" and save_steps:
                cb["save_checkpoint_steps"] = save_steps
        path.write_text(header + yaml.safe_dump(run, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


# ---------------------------------------------------------------- preflight

def _preflight(cfg, out: Path, data_dir: Path, rows: int, load: Path | None, node_rank: int, ranks: list[int],
               log, env: dict[str, str] | None = None, token_ids=None) -> dict:
    from ..planner import predicted_peak_gb, predicted_vs_measured

    steps, pre = cfg.training.preflight_steps, out / "preflight"
    shutil.rmtree(pre, ignore_errors=True)
    yaml_path = _write_yaml(cfg, pre / RUN_YAML, out=pre, data_dir=data_dir, rows=rows, load=load, steps=steps,
                            save_steps=10 ** 9, token_ids=token_ids)
    log(f"pretrain: preflight of {steps} steps in {pre}")
    try:
        result = launch_trainer(cfg, yaml_path, pre, node_rank, log, env=env)
        crash = None
    except GuardTripped as err:  # a non-finite loss is a verdict, not a crash
        result, crash = err.result, None
    except TrainingLaunchError as err:
        result, crash = err.result, str(err)
    records = read_metrics(pre / METRICS_FILE)
    on_cpu = device_target(cfg) == "CPU"
    # on CPU the devices are processes on this host: their summed RSS is what the device memory limit bounds
    limit = int(cfg.parallel.device_memory_gb * GB * len(ranks)) if on_cpu else None
    verdict = evaluate_preflight(records, expected_steps=steps, peak_rss_bytes=result.peak_rss_bytes or None,
                                 memory_limit_bytes=limit)
    measured_gb = (result.peak_rss_bytes or 0) / GB / max(1, len(ranks))
    try:
        predicted = predicted_peak_gb(cfg)
        memory_line = predicted_vs_measured(cfg, measured_gb)
    except Exception as err:  # the planner is advice: never fail the preflight on it
        predicted, memory_line = None, f"planner prediction unavailable: {err}"
    s = verdict.summary
    report = {"ok": verdict.ok and crash is None, "message": verdict.message, "problems": verdict.problems,
              "steps": s.steps, "expected_steps": steps, "step_time_ms": s.step_time_ms,
              "tokens_per_s": s.tokens_per_s, "loss_first": s.loss_first, "loss_last": s.loss_last,
              "loss_finite": s.first_nonfinite_step is None, "loss_falling": s.loss_falling,
              "peak_rss_bytes": result.peak_rss_bytes, "measured_gb_per_device": round(measured_gb, 3),
              "predicted_gb_per_device": None if predicted is None else round(predicted, 3),
              "memory": memory_line, "memory_limit_bytes": limit, "seconds": round(result.duration_s, 1)}
    if crash:
        report["problems"] = [f"the preflight trainer failed: {crash.splitlines()[0]}", *report["problems"]]
        report["message"] = "preflight failed:\n- " + "\n- ".join(report["problems"])
    _write_json(out / PREFLIGHT_FILE, report)
    shutil.rmtree(pre / "checkpoint", ignore_errors=True)
    log(f"pretrain: {report['message']}; {memory_line}")
    if not report["ok"]:
        detail = f"\n{crash}" if crash else ""
        raise PreflightFailed(f"pretrain {report['message']}\n{memory_line}\n(see {out / PREFLIGHT_FILE}){detail}")
    return report


# ---------------------------------------------------------------- guard

# ---------------------------------------------------------------- helpers

def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(obj, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _restore_remote_checkpoint(manager: CheckpointManager, remote: str, endpoint: str | None, identity: str,
                               stage_uri: str, log) -> None:
    """Download the uploaded latest checkpoint (and its sidecars) of the same run into the local work folder."""
    store = store_for(remote, endpoint)
    ident_uri = join(stage_uri, IDENTITY_FILE)
    latest_uri = join(remote, LATEST_FILE)
    if not (store.exists(ident_uri) and store.exists(latest_uri)):
        return
    if json.loads(store.get_bytes(ident_uri))["identity"] != identity:
        return
    latest = json.loads(store.get_bytes(latest_uri))
    for rank, info in latest["ranks"].items():
        if not info.get("uri"):
            return
        name = info["uri"].rsplit("/", 1)[-1]
        dest = manager.output_dir / manager.subdir / f"rank_{rank}" / name
        store.get_file(info["uri"], dest)
        store.get_file(info["uri"] + ".verified.json", dest.with_name(dest.name + ".verified.json"))
    metrics_uri = join(stage_uri, METRICS_FILE)
    if store.exists(metrics_uri):
        store.get_file(metrics_uri, manager.output_dir / METRICS_FILE)
    log(f"pretrain: downloaded the uploaded checkpoint of step {latest['step']} from {remote} to resume")
    manager.sync()


# ---------------------------------------------------------------- the stage

def run_pretrain_stage(cfg, paths: RunPaths, log=print, progress=None, *,
                       checkpoint_bytes: int | None = None, env: dict[str, str] | None = None) -> Manifest:
    """Run the pretraining stage (see the module docstring); returns the manifest it wrote.

    `checkpoint_bytes` overrides the estimated size of one checkpoint for the free-disk check; `env` is added
    to the trainer processes' environment (e.g. HCCL settings, or the guard's NaN test hook).
    """
    log = log or (lambda line: None)
    started = time.time()
    stage_uri, endpoint = paths.stage_uri(STAGE), paths.endpoint_url
    remote = is_s3(stage_uri)
    out = _work_dir(stage_uri)
    node_rank = _node_rank(cfg)
    ranks = local_ranks(cfg, node_rank)

    # 1. inputs (fast failures first: nothing is launched or deleted before they pass)
    for issue in preflight_steps_issues(cfg):  # the rule `validate` applies
        raise PretrainStageError(str(issue))
    base, base_info = _base_inputs(cfg)
    invalidate(stage_uri, endpoint)  # a stage being redone is never seen as done
    out.mkdir(parents=True, exist_ok=True)
    data_dir, rows, _ = _data_inputs(paths, out, log)
    token_ids = _token_ids(paths)
    steps = total_steps(cfg, rows)
    t = cfg.training
    rows_per_step = t.micro_batch_size * t.gradient_accumulation_steps * cfg.parallel.data_parallel
    steps_per_epoch = rows // rows_per_step
    if steps_per_epoch < 1:
        raise PretrainStageError(f"the data stage produced {rows} train rows, fewer than one optimizer step needs "
                                 f"({rows_per_step} = training.micro_batch_size x gradient_accumulation_steps x "
                                 "parallel.data_parallel): add data or lower training.micro_batch_size")

    # 2. resume or start afresh
    identity = _identity(cfg, paths, base_info)
    # on a local run store the checkpoints already live in the stage folder: nothing to upload
    upload = join(stage_uri, "checkpoint") if t.upload_checkpoints and remote else None
    manager = CheckpointManager(out, ranks=ranks, keep=t.keep_checkpoint_max, upload_uri=upload,
                                endpoint_url=endpoint, log=log)
    ident_file = out / IDENTITY_FILE
    same_run = ident_file.exists() and json.loads(ident_file.read_text(encoding="utf-8")).get("identity") == identity
    if same_run:
        manager.sync()  # verify what a killed attempt left behind
    elif upload:
        for p in list(out.iterdir()):
            if p.name != "_data":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        _write_json(ident_file, {"identity": identity})
        _restore_remote_checkpoint(manager, upload, endpoint, identity, stage_uri, log)
        same_run = manager.latest() is not None
    latest = manager.latest() if same_run else None
    if latest is not None and not all(Path(r["path"]).exists() for r in latest["ranks"].values()):
        latest = None
    if latest is None:
        for p in list(out.iterdir()):  # an earlier run of another config, or an attempt without a checkpoint
            if p.name != "_data":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        _write_json(ident_file, {"identity": identity})
        if remote:
            store_for(stage_uri, endpoint).put_file(ident_file, join(stage_uri, IDENTITY_FILE))
    resumed_from = latest["step"] if latest else None

    # 3. free disk for the checkpoints this node keeps (planner.disk: the ranks' shards x kept copies)
    from ..planner.disk import CheckpointDisk, checkpoint_disk, disk_fix

    need = checkpoint_disk(cfg, ranks)
    if checkpoint_bytes is not None:
        need = CheckpointDisk({r: int(checkpoint_bytes) for r in ranks}, need.copies)
    where = "$LLM_PIPELINE_WORK_DIR (s3:// runs train in a local work folder)" if remote else "run.output_root"
    free = check_disk(out, need.total, need.explain(), disk_fix(cfg, need, where=where))
    log(f"pretrain: {free / GB:.1f} GB free for {need.explain()} = {need.total / GB:.1f} GB")

    load = _materialize_base(cfg, base, base_info, out, endpoint, log)
    # the fresh-start yaml (from the base; runs with the entry module, see its header); resumed attempts launch run_resume.yaml
    _write_yaml(cfg, out / RUN_YAML, out=out, data_dir=data_dir, rows=rows, load=load, token_ids=token_ids)

    # 4. preflight on a fresh start
    preflight = None
    if t.preflight_steps and latest is None:
        preflight = _preflight(cfg, out, data_dir, rows, load, node_rank, ranks, log, env, token_ids)
    elif (out / PREFLIGHT_FILE).exists():
        preflight = json.loads((out / PREFLIGHT_FILE).read_text(encoding="utf-8"))

    # 5./6. train, resuming and (policy rollback) rolling back as needed
    if progress:
        progress("train", latest["step"] if latest else 0, steps)

    tick = CheckpointTicker(manager, out, steps, progress, log, join(stage_uri, METRICS_FILE) if upload else None,
                            endpoint)

    rollbacks: list[dict] = []
    attempts = 0
    skipped = 0  # data steps skipped by rollbacks: the run needs that many more batches
    while latest is None or (latest.get("global_step") or 0) < steps:
        attempts += 1
        if latest is None:
            yaml_path = out / RUN_YAML
            log(f"pretrain: training {steps} steps" + (f" from {load}" if load else " from random init"))
        else:
            start = Path(latest.get("rollback_path") or latest["path"])
            yaml_path = _write_yaml(cfg, out / RESUME_YAML, out=out, data_dir=data_dir, rows=rows, resume_from=start,
                                    extra_epochs=math.ceil(skipped / steps_per_epoch) if skipped else 0,
                                    token_ids=token_ids)
            log(f"pretrain: resuming at data step {latest.get('data_step', latest['step'])} (optimizer step "
                f"{latest.get('global_step')}) of {steps} from {start.name}")
        try:
            launch_trainer(cfg, yaml_path, out, node_rank, log, on_tick=tick, env=env)
        except GuardTripped as err:
            manager.sync()
            good = manager.latest()
            diag = err.diagnoses[0]
            message = describe_guard(diag, good)
            if t.guard.on_failure != "rollback" or len(rollbacks) >= t.guard.max_rollbacks or good is None:
                why = ("" if t.guard.on_failure != "rollback" else
                       " (no checkpoint to roll back to)" if good is None else
                       f" (training.guard.max_rollbacks={t.guard.max_rollbacks} reached)")
                raise GuardTripped(message + why + "\n" + str(err), err.result, err.diagnoses) from None
            bad = int(diag["step"])
            dest = rollback_checkpoint(good, out / "rollback" / f"rollback{len(rollbacks) + 1}_step{bad}", bad,
                                        steps_per_epoch)
            skipped += bad - int(good["step"])
            rollbacks.append({"bad_step": bad, "from_step": good["step"], "skipped_steps": list(range(good["step"] + 1, bad + 1)),
                              "loss": _finite(diag.get("loss")), "reason": diag.get("reason"),
                              "rows": diag.get("batch_rows")})
            log(f"{message}\npretrain: rollback {len(rollbacks)}/{t.guard.max_rollbacks}: back to step {good['step']}, "
                f"skipping data steps {good['step'] + 1}..{bad}")
            latest = {**good, "rollback_path": str(dest), "data_step": bad}
            continue
        except TrainingLaunchError:
            manager.sync()  # what the failed attempt saved is verified and latest_checkpoint.json points at it
            tick.upload_metrics()
            raise
        manager.sync()
        latest = manager.latest()
        if latest is None:
            raise PretrainStageError(f"training left no verified checkpoint in {out}/checkpoint: see the log above; "
                                     "check training.save_steps and the disk")
        if (latest.get("global_step") or 0) < steps:
            raise PretrainStageError(f"training stopped at optimizer step {latest.get('global_step')} of {steps} "
                                     f"without an error (overflow-skipped steps or too few epochs): see {out}/log")

    # 7. outputs and the manifest (last)
    records = read_metrics(out / METRICS_FILE)  # each step once, also after a resume
    if records:
        plot_loss(records, out / LOSS_PNG, title=f"pretraining loss ({cfg.model.name})")
    summary = summarize_steps(records) if records else None
    rels = [RUN_YAML, IDENTITY_FILE, LATEST_FILE]
    rels += [r for r in (RESUME_YAML, METRICS_FILE, LOSS_PNG, PREFLIGHT_FILE) if (out / r).exists()]
    ckpt_rels = sorted(Path(info["path"]).resolve().relative_to(out).as_posix() for info in latest["ranks"].values())
    rels += ckpt_rels
    store = store_for(stage_uri, endpoint)
    outputs = []
    for rel in sorted(set(rels)):
        local = out / rel
        size = local.stat().st_size
        if remote and not (store.exists(join(stage_uri, rel)) and store.size(join(stage_uri, rel)) == size):
            store.put_file(local, join(stage_uri, rel))
        outputs.append({"path": rel, "size": size, "sha256": sha256_file(local)})
    rank0 = latest["ranks"][str(min(int(r) for r in latest["ranks"]))]
    rank0_rel = Path(rank0["path"]).resolve().relative_to(out).as_posix()
    latest_ref = join(stage_uri, rank0_rel) if remote else str(Path(rank0["path"]).resolve())
    keys = ("step", "loss", "lr", "global_norm", "loss_scale", "overflow", "step_time_ms", "tokens_per_s")
    table = [{k: (_finite(r.get(k)) if k not in ("step", "overflow") else r.get(k)) for k in keys}
             for r in records[-TABLE_STEPS:]]
    final_loss = records[-1]["loss"] if records else None
    metrics = {
        "latest_checkpoint": latest_ref,
        "latest_checkpoint_step": latest["step"], "latest_checkpoint_sha256": latest["sha256"],
        "checkpoints": {r: (join(stage_uri, Path(i["path"]).resolve().relative_to(out).as_posix()) if remote
                            else str(Path(i["path"]).resolve())) for r, i in latest["ranks"].items()},
        "steps": latest.get("global_step"), "total_steps": steps, "data_steps": latest["step"],
        "loss_first": _finite(records[0]["loss"]) if records else None, "final_loss": _finite(final_loss),
        "tokens_per_s": summary.tokens_per_s if summary else None,
        "step_time_ms": summary.step_time_ms if summary else None,
        "tokens_per_step": t.micro_batch_size * t.gradient_accumulation_steps * cfg.parallel.data_parallel
        * cfg.model.seq_length,
        "train_rows": rows, "resumed_from_step": resumed_from, "attempts": attempts, "rollbacks": rollbacks,
        "base": base_info or None, "preflight": preflight, "node_rank": node_rank, "ranks": ranks,
        "seconds": round(time.time() - started, 1),
        "images": {"loss_curve": LOSS_PNG} if (out / LOSS_PNG).exists() else {},
        "tables": {"metrics": {"description": f"last {len(table)} training steps (metrics.jsonl)", "rows": table}},
        "markdown": {"summary": _summary_markdown(steps, latest, records, summary, resumed_from, rollbacks, latest_ref)},
    }
    manifest = Manifest(stage=STAGE, run_id=paths.run_id, config_hash=stage_hash(cfg, STAGE),
                        inputs=stage_inputs(paths, STAGE), outputs=outputs, metrics=metrics)
    write_manifest(stage_uri, manifest, endpoint)
    if remote:  # everything is in the run store now; a 7B run would otherwise leave its checkpoints in /tmp
        shutil.rmtree(out, ignore_errors=True)
    if progress:
        progress("train", steps, steps)
    log(f"pretrain: done in {metrics['seconds']} s: {latest.get('global_step')} steps, loss "
        f"{metrics['loss_first']} -> {metrics['final_loss']}, latest checkpoint {latest_ref}")
    return manifest


def _summary_markdown(steps, latest, records, summary, resumed_from, rollbacks, latest_ref) -> str:
    lines = ["| | |", "|---|---|", f"| optimizer steps | {latest.get('global_step')} / {steps} |",
             f"| latest checkpoint | `{latest_ref}` (data step {latest['step']}) |"]
    if records:
        lines.append(f"| loss | {records[0]['loss']:.4f} -> {records[-1]['loss']:.4f} |")
    if summary and summary.step_time_ms:
        lines.append(f"| step time (median) | {summary.step_time_ms:.0f} ms |")
    if summary and summary.tokens_per_s:
        lines.append(f"| tokens/s (median) | {summary.tokens_per_s:,.0f} |")
    if resumed_from is not None:
        lines.append(f"| resumed from | data step {resumed_from} |")
    for rb in rollbacks:
        lines.append(f"| rollback | bad step {rb['bad_step']} -> step {rb['from_step']}, skipped "
                     f"{len(rb['skipped_steps'])} batch(es) |")
    return "\n".join(lines)

