"""A night's documents: the data stage's counts per file, their entry into the lineage's dedup index when the night
is promoted, and whether a failed night failed on them.

The nightly runs the data stage with data.dedup.defer_publish: the stage merges its segment's entries into the
index partitions (unseen by readers without the segment's meta.json) and keeps the segment in <run>/data/segment/.
publish_night_documents puts it into the index when the night is promoted (by the gate or by hand later); a held
night's segment is never published, so its documents are new again when they are carried to the next night.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..config.schema import PipelineConfig
from ..storage import RunPaths, join, store_for

# preflight problems that are the night's data rather than the machine (train/preflight.py's problem lines): a
# memory limit, a run shorter than the preflight or a crash are not
DATA_PROBLEMS = ("loss rose", "loss did not fall", "loss is not finite", "gradients not finite")


def night_index_cfg(cfg: PipelineConfig) -> PipelineConfig:
    """The config whose data.dedup names the nightly's own index (tonight.nightly_overrides' lineage rule)."""
    from ..data.dedup_index import lineage

    if cfg.data.dedup.lineage:
        return cfg
    out = cfg.model_copy(deep=True)
    out.data.dedup.lineage = f"{lineage(cfg)}-nightly"
    return out


def night_documents(cfg: PipelineConfig, run_id: str) -> dict[str, dict]:
    """Per input file URI the data stage's counts (stats.json): kept, duplicates (exact + near), filtered,
    rejected; {} when the stage left no stats.json."""
    uri = join(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("data"), "stats.json")
    store = store_for(uri, cfg.run.s3_endpoint_url)
    if not store.exists(uri):
        return {}
    out = {}
    for entry in json.loads(store.get_bytes(uri)).get("files", {}).values():
        out[entry["uri"]] = {"kept": entry["kept"], "duplicates": entry["exact_duplicates"] + entry["near_duplicates"],
                             "filtered": entry["filtered_total"], "rejected": entry["rejected_total"]}
    return out


def publish_night_documents(cfg: PipelineConfig, run_id: str) -> str | None:
    """Put night `run_id`'s kept segment (<run>/data/segment/) into the nightly's dedup index: from now on its
    documents are "seen before". Idempotent. Returns the segment's folder in the index, None when the night kept
    none (no incremental index, or a run of an earlier version that published at the end of its data stage)."""
    from ..data.dedup_index import index_uri, publish_segment
    from ..data.stage import KEPT_SEGMENT

    folder = join(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("data"), KEPT_SEGMENT)
    store = store_for(folder, cfg.run.s3_endpoint_url)
    files = [u for u in store.list(folder.rstrip("/") + "/")]
    if not any(u.endswith("/meta.json") for u in files):
        return None
    with tempfile.TemporaryDirectory(prefix="night-segment-") as tmp:
        names = []
        for uri in files:
            name = uri.rsplit("/", 1)[-1]
            store.get_file(uri, Path(tmp) / name)
            names.append(name)
        target = index_uri(night_index_cfg(cfg))
        return publish_segment(Path(tmp), names, target, run_id, cfg.run.s3_endpoint_url)


def data_failure(cfg: PipelineConfig, run_id: str) -> str | None:
    """Why a failed night failed on its data, else None: its loss guard tripped (guard/rank_*.json in the pretrain
    stage) or its preflight judged the loss of tonight's documents bad (preflight.json: not ok, no crash, a loss
    problem). A killed trainer, a full disk or a memory limit are not the data's: None."""
    from ..train.metrics import GUARD_DIR
    from ..train.preflight import PREFLIGHT_FILE

    stage = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("pretrain")
    store = store_for(stage, cfg.run.s3_endpoint_url)
    found = store.list(stage.rstrip("/") + "/")
    guards = [u for u in found if f"/{GUARD_DIR}/rank_" in u and u.endswith(".json")]
    if guards:
        message = json.loads(store.get_bytes(guards[0])).get("message", "")
        return f"the loss guard stopped training: {message.splitlines()[0] if message else guards[0]}"
    preflight = [u for u in found if u.endswith(f"/{PREFLIGHT_FILE}")]
    if preflight:
        report = json.loads(store.get_bytes(preflight[0]))
        problems = [p for p in report.get("problems") or [] if p.startswith(DATA_PROBLEMS)]
        if not report.get("ok") and not report.get("crash") and problems:
            return f"preflight failed on tonight's documents: {problems[0]}"
    return None
