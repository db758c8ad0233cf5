"""A person promotes or rejects a held night from the UI: the `nightly-decide/nightly` deployment's typed form (the
held night from a list, promote | reject, why, who).

promote: the held checkpoint's sha256 is checked against what its night recorded (as `llm-pipeline nightly promote`
does), then pipeline_lib.nightly.promote_held: it becomes `latest`, its files are trained into it, its documents
enter the dedup index. reject: pipeline_lib.nightly.reject_held: it leaves `held` (retention may remove its
weights), `latest` stays, its carried files still train with the next night. Either way the state's history
records who and why (`unverified: <name>`: the self-hosted server knows no accounts, pipeline_lib/nightly/
approval.py), and the `nightly-lineage` artifact and this form's list of held nights are refreshed.
A refusal (not held, a replaced checkpoint) fails the run with the reason; nothing is changed then.
"""
from __future__ import annotations

from typing import Literal

from prefect import flow, get_run_logger
from prefect.states import Completed

from pipeline_lib.nightly import load_state, promote_held, reject_held
from pipeline_lib.nightly.approval import decided_by
from pipeline_lib.nightly.verify import verify_held_checkpoint

from flows.common import resolve_config
from flows.heartbeats import beating
from flows.night_lineage import publish_lineage


def _run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"decide/{p.get('run_id') or '?'}/{p.get('decision') or '?'}"


@flow(name="nightly-decide", flow_run_name=_run_name, log_prints=True)
@beating
def nightly_decide(config: str, run_id: str, decision: Literal["promote", "reject"], reason: str, who: str,
                   overrides: list[str] | None = None):
    """Promote or reject a night the gate held.

    Args:
        config: The nightly's pipeline config file (its output root holds the nightly state).
        run_id: The held night to decide on.
        decision: promote (it becomes the live night, tomorrow continues from it) or reject (it stays out;
            its carried files still train with the next night).
        reason: Why (recorded in the nightly state's history).
        who: Your name (recorded as `unverified: <name>`: the server knows no accounts).
        overrides: Dotted `section.field=value` settings of the nightly's config, as its deployment has them.
    """
    logger = get_run_logger()
    cfg = resolve_config(config, overrides)
    if not who.strip():
        raise ValueError("who: empty. Fix: type your name (the state records who decided)")
    by = decided_by(who, reason, asked_at="")["who"]
    if decision == "promote":
        held = next((h for h in load_state(cfg).get("held", []) if h["run_id"] == run_id), None)
        if held is not None:  # a night not held: promote_held names the held ones
            verify_held_checkpoint(cfg, held)
        promote_held(cfg, run_id, who=by, reason=reason)
        message = f"{run_id}: promoted by hand by {by} ({reason or 'no reason given'}): it is the live night now"
    elif decision == "reject":
        reject_held(cfg, run_id, who=by, reason=reason)
        message = (f"{run_id}: rejected by {by} ({reason or 'no reason given'}): it is no longer held; the live "
                   "night stays")
    else:
        raise ValueError(f"decision={decision!r}: not a decision. Fix: promote or reject")
    logger.info(message)
    publish_lineage(cfg, logger)
    return Completed(name="PromotedByHand" if decision == "promote" else "Rejected", message=message,
                     data={"run_id": run_id, "decision": decision, "who": by, "reason": reason})
