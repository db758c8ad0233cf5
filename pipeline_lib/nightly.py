"""Nightly continued pretraining bookkeeping: what arrived since the last good night.

State lives in the run store under <output_root>/_nightly/state/ as numbered generations
(storage.generations; <output_root>/_nightly/state.json is a readable copy of the newest one, and
what earlier versions wrote):
  consumed: {input URI: size} of every raw file a successful night has trained on
  latest:   {run_id, checkpoint, tokenizer, finished_at} of the promoted night (every stage succeeded and the
            gate passed, or a person promoted it); the next night continues that checkpoint with that
            tokenizer (one tokenizer per lineage)
  held:     the candidates of nights that were over the regression budget (nightly_gate), with the gate's
            comparison; `llm-pipeline nightly promote CONFIG --run-id ID` promotes one by hand
  reference_heldout: the held-out split of the lineage's first promoted night; every later night scores it
            (evaluate.reference_heldout): rows in the lineage's domain that do not move, so forgetting shows
  history:  per night its decision (promoted, held, promoted by hand, no new data, no usable data), the gate's
            metrics, and who decided; with
            data.replay on, the promoted nights' packed rows are tonight's replay pool (`replay_runs`)
It is updated only after a night succeeds, so a failed night leaves the watermark and the
`latest` pointer where they were and its data is picked up again tomorrow. An update applies the
night's change to the newest state in one conditional write, so two nights finishing at once
both land (neither overwrites the other's consumed files).
A night whose new files hold no new document (all seen by earlier runs of the dedup lineage)
is not a failure: its files are consumed (the watermark moves past them), nothing is trained and
`latest` stays (`consume_without_training`).

One night at a time per output root: a night takes <output_root>/_nightly/lock.json (created only if
absent: `Store.put_new`, os.link locally, If-None-Match on S3) before it lists new files and gives it
back when it ends. A second night started meanwhile (two dates at once, or tonight while last night is
still training) would list the same new files and train on them twice; instead it does nothing and
says who holds the lock (`NightBusy`). The holder rewrites the lock every LOCK_HEARTBEAT_SECONDS
(`heartbeat_at`), so a night of any length keeps it. A lock is taken over when it is stale: held by the
same night on another machine (a rerun after a kill there), by a process on this host that is gone,
or not refreshed for LOCK_STALE_SECONDS (its night died on another machine).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
from contextlib import contextmanager

from .config.schema import PipelineConfig
from . import killpoints
from .storage import generations, join, store_for
from .storage.input_files import find_inputs
from .storage.errors import PicklableError


def state_uri(cfg: PipelineConfig) -> str:
    return join(cfg.run.output_root, "_nightly", "state.json")


def state_folder(cfg: PipelineConfig) -> str:
    return join(cfg.run.output_root, "_nightly", "state")


LOCK_HEARTBEAT_SECONDS = 60
LOCK_STALE_SECONDS = 15 * 60  # 15 missed heartbeats: the holder is gone (a store outage that long fails the night too)


class NightBusy(PicklableError, RuntimeError):
    """Another night holds the nightly lock of this output root; `holder` is what it wrote."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def lock_uri(cfg: PipelineConfig) -> str:
    return join(cfg.run.output_root, "_nightly", "lock.json")


def _stale(holder: dict, run_id: str) -> str | None:
    """Why the lock `holder` wrote no longer holds, else None."""
    if holder.get("host") == socket.gethostname() and holder.get("pid"):  # this host: ask the process itself
        try:
            os.kill(int(holder["pid"]), 0)
            return None  # alive: also when it runs this same night (two runs of one date at once)
        except ProcessLookupError:
            return f"its process {holder['pid']} on this host is gone"
        except PermissionError:
            return None
    if holder.get("run_id") == run_id:
        return "held by this same night on another machine (a rerun after it was stopped)"
    beat = holder.get("heartbeat_at") or holder.get("started_at") or "1970-01-01T00:00:00+00:00"
    if (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(beat)).total_seconds() > LOCK_STALE_SECONDS:
        return f"not refreshed since {beat}, more than {LOCK_STALE_SECONDS // 60} min ago"
    return None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


@contextmanager
def night_lock(cfg: PipelineConfig, run_id: str, log=print):
    """Hold the nightly lock of cfg.run.output_root for the block; NightBusy when another night holds it."""
    store = store_for(cfg.run.output_root, cfg.run.s3_endpoint_url)
    uri = lock_uri(cfg)
    mine = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "started_at": _now()}
    body = json.dumps({**mine, "heartbeat_at": mine["started_at"]}, sort_keys=True).encode()
    for _ in range(3):
        if store.put_new(uri, body):
            break
        try:
            holder = json.loads(store.get_bytes(uri))
        except Exception:  # released between our attempt and this read: try again
            continue
        why = _stale(holder, run_id)
        if why is None:
            raise NightBusy(
                f"{run_id}: another night holds the nightly lock of {cfg.run.output_root}: {holder.get('run_id')} "
                f"(pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('started_at')}, alive at "
                f"{holder.get('heartbeat_at')}); this night "
                "did nothing, its new files stay new for the next night. Fix: nothing if that night is running; if "
                f"it died, rerun it with its --run-date (it takes the lock back) or delete {uri}", holder)
        log(f"{run_id}: taking over the nightly lock of {holder.get('run_id')}: {why}")
        store.delete(uri)  # best effort: two nights taking over the same stale lock at once both retry put_new
    else:
        raise NightBusy(f"{run_id}: could not take the nightly lock {uri} (it kept changing hands); "
                        "Fix: run this night again", {})
    def ours() -> bool:
        try:
            held = json.loads(store.get_bytes(uri))
        except Exception:
            return False
        return {k: held.get(k) for k in mine} == mine

    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(LOCK_HEARTBEAT_SECONDS):
            try:
                if ours():  # never refresh a lock someone took over
                    store.put_bytes(uri, json.dumps({**mine, "heartbeat_at": _now()}, sort_keys=True).encode())
            except Exception:  # a store hiccup: the next beat tries again (15 missed ones make the lock stale)
                pass

    beating = threading.Thread(target=heartbeat, name="nightly-lock-heartbeat", daemon=True)
    beating.start()
    try:
        yield mine
    finally:
        stop.set()
        beating.join()
        if ours():  # never release a lock someone took over
            store.delete(uri)


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
    for uris in find_inputs(cfg.data.inputs, cfg.run.s3_endpoint_url, cfg.data.follow_symlinks):
        for uri in uris:
            found[uri] = store_for(uri, cfg.run.s3_endpoint_url).size(uri)
    return dict(sorted(found.items()))


def new_files(cfg: PipelineConfig, state: dict) -> dict[str, int]:
    """Files not trained on yet; a file that grew since (appended) counts as new."""
    consumed = state.get("consumed", {})
    return {u: s for u, s in list_raw_files(cfg).items() if consumed.get(u) != s}


def promoted_nights(state: dict) -> list[str]:
    """Run ids of the promoted nights, oldest first: what `latest` descends from (a held night is not; an entry of an
    earlier version without a decision was promoted when it has a checkpoint)."""
    out: list[str] = []
    for night in state.get("history", []):
        decision = night.get("decision", "promoted" if night.get("checkpoint") else None)
        if decision in ("promoted", "promoted by hand") and night["run_id"] not in out:
            out.append(night["run_id"])
    return out


def replay_runs(cfg: PipelineConfig, state: dict) -> list[str]:
    """data.replay.runs for tonight: the configured ones, then the promoted nights whose data stage is still there
    (their packed rows are what replay samples; data/replay.py)."""
    from .storage import RunPaths

    runs = list(cfg.data.replay.runs)
    for run_id in promoted_nights(state):
        manifest = join(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("data"), "manifest.json")
        if run_id not in runs and store_for(manifest, cfg.run.s3_endpoint_url).exists(manifest):
            runs.append(run_id)
    return runs


def nightly_overrides(cfg: PipelineConfig, state: dict, files: dict[str, int]) -> dict:
    """Config changes for tonight: only the new files, continue from last night's checkpoint, score the
    lineage's fixed held-out split beside the configured evaluate.reference_heldout, and deduplicate against
    the nights only: the nightly is its own lineage (`<run.name>-nightly` unless data.dedup.lineage is set), so a
    manual run of the same config (make demo) does not make every document of the first night "seen before";
    with data.replay on, replay from the promoted nights (replay_runs)."""
    from .data.dedup_index import lineage

    changes: dict = {"data": {"inputs": sorted(files)}}
    if cfg.data.replay.fraction > 0:
        changes["data"]["replay"] = {"runs": replay_runs(cfg, state)}
    if not cfg.data.dedup.lineage:
        changes["data"]["dedup"] = {"lineage": f"{lineage(cfg)}-nightly"}
    if state.get("reference_heldout"):
        changes["evaluate"] = {"reference_heldout": list(dict.fromkeys([*cfg.evaluate.reference_heldout,
                                                                       state["reference_heldout"]]))}
    latest = state.get("latest")
    if latest and latest.get("checkpoint"):
        changes["model"] = {"base_checkpoint": latest["checkpoint"], "hf_checkpoint": None}
        if latest.get("tokenizer"):  # one tokenizer per lineage: never a new one trained on tonight's files
            changes["tokenizer"] = {"path": latest["tokenizer"]}
        # the promoted model is evaluated as `base` (model.base_checkpoint) beside tonight's candidate: the gate
        # compares the two (nightly_gate)
    return changes


def next_base_checkpoint(cfg: PipelineConfig, run_id: str, log=None) -> str | None:
    """Tonight's pretrain checkpoint as one full .ckpt for tomorrow's model.base_checkpoint: the merged copy of
    every rank's file for a tensor/pipeline-parallel run (model.checkpoint_cache.pretrain_checkpoint), else the file."""
    from .model.checkpoint_cache import pretrain_checkpoint
    from .storage import RunPaths

    return pretrain_checkpoint(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url), None, log)


def night_tokenizer(cfg: PipelineConfig, run_id: str) -> str | None:
    """The tokenizer tonight's weights were trained with, as the pretrain manifest records it (beside the weights:
    model.tokenizer_lineage); tomorrow's night loads it as tokenizer.path."""
    from .storage import RunPaths, read_manifest

    m = read_manifest(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("pretrain"),
                      cfg.run.s3_endpoint_url)
    found = (m.metrics or {}).get("tokenizer") if m else None
    return found.get("uri") if isinstance(found, dict) else None


def night_heldout(cfg: PipelineConfig, run_id: str) -> str | None:
    """Tonight's domain held-out split (data/mindrecord/heldout), None when the data stage held out no row."""
    from .runtime.upstream import find_heldout
    from .storage import RunPaths

    return find_heldout(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url))


def commit_night(cfg: PipelineConfig, state: dict, files: dict[str, int], run_id: str,
                 checkpoint: str | None, tokenizer: str | None = None, *, decision: str = "promoted",
                 verdict: dict | None = None, decided_by: dict | None = None, heldout: str | None = None) -> dict:
    """Advance the watermark and record the night's decision; call only after every stage succeeded.
    `promoted` moves `latest` (the checkpoint and the lineage's tokenizer); `held` keeps `latest` and lists the
    candidate under `held` (a person may promote it later: promote_held). `verdict` is the gate's comparison
    (nightly_gate.Verdict.to_json), `decided_by` who decided when a person did. `state` is what the night read
    at its start; the change is applied to the newest state. `heldout` (the night's held-out split) becomes the
    lineage's `reference_heldout` when the lineage has none yet: every later night is judged on those rows."""
    candidate = {"run_id": run_id, "checkpoint": checkpoint, "tokenizer": tokenizer, "finished_at": _now()}

    def change(state: dict) -> dict:
        state.setdefault("consumed", {}).update(files)
        if decision == "promoted":
            state["latest"] = candidate
            if heldout and not state.get("reference_heldout"):
                state["reference_heldout"] = heldout
        else:
            state.setdefault("held", []).append({**candidate, "verdict": verdict})
        state.setdefault("history", []).append({"run_id": run_id, "files": len(files), "checkpoint": checkpoint,
                                                "decision": decision, "verdict": verdict,
                                                "decided_by": decided_by})
        return state
    killpoints.reached("nightly.before_state_commit")
    return update_state(cfg, change)


class NotHeld(PicklableError, ValueError):
    def __init__(self, run_id: str, held: list[str]):
        self.run_id, self.held = run_id, held
        super().__init__(f"--run-id={run_id!r}: not a held night of this output root (held: "
                         f"{', '.join(held) or 'none'}). Fix: pass one of the held run ids "
                         "(llm-pipeline nightly CONFIG shows them in _nightly/state.json under held)")


def promote_held(cfg: PipelineConfig, run_id: str, who: str, reason: str) -> dict:
    """A person promotes a held candidate: `latest` moves to it, it leaves `held`, history records who and why."""
    def change(state: dict) -> dict:
        held = state.get("held", [])
        found = next((h for h in held if h["run_id"] == run_id), None)
        if found is None:
            raise NotHeld(run_id, [h["run_id"] for h in held])
        state["held"] = [h for h in held if h["run_id"] != run_id]
        state["latest"] = {k: found[k] for k in ("run_id", "checkpoint", "tokenizer", "finished_at")}
        state.setdefault("history", []).append({"run_id": run_id, "decision": "promoted by hand",
                                                "decided_by": {"who": who, "reason": reason, "at": _now()}})
        return state
    return update_state(cfg, change)


def evaluate_metrics(cfg: PipelineConfig, run_id: str) -> dict:
    """The night's evaluate manifest metrics (what the gate judges); {} when the stage wrote none."""
    from .storage import RunPaths, read_manifest

    m = read_manifest(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("evaluate"),
                      cfg.run.s3_endpoint_url)
    return (m.metrics or {}) if m else {}


def no_new_documents(cfg: PipelineConfig, run_id: str) -> dict | None:
    """The counts the data stage left when every document of the night was seen before, else None."""
    from .data.prep import NO_NEW_DOCUMENTS
    from .storage import RunPaths

    uri = join(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("data"), NO_NEW_DOCUMENTS)
    store = store_for(uri, cfg.run.s3_endpoint_url)
    return json.loads(store.get_bytes(uri)) if store.exists(uri) else None


def consume_without_training(cfg: PipelineConfig, state: dict, files: dict[str, int], run_id: str,
                             found: dict) -> dict:
    """Move the watermark past files that held only already-seen documents (`found` kind all_seen: decision
    "no new data") or only rejected / filtered records (no_usable_documents: "no usable data"); `latest` stays."""
    decision = "no usable data" if found.get("kind") == "no_usable_documents" else "no new data"

    def change(state: dict) -> dict:
        state.setdefault("consumed", {}).update(files)
        state.setdefault("history", []).append({"run_id": run_id, "files": len(files), "checkpoint": None,
                                                "decision": decision, "no_new_data": found})
        return state
    return update_state(cfg, change)


def deep_update(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = deep_update(out.get(key) or {}, value) if isinstance(value, dict) and key != "compare_checkpoints" \
            else value
    return out
