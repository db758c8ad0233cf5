"""Where a failed run's logs are: the failed stage's folder under run.output_root/<run_id>/.

The training stages keep theirs in the stage folder: msrun's `msrun/worker_N.log` and `scheduler.log`, mindformers'
`log/rank_N/*.log` (LOG_MF_PATH; the preflight is the first steps of the same launch), `preflight.json` (its verdict's
message: a bad one is the failure, which no trainer log holds) and the loss guard's diagnosis json. Evaluate and export run their worker in a scratch folder that is removed; their failure text travels in the stage's error
message (the worker's last lines), which the stage failure path classifies.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..storage import RunPaths
from ..train.metrics import GUARD_DIR
from ..train.preflight import PREFLIGHT_FILE

LOG_GLOBS = ("**/*.log", "**/*.log.[0-9]*")


def failed_stage(cfg, paths: RunPaths) -> str | None:
    """The first stage, in pipeline order, whose folder exists but whose manifest does not match."""
    from ..stages import SPECS, stage_done

    for stage in SPECS:
        folder = Path(paths.stage_uri(stage))
        if folder.is_dir() and not stage_done(cfg, paths, stage)[0]:
            return stage
    return None


def stage_log_files(folder: Path) -> list[Path]:
    found = {p for pattern in LOG_GLOBS for p in folder.glob(pattern) if p.is_file()}
    found |= {p for p in folder.glob(f"**/{GUARD_DIR}/rank_*.json") if p.is_file()}
    found |= {p for p in folder.glob(f"**/{PREFLIGHT_FILE}") if p.is_file()}
    return sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))


def read_logs(files: list[Path], max_bytes: int = 4_000_000) -> str:
    """The files' text, each after a `==> path <==` header; of a large file only its last `max_bytes`."""
    parts = []
    for path in files:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", "replace")
        if path.suffix == ".json":  # the loss guard's diagnosis, the preflight's verdict: the message is the evidence
            try:
                text = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                pass
        parts.append(f"==> {path} <==\n{text}")
    return "\n".join(parts)


def run_logs(cfg, run_id: str, stage: str | None = None) -> tuple[str, list[Path]]:
    """(stage, its log files) of run `run_id`; ValueError naming what to pass instead when there are none."""
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    if paths.store().remote:
        raise ValueError(f"run.output_root={cfg.run.output_root} is on S3: the trainer's logs are in the local work "
                         "folder of the machine that ran it. Fix: run doctor there with --log FILE")
    if not Path(paths.run_uri).is_dir():
        raise ValueError(f"no run folder {paths.run_uri} for --run-id {run_id} under run.output_root="
                         f"{cfg.run.output_root}. Fix: pass the config (and overrides) the run used")
    stage = stage or failed_stage(cfg, paths)
    if stage is None:
        raise ValueError(f"every stage folder of run {run_id} has a complete manifest: nothing failed. "
                         "Fix: name a stage with --stage, or pass --log FILE")
    folder = Path(paths.stage_uri(stage))
    files = stage_log_files(folder) if folder.is_dir() else []
    return stage, files
