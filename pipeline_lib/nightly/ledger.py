"""The ledger: what became of every raw file a night read, so no night's data is lost without a trace.

state["ledger"][uri] = {size, status, nights (run ids that read it, oldest first), documents (the data stage's
counts for the file: kept / duplicates / filtered / rejected), and per status: `into` (trained: the promoted run),
`carries` (carried: how many held nights carried it), `reason` (quarantined)}.
Statuses:
  trained      it reached the promoted model (`into` that run)
  carried      its night was held (nightly.on_hold: carry): the next night trains it again with its own files, from
               the promoted base; not consumed
  dropped      its night was held under nightly.on_hold: drop: consumed, never trained into the promoted model
  quarantined  held more than nightly.max_carries times, or its night failed on its data (preflight, loss guard):
               consumed, and the night asks for a person (state["attention"])
  duplicate    every document in it was seen before (nothing kept)
  unusable     every record in it was rejected or filtered
A file of a trained night that kept no document is `duplicate` / `unusable` whatever the night's decision.
Pure functions on the state dict: state.py applies them inside its conditional write.
"""
from __future__ import annotations

import datetime as dt

FINAL = ("trained", "dropped", "quarantined", "duplicate", "unusable")  # consumed: not read again


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def _entry(state: dict, uri: str, size: int, run_id: str, documents: dict | None) -> dict:
    entry = state.setdefault("ledger", {}).setdefault(uri, {"size": size, "nights": []})
    entry["size"] = size
    if run_id not in entry["nights"]:
        entry["nights"].append(run_id)
    if documents:
        entry["documents"] = documents
    return entry


def _set(state: dict, uri: str, entry: dict, status: str, **fields) -> None:
    for key in ("into", "carries", "reason"):  # what the earlier status said
        entry.pop(key, None)
    entry.update(status=status, **fields)
    consumed = state.setdefault("consumed", {})
    if status in FINAL:
        consumed[uri] = entry["size"]
    else:  # carried: listed again tomorrow (inputs.new_files)
        consumed.pop(uri, None)


def _nothing_kept(documents: dict | None) -> str | None:
    """`duplicate` / `unusable` for a file the data stage kept no document of, else None (no counts: unknown)."""
    if not documents or documents.get("kept", 0) > 0 or not any(documents.values()):
        return None
    return "duplicate" if documents.get("duplicates", 0) else "unusable"


def record_decision(state: dict, files: dict[str, int], run_id: str, decision: str, documents: dict[str, dict],
                    on_hold: str = "carry", max_carries: int = 2) -> list[str]:
    """Each file of a night that trained and ended `decision` ("promoted" / "promoted by hand" / anything else:
    held). Returns the files quarantined now (carried more than max_carries times)."""
    quarantined = []
    for uri, size in files.items():
        entry = _entry(state, uri, size, run_id, documents.get(uri))
        empty = _nothing_kept(documents.get(uri))
        if empty:
            _set(state, uri, entry, empty)
        elif decision in ("promoted", "promoted by hand"):
            _set(state, uri, entry, "trained", into=run_id)
        elif on_hold == "drop":
            _set(state, uri, entry, "dropped")
        else:
            carries = entry.get("carries", 0) if entry.get("status") == "carried" else 0
            if carries + 1 > max_carries:
                _set(state, uri, entry, "quarantined", carries=carries,
                     reason=f"carried {carries} times, held every time")
                quarantined.append(uri)
            else:
                _set(state, uri, entry, "carried", carries=carries + 1)
    return quarantined


def record_without_training(state: dict, files: dict[str, int], run_id: str, status: str) -> None:
    """A night that trained nothing: every file `duplicate` (no new data) or `unusable` (no usable data)."""
    for uri, size in files.items():
        _set(state, uri, _entry(state, uri, size, run_id, None), status)


def record_quarantine(state: dict, files: dict[str, int], run_id: str, reason: str,
                      documents: dict[str, dict] | None = None) -> None:
    for uri, size in files.items():
        _set(state, uri, _entry(state, uri, size, run_id, (documents or {}).get(uri)), "quarantined", reason=reason)


def record_screened_out(state: dict, files: dict[str, int], run_id: str, screen: dict | None) -> None:
    """The files tonight's data screen quarantined (most of their documents far outside the lineage: screen.py's
    record `quarantined`, with per file `excluded` / `screened`): `quarantined`, whatever the night decided."""
    shares = (screen or {}).get("files") or {}
    for uri in (screen or {}).get("quarantined") or []:
        if uri in files:
            share = shares.get(uri) or {}
            reason = (f"screen: {share['excluded']} of {share['screened']} documents far outside the lineage"
                      if "excluded" in share and "screened" in share else "screen: far outside the lineage")
            record_quarantine(state, {uri: files[uri]}, run_id, reason)


def record_promoted_by_hand(state: dict, run_id: str) -> list[str]:
    """A held night promoted by a person: its files that did not reach a promoted model since are trained into it
    (a carried one stops coming back). Returns them."""
    done = []
    for uri, entry in state.get("ledger", {}).items():
        if run_id in entry["nights"] and entry.get("status") in ("carried", "dropped", "quarantined"):
            _set(state, uri, entry, "trained", into=run_id)
            done.append(uri)
    return done


def ask_attention(state: dict, run_id: str, message: str, files: list[str]) -> dict:
    item = {"run_id": run_id, "at": _now(), "message": message, "files": sorted(files)}
    state.setdefault("attention", []).append(item)
    return item


def quarantined_by(state: dict, run_id: str) -> list[str]:
    """The files night `run_id` quarantined (it was the last night to read them)."""
    return sorted(u for u, e in state.get("ledger", {}).items()
                  if e.get("status") == "quarantined" and e["nights"][-1:] == [run_id])


def carried_files(state: dict) -> dict[str, int]:
    return {u: e["size"] for u, e in state.get("ledger", {}).items() if e.get("status") == "carried"}


def reached_share(state: dict) -> dict:
    """Accepted documents (kept by the data stage) by what became of them, and the share that reached the promoted
    model: trained / (trained + carried + dropped + quarantined after carrying). Files without counts count 0."""
    sums = {"trained": 0, "carried": 0, "dropped": 0, "quarantined_after_carry": 0}
    for entry in state.get("ledger", {}).values():
        kept = (entry.get("documents") or {}).get("kept", 0)
        status = entry.get("status")
        if status == "quarantined" and "carries" in entry:
            sums["quarantined_after_carry"] += kept
        elif status in sums:
            sums[status] += kept
    total = sum(sums.values())
    return {**sums, "share": (sums["trained"] / total) if total else None}


def _status_text(entry: dict) -> str:
    status = entry.get("status", "?")
    if status == "trained":
        return f"trained into {entry.get('into')}"
    if status == "carried":
        return f"carried ({entry.get('carries')})"
    if status == "quarantined":
        return f"quarantined ({entry.get('reason')})"
    return status


def render_ledger(state: dict) -> str:
    """The ledger as text: one line per file (status, nights, documents), the share of accepted documents that
    reached the promoted model, and what asks for a person (`llm-pipeline nightly status CONFIG`)."""
    rows = [("file", "status", "nights", "kept", "duplicates", "filtered", "rejected")]
    for uri, entry in sorted(state.get("ledger", {}).items()):
        docs = entry.get("documents") or {}
        rows.append((uri, _status_text(entry), ", ".join(entry.get("nights", [])),
                     *[str(docs[k]) if k in docs else "-" for k in ("kept", "duplicates", "filtered", "rejected")]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if len(rows) == 1:
        lines = ["no file in the ledger yet (no night has decided)"]
    share = reached_share(state)
    latest = (state.get("latest") or {}).get("run_id") or "none"
    if share["share"] is None:
        lines.append(f"\naccepted documents that reached the promoted model ({latest}): none accepted yet")
    else:
        lines.append(f"\naccepted documents that reached the promoted model ({latest}): {share['share']:.1%} "
                     f"({share['trained']} trained / {share['trained'] + share['carried'] + share['dropped'] + share['quarantined_after_carry']}"
                     f": {share['carried']} carried, {share['dropped']} dropped, "
                     f"{share['quarantined_after_carry']} quarantined after carrying)")
    attention = state.get("attention", [])
    lines.append(f"\nattention ({len(attention)}):" if attention else "\nattention: nothing")
    for item in attention:
        lines.append(f"- {item['at'][:19]} {item['run_id']}: {item['message']}: {', '.join(item['files'])}")
    return "\n".join(lines)
