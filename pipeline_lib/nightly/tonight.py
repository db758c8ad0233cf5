"""Tonight's config and what a finished night left behind (checkpoint, tokenizer, held-out split, metrics)."""
from __future__ import annotations

import json

from ..config.schema import PipelineConfig
from ..storage import join, store_for
from .schedule import lineage_overrides

def replay_runs(cfg: PipelineConfig, state: dict) -> list[str]:
    """data.replay.runs for tonight: the configured ones, then the promoted nights whose data stage is still there
    (their packed rows are what replay samples; data/replay.py): the newest nightly.retention.replay_nights of them,
    the ones retention keeps, never one whose rows retention removed."""
    from ..storage import RunPaths
    from .retention import DATA, removed_by_retention, replay_nights_kept

    runs = list(cfg.data.replay.runs)
    for run_id in replay_nights_kept(cfg.nightly.retention, state, replay_on=True):
        manifest = join(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("data"), "manifest.json")
        if (run_id not in runs and store_for(manifest, cfg.run.s3_endpoint_url).exists(manifest)
                and DATA not in removed_by_retention(cfg, run_id)):
            runs.append(run_id)
    return runs


def nightly_overrides(cfg: PipelineConfig, state: dict, files: dict[str, int]) -> dict:
    """Config changes for tonight: only the new files, continue from last night's checkpoint, score the
    lineage's fixed held-out split beside the configured evaluate.reference_heldout, and deduplicate against
    the nights only: the nightly is its own lineage (`<run.name>-nightly` unless data.dedup.lineage is set), so a
    manual run of the same config (make demo) does not make every document of the first night "seen before";
    with data.replay on, replay from the promoted nights (replay_runs); under nightly.lr_schedule=lineage, continue the
    lineage's warmup-stable-decay from the promoted night's stable-phase weights (schedule.lineage_overrides)."""
    from ..data.dedup_index import lineage

    # the night's segment of the dedup index is published only when the night is promoted (documents.py)
    changes: dict = {"data": {"inputs": sorted(files), "dedup": {"defer_publish": True}}}
    if cfg.data.replay.fraction > 0:
        changes["data"]["replay"] = {"runs": replay_runs(cfg, state)}
    if not cfg.data.dedup.lineage:
        changes["data"]["dedup"]["lineage"] = f"{lineage(cfg)}-nightly"
    if state.get("reference_heldout"):
        changes["evaluate"] = {"reference_heldout": list(dict.fromkeys([*cfg.evaluate.reference_heldout,
                                                                       state["reference_heldout"]]))}
    latest = state.get("latest")
    if latest and latest.get("checkpoint"):
        changes["model"] = {"base_checkpoint": latest["checkpoint"], "hf_checkpoint": None}
        if latest.get("tokenizer"):  # one tokenizer per lineage: never a new one trained on tonight's files
            changes["tokenizer"] = {"path": latest["tokenizer"]}
        # the promoted model is evaluated as `base` (model.base_checkpoint) beside tonight's candidate: the gate
        # compares the two (nightly.gate)
    for section, values in lineage_overrides(cfg, state).items():  # nightly.lr_schedule=lineage (nightly/schedule.py)
        changes.setdefault(section, {}).update(values)
    return changes


def next_base_checkpoint(cfg: PipelineConfig, run_id: str, log=None) -> str | None:
    """Tonight's pretrain checkpoint as one full .ckpt for tomorrow's model.base_checkpoint: the merged copy of
    every rank's file for a tensor/pipeline-parallel run (model.checkpoint_cache.pretrain_checkpoint), else the file."""
    from ..model.checkpoint_cache import pretrain_checkpoint
    from ..storage import RunPaths

    return pretrain_checkpoint(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url), None, log)


def night_tokenizer(cfg: PipelineConfig, run_id: str) -> str | None:
    """The tokenizer tonight's weights were trained with, as the pretrain manifest records it (beside the weights:
    model.tokenizer_lineage); tomorrow's night loads it as tokenizer.path."""
    from ..storage import RunPaths, read_manifest

    m = read_manifest(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("pretrain"),
                      cfg.run.s3_endpoint_url)
    found = (m.metrics or {}).get("tokenizer") if m else None
    return found.get("uri") if isinstance(found, dict) else None


def night_heldout(cfg: PipelineConfig, run_id: str) -> str | None:
    """Tonight's domain held-out split (data/mindrecord/heldout), None when the data stage held out no row."""
    from ..runtime.upstream import find_heldout
    from ..storage import RunPaths

    return find_heldout(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url))


def evaluate_metrics(cfg: PipelineConfig, run_id: str) -> dict:
    """The night's evaluate manifest metrics (what the gate judges); {} when the stage wrote none."""
    from ..storage import RunPaths, read_manifest

    m = read_manifest(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("evaluate"),
                      cfg.run.s3_endpoint_url)
    return (m.metrics or {}) if m else {}


def no_new_documents(cfg: PipelineConfig, run_id: str) -> dict | None:
    """The counts the data stage left when every document of the night was seen before, else None."""
    from ..data.prep import NO_NEW_DOCUMENTS
    from ..storage import RunPaths

    uri = join(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("data"), NO_NEW_DOCUMENTS)
    store = store_for(uri, cfg.run.s3_endpoint_url)
    return json.loads(store.get_bytes(uri)) if store.exists(uri) else None


def deep_update(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = deep_update(out.get(key) or {}, value) if isinstance(value, dict) and key != "compare_checkpoints" \
            else value
    return out


def tonight_timing(cfg: PipelineConfig, run_id: str, summary: dict) -> dict | None:
    """What tonight's training measured for tomorrow's nightly.deadline sizing (deadline.night_timing): the pretrain
    manifest's steps and median step time, each stage's wall time from the pipeline's summary."""
    from ..storage import RunPaths, read_manifest
    from .deadline import night_timing

    m = read_manifest(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("pretrain"),
                      cfg.run.s3_endpoint_url)
    metrics = (m.metrics or {}) if m else {}
    seconds = {stage: entry.get("seconds") or 0.0 for stage, entry in (summary.get("stages") or {}).items()}
    return night_timing(metrics.get("steps") or cfg.training.steps, metrics.get("step_time_ms"), seconds)
