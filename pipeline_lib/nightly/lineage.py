"""The lineage at a glance: which night is live (`latest`), which wait for a decision (`held`), what was decided
last. Rendered from the state alone (no Prefect here): flows/night_lineage.py publishes it as the artifact
`nightly-lineage` at every night's end and every decision, so the newest version is always the answer.

Also the words a person reads in the runs list for a night's end state (`end_tags`): Prefect colours a state by
its type, and every decided night is Completed (green), so the tags carry what the colour cannot.
"""
from __future__ import annotations

from ..markdown import md_code, md_text

DECISIONS_SHOWN = 10

# A night's end state -> the tags its flow run gets (shown as chips beside its name in the runs list).
# `decide` marks the ones a person must act on.
END_TAGS = {
    "Promoted": ["promoted", "live"],
    "Held": ["HELD", "decide"],
    "Quarantined": ["QUARANTINED", "look"],
    "NoNewData": ["no-new-data"],
    "NoUsableData": ["NO-USABLE-DATA", "look"],
    "Failed": ["FAILED"],
}


# A night that asks for a person says so in its run's name too (the blue link of every list): `nightly/<date> · HELD`.
END_NAME_SUFFIX = {"Held": "HELD, decide", "Quarantined": "QUARANTINED", "NoUsableData": "NO USABLE DATA"}


def end_name(run_name: str, state_name: str) -> str:
    """The night's run name once it ended in `state_name` (unchanged unless a person must look)."""
    suffix = END_NAME_SUFFIX.get(state_name)
    if not suffix or run_name.endswith(f" · {suffix}"):
        return run_name
    return f"{run_name} · {suffix}"


def end_tags(state_name: str) -> list[str]:
    """The tags of a night that ended in `state_name` (none for Skipped and Busy: they touch nothing)."""
    return list(END_TAGS.get(state_name, []))


def held_why(entry: dict) -> str:
    """What held a night, from the gate's verdict it kept: the regressed metrics and their changes."""
    verdict = entry.get("verdict") or {}
    bad = [r for r in verdict.get("rows") or [] if r.get("outcome") == "regressed"]
    if bad:
        return "; ".join(f"{r['metric']} {r.get('change_text') or ''}".strip() for r in bad)
    return str(verdict.get("reason") or "the gate did not promote it")


def _by(entry: dict) -> str:
    by = entry.get("decided_by") or {}
    if not by:
        return "the gate" if entry.get("decision") in ("promoted", "held") else ""
    return str(by.get("who") or "no one (timeout)")


def _when(iso: str | None) -> str:
    return (iso or "")[:19].replace("T", " ") + (" UTC" if iso else "")


def lineage_markdown(state: dict, decide_hint: str) -> str:
    """The `nightly-lineage` artifact: the live night, the held ones (with how to decide: `decide_hint`), the last
    DECISIONS_SHOWN decisions, newest first."""
    latest = state.get("latest") or {}
    held = state.get("held") or []
    history = state.get("history") or []
    live = latest.get("run_id")
    decided = next((h for h in reversed(history) if h.get("run_id") == live), {})
    title = f"Live night: {md_code(live)}" if live else "No night is live yet"
    lines = [f"# {title}", ""]
    if live:
        how = (f"promoted by hand by {md_text(_by(decided))}" if decided.get("decision") == "promoted by hand"
               else "promoted by the gate")
        lines += [f"**Live (`latest`)**: {md_code(live)}, {how}, finished {_when(latest.get('finished_at'))}. "
                  f"Tomorrow's night continues from its checkpoint {md_code(latest.get('checkpoint') or '-')}.", ""]
    if held:
        lines += [f"## Held: {len(held)} waiting for a decision", "",
                  "| night | ended | why the gate held it |", "|---|---|---|"]
        lines += [f"| {md_code(h['run_id'])} | {_when(h.get('finished_at'))} | {md_text(held_why(h))} |" for h in held]
        lines += ["", md_text(decide_hint), ""]
    else:
        lines += ["**Held**: none waiting for a decision.", ""]
    shown = list(reversed(history))[:DECISIONS_SHOWN]
    if shown:
        lines += [f"## Last decisions (newest first, {len(shown)} of {len(history)})", "",
                  "| night | decision | by | why |", "|---|---|---|---|"]
        for h in shown:
            reason = (h.get("decided_by") or {}).get("reason") or h.get("reason") or ""
            if not reason and h.get("decision") == "held":
                reason = held_why(h)
            lines.append(f"| {md_code(h['run_id'])} | {md_text(h.get('decision') or '')} | {md_text(_by(h))} | "
                         f"{md_text(reason)} |")
    return "\n".join(lines).rstrip() + "\n"


def held_run_ids(state: dict) -> list[str]:
    return [h["run_id"] for h in state.get("held") or []]
