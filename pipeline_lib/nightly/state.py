"""The nightly state of an output root: what arrived, what was decided, what is live.

State lives in the run store under <output_root>/_nightly/state/ as numbered generations
(storage.generations; <output_root>/_nightly/state.json is a readable copy of the newest one, and
what earlier versions wrote):
  consumed: {input URI: size} of every raw file a decided night has read
  latest:   {run_id, checkpoint, tokenizer, finished_at} of the promoted night (every stage succeeded and the
            gate passed, or a person promoted it); the next night continues that checkpoint with that
            tokenizer (one tokenizer per lineage)
  held:     the candidates of nights the gate did not promote, with the gate's comparison;
            `llm-pipeline nightly promote CONFIG --run-id ID` promotes one by hand
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
                 record: dict | None = None) -> dict:
    """Advance the watermark and record the night's decision; call only after every stage succeeded.
    `promoted` moves `latest` (the checkpoint and the lineage's tokenizer); `held` keeps `latest` and lists the
    candidate under `held` (a person may promote it later: promote_held). `verdict` is the gate's comparison
    (gate.Verdict.to_json), `decided_by` who decided when a person did. `state` is what the night read
    at its start; the change is applied to the newest state. `heldout` (the night's held-out split) becomes the
    lineage's `reference_heldout` when the lineage has none yet: every later night is judged on those rows.
    `record`: what the nightly's other parts keep of the night (the screen, the schedule, the deadline: one key each),
    stored on its history entry and, for a promoted night, on `latest`."""
    record = record or {}
    candidate = {"run_id": run_id, "checkpoint": checkpoint, "tokenizer": tokenizer, "finished_at": _now(), **record}

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
    """A person promotes a held candidate: `latest` moves to it, it leaves `held`, history records who and why."""
    def change(state: dict) -> dict:
        held = state.get("held", [])
        found = next((h for h in held if h["run_id"] == run_id), None)
        if found is None:
            raise NotHeld(run_id, [h["run_id"] for h in held])
        state["held"] = [h for h in held if h["run_id"] != run_id]
        state["latest"] = {k: v for k, v in found.items() if k != "verdict"}  # with the night's record (schedule, ...)
        state.setdefault("history", []).append({"run_id": run_id, "decision": "promoted by hand",
                                                "decided_by": {"who": who, "reason": reason, "at": _now()}})
        return state
    return update_state(cfg, change)


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
