"""A training session: what the pretrain and SFT stages both do around the launcher, written once.

A `TrainingSession` runs one stage's training in one mindformers output_dir `out` (checkpoint/, metrics.jsonl,
latest_checkpoint.json, identity.json); `remote` is the run-store folder that mirrors it on an s3:// run store.
- `work_dir(stage_uri, node_rank)`: the stage folder itself, or for an s3:// stage (and for node ranks > 0 of a
  multi-node job) a fixed local folder per URI (and node) under $LLM_PIPELINE_WORK_DIR (else
  `<temp dir>/llm-pipeline-<uid>`), so a rerun on the same machine resumes there; created 0700 or checked to be this
  user's own private folder (runtime.work_folders: a folder another account made first is refused, never used).
- `session.resume_or_start(identity)`: the verified latest checkpoint of the same run (same `identity.json`),
  else an emptied `out`; with training.upload_checkpoints on an s3:// store, a rerun on another machine downloads
  the uploaded latest checkpoint of the same run first: every rank of this node gets its own file back into
  checkpoint/rank_N/ (a tensor/pipeline shard each), from this node's own pointer (checkpoints.remote_latest_name).
- `session.train(latest, yaml, origin=..., preflight_dir=...)`: the attempt loop; each attempt launches the stage's `StageYaml`
  (`name` for the fresh start, `resume_name` for a resume) written for it. Resumes from `latest`, syncs checkpoints
  on each tick (runner.CheckpointTicker: CPU budget, tolerates a checkpoint rotated away mid-check) and after
  each attempt; the loss guard's diagnosis (runner.describe_guard with the stage's name) stops the stage, or
  with a rollback policy resumes past the bad data window; every trip is added to `guard_diagnosis.json` (the bad
  batches' rows and source documents, what `data.exclude_from` reads). A hang (train.hang: the watchdog killed the tree) is
  recorded in `hang.json` and resumed from the last verified checkpoint; a second hang at the same step, or more
  than MAX_HANG_RESUMES hangs in one run, raises `TrainingHang` with `retryable = False`.
  The preflight is the first training.preflight_steps steps of a fresh start's first launch (train.preflight.
  PreflightWatch): a crash, a tripped guard or a bad verdict within them writes `<preflight_dir>/preflight.json`,
  forgets the run (a rerun starts afresh and preflights again) and raises the stage's preflight error.
- `StageYaml`: the mindformers yaml of either stage, a dict built once per attempt with the metrics and guard
  callbacks, resume fields and extra epochs, then written once (header + yaml).
Errors a user must fix are raised as the stage's own error class (`error`), naming the field and the fix.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .mindformers_yaml import build_run_config, write_run_yaml
from ..config.platform import device_target
from ..config.schema import GuardConfig, global_batch
from .. import killpoints
from ..storage import join, store_for
from ..runtime.nodes import node_rank
from ..runtime.work_folders import WORK_DIR_ENV, work_folder  # noqa: F401 (WORK_DIR_ENV: its name, for callers)
from .checkpoints import OPTIMIZER_UPLOAD, CheckpointManager, check_disk
from .checkpoint_split import RESUME_DIR, CheckpointSplitError, optimizer_file, resume_record
from .launch import GuardTripped, TrainingHang, TrainingLaunchError
from .metrics import METRICS_FILE, LossRule, plot_loss, read_metrics, training_callbacks
from .preflight import GB, PREFLIGHT_FILE, PreflightWatch
from .runner import (CheckpointTicker, TrainerKilled, describe_guard, launch_trainer, local_ranks, resume_fields,
                     rollback_checkpoint)

IDENTITY_FILE = "identity.json"
HANG_FILE = "hang.json"
GUARD_DIAGNOSIS_FILE = "guard_diagnosis.json"
MAX_HANG_RESUMES = 3


def work_dir(stage_uri: str, node_rank: int = 0, *, create: bool = False) -> Path:
    """The folder a stage trains in (see the module docstring). Node ranks > 0 of a multi-node job always train
    in their own local folder and publish their ranks' files: node 0 owns the stage folder (and may empty it when
    it starts), also when the run store is a file system every node shares. A local work folder is checked to be
    private when it exists; `create` (the stage that trains there) creates it 0700 when it does not."""
    store = store_for(stage_uri)
    if not store.remote and node_rank == 0:
        return store.local_path(stage_uri).resolve()
    name = hashlib.sha256(stage_uri.encode()).hexdigest()[:16] + (f"-node{node_rank}" if node_rank else "")
    return work_folder(name, create=create)  # private to this user, never through a link (runtime.work_folders)


def write_json(path: Path, obj) -> None:
    """Write `obj` as json atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(obj, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def finite(x):
    """x when it is a finite number, else None (json has no NaN)."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def clear_folder(folder: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove everything in `folder` but the entries named in `keep`."""
    for p in list(folder.iterdir()) if folder.is_dir() else ():
        if p.name not in keep:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def loss_history(out: Path, png: Path, title: str) -> list[dict]:
    """metrics.jsonl's records (each step once, also after a resume), plotted to `png` when there are any."""
    records = read_metrics(out / METRICS_FILE)
    if records:
        plot_loss(records, png, title=title)
    return records


@dataclass(frozen=True)
class Batch:
    """How a stage batches and guards its training: training.* for pretrain, sft.* for SFT."""

    micro_batch_size: int
    accumulation: int
    guard: GuardConfig


TENSORBOARD_FOLDER = "_tensorboard"


def tensorboard_dir(cfg, run_id: str, stage: str) -> Path | None:
    """`<output_root>/_tensorboard/<run.name>/<run_id>/<stage>`: every run of a lineage (the nightly's nights among
    them) under one folder, so `tensorboard --logdir <output_root>/_tensorboard/<run.name>` overlays them; mindformers
    adds `rank_N/`. None for an s3:// run store: mindformers' writer (tensorboardX) writes local files only."""
    from ..storage import store_for

    if store_for(cfg.run.output_root, cfg.run.s3_endpoint_url).remote:
        return None
    return Path(cfg.run.output_root) / TENSORBOARD_FOLDER / cfg.run.name / run_id / stage


def tensorboard_section(folder: Path) -> dict:
    """mindformers 1.9's `tensorboard` yaml section (trainer/base_trainer.py reads `tensorboard_dir`, appends
    `rank_N`; utils/tensorboard.py opens tensorboardX's SummaryWriter there; MFLossMonitor, core/callback/callback.py,
    adds `loss`, `learning-rate`, `grad-norm` and, with these flags, `loss-scale`, `iteration-time`, `throughput`
    per step)."""
    return {"tensorboard_dir": str(folder), "tensorboard_queue_size": 10,
            "log_loss_scale_to_tensorboard": True, "log_timers_to_tensorboard": True}


@dataclass(frozen=True)
class StageYaml:
    """The recipe of a stage's mindformers yaml: the fresh start (the preflight rides on it) and every resumed attempt
    are this run config (train.mindformers_yaml) with the PipelineMetrics / LossGuard callbacks and a few
    fields changed, built as a dict and written once. `name` is the fresh start's file name, `resume_name`
    a resumed attempt's; `load` the weights a fresh start loads (None: random init)."""

    cfg: Any
    stage: str
    batch: Batch
    data_dir: Path
    rows: int
    name: str
    resume_name: str
    load: Path | None = None
    token_ids: Any = None
    tensorboard_dir: Path | None = None  # mindformers' own `tensorboard` section writes its event files there

    def run_config(self, out: Path, *, resume_from: Path | None = None, extra_epochs: int = 0) -> dict:
        """The run config of an attempt in `out`. `resume_from` is a checkpoint file `<dir>/rank_N/<name>.ckpt`:
        the yaml gets `load_checkpoint: <dir>` and `resume_training: <name>` (runner.resume_fields: mindformers 1.9
        resumes only from a folder). `extra_epochs` lets a rollback (which skips data) reach the same
        optimizer-step budget."""
        cfg, batch = self.cfg, self.batch
        dp = cfg.parallel.data_parallel
        on_cpu = device_target(cfg) == "CPU"
        # tokens per optimizer step across all ranks (rows hold seq_length + 1 tokens, seq_length are predicted)
        tokens = global_batch(cfg, self.stage) * cfg.model.seq_length
        callbacks = training_callbacks(out, tokens_per_step=tokens, data_parallel=dp, num_rows=self.rows,
                                       batch_size=batch.micro_batch_size * (batch.accumulation if on_cpu else 1),
                                       spike_factor=batch.guard.spike_factor, window=batch.guard.window,
                                       shuffle_seed=cfg.run.seed if cfg.training.shuffle else None,
                                       dataset_dir=self.data_dir)
        resume = resume_fields(resume_from) if resume_from is not None else {}
        load = resume.get("load_checkpoint", self.load)
        run = build_run_config(cfg, stage=self.stage, dataset_dir=str(self.data_dir), output_dir=str(out),
                               load_checkpoint=str(load) if load else None, resume=bool(resume), train_rows=self.rows,
                               extra_callbacks=callbacks, token_ids=self.token_ids)
        # the loss rank and normalisation come from the values mindformers reads in this config (metrics.LossRule)
        rule = LossRule.from_run_yaml(run).to_json()
        for cb in run["callbacks"]:
            if cb["type"] in ("PipelineMetrics", "LossGuard"):
                cb["loss_rule"] = rule
        if resume:
            run["resume_training"] = resume["resume_training"]
        run["runner_config"]["epochs"] += extra_epochs
        if self.tensorboard_dir is not None:
            run["tensorboard"] = tensorboard_section(self.tensorboard_dir)
        return run

    def write(self, path: Path, out: Path, **changes) -> Path:
        """Write the run config of an attempt in `out` (changes as in run_config) to `path`; returns the path."""
        return write_run_yaml(self.cfg, path, self.run_config(out, **changes), stage=self.stage)


@dataclass
class Trained:
    """What the attempt loop ends with."""

    latest: dict                        # the latest_checkpoint.json record of the final step
    resumed_from_step: int | None
    attempts: int = 0
    rollbacks: list[dict] = field(default_factory=list)
    hangs: list[dict] = field(default_factory=list)  # the hang watchdog's reports of this stage run
    peak_rss_bytes: int = 0             # the highest peak RSS of the trainer's process tree over the attempts
    preflight: dict | None = None       # preflight.json's report (this run's first attempt wrote it)


class TrainingSession:
    """One stage's training in `out` (see the module docstring)."""

    def __init__(self, cfg, *, stage: str, out: Path, remote: str | None, endpoint: str | None, steps: int,
                 log, progress=None, env: dict[str, str] | None = None, error: type[Exception] = ValueError,
                 preflight_error: type[Exception] = ValueError):
        self.cfg, self.stage, self.out, self.remote, self.endpoint = cfg, stage, Path(out), remote, endpoint
        self.steps, self.log, self.progress, self.env = steps, log, progress, env
        self.error, self.preflight_error = error, preflight_error
        try:
            self.node_rank = node_rank(cfg)
        except ValueError as err:
            raise error(str(err)) from None
        self.ranks = local_ranks(cfg, self.node_rank)
        # on a local run store the checkpoints already live in the stage folder: nothing to upload
        self.upload = join(remote, "checkpoint") if remote and cfg.training.upload_checkpoints else None
        self.manager = CheckpointManager(self.out, ranks=self.ranks, keep=cfg.training.keep_checkpoint_max,
                                         upload_uri=self.upload, endpoint_url=endpoint, log=log,
                                         node_rank=self.node_rank)

    # ------------------------------------------------------------ free disk

    def check_disk(self, need) -> int:
        """Room under `out` for `need` (a planner.disk.CheckpointDisk: this node's checkpoints at the worst moment);
        raises InsufficientDiskError naming the need and the knobs that change it. Returns the free bytes."""
        from ..planner.disk import disk_fix

        where = ("$LLM_PIPELINE_WORK_DIR (s3:// runs train in a local work folder)" if self.remote
                 else "run.output_root")
        free = check_disk(self.out, need.total, need.explain(), disk_fix(self.cfg, need, where=where))
        self.log(f"{self.stage}: {free / GB:.1f} GB free for {need.explain()} = {need.total / GB:.1f} GB")
        return free

    # ------------------------------------------------------------ resume

    def resume_or_start(self, identity: str, keep: tuple[str, ...] = ()) -> dict | None:
        """The verified latest checkpoint of the run `identity`, or None after emptying `out` (but `keep`)."""
        ident_file = self.out / IDENTITY_FILE
        same_run = ident_file.exists() and json.loads(ident_file.read_text(encoding="utf-8")).get("identity") == identity
        if same_run:
            self.manager.sync()  # verify what a killed attempt left behind
        elif self.upload:
            clear_folder(self.out, keep)
            write_json(ident_file, {"identity": identity})
            self._restore_uploaded(identity)
            same_run = self.manager.latest() is not None
        latest = self.manager.latest() if same_run else None
        if latest is not None and not all(Path(r["path"]).exists() for r in latest["ranks"].values()):
            latest = None
        if latest is None:  # an earlier run of another config, or an attempt without a checkpoint
            clear_folder(self.out, keep)
            write_json(ident_file, {"identity": identity})
            if self.remote:
                store_for(self.remote, self.endpoint).put_file(ident_file, join(self.remote, IDENTITY_FILE))
        else:
            killpoints.reached("train.resuming")
        return latest

    def _restore_uploaded(self, identity: str) -> None:
        """Download the uploaded latest checkpoint of this node (every one of its ranks' own file, with sidecars) of
        the same run into `out`: rank N's file goes back to checkpoint/rank_N/, where mindformers 1.9 resumes it."""
        store = store_for(self.upload, self.endpoint)
        ident_uri, latest_uri = join(self.remote, IDENTITY_FILE), join(self.upload, self.manager.remote_latest)
        if not (store.exists(ident_uri) and store.exists(latest_uri)):
            return
        if json.loads(store.get_bytes(ident_uri))["identity"] != identity:
            return
        latest = json.loads(store.get_bytes(latest_uri))
        if sorted(int(r) for r in latest["ranks"]) != self.ranks:
            self.log(f"{self.stage}: the uploaded checkpoint holds ranks {sorted(latest['ranks'], key=int)}, this node "
                     f"runs {self.ranks}: not resumed from it")
            return
        for rank, info in latest["ranks"].items():
            if not info.get("uri"):
                return
            dest = self.out / self.manager.subdir / f"rank_{rank}" / info["uri"].rsplit("/", 1)[-1]
            store.get_file(info["uri"], dest)
            store.get_file(info["uri"] + ".verified.json", dest.with_name(dest.name + ".verified.json"))
            opt_uri = join(info["uri"].rsplit("/", 1)[0], OPTIMIZER_UPLOAD + dest.name)
            if store.exists(opt_uri):  # the split file's optimizer state (train.checkpoint_split)
                store.get_file(opt_uri, optimizer_file(dest))
        metrics_uri = join(self.remote, METRICS_FILE)
        if store.exists(metrics_uri):
            store.get_file(metrics_uri, self.out / METRICS_FILE)
        self.log(f"{self.stage}: downloaded the uploaded checkpoint of step {latest['step']} from {self.upload} "
                 "to resume")
        self.manager.sync()

    def _short_of_steps(self, reached, steps: int, out: Path) -> str:
        """Why the trainer ended before its optimizer steps: the steps whose gradients overflowed (their updates are
        skipped, so the optimizer step count falls behind the data steps), from metrics.jsonl, else the epochs."""
        rows = read_metrics(self.out / METRICS_FILE)
        overflowed = [r["step"] for r in rows if r.get("overflow")]
        head = f"{self.stage}: training stopped at optimizer step {reached} of {steps} without an error"
        if not overflowed:
            return f"{head}: too few epochs of data for the steps (check the MindRecord rows); see {out}/log"
        section = "sft" if self.stage == "sft" else "training"
        return (f"{head}: {len(overflowed)} of {len(rows)} steps overflowed (gradients not finite from step "
                f"{overflowed[0]}; their updates were skipped), so the run did not train. Fix: lower "
                f"{section}.learning_rate (a tenth is a first try) or clip harder (training.grad_clip); see {out}/log")

    # ------------------------------------------------------------ preflight

    def _preflight_watch(self, folder: Path, memory_check: bool, from_trained: bool) -> PreflightWatch | None:
        """The watch over a fresh start's first training.preflight_steps steps (None when they are 0); its verdict
        is written to `<folder>/preflight.json` and logged as soon as it is made."""
        cfg = self.cfg
        steps = min(cfg.training.preflight_steps, self.steps)
        if not steps:
            return None
        # the steps are judged where metrics.jsonl is written: the node running the rank whose loss is recorded
        loss_rank = LossRule(pipeline_stages=cfg.parallel.pipeline_stage).loss_rank(cfg.parallel.devices)
        if loss_rank not in self.ranks:
            self.log(f"{self.stage}: the preflight is judged on the node running rank {loss_rank} (its loss is the "
                     "recorded one)")
            return None
        # on CPU the devices are processes on this host: their summed RSS is what the device memory limit bounds
        on_cpu = device_target(cfg) == "CPU"
        limit = int(cfg.parallel.device_memory_gb * GB * len(self.ranks)) if memory_check and on_cpu else None
        (folder / PREFLIGHT_FILE).unlink(missing_ok=True)

        def verdict(report: dict) -> None:
            write_json(folder / PREFLIGHT_FILE, report)
            memory_line = report.get("memory")
            self.log(f"{self.stage}: {report['message']}" + (f"; {memory_line}" if memory_line else ""))

        return PreflightWatch(self.out / METRICS_FILE, steps, memory_limit_bytes=limit, devices=len(self.ranks),
                              planner_line=self._planner_line if memory_check else None, on_verdict=verdict,
                              section="sft" if self.stage == "sft" else "training", from_trained=from_trained)

    def _preflight_end(self, watch: PreflightWatch, folder: Path, *, peak_rss: int = 0, crash: str | None = None,
                       killed: bool = False) -> None:
        """After the preflight's launch: the verdict over what it left when the watch had not judged yet; a bad
        verdict forgets this run (a rerun starts afresh and preflights again, whatever the trainer saved) and raises
        the stage's preflight error. `killed`: a signal ended the trainer before the verdict, which is no verdict:
        the run is forgotten and the caller re-raises the kill (transient)."""
        if killed:
            self._forget_run("the trainer was killed before the preflight's verdict")
            return
        report = watch.conclude(peak_rss, crash)
        if report["ok"]:
            return
        self._forget_run("the preflight failed")
        memory_line = report.get("memory")
        raise self.preflight_error(f"{self.stage} {report['message']}" + (f"\n{memory_line}" if memory_line else "")
                                   + f"\n(see {folder / PREFLIGHT_FILE}; the trainer's log: {self.out / 'log'})"
                                   + (f"\n{crash}" if crash else "")) from None  # not "during TrainingHang"

    def _forget_run(self, why: str) -> None:
        """No checkpoint of this run is resumed: a rerun starts afresh (the identity no run has)."""
        shutil.rmtree(self.out / self.manager.subdir, ignore_errors=True)
        self.manager.latest_path.unlink(missing_ok=True)
        write_json(self.out / IDENTITY_FILE, {"identity": None, "forgotten": why})
        if self.remote:
            store_for(self.remote, self.endpoint).put_file(self.out / IDENTITY_FILE, join(self.remote, IDENTITY_FILE))

    def _planner_line(self, measured_gb: float) -> tuple[float | None, str]:
        from ..planner import predicted_peak_gb, predicted_vs_measured

        try:
            return predicted_peak_gb(self.cfg), predicted_vs_measured(self.cfg, measured_gb)
        except Exception as err:  # the planner is advice: never fail the preflight on it
            return None, f"planner prediction unavailable: {err}"

    # ------------------------------------------------------------ the attempt loop

    def train(self, latest: dict | None, yaml: StageYaml, *, origin: str, preflight_dir: Path,
              memory_check: bool = False, rollback: GuardConfig | None = None, steps_per_epoch: int = 1) -> Trained:
        """Train until optimizer step `steps`, resuming from `latest`. Each attempt launches `yaml` written for it in
        `out`: `yaml.name` for the fresh start from `origin`, `yaml.resume_name` for a resume (with the epochs the
        data skipped by rollbacks needs). `rollback` (a guard with
        on_failure=rollback) resumes past a bad data window at most max_rollbacks times; else the guard stops.
        A fresh start's first launch is also the preflight (train.preflight.PreflightWatch): its verdict goes to
        `<preflight_dir>/preflight.json` (`memory_check`: the peak RSS against parallel.device_memory_gb and the
        planner's prediction); a resumed run keeps the report its first attempt wrote."""
        steps, out, manager = self.steps, self.out, self.manager
        done = Trained(latest, latest["step"] if latest else None)
        from_trained = bool(yaml.load) and self.stage != "sft"  # continued pretraining: flat is not a failure
        watch = self._preflight_watch(preflight_dir, memory_check, from_trained) if latest is None else None
        if watch is None and (preflight_dir / PREFLIGHT_FILE).exists():
            done.preflight = json.loads((preflight_dir / PREFLIGHT_FILE).read_text(encoding="utf-8"))
        if self.progress:
            self.progress("train", latest["step"] if latest else 0, steps)
        tick = CheckpointTicker(manager, out, steps, self.progress, self.log,
                                join(self.remote, METRICS_FILE) if self.upload else None, self.endpoint)
        skipped = 0  # data steps skipped by rollbacks: the run needs that many more batches
        while latest is None or (latest.get("global_step") or 0) < steps:
            done.attempts += 1
            if latest is None:
                yaml_path = yaml.write(out / yaml.name, out)
                self.log(f"{self.stage}: training {steps} steps from {origin}"
                         + (f"; its first {watch.steps} are the preflight" if watch and not watch.report else ""))
            else:
                start = Path(latest.get("rollback_path") or self._resumable(latest)["path"])
                yaml_path = yaml.write(out / yaml.resume_name, out, resume_from=start,
                                       extra_epochs=math.ceil(skipped / steps_per_epoch) if skipped else 0)
                self.log(f"{self.stage}: training {steps} steps from {start.name} (resume), resuming at data step "
                         f"{latest.get('data_step', latest['step'])} (optimizer step {latest.get('global_step')}) "
                         f"of {steps}")
            judging = watch if watch is not None and watch.report is None else None
            try:
                try:
                    result = launch_trainer(self.cfg, yaml_path, out, self.node_rank, self.log, on_tick=tick,
                                            env=self.env, attempt=done.attempts, preflight=judging)
                except TrainingLaunchError as err:
                    if judging is not None:  # the verdict came first (the watch stopped it), or there is none yet
                        self._preflight_end(judging, preflight_dir, peak_rss=err.result.peak_rss_bytes or 0,
                                            crash=None if judging.report or isinstance(err, GuardTripped) else str(err),
                                            killed=isinstance(err, TrainerKilled) and judging.report is None)
                    raise
                if judging is not None:  # a passed verdict, or a run shorter than the preflight judged now
                    self._preflight_end(judging, preflight_dir, peak_rss=result.peak_rss_bytes or 0)
                done.peak_rss_bytes = max(done.peak_rss_bytes, result.peak_rss_bytes or 0)
            except TrainingHang as err:
                manager.sync()
                tick.upload_metrics()
                self._after_hang(err, done)
                latest = manager.latest()
                self._say_hang_resume(err.report, latest, done)
                continue
            except GuardTripped as err:
                latest = self._after_guard(err, done, rollback, steps_per_epoch)
                skipped += int(latest["data_step"]) - int(latest["step"])
                continue
            except TrainingLaunchError:
                manager.sync()  # what the failed attempt saved is verified and latest_checkpoint.json points at it
                tick.upload_metrics()
                raise
            manager.sync()
            latest = manager.latest()
            if latest is None:
                raise self.error(f"training left no verified checkpoint in {out}/checkpoint: see the log above; "
                                 "check training.save_steps and the disk")
            if (latest.get("global_step") or 0) < steps:
                raise self.error(self._short_of_steps(latest.get("global_step"), steps, out))
        done.latest = latest
        shutil.rmtree(out / RESUME_DIR, ignore_errors=True)  # the joined resume files: a full copy, no longer needed
        if watch is not None:
            done.preflight = watch.report
        if self.progress:
            self.progress("train", steps, steps)
        return done

    def _resumable(self, latest: dict) -> dict:
        """`latest` with one file per rank that mindformers resumes from: the split weights + optimizer state
        (+ a LoRA file's base) joined under checkpoint_resume/ (train.checkpoint_split), replaced at each resume."""
        dest = self.out / RESUME_DIR
        shutil.rmtree(dest, ignore_errors=True)
        try:
            return resume_record(latest, dest)
        except CheckpointSplitError as err:
            raise self.error(str(err)) from None

    def _record_guard(self, diagnoses: list[dict]) -> None:
        """Add a trip's diagnoses (every rank's) to guard_diagnosis.json: `trips` (step, rank, reason, loss, rows,
        documents) and `documents`, every source document of every bad batch once, which `data.exclude_from` reads."""
        path = self.out / GUARD_DIAGNOSIS_FILE
        trips = json.loads(path.read_text(encoding="utf-8"))["trips"] if path.exists() else []
        for d in diagnoses:
            trips.append({k: d.get(k) for k in ("step", "epoch", "rank", "reason", "message", "batch_rows",
                                                "batch_where", "documents", "documents_error")}
                         | {"loss": finite(d.get("loss"))})
        docs: dict = {}
        for trip in trips:
            for doc in trip.get("documents") or []:
                docs.setdefault(doc["origin"], {"id": doc["id"], "origin": doc["origin"], "steps": []})
                if trip["step"] not in docs[doc["origin"]]["steps"]:
                    docs[doc["origin"]]["steps"].append(trip["step"])
        write_json(path, {"stage": self.stage, "trips": trips, "documents": list(docs.values())})

    def _say_hang_resume(self, report: dict, latest: dict | None, done: Trained) -> None:
        """The terminal's line that a hang was declared and training goes on, and the step it resumes from (the
        manifest's resumed_from_step: the first resume of this stage run, when it did not already resume)."""
        at = latest["step"] if latest else None
        if done.resumed_from_step is None and at is not None:
            done.resumed_from_step = at
        self.log(f"{self.stage}: WARNING training hung after step {report.get('step')} (ranks "
                 f"{report.get('first_ranks')} stopped first; no step finished for {report.get('idle_s')} s, limit "
                 f"{report.get('limit_s')} s: {report.get('limit_why')}); the trainer tree was killed and training resumes " +
                 (f"from the checkpoint of step {at}" if at is not None else "from the start (no verified checkpoint)")
                 + f". Stacks of every rank: {report.get('stacks')}")

    def _after_hang(self, err: TrainingHang, done: Trained) -> None:
        """Record the hang in hang.json; raise it (not retryable) when it repeats a step or there were too many."""
        path = self.out / HANG_FILE
        earlier = json.loads(path.read_text(encoding="utf-8"))["hangs"] if path.exists() else []
        report = {**err.report, "attempt": done.attempts}
        write_json(path, {"hangs": [*earlier, report]})
        done.hangs.append(report)
        step = report.get("step")
        again = [h for h in earlier if h.get("step") == step]
        why = (f"it hung at step {step} before (attempt {again[0].get('attempt')}): resuming would hang there again"
               if again else f"{len(earlier) + 1} hangs in this run (at most {MAX_HANG_RESUMES} are resumed)"
               if len(earlier) >= MAX_HANG_RESUMES else None)
        if why is not None:
            err.retryable = False
            err.args = (f"{self.stage}: training hung and is not resumed: {why}; see {path} and the stacks in "
                        f"{report.get('stacks')}\n{err}",)
            raise err

    def _after_guard(self, err: GuardTripped, done: Trained, rollback: GuardConfig | None,
                     steps_per_epoch: int) -> dict:
        """The guard tripped: raise its diagnosis, or (rollback policy) return the record to resume from."""
        self.manager.sync()
        good = self.manager.latest()
        self._record_guard(err.diagnoses)
        diag = err.diagnoses[0]
        message = describe_guard(diag, good, stage=self.stage)
        if rollback is None or len(done.rollbacks) >= rollback.max_rollbacks or good is None:
            why = ("" if rollback is None else " (no checkpoint to roll back to)" if good is None else
                   f" (training.guard.max_rollbacks={rollback.max_rollbacks} reached)")
            raise GuardTripped(message + why + "\n" + str(err), err.result, err.diagnoses) from None
        bad = int(diag["step"])
        n = len(done.rollbacks) + 1
        dest = rollback_checkpoint(self._resumable(good), self.out / "rollback" / f"rollback{n}_step{bad}", bad, steps_per_epoch)
        done.rollbacks.append({"bad_step": bad, "from_step": good["step"],
                               "skipped_steps": list(range(good["step"] + 1, bad + 1)),
                               "loss": finite(diag.get("loss")), "reason": diag.get("reason"),
                               "rows": diag.get("batch_rows")})
        self.log(f"{message}\n{self.stage}: rollback {n}/{rollback.max_rollbacks}: back to step {good['step']}, "
                 f"skipping data steps {good['step'] + 1}..{bad}")
        return {**good, "rollback_path": str(dest), "data_step": bad}
