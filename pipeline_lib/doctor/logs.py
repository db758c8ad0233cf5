"""Where a failed run's logs are: the failed stage's folder under run.output_root/<run_id>/.

The training stages keep theirs in the stage folder: msrun's `msrun/worker_N.log` and `scheduler.log`, mindformers'
`log/rank_N/*.log` (LOG_MF_PATH; the preflight is the first steps of the same launch), `preflight.json` (its verdict's
message: a bad one is the failure, which no trainer log holds) and the loss guard's diagnosis json. Evaluate and export run their worker in a scratch folder that is removed; their failure text travels in the stage's error
message (the worker's last lines), which the stage failure path classifies.
Bounds: at most MAX_TOTAL_BYTES are read over all files (the newest files first, then shown in order), at most
`max_bytes` of a file's end, of a sparse file (fewer bytes on disk than its size) no more than it has on disk: 100
sparse logs of 8 KB on disk took 474 s and 841 MB. --stage must be a stage's name, folders are walked without
following links, and a log that is a link to a file outside the run folder is not read (named in the note).
"""
from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

from ..storage import RunPaths
from ..train.metrics import GUARD_DIR
from ..train.preflight import PREFLIGHT_FILE

LOG_GLOBS = ("*.log", "*.log.[0-9]*")
MAX_TOTAL_BYTES = 16 << 20


def failed_stage(cfg, paths: RunPaths) -> str | None:
    """The first stage, in pipeline order, whose folder exists but whose manifest does not match."""
    from ..stages import SPECS, stage_done

    for stage in SPECS:
        folder = Path(paths.stage_uri(stage))
        if folder.is_dir() and not stage_done(cfg, paths, stage)[0]:
            return stage
    return None


def stage_log_files(folder: Path, root: Path | None = None) -> list[Path]:
    """The log files under `folder` (walked without following links), oldest first; with `root`, a file that
    resolves outside it (a link) is left out (see outside_root)."""
    found = []
    for here, _dirs, names in os.walk(folder):  # followlinks=False: a linked folder is not entered
        for name in names:
            path = Path(here) / name
            wanted = (any(fnmatch.fnmatch(name, g) for g in LOG_GLOBS) or name == PREFLIGHT_FILE
                      or (Path(here).name == GUARD_DIR and fnmatch.fnmatch(name, "rank_*.json")))
            if wanted and path.is_file() and (root is None or not outside_root(path, root)):
                found.append(path)
    return sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))


def outside_root(path: Path, root: Path) -> bool:
    """Whether `path` (a link, or under one) resolves outside `root`."""
    try:
        path.resolve().relative_to(root.resolve())
        return False
    except ValueError:
        return True


def linked_outside(folder: Path, root: Path) -> list[Path]:
    """Log files under `folder` that are links leading outside `root` (not read; the note names them)."""
    return [p for p in stage_log_files(folder) if outside_root(p, root)]


def _tail(path: Path, take: int) -> str:
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - take))
        # NUL bytes are no log text (a sparse file's holes, a crash's preallocated tail): left out, not scanned
        return fh.read(take).replace(b"\0", b"").decode("utf-8", "replace")


def read_logs(files: list[Path], max_bytes: int = 4_000_000, max_total: int = MAX_TOTAL_BYTES) -> str:
    """The files' text, each after a `==> path <==` header; of a large file only its last `max_bytes`, of all at
    most `max_total` (the newest files first: the failure is at the end), of a sparse file what it has on disk."""
    parts, left = {}, max_total
    for path in reversed(files):  # sorted oldest first: the budget goes to the newest
        st = path.stat()
        on_disk = st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
        take = min(st.st_size, max_bytes, left, max(on_disk, 1 << 16))
        if take <= 0 and st.st_size:
            parts[path] = f"(not read: the doctor reads at most {max_total:,} bytes of logs)"
            continue
        text = _tail(path, take) if take else ""
        left -= take
        if path.suffix == ".json":  # the loss guard's diagnosis, the preflight's verdict: the message is the evidence
            try:
                text = json.loads(text).get("message", text)
            except (ValueError, AttributeError, RecursionError):
                pass
        parts[path] = text
    return "\n".join(f"==> {path} <==\n{parts[path]}" for path in files)


class NothingFailed(ValueError):
    """A run whose every stage finished: doctor's answer, not an argument error."""


def run_logs(cfg, run_id: str, stage: str | None = None) -> tuple[str, list[Path]]:
    """(stage, its log files) of run `run_id`; ValueError naming what to pass instead when there are none."""
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    if paths.store().remote:
        raise ValueError(f"run.output_root={cfg.run.output_root} is on S3: the trainer's logs are in the local work "
                         "folder of the machine that ran it. Fix: run doctor there with --log FILE")
    if not Path(paths.run_uri).is_dir():
        raise ValueError(f"no run folder {paths.run_uri} for --run-id {run_id} under run.output_root="
                         f"{cfg.run.output_root}. Fix: pass the config (and overrides) the run used")
    from ..stages import SPECS

    if stage is not None and stage not in SPECS:  # a name, never a path: `--stage ../..` read any folder's logs
        raise ValueError(f"--stage={stage!r}: not a stage. Fix: name one of {', '.join(SPECS)}")
    stage = stage or failed_stage(cfg, paths)
    if stage is None:
        raise NothingFailed(f"run {run_id}: nothing is wrong: every stage it ran has a complete manifest (no failure to "
                            "diagnose). To read a finished stage's logs anyway: --stage STAGE")
    folder = Path(paths.stage_uri(stage))
    files = stage_log_files(folder, Path(paths.run_uri)) if folder.is_dir() else []
    return stage, files
