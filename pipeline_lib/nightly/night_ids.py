"""Which run id a night runs under: a date's first night is nightly-<date>; a night that ended in a decision
(promoted, held, no new data, no usable data, quarantined) is never run again in place, so a later night on the same
date gets the next free id (nightly-<date>-2, -3, ...); a night that failed (no decision) is resumed under its id.
Allocated under the nightly lock (lock.py), from the state's history and the run folders that exist.
`refuse_decided` is the guard beside it: no run writes into a decided night's folder (latest's checkpoint and
tokenizer, the lineage's reference_heldout)."""
from __future__ import annotations

import re

from ..config.schema import PipelineConfig
from ..storage import RunPaths
from ..storage.errors import PicklableError
from ..storage.names import check_name

MAX_NIGHTS_A_DATE = 99
NIGHT_ID = re.compile(r"nightly-(\d{4}-\d{2}-\d{2})(?:-\d+)?")


def resume_hint(run_id: str) -> str:
    """How a person resumes a failed run: a night is rerun by its date (the nightly finds its failed run id and
    resumes it with the night's inputs, base and lineage), never by `llm-pipeline run`, which would run the whole chain
    without them and leave the nightly state as it was."""
    night = NIGHT_ID.fullmatch(run_id)
    if night:
        return (f"rerun the night with `llm-pipeline nightly CONFIG --run-date {night.group(1)}` (it resumes "
                f"{run_id}: finished stages are not redone), or let the next night retry its files")
    return f"resume with `llm-pipeline run CONFIG --run-id {run_id}`: finished stages are not redone"


class NightDecided(PicklableError, RuntimeError):
    def __init__(self, run_id: str, why: str, doing: str = "run a night in this folder"):
        self.run_id, self.why, self.doing = run_id, why, doing
        super().__init__(f"{run_id}: refusing to {doing}: {why}. Fix: run under a new id (llm-pipeline nightly picks "
                         "nightly-<date>-2, -3, ... by itself; llm-pipeline run --run-id NEW); the decided night's "
                         "files stay as they are")


def decided_nights(state: dict) -> set[str]:
    """Run ids of the nights that ended in a decision (every history entry has one), the held ones and `latest`."""
    out = {h["run_id"] for h in state.get("history", []) if h.get("run_id")}
    out |= {h["run_id"] for h in state.get("held", [])}
    if state.get("latest"):
        out.add(state["latest"]["run_id"])
    return out


def _folder_exists(cfg: PipelineConfig, run_id: str) -> bool:
    paths = RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url)
    return bool(paths.store().list(paths.run_uri.rstrip("/") + "/"))


def night_run_id(cfg: PipelineConfig, state: dict, first: str) -> tuple[str, str]:
    """(tonight's run id, why) for the nights of one date whose first id is `first` (nightly-<date>): the first id
    of first, first-2, first-3, ... that no decided night has; its folder exists when a failed night left it
    (resumed in place)."""
    decided = decided_nights(state)
    for n in range(1, MAX_NIGHTS_A_DATE + 1):
        run_id = first if n == 1 else f"{first}-{n}"
        check_name("run id", run_id, "give the night's date, YYYY-MM-DD")
        if run_id in decided:
            continue
        if _folder_exists(cfg, run_id):
            return run_id, f"resuming {run_id}: it failed before it was decided"
        if n == 1:
            return run_id, f"{run_id}: the date's first night"
        return run_id, f"{run_id}: {first}{'' if n == 2 else f' .. {first}-{n - 1}'} already decided"
    raise NightDecided(f"{first}-{MAX_NIGHTS_A_DATE}", f"{MAX_NIGHTS_A_DATE} nights of this date are decided")


def _resolved(uri: str) -> str:
    """A local path made absolute (the state keeps resolved paths; output_root may be relative); a URI as it is."""
    import os

    return uri if "://" in uri or not uri else os.path.realpath(uri)


def refuse_decided(cfg: PipelineConfig, state: dict, run_id: str, doing: str = "run a night in this folder") -> None:
    """Raise NightDecided when night `run_id` ended in a decision, is `latest`, or holds the lineage's
    reference_heldout: running it again would rewrite files a later night reads."""
    latest = (state.get("latest") or {}).get("run_id")
    reference = _resolved(state.get("reference_heldout") or "")
    folder = _resolved(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).run_uri).rstrip("/") + "/"
    if run_id == latest:
        raise NightDecided(run_id, "it is `latest`, the promoted model every later night continues", doing)
    if reference.startswith(folder):
        raise NightDecided(run_id, f"it holds the lineage's fixed held-out split (reference_heldout {reference})",
                           doing)
    if run_id in decided_nights(state):
        raise NightDecided(run_id, "it ended in a decision (the state's history)", doing)


REWRITES_A_NIGHT = ("data", "pretrain")  # a night's held-out split and tokenizer; its checkpoint


def refuse_redo_in_decided_night(cfg: PipelineConfig, run_id: str, stage: str) -> None:
    """Any run (llm-pipeline run --run-id nightly-<date> with another config too): a data or pretrain stage about to
    do its work in the folder of a decided night of this output root's nightly is refused (NightDecided)."""
    from .state import load_state

    if stage in REWRITES_A_NIGHT:
        refuse_decided(cfg, load_state(cfg), run_id, f"redo its {stage} stage (a decided night's folder)")
