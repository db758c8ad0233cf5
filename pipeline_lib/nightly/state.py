"""The nightly state of an output root: what arrived, what was decided, what is live.

State lives in the run store under <output_root>/_nightly/state/ as numbered generations
(storage.generations; <output_root>/_nightly/state.json is a readable copy of the newest one, and
what earlier versions wrote):
  consumed: {input URI: size} of every raw file a decided night has read and is done with (a carried file is not)
  ledger:   per input file what became of it: trained into a promoted run, carried (n), dropped, quarantined
            (reason), duplicate, unusable, with its nights and document counts (ledger.py)
  attention: what a person must look at (files quarantined after max_carries held nights, nights that failed on
            their data), newest last; `llm-pipeline nightly status CONFIG` shows it
  latest:   {run_id, checkpoint, tokenizer, finished_at} of the promoted night (every stage succeeded and the
            gate passed, or a person promoted it); the next night continues that checkpoint with that
            tokenizer (one tokenizer per lineage)
  held:     the candidates of nights the gate did not promote, with the gate's comparison;
            `llm-pipeline nightly promote CONFIG --run-id ID` (or the nightly-decide deployment) promotes one by
            hand, reject_held drops one
  reference_heldout: the held-out split of the lineage's first promoted night; every later night scores it
            (evaluate.reference_heldout): rows in the lineage's domain that do not move, so forgetting shows
  history:  per night its decision, the gate's metrics, and who decided
It is updated only after a night ends in a decision, so a failed night leaves the watermark and the
`latest` pointer where they were. An update applies the night's change to the newest state in one conditional
write, so two nights finishing at once both land.
"""
from __future__ import annotations

import datetime as dt
import json

from ..config.schema import PipelineConfig
from .. import killpoints
from . import ledger
from ..storage import generations, join, store_for
from ..storage.errors import PicklableError

def state_uri(cfg: PipelineConfig) -> str:
    return join(cfg.run.output_root, "_nightly", "state.json")


def state_folder(cfg: PipelineConfig) -> str:
    return join(cfg.run.output_root, "_nightly", "state")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


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


def promoted_nights(state: dict) -> list[str]:
    """Run ids of the promoted nights, oldest first: what `latest` descends from (a held night is not; an entry of an
    earlier version without a decision was promoted when it has a checkpoint)."""
    out: list[str] = []
    for night in state.get("history", []):
        decision = night.get("decision", "promoted" if night.get("checkpoint") else None)
        if decision in ("promoted", "promoted by hand") and night["run_id"] not in out:
            out.append(night["run_id"])
    return out


def commit_night(cfg: PipelineConfig, state: dict, files: dict[str, int], run_id: str,
                 checkpoint: str | None, tokenizer: str | None = None, *, decision: str = "promoted",
                 verdict: dict | None = None, decided_by: dict | None = None, heldout: str | None = None,
                 record: dict | None = None, documents: dict[str, dict] | None = None) -> dict:
    """Record the night's decision and what became of its files; call only after every stage succeeded.
    `promoted` moves `latest` (the checkpoint and the lineage's tokenizer) and its files are trained; `held` keeps
    `latest` and lists the candidate under `held` (a person may promote it later: promote_held); its files are
    carried to the next night (nightly.on_hold: carry; quarantined once held more than nightly.max_carries times,
    and the state asks for attention) or dropped (on_hold: drop). `documents`: per file the data stage's counts
    (tonight.night_documents). `verdict` is the gate's comparison (gate.Verdict.to_json), `decided_by` who decided
    when a person did. `state` is what the night read at its start; the change is applied to the newest state.
    `heldout` (the night's held-out split) becomes the lineage's `reference_heldout` when the lineage has none yet
    (a held night's when a person promotes it): every later night is judged on those rows.
    `record`: what the nightly's other parts keep of the night (the screen, the schedule, the deadline: one key each),
    stored on its history entry and, for a promoted night, on `latest`. Returns the state written
    (ledger.quarantined_by(state, run_id): the files this night quarantined)."""
    record = record or {}
    candidate = {"run_id": run_id, "checkpoint": checkpoint, "tokenizer": tokenizer, "finished_at": _now(), **record}

    def change(state: dict) -> dict:
        quarantined = ledger.record_decision(state, files, run_id, decision, documents or {},
                                             cfg.nightly.on_hold, cfg.nightly.max_carries)
        ledger.record_screened_out(state, files, run_id, record.get("screen"))
        if decision == "promoted":
            state["latest"] = candidate
            if heldout and not state.get("reference_heldout"):
                state["reference_heldout"] = heldout
        else:
            state.setdefault("held", []).append({**candidate, "verdict": verdict, "heldout": heldout})
        if quarantined:
            ledger.ask_attention(state, run_id, f"{len(quarantined)} file(s) held {cfg.nightly.max_carries + 1} "
                                 "nights running, quarantined: look at the held nights' gate artifacts; promote one "
                                 "by hand (llm-pipeline nightly promote) or give the files again under new names",
                                 quarantined)
        state.setdefault("history", []).append({"run_id": run_id, "files": len(files), "checkpoint": checkpoint,
                                                "decision": decision, "verdict": verdict,
                                                "decided_by": decided_by, **record})
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
    """A person promotes a held candidate: `latest` moves to it (with the record keys its night kept), it leaves
    `held`, its files still pending are trained into it, its documents enter the lineage's dedup index, history
    records who and why."""
    def change(state: dict) -> dict:
        held = state.get("held", [])
        found = next((h for h in held if h["run_id"] == run_id), None)
        if found is None:
            raise NotHeld(run_id, [h["run_id"] for h in held])
        state["held"] = [h for h in held if h["run_id"] != run_id]
        state["latest"] = {k: v for k, v in found.items() if k not in ("verdict", "heldout")}
        if found.get("heldout") and not state.get("reference_heldout"):
            state["reference_heldout"] = found["heldout"]
        ledger.record_promoted_by_hand(state, run_id)
        record = {k: v for k, v in state["latest"].items() if k not in ("run_id", "checkpoint", "tokenizer",
                                                                           "finished_at")}
        state.setdefault("history", []).append({"run_id": run_id, "decision": "promoted by hand",
                                                "decided_by": {"who": who, "reason": reason, "at": _now()},
                                                **record})
        return state
    held = [h["run_id"] for h in load_state(cfg).get("held", [])]
    if run_id not in held:  # before anything is published
        raise NotHeld(run_id, held)
    from .documents import publish_night_documents

    publish_night_documents(cfg, run_id)  # before the state: a retry after a crash publishes again (idempotent)
    return update_state(cfg, change)


def reject_held(cfg: PipelineConfig, run_id: str, who: str, reason: str) -> dict:
    """A person rejects a held candidate: it leaves `held` (retention may remove its weights from then on; it can
    no longer be promoted), `latest` stays, history records who and why. Its files are untouched: a carried file
    still trains with the next night (the data was not judged, the candidate was)."""
    def change(state: dict) -> dict:
        held = state.get("held", [])
        if not any(h["run_id"] == run_id for h in held):
            raise NotHeld(run_id, [h["run_id"] for h in held])
        state["held"] = [h for h in held if h["run_id"] != run_id]
        state.setdefault("history", []).append({"run_id": run_id, "decision": "rejected by hand",
                                                "decided_by": {"who": who, "reason": reason, "at": _now()}})
        return state
    return update_state(cfg, change)


def consume_without_training(cfg: PipelineConfig, state: dict, files: dict[str, int], run_id: str,
                             found: dict) -> dict:
    """Move the watermark past files that held only already-seen documents (`found` kind all_seen: decision
    "no new data", files `duplicate`) or only rejected / filtered records (no_usable_documents: "no usable data",
    files `unusable`); `latest` stays."""
    decision = "no usable data" if found.get("kind") == "no_usable_documents" else "no new data"

    def change(state: dict) -> dict:
        ledger.record_without_training(state, files, run_id,
                                       "unusable" if decision == "no usable data" else "duplicate")
        ledger.record_screened_out(state, files, run_id, found.get("screen"))
        state.setdefault("history", []).append({"run_id": run_id, "files": len(files), "checkpoint": None,
                                                "decision": decision, "no_new_data": found})
        return state
    return update_state(cfg, change)


def quarantine_night(cfg: PipelineConfig, state: dict, files: dict[str, int], run_id: str, reason: str,
                     documents: dict[str, dict] | None = None) -> dict:
    """A night that failed on its data (its preflight or loss guard on tonight's documents): its files (new and
    carried) are quarantined with `reason` instead of failing every later night; `latest` stays; a person is
    asked (attention)."""
    def change(state: dict) -> dict:
        ledger.record_quarantine(state, files, run_id, reason, documents)
        ledger.ask_attention(state, run_id, f"the night failed on its data ({reason}); its files are quarantined",
                             list(files))
        state.setdefault("history", []).append({"run_id": run_id, "files": len(files), "checkpoint": None,
                                                "decision": "quarantined", "reason": reason})
        return state
    return update_state(cfg, change)
