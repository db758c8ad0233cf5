"""The lineage schedule (nightly.lr_schedule=lineage): one warmup-stable-decay across the nights of a lineage.

The lineage warms up once (training.warmup_steps, in its first night), each night trains at the held rate
and ends with a short decay (training.decay_steps / decay_fraction) for the checkpoint it hands on, as OLMo-core's
WSDS does for multi-period pretraining. Two checkpoints per night:
- the decayed weights (the pretrain stage's `weights_checkpoint`): evaluated, gated, handed to SFT and export, and
  `latest.checkpoint` when the night is promoted (model.base_checkpoint of the next night: the `base` it is judged
  against);
- the stable-phase weights, written as the decay starts (`stable_checkpoint` of the pretrain manifest): what the next
  night continues (training.stable_checkpoint), so no night trains on top of another night's decay.
The state keeps, per night, `schedule` = {lineage_steps: held-rate steps of the lineage up to and including this
night, stable_checkpoint, stable_step, decay_steps, total_steps, stable_lr} (history entry; `latest` for a promoted
night). A held night does not move `latest`, so the next night continues the promoted night's schedule.
"""
from __future__ import annotations

from ..config.schema import PipelineConfig


def lineage_overrides(cfg: PipelineConfig, state: dict) -> dict:
    """Tonight's training.* under the lineage schedule ({} for per_run): wsd, the warm-up continued where the promoted
    night's left it, its stable-phase weights as the start, and the stable weights of tonight kept."""
    if cfg.nightly.lr_schedule != "lineage":
        return {}
    done = ((state.get("latest") or {}).get("schedule")) or {}
    training = {"lr_schedule": "wsd", "keep_stable_weights": True, "lineage_steps": int(done.get("lineage_steps", 0))}
    if done.get("stable_checkpoint"):
        training["stable_checkpoint"] = done["stable_checkpoint"]
    return {"training": training}


def lineage_record(lr_schedule: dict, stable_checkpoint: str | None) -> dict:
    """The night's `schedule` record from its pretrain manifest's `lr_schedule` (train/stage.py _schedule_metrics):
    the lineage's held-rate steps after tonight = before tonight + tonight's steps up to its decay."""
    return {"lineage_steps": int(lr_schedule["lineage_steps"]) + int(lr_schedule["stable_step"]),
            "stable_checkpoint": stable_checkpoint, "stable_step": lr_schedule["stable_step"],
            "decay_steps": lr_schedule["decay_steps"], "total_steps": lr_schedule["total_steps"],
            "stable_lr": lr_schedule.get("stable_lr")}


def schedule_record(night_cfg: PipelineConfig, run_id: str) -> dict:
    """What commit_night keeps of tonight's schedule, {"schedule": {...}}, or {} when the night did not train a wsd
    lineage (per_run, or nothing trained)."""
    from ..storage import RunPaths, read_manifest

    if night_cfg.nightly.lr_schedule != "lineage":
        return {}
    m = read_manifest(RunPaths(night_cfg.run.output_root, run_id, night_cfg.run.s3_endpoint_url).stage_uri("pretrain"),
                      night_cfg.run.s3_endpoint_url)
    metrics = (m.metrics or {}) if m else {}
    sched, stable = metrics.get("lr_schedule") or {}, metrics.get("stable_checkpoint") or {}
    if sched.get("kind") != "wsd":
        return {}
    return {"schedule": lineage_record(sched, stable.get("path"))}


def lineage_note(night_cfg: PipelineConfig) -> str:
    """What the night's log says of its schedule ("" under per_run): where the lineage's warm-up stands and the decay."""
    from ..config.schema import wsd_decay_steps

    t = night_cfg.training
    if night_cfg.nightly.lr_schedule != "lineage":
        return ""
    return (f"; lineage schedule: wsd from the lineage's step {t.lineage_steps} (warm-up {t.warmup_steps}), the last "
            f"{wsd_decay_steps(t)} of {t.steps} steps decay to {t.min_lr:g}")
