"""The pretraining stage: packed MindRecord shards (+ optional base weights) -> verified checkpoints and a loss history.

`run_pretrain_stage(run, checkpoint_bytes=None, env=None)` (the stage contract: runtime/contract.py) reads, top to
bottom, as its steps:
1. inputs (`_check_inputs`, `_data_inputs`): training.preflight_steps and the base weights are checked before anything
   is launched or deleted: `model.base_checkpoint` (a mindformers .ckpt) or `model.hf_checkpoint` (a Hugging Face
   Llama folder, checked against model.* and converted by `model.hf` into `base/hf_import.ckpt`). Continued
   pretraining loads the base's weights only: optimizer state and step count start afresh; the LR schedule too,
   unless a wsd lineage continues its warm-up (training.lineage_steps, docs/training-schedule.md). The data comes from the data manifest (`run.upstream["data"]`: its
   `mindrecord/train` shards and row count) and the tokenizer's special ids from its tokenizer_config.json.
2. resume (session.TrainingSession.resume_or_start): when the stage folder holds `identity.json` of the same run
   (the registry's `run.identity` plus the base) and a verified `latest_checkpoint.json`, training continues from
   that checkpoint with `resume_training` (weights, AdamW moments, global step and so the LR position, the data
   position); otherwise the folder is emptied. A finished attempt that died before its manifest is not trained again.
3. free disk (`_check_disk`): training.keep_checkpoint_max + 1 checkpoints of this node's rank shards
   (planner.disk: weights in param_init_type + fp32 AdamW moments, per pipeline stage / tensor-parallel shard).
4. preflight (training.preflight_steps > 0, fresh start only): the first N steps of the training launch, judged
   while it runs (train.preflight.PreflightWatch, no launch or graph compile of its own): step time, tokens/s, peak
   RSS of the process tree, loss finite and falling, planner prediction vs measured memory -> `preflight.json`; a bad
   verdict stops the trainer and the stage with what to change (`PreflightFailed`), and a rerun starts afresh.
5. train (session.TrainingSession.train): `run.yaml` (mindformers_yaml + the PipelineMetrics / LossGuard callbacks)
   is exactly the yaml that is launched (`python -m pipeline_lib.train.entry --yaml run.yaml`, msrun for several
   ranks, own process group, timeout training.timeout_seconds, node rank from $LLM_PIPELINE_NODE_RANK); a resumed
   attempt launches `run_resume.yaml` (the same plus resume_training/load_checkpoint). Ticks sync checkpoints
   (verify, keep training.keep_checkpoint_max, `latest_checkpoint.json`, upload when training.upload_checkpoints;
   verification takes at most ~5% of the wall time while the trainer runs, and runs again after every attempt) and
   report `progress("train", step, total)` from metrics.jsonl.
   Guard: a NaN/spike stops training at that step (callbacks.LossGuard); the stage raises `GuardTripped` whose
   message names step, loss, lr, loss scale, global norm and the batch's dataset rows. With
   training.guard.on_failure=rollback it instead resumes from the last good checkpoint with the data position moved
   past the bad step (the window last checkpoint+1 .. bad step is skipped), at most guard.max_rollbacks times.
   Measured (`_measured_reports`, advice that never fails the stage): with training.profile.enabled the profiler runs
   over its window and `profile_summary.json` splits a step into compute / data wait / communication (train/profile.py);
   `planner_check.json` sets the median step time and the peak RSS per rank against the planner (planner/check.py)
   and logs a warning per figure off by more than training.planner_alert_factor.
6. publish (`_publish`): `loss_curve.png`, run.yaml, metrics.jsonl, identity.json, latest_checkpoint.json, the latest
   checkpoint file of each rank, preflight.json, profile_summary.json + profile/, planner_check.json, the loss guard's
   guard_diagnosis.json and the hang watchdog's hang.json when there were any, described (size,
   sha256) and uploaded on an s3:// store.
6b. weights only (`_weights_checkpoint`): the model's parameters only (model.weights_only) under checkpoint/merged/
   (one rank's file cut, or a single-node sharded run's weights-only merge), published and listed as
   `weights_checkpoint` {path, size, sha256}: what SFT, evaluate, export and the next night load.
   A wsd run with training.keep_stable_weights also publishes the weights as its decay started
   (`_stable_weights`, checkpoint/merged/<model>-stable-weights.ckpt, written by the trainer's SaveWeightsAtStep) as
   `stable_checkpoint` {path, size, sha256, step}: what the next night of a lineage schedule continues from
   (training.stable_checkpoint, which a fresh start loads instead of model.base_checkpoint). `lr_schedule` records the
   schedule (kind, total/warm-up/decay steps, lineage_steps, stable_step).
7. summarise (`_metrics`): `latest_checkpoint` (absolute path, or URI on s3://), final loss, steps, tokens/s, a table
   of the last steps, the loss-curve image, `profile` / `planner_check` / `warnings` and their markdown (the Prefect
   artifacts `pretrain-profile`, `pretrain-planner`). The registry writes the manifest from the returned StageOutput.

An s3:// run store trains in a local work folder (session.work_dir: $LLM_PIPELINE_WORK_DIR or the temp dir, one per
stage URI, so a rerun on the same machine resumes; removed before the stage returns) and uploads the outputs; with
training.upload_checkpoints the checkpoints (with `checkpoint/latest_checkpoint.json` and metrics.jsonl) are uploaded
as they are verified, and a rerun on another machine downloads the latest one to resume.

Limits: a resume launches every rank on its own file of the verified step (mindformers 1.9 picks
`checkpoint/rank_N/<name>` with N = its rank); parallel.* is part of the stage identity, so those files always come
from the same data/tensor/pipeline layout (auto_trans_ckpt is off: nothing is resharded). With
training.upload_checkpoints each node uploads its own ranks' files and its own pointer (checkpoint/
latest_checkpoint.json for node 0, latest_checkpoint_node_N.json for node N), and a rerun restores every rank of
its node (tests/train/test_session.py, with per-rank files of distinct bytes); a real TP/PP resume needs Ascend.
The manifest's `checkpoint_layout` (dp/mp/pp, optimizer shard, every rank's file, the strategy files) is what
consumers read (model.checkpoints.CheckpointRef.from_manifest, docs/checkpoints.md). Every node returns the outputs of its own ranks.
Raises PretrainStageError (inputs, naming the field and fix), PreflightFailed, HFImportError,
InsufficientDiskError, GuardTripped, TrainingTimeout, TrainerKilled (killed by a signal: transient, a retry
resumes) and TrainingLaunchError.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ..config.load import config_hash
from ..config.validate import base_weights_issues, preflight_steps_issues, profile_issues
from ..config.schema import global_batch
from ..runtime.contract import StageOutput, StageRun
from ..storage import join, sha256_file, store_for
from ..model.checkpoint_format import mindformers_base, weights_only_copy as checkpoint_2_weights
from .checkpoints import LATEST_FILE
from .metrics import METRICS_FILE
from .preflight import summarize_steps
from .session import GUARD_DIAGNOSIS_FILE, HANG_FILE, IDENTITY_FILE, PREFLIGHT_FILE, Batch, StageYaml, TrainingSession, \
    finite, loss_history, tensorboard_dir, work_dir, write_json

STAGE = "pretrain"
RUN_YAML = "run.yaml"
RESUME_YAML = "run_resume.yaml"
LOSS_PNG = "loss_curve.png"
PROFILE_FILE = "profile_summary.json"
PLANNER_CHECK_FILE = "planner_check.json"
TABLE_STEPS = 10
TOKENIZER_DIR = "checkpoint"  # the lineage's tokenizer lives beside the weights (model.tokenizer_lineage)


class PretrainStageError(ValueError):
    """A problem with the stage's inputs or config that a user must fix (not worth a retry)."""


class PreflightFailed(PretrainStageError):
    """The preflight's verdict was bad; the message lists each problem with its fix."""

    # it stops the trainer before its first checkpoint: a rerun starts training afresh and preflights again
    starts_afresh = True


def run_pretrain_stage(run: StageRun, *, checkpoint_bytes: int | None = None,
                       env: dict[str, str] | None = None) -> StageOutput:
    """Run the pretraining stage (see the module docstring); returns its outputs and metrics.

    `checkpoint_bytes` overrides the estimated size of one checkpoint for the free-disk check; `env` is added
    to the trainer processes' environment (e.g. HCCL settings, or the guard's NaN test hook).
    """
    started, cfg, log = time.time(), run.cfg, run.log or (lambda line: None)
    # 1. inputs (fast failures first: nothing is launched or deleted before they pass)
    base, base_info = _check_inputs(cfg)
    out = work_dir(run.uri, run.node_rank, create=True)
    remote = run.uri if run.remote else None
    out.mkdir(parents=True, exist_ok=True)
    data_dir, rows, token_ids = _data_inputs(run, out, log)
    tokenizer = _lineage_tokenizer(run, out)
    steps, steps_per_epoch = _schedule(cfg, rows)
    session = TrainingSession(cfg, stage=STAGE, out=out, remote=remote, endpoint=run.endpoint, steps=steps, log=log,
                              progress=run.progress, env=env, error=PretrainStageError, preflight_error=PreflightFailed)
    # 2. resume or start afresh, 3. free disk
    latest = session.resume_or_start(config_hash({"run": run.identity, "base": _without_remote(base_info)}),
                                     keep=("_data",))
    _check_disk(cfg, session, checkpoint_bytes)
    load = _materialize_base(cfg, base, base_info, out, run.endpoint, log)
    if load is not None:  # a folder for Checkpoint 2.0, a .ckpt for the legacy loader (train/checkpoint_format.py)
        load = mindformers_base(load, cfg.training.checkpoint_format, out / "base")
    t = cfg.training  # the mindformers yaml: one recipe for the fresh start (and its preflight) and every resume
    yaml = StageYaml(cfg, STAGE, Batch(t.micro_batch_size, t.gradient_accumulation_steps, t.guard), data_dir, rows,
                     RUN_YAML, RESUME_YAML, load=load, token_ids=token_ids,
                     tensorboard_dir=tensorboard_dir(cfg, run.paths.run_id, STAGE))
    yaml.write(out / RUN_YAML, out)  # the fresh start's, published with the stage also when this run resumes
    # 4.+5. train, a fresh start's first steps being the preflight (resumed attempts launch run_resume.yaml; a
    # rollback also adds the epochs its skipped data needs)
    trained = session.train(latest, yaml, origin=str(load) if load else "random init", preflight_dir=out,
                            memory_check=True, steps_per_epoch=steps_per_epoch,
                            rollback=t.guard if t.guard.on_failure == "rollback" else None)

    # 6. publish, 7. summarise (the registry writes the manifest)
    records = loss_history(out, out / LOSS_PNG, title=f"pretraining loss ({cfg.model.name})")
    _measured_reports(cfg, out, records, trained, session)
    weights = _weights_checkpoint(cfg, out, trained.latest, session, log)
    stable = _stable_weights(cfg, out, session, log)
    outputs = _publish(run, out, trained.latest, tokenizer, weights + stable)
    metrics = _metrics(run, out, trained, records, steps=steps, rows=rows, base_info=base_info, session=session,
                       started=started)
    if weights:  # {path, size, sha256}: the file every consumer of the weights takes
        metrics["weights_checkpoint"] = next({**o, "path": _ref(run, out, str(out / o["path"]))} for o in outputs
                                             if o["path"] == weights[0].relative_to(out).as_posix())
    metrics["lr_schedule"] = _schedule_metrics(cfg, steps)
    if stable:  # the stable-phase weights: what the next run of a wsd lineage continues from
        metrics["stable_checkpoint"] = next({**o, "path": _ref(run, out, str(out / o["path"])),
                                             "step": metrics["lr_schedule"]["stable_step"]} for o in outputs
                                            if o["path"] == stable[0].relative_to(out).as_posix())
    if _scratch(run):  # everything is in the run store now; a 7B run would otherwise leave its checkpoints in /tmp
        shutil.rmtree(out, ignore_errors=True)
    log(f"pretrain: done in {metrics['seconds']} s: {trained.latest.get('global_step')} steps, loss "
        f"{metrics['loss_first']} -> {metrics['final_loss']}, latest checkpoint {metrics['latest_checkpoint']}")
    return StageOutput(outputs, metrics)


# ---------------------------------------------------------------- 1. inputs

def _check_inputs(cfg) -> tuple[Path | None, dict]:
    """The config rules `validate` applies to this stage, then the base weights (see _base_inputs)."""
    for issue in [*preflight_steps_issues(cfg), *profile_issues(cfg)]:
        raise PretrainStageError(str(issue))
    return _base_inputs(cfg)


def _data_inputs(run: StageRun, work: Path, log) -> tuple[Path, int, object]:
    """The local folder of the data stage's train shards, its row count and the tokenizer's special ids."""
    from ..model.token_ids import CONFIG_NAME, TokenIds

    uri, m = run.upstream_uri("data"), run.upstream.get("data")
    if m is None:
        raise PretrainStageError(f"no data stage manifest at {uri}: run the data stage first "
                                 "(llm-pipeline run --stages data,pretrain)")
    rels = [o["path"] for o in m.outputs if o["path"].startswith("mindrecord/train/")]
    if not rels:
        raise PretrainStageError(f"the data manifest at {uri} lists no mindrecord/train/ shards: rerun the data stage")
    store = store_for(uri, run.endpoint)
    if store.remote:
        local = work / "_data" / "train"
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
        from .mindformers_yaml import count_mindrecord_rows

        rows = count_mindrecord_rows(str(local))
    # the special ids the data stage recorded: the tokenizer's, not the config's
    token_ids = TokenIds.from_meta(json.loads(store.get_bytes(join(uri, "tokenizer", CONFIG_NAME))))
    return local, int(rows), token_ids


def _lineage_tokenizer(run: StageRun, work: Path) -> Path:
    """The data stage's tokenizer.model, local (with its config), after refusing base weights trained with another
    one: it travels with this stage's checkpoints (checkpoint/, model.tokenizer_lineage)."""
    from ..model.token_ids import CONFIG_NAME
    from ..model.tokenizer_lineage import TokenizerMismatch, base_weights, require_same_tokenizer

    uri = join(run.upstream_uri("data"), "tokenizer", "tokenizer.model")
    base, field = base_weights(run.cfg)
    try:
        require_same_tokenizer(base, uri, run.endpoint, what=field)
    except TokenizerMismatch as err:
        raise PretrainStageError(str(err)) from None
    store = store_for(uri, run.endpoint)
    if not store.remote:
        return Path(uri).resolve()
    local = work / "_data" / "tokenizer"
    for name in ("tokenizer.model", CONFIG_NAME):
        store.get_file(join(run.upstream_uri("data"), "tokenizer", name), local / name)
    return local / "tokenizer.model"


def _base_inputs(cfg) -> tuple[Path | None, dict]:
    """Check the base weights (fast, before any launch); convert an HF folder. Returns (local .ckpt or None, info)."""
    m = cfg.model
    for issue in base_weights_issues(cfg):  # the rule `validate` applies
        raise PretrainStageError(str(issue))
    # a wsd lineage continues its stable-phase weights; model.base_checkpoint stays the model evaluated as `base`
    start, field = ((cfg.training.stable_checkpoint, "training.stable_checkpoint") if cfg.training.stable_checkpoint
                    else (m.base_checkpoint, "model.base_checkpoint"))
    if start:
        if store_for(start, cfg.run.s3_endpoint_url).remote:
            return None, {"base_checkpoint": start, "remote": True}
        path = Path(start).expanduser().resolve()
        if not path.is_file():
            raise PretrainStageError(f"{field}={start!r}: no such file (resolved to {path}); "
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


def _schedule(cfg, rows: int) -> tuple[int, int]:
    """(optimizer steps of the run: training.steps, else epochs x steps per epoch; optimizer steps per epoch).
    Refuses data smaller than one step."""
    t = cfg.training
    rows_per_step = global_batch(cfg)
    if rows // rows_per_step < 1:
        raise PretrainStageError(f"the data stage produced {rows} train rows, fewer than one optimizer step needs "
                                 f"({rows_per_step} = training.micro_batch_size x gradient_accumulation_steps x "
                                 "parallel.data_parallel): add data or lower training.micro_batch_size")
    steps = t.steps if t.steps is not None else t.epochs * (rows // rows_per_step)
    return steps, rows // rows_per_step


def _without_remote(base_info: dict) -> dict:
    return {k: v for k, v in base_info.items() if k != "remote"}


# ---------------------------------------------------------------- 3. free disk

def _check_disk(cfg, session: TrainingSession, checkpoint_bytes: int | None) -> None:
    """Room for the checkpoints this node keeps (planner.disk: the ranks' shards x kept copies)."""
    from ..planner.disk import CheckpointDisk, checkpoint_disk

    need = checkpoint_disk(cfg, session.ranks)
    if checkpoint_bytes is not None:
        need = CheckpointDisk({r: int(checkpoint_bytes) for r in session.ranks}, need.copies)
    session.check_disk(need)


# ---------------------------------------------------------------- 5b. measured: profile summary, planner check

def _measured_reports(cfg, out: Path, records: list[dict], trained, session: TrainingSession) -> None:
    """`profile_summary.json` (training.profile.enabled) and `planner_check.json` (measured step time and memory
    against the planner's prediction; each figure off by more than training.planner_alert_factor is logged as a
    warning). Both are advice: they never fail the stage."""
    from ..planner.check import planner_check
    from ..planner.readings import local_npu_name
    from .profile import ProfileWindow, profile_summary

    step_ms = summarize_steps(records).step_time_ms if records else None  # median, compile step left out
    if cfg.training.profile.enabled:
        window = ProfileWindow.from_config(cfg.training.profile)
        summary = profile_summary(records, window, out / "profile")
        write_json(out / PROFILE_FILE, summary)
        session.log(f"pretrain: profile of steps {summary['start_step']}..{summary['stop_step']}: step "
                    f"{summary['step_ms']} ms = compute {summary['compute_ms']} ms + data wait "
                    f"{summary['data_wait_ms']} ms; communication: {summary['communication_ms']} ms "
                    f"({summary['communication']}); unprofiled steps: compute {summary['unprofiled_compute_ms']} ms")
        # profiled steps are slower (the profiler records every op): compare the others when there are any
        step_ms = summary["unprofiled_compute_ms"] or step_ms
    else:
        (out / PROFILE_FILE).unlink(missing_ok=True)  # an earlier attempt's, when profiling was on then
    device = max((r.get("device_max_reserved_bytes") or 0 for r in records), default=0) or None
    check = planner_check(cfg, step_time_ms=step_ms, peak_rss_bytes=trained.peak_rss_bytes or None,
                          ranks=len(session.ranks), device_peak_bytes=device,
                          device_source="MindSpore memory_stats max_reserved_memory (metrics.jsonl)",
                          device_name=local_npu_name())
    write_json(out / PLANNER_CHECK_FILE, check)
    for warning in check["warnings"]:
        session.log(f"pretrain: WARNING {warning}")
    for note in check.get("notes", []):  # an INFO line: in the stage's log, not on the terminal
        session.log(f"pretrain: {note}")


# ---------------------------------------------------------------- 6. publish

def _scratch(run: StageRun) -> bool:
    """True when the stage trained outside its stage folder (s3:// run store, or a node rank > 0: session.work_dir)
    and so publishes by copying."""
    return run.remote or run.node_rank > 0


def _weights_checkpoint(cfg, out: Path, latest: dict, session: TrainingSession, log) -> list[Path]:
    """The model's parameters only (model.weights_only), what SFT, evaluate, export and the next night load, under
    checkpoint/merged/ (its tokenizer is found from there, model.tokenizer_lineage): `<latest name>-weights.ckpt`
    when one rank's file holds the whole model; for a sharded single-node run the weights-only merge consumers
    would otherwise make first (model.checkpoint_cache: `<shard key>-weights.ckpt` + its sidecar, found by them
    as a verified cache entry). [] on node ranks > 0 and for a sharded multi-node run (node 0 lacks the other
    nodes' files: its first consumer merges). Returns the files to publish, the weights file first.

    Not in checkpoint/ itself: mindformers 1.9 resumes from load_checkpoint=checkpoint/ and loads every .ckpt
    lying directly in that folder instead of rank_N/<resume_training> (trainer/utils.py:684-691,
    tools/ckpt_transform/utils.py:68 check_ckpt_file_exist)."""
    import tempfile

    from ..model.checkpoint_cache import MERGED_DIR, full_checkpoint
    from ..model.weights_only import copy_weights
    from .checkpoint_split import hand_off_weights
    from ..model.checkpoints import CheckpointRef
    from ..runtime.launcher import launch_module

    if session.node_rank:
        return []
    ref = CheckpointRef.from_layout(checkpoint_layout(cfg, latest, out, lambda p: str(Path(p).resolve())))
    first = Path(latest["ranks"][min(latest["ranks"], key=int)]["path"])
    if first.suffix == ".safetensors":  # Checkpoint 2.0: rank 0's model file, or the merge of a sharded step
        return [checkpoint_2_weights(first, out / TOKENIZER_DIR / MERGED_DIR, log)]
    if ref.sharded:
        if cfg.parallel.num_nodes > 1:
            return []
        with tempfile.TemporaryDirectory(prefix="ckpt-merge-") as tmp:
            merged = Path(full_checkpoint(ref, Path(tmp), None, log))
        return [merged, merged.with_suffix(".json")]
    src = Path(ref.ckpt)
    dst = out / TOKENIZER_DIR / MERGED_DIR / f"{src.stem}-weights.ckpt"
    try:  # a split checkpoint's weights file is the hand-off itself (train.checkpoint_split): linked, not rewritten
        copied = hand_off_weights(src, dst) or copy_weights(src, dst)
    except ValueError as err:
        raise PretrainStageError(f"writing the weights-only checkpoint {dst} failed: {err}") from None
    if copied is None:  # a file ckpt_scan does not read: MindSpore rewrites it
        done = launch_module("pipeline_lib.model.weights_only", [str(src), str(dst)], cwd=None, timeout_s=3600,
                             env={"GLOG_v": "3"})
        if not done.ok:
            raise PretrainStageError(f"writing the weights-only checkpoint {dst} failed: "
                                     + done.describe("weights_only"))
    log(f"pretrain: weights-only checkpoint {dst.name}: {dst.stat().st_size:,} bytes (training checkpoint "
        f"{src.stat().st_size:,})")
    return [dst]


def _stable_weights(cfg, out: Path, session: TrainingSession, log) -> list[Path]:
    """The stable-phase weights a wsd run with training.keep_stable_weights wrote as its decay started
    (train/mf_callbacks.py SaveWeightsAtStep, rank 0), [] otherwise and on node ranks > 0."""
    from .mindformers_yaml import stable_weights_path

    t = cfg.training
    if session.node_rank or t.lr_schedule != "wsd" or not t.keep_stable_weights:
        return []
    path = stable_weights_path(cfg, out)
    if not path.is_file():
        raise PretrainStageError(f"training.keep_stable_weights: the stable-phase weights {path} were not written "
                                 "(the trainer's SaveWeightsAtStep callback writes them as the decay starts); rerun "
                                 "the stage from scratch")
    log(f"pretrain: stable-phase weights {path.name}: {path.stat().st_size:,} bytes (at the decay's start)")
    return [path]


def _schedule_metrics(cfg, steps: int) -> dict:
    """The run's learning-rate schedule as the manifest records it (the nightly's lineage reads stable_step)."""
    from .lr_schedule import Wsd

    t = cfg.training
    if t.lr_schedule != "wsd":
        return {"kind": t.lr_schedule, "total_steps": steps, "warmup_steps": t.warmup_steps}
    w = Wsd.from_training(t, steps)
    return {"kind": "wsd", "total_steps": steps, "warmup_steps": t.warmup_steps, "lineage_steps": w.lineage_steps,
            "decay_steps": w.decay_steps, "stable_step": w.stable_step, "decay_shape": w.shape,
            "stable_lr": w.held(w.stable_step)}


def _publish(run: StageRun, out: Path, latest: dict, tokenizer: Path, weights: list[Path] = ()) -> list[dict]:
    """Describe (size, sha256) the stage's files and copy them to the stage folder when trained elsewhere. A node
    rank > 0 publishes only its own ranks' checkpoints (and strategy files): the run's yaml, loss history,
    pointers and the lineage's tokenizer (checkpoint/tokenizer.model, beside the weights) are node 0's
    (runtime/nodes.py)."""
    from ..model.tokenizer_lineage import attach

    remote = _scratch(run)
    rels = [] if run.node_rank else [RUN_YAML, IDENTITY_FILE, LATEST_FILE]
    if not run.node_rank:
        rels += [p.relative_to(out).as_posix() for p in attach(tokenizer, out / TOKENIZER_DIR)]
        rels += [r for r in (RESUME_YAML, METRICS_FILE, LOSS_PNG, PREFLIGHT_FILE, PROFILE_FILE,
                                  PLANNER_CHECK_FILE, GUARD_DIAGNOSIS_FILE, HANG_FILE) if (out / r).exists()]
    rels += [Path(info["path"]).resolve().relative_to(out).as_posix() for info in latest["ranks"].values()]
    rels += [w.relative_to(out).as_posix() for w in weights]
    rels += strategy_files(out)  # needed to merge or reshard the rank files: lost with an s3 run's work folder
    # the profiler's own output (training.profile), for MindStudio Insight: also lost with an s3 run's work folder
    rels += [p.relative_to(out).as_posix() for p in sorted((out / "profile").rglob("*")) if p.is_file()]
    store = store_for(run.uri, run.endpoint)
    outputs = []
    for rel in sorted(set(rels)):
        local, uri = out / rel, join(run.uri, rel)
        size = local.stat().st_size
        if remote and not (store.exists(uri) and store.size(uri) == size):
            store.put_file(local, uri)
        outputs.append({"path": rel, "size": size, "sha256": sha256_file(local)})
    return outputs


# ---------------------------------------------------------------- 7. summarise

def _ref(run: StageRun, out: Path, path: str) -> str:
    """A file of the stage's absolute path, or its URI on an s3:// store."""
    return join(run.uri, Path(path).resolve().relative_to(out).as_posix()) if _scratch(run) \
        else str(Path(path).resolve())


def _metrics(run: StageRun, out: Path, trained, records: list[dict], *, steps: int, rows: int, base_info: dict,
             session: TrainingSession, started: float) -> dict:
    cfg, latest = run.cfg, trained.latest

    def ref(path: str) -> str:
        return _ref(run, out, path)

    latest_ref = ref(latest["ranks"][str(min(int(r) for r in latest["ranks"]))]["path"])
    from ..planner.check import planner_markdown
    from .profile import profile_markdown

    profile = json.loads((out / PROFILE_FILE).read_text(encoding="utf-8")) if (out / PROFILE_FILE).exists() else None
    check = (json.loads((out / PLANNER_CHECK_FILE).read_text(encoding="utf-8"))
             if (out / PLANNER_CHECK_FILE).exists() else None)
    measured_markdown = {}
    if profile:
        measured_markdown["profile"] = profile_markdown(profile)
    if check:
        measured_markdown["planner"] = planner_markdown(check)
    summary = summarize_steps(records) if records else None
    keys = ("step", "loss", "lr", "global_norm", "loss_scale", "overflow", "step_time_ms", "tokens_per_s")
    table = [{k: (finite(r.get(k)) if k not in ("step", "overflow") else r.get(k)) for k in keys}
             for r in records[-TABLE_STEPS:]]
    return {
        "latest_checkpoint": latest_ref,
        "tokenizer": _tokenizer_print(out, ref) if not session.node_rank else None,
        "checkpoint_layout": checkpoint_layout(cfg, latest, out, ref),
        "latest_checkpoint_step": latest["step"], "latest_checkpoint_sha256": latest["sha256"],
        "checkpoints": {r: ref(i["path"]) for r, i in latest["ranks"].items()},
        "steps": latest.get("global_step"), "total_steps": steps, "data_steps": latest["step"],
        "loss_first": finite(records[0]["loss"]) if records else None,
        "final_loss": finite(records[-1]["loss"]) if records else None,
        "tokens_per_s": summary.tokens_per_s if summary else None,
        "step_time_ms": summary.step_time_ms if summary else None,
        "tokens_per_step": global_batch(cfg) * cfg.model.seq_length,
        "train_rows": rows, "resumed_from_step": trained.resumed_from_step, "attempts": trained.attempts,
        "rollbacks": trained.rollbacks, "hangs": trained.hangs, "base": base_info or None, "preflight": trained.preflight,
        "node_rank": session.node_rank, "ranks": session.ranks, "seconds": round(time.time() - started, 1),
        "images": {"loss_curve": LOSS_PNG} if (out / LOSS_PNG).exists() else {},
        "tables": {"metrics": {"description": f"last {len(table)} training steps (metrics.jsonl)", "rows": table}},
        "markdown": {"summary": _summary_markdown(steps, latest, records, summary, trained.resumed_from_step,
                                                  trained.rollbacks, latest_ref), **measured_markdown},
        "profile": profile, "planner_check": check, "warnings": check["warnings"] if check else [],
        "peak_rss_bytes": trained.peak_rss_bytes or None,
    }


def _tokenizer_print(out: Path, ref) -> dict:
    """{uri, sha256, vocab_size} of the tokenizer published beside the weights: what tomorrow's night loads."""
    from ..model.tokenizer_lineage import TokenizerPrint

    local = out / TOKENIZER_DIR / "tokenizer.model"
    return {**TokenizerPrint.of(str(local)).to_json(), "uri": ref(str(local))}


def strategy_files(out: Path) -> list[str]:
    """The strategy files mindformers wrote for a parallel run (<output_dir>/strategy/, see
    train/mindformers_yaml.py strategy_ckpt_save_file), relative to `out`."""
    return sorted(p.relative_to(out).as_posix() for p in (out / "strategy").glob("*.ckpt"))


def checkpoint_layout(cfg, latest: dict, out: Path, ref) -> dict:
    """What a consumer needs to use the latest checkpoint (model.checkpoints.CheckpointRef.from_manifest): the
    parallel layout, every rank's file (absolute path or s3 URI, size, sha256) and the strategy files."""
    p = cfg.parallel
    world = p.data_parallel * p.model_parallel * p.pipeline_stage
    strategy = [{"path": ref(str(out / rel)), "size": (out / rel).stat().st_size, "sha256": sha256_file(out / rel)}
                for rel in strategy_files(out)]
    return {"data_parallel": p.data_parallel, "model_parallel": p.model_parallel, "pipeline_stage": p.pipeline_stage,
            "optimizer_shard": bool(p.optimizer_shard), "world_size": world, "step": latest["step"],
            "ranks": {r: {"path": ref(i["path"]), "size": i["size"], "sha256": i["sha256"]}
                      for r, i in sorted(latest["ranks"].items(), key=lambda kv: int(kv[0]))},
            "strategy": strategy}


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

