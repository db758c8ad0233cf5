"""Nightly continued pretraining bookkeeping: what arrived since the last good night.

State lives in the run store under <output_root>/_nightly/state/ as numbered generations
(storage.generations; <output_root>/_nightly/state.json is a readable copy of the newest one, and
what earlier versions wrote):
  consumed: {input URI: size} of every raw file a successful night has trained on
  latest:   {run_id, checkpoint, finished_at} of the last night where EVERY stage succeeded
It is updated only after a night succeeds, so a failed night leaves the watermark and the
`latest` pointer where they were and its data is picked up again tomorrow. An update applies the
night's change to the newest state in one conditional write, so two nights finishing at once
both land (neither overwrites the other's consumed files).
A night whose new files hold no new document (all seen by earlier runs of the dedup lineage)
is not a failure: its files are consumed (the watermark moves past them), nothing is trained and
`latest` stays (`consume_without_training`).
"""
from __future__ import annotations

import datetime as dt
import json

from .config.schema import PipelineConfig
from . import killpoints
from .storage import generations, join, store_for
from .storage.input_files import find_inputs


def state_uri(cfg: PipelineConfig) -> str:
    return join(cfg.run.output_root, "_nightly", "state.json")


def state_folder(cfg: PipelineConfig) -> str:
    return join(cfg.run.output_root, "_nightly", "state")


def load_state(cfg: PipelineConfig) -> dict:
    store = store_for(cfg.run.output_root, cfg.run.s3_endpoint_url)
    data = generations.read_bytes(store, state_folder(cfg))
    if data is None:  # no generation yet: the state.json of an earlier version, if any
        uri = state_uri(cfg)
        if not store.exists(uri):
            return {"consumed": {}, "latest": None, "history": []}
        data = store.get_bytes(uri)
    return json.loads(data)


def update_state(cfg: PipelineConfig, change) -> dict:
    """Apply `change(state) -> state` to the newest state as one conditional write (re-read and
    applied again when another night wrote first); returns the state written."""
    store = store_for(cfg.run.output_root, cfg.run.s3_endpoint_url)
    written: dict = {}

    def write_next(current, out):
        state = json.loads(store.get_bytes(current)) if current else load_state(cfg)
        written["state"] = change(state)
        out.write_text(json.dumps(written["state"], indent=2, sort_keys=True))

    generations.update(store, state_folder(cfg), write_next, suffix=".json")
    store.put_bytes(state_uri(cfg), json.dumps(load_state(cfg), indent=2, sort_keys=True).encode())
    return written["state"]


def list_raw_files(cfg: PipelineConfig) -> dict[str, int]:
    """Every raw input file of data.inputs with its size, listed exactly as the data stage lists
    them (storage.input_files.find_inputs); an entry matching nothing yet is not an error here."""
    found: dict[str, int] = {}
    for uris in find_inputs(cfg.data.inputs, cfg.run.s3_endpoint_url):
        for uri in uris:
            found[uri] = store_for(uri, cfg.run.s3_endpoint_url).size(uri)
    return dict(sorted(found.items()))


def new_files(cfg: PipelineConfig, state: dict) -> dict[str, int]:
    """Files not trained on yet; a file that grew since (appended) counts as new."""
    consumed = state.get("consumed", {})
    return {u: s for u, s in list_raw_files(cfg).items() if consumed.get(u) != s}


def nightly_overrides(state: dict, files: dict[str, int]) -> dict:
    """Config changes for tonight: only the new files, continue from last night's checkpoint."""
    changes: dict = {"data": {"inputs": sorted(files)}}
    latest = state.get("latest")
    if latest and latest.get("checkpoint"):
        changes["model"] = {"base_checkpoint": latest["checkpoint"], "hf_checkpoint": None}
        changes["evaluate"] = {"compare_checkpoints": {f"last night ({latest['run_id']})": latest["checkpoint"]}}
    return changes


def next_base_checkpoint(cfg: PipelineConfig, run_id: str, log=None) -> str | None:
    """Tonight's pretrain checkpoint as one full .ckpt for tomorrow's model.base_checkpoint: the merged copy of
    every rank's file for a tensor/pipeline-parallel run (model.checkpoint_cache.pretrain_checkpoint), else the file."""
    from .model.checkpoint_cache import pretrain_checkpoint
    from .storage import RunPaths

    return pretrain_checkpoint(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url), None, log)


def commit_night(cfg: PipelineConfig, state: dict, files: dict[str, int], run_id: str,
                 checkpoint: str | None) -> dict:
    """Advance the watermark and the `latest` pointer; call only after every stage succeeded.
    `state` is what the night read at its start; the change is applied to the newest state."""
    def change(state: dict) -> dict:
        state.setdefault("consumed", {}).update(files)
        state["latest"] = {"run_id": run_id, "checkpoint": checkpoint,
                           "finished_at": dt.datetime.now(dt.timezone.utc).isoformat()}
        state.setdefault("history", []).append({"run_id": run_id, "files": len(files), "checkpoint": checkpoint})
        return state
    killpoints.reached("nightly.before_state_commit")
    return update_state(cfg, change)


def no_new_documents(cfg: PipelineConfig, run_id: str) -> dict | None:
    """The counts the data stage left when every document of the night was seen before, else None."""
    from .data.prep import NO_NEW_DOCUMENTS
    from .storage import RunPaths

    uri = join(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("data"), NO_NEW_DOCUMENTS)
    store = store_for(uri, cfg.run.s3_endpoint_url)
    return json.loads(store.get_bytes(uri)) if store.exists(uri) else None


def consume_without_training(cfg: PipelineConfig, state: dict, files: dict[str, int], run_id: str,
                             found: dict) -> dict:
    """Move the watermark past files that held only already-seen documents; `latest` stays."""
    def change(state: dict) -> dict:
        state.setdefault("consumed", {}).update(files)
        state.setdefault("history", []).append({"run_id": run_id, "files": len(files), "checkpoint": None,
                                                "no_new_data": found})
        return state
    return update_state(cfg, change)


def deep_update(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = deep_update(out.get(key) or {}, value) if isinstance(value, dict) and key != "compare_checkpoints" \
            else value
    return out
