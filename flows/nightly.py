"""Nightly continued pretraining: new raw data since the last good night -> the data screen (pipeline_lib/nightly/
screen.py: documents far outside the lineage excluded, a garbage file quarantined) -> data (incremental
dedup against everything seen) -> pretrain from last night's checkpoint -> evaluate side by side
with last night. The watermark and `latest` pointer move only when every stage succeeded.

After evaluate the night is judged (pipeline_lib/nightly/gate.py, nightly.gate): its candidate against the promoted
model on the same rows and items, paired. Promote: Completed "Promoted" (latest moves). Investigate (ambiguous):
nightly.gate.on_investigate decides, or a person with ask. Hold (a clear regression): with on_regression=hold,
Completed "Held" (latest stays, the files are carried to the next night or dropped: nightly.on_hold, the ledger
in the state says which; the candidate is listed under `held`, the artifact
`nightly-gate` and the webhook give each failed metric with both values and the budget); with ask, the flow pauses
with a form (approve / reason / who) and holds on reject or after nightly.gate.ask_timeout_hours. Either way the
artifact `nightly-changes` (and <run>/changes.md) says what changed against the promoted run (flows/night_changes.py).
Other final states: Completed "Busy" (another night holds this output root's nightly lock: this one did
nothing, the message names the holder), Completed "Skipped" (no new file), Completed "NoNewData" (new files, but every
document in them was seen before: they are consumed, nothing is trained, a markdown artifact and
the webhook say so), Completed "NoUsableData" (every record of the new files rejected or filtered: consumed too, so
a file of garbage is not retried every night; the message counts the reasons and names the quarantine records;
a config that reads no text at all, data.text_field, fails instead), Completed "Quarantined" (the night failed on
its data, its preflight or loss guard: its files are quarantined, not handed to every later night; the webhook asks
a person), or Failed (watermark unchanged, webhook notice). A night that ended in one of these decisions is never
run again in place: a later night of the same date runs as nightly-<date>-2, -3, ... (night_ids.py); a Failed one
is resumed under its id."""
from __future__ import annotations

import datetime as dt
import threading

from prefect import flow, get_run_logger
from prefect.states import Completed

from prefect.artifacts import create_markdown_artifact
from prefect.input import RunInput
from pydantic import Field

from pipeline_lib.config import config_from_dict
from pipeline_lib.config.secrets import public_config, secret_value
from pipeline_lib.data.errors import NoNewDocuments
from pipeline_lib.nightly import (NightBusy, commit_night, consume_without_training, deep_update, load_state,
                                  evaluate_metrics, new_files, next_base_checkpoint, night_heldout, night_lock,
                                  lineage_note, night_tokenizer, nightly_overrides, no_new_documents,
                                  schedule_record)
from pipeline_lib.nightly.approval import decided_by as approval_record
from pipeline_lib.storage.names import BadName, check_name
from pipeline_lib.nightly.deadline import size_tonight
from pipeline_lib.nightly.gate import judge
from pipeline_lib.nightly.documents import data_failure, night_documents, publish_night_documents
from pipeline_lib.nightly.ledger import quarantined_by
from pipeline_lib.nightly.night_ids import night_run_id, refuse_decided
from pipeline_lib.nightly.state import quarantine_night
from pipeline_lib.nightly.scores import night_scores
from pipeline_lib.nightly.retention import after_night
from pipeline_lib.nightly.tonight import tonight_timing
from pipeline_lib.nightly.screen import screen_night
from pipeline_lib.nightly.screen_sample import keep_accepted
from pipeline_lib.stages import nightly_stages

from pipeline_lib.config.schema import NightlyConfig, OrchestrationConfig, TrainingConfig

from flows.common import deployment_parameters, resolve_config, untouched_form_sections, with_form_defaults
from flows.form_types import DataConfig
from flows.heartbeats import beating
from flows.night_changes import publish_night_changes
from flows.night_lineage import publish_lineage, tag_night
from flows.night_names import name_upcoming_nights, rename_this_night
from flows.night_summary import publish_night_summary
from flows.notify import notify_failure, notify_night
from flows.pause_lease import kept_slot_while_paused
from flows.pipeline import llm_pipeline

def check_run_date(run_date: str) -> str:
    """A night's date is a calendar date (it names the run nightly-<date>: never a path)."""
    fix = "give the night's date, YYYY-MM-DD"
    check_name("--run-date", run_date, fix)
    try:
        return dt.date.fromisoformat(run_date).isoformat()
    except ValueError:
        raise BadName("--run-date", run_date, fix) from None


def _night_id(run_date: str) -> str:
    return f"nightly-{check_run_date(run_date)}"


def night_date(timezone: str, now: dt.datetime | None = None) -> str:
    """Today in the schedule's zone (orchestration.timezone): the 02:00 run in Asia/Shanghai is on the Shanghai
    date, which UTC (the server's clock) still calls yesterday."""
    from zoneinfo import ZoneInfo

    return (now or dt.datetime.now(dt.timezone.utc)).astimezone(ZoneInfo(timezone)).date().isoformat()


def _zone(config, overrides, sections: dict | None = None) -> str:
    """The night's orchestration.timezone; the schema's default when the config does not resolve (the run then
    fails with the config's own errors, under a name that still carries a date)."""
    try:
        return resolve_config(config, overrides, sections, stages=nightly_stages()).orchestration.timezone
    except Exception:
        return OrchestrationConfig().timezone


def _run_name() -> str:
    """nightly/<date>: the date the night runs under, today in the schedule's zone when none was given (never
    `nightly/None`)."""
    from prefect.runtime import flow_run

    params = flow_run.parameters
    given = params.get("run_date")
    if given:
        return f"nightly/{given}"
    sections = {k: params.get(k) for k in FORM_SECTIONS}
    return f"nightly/{night_date(_zone(params.get('config'), params.get('overrides'), sections))}"


# The run form's sections of the nightly: what a night changes (its raw inputs, how long it trains, the gate, the
# schedule's zone and the webhook); any other field is an override.
FORM_SECTIONS = ("data", "training", "nightly", "orchestration")


# validate_parameters=False, as the chain's: the sections arrive as the form sent them and are checked as one config
# by resolve_config (errors naming the field and the fix).
@flow(name="nightly-pretrain", flow_run_name=_run_name, log_prints=True, validate_parameters=False,
      on_failure=[notify_failure], on_crashed=[notify_failure])
@beating
def nightly(config: str | dict, overrides: list[str] | None = None, run_date: dt.date | None = None,
            dispatch: bool = False, data: DataConfig | None = None, training: TrainingConfig | None = None,
            nightly: NightlyConfig | None = None, orchestration: OrchestrationConfig | None = None) -> dict:
    """One night: the raw files that arrived since the last good night, trained from the promoted model, judged.

    Args:
        config: The pipeline config file (relative to the project root on the worker), or a resolved config.
        overrides: Dotted `section.field=value` settings, applied last.
        run_date: The night's date, naming the run (nightly/DATE, run id nightly-DATE); empty: today in
            orchestration.timezone.
        dispatch: Send each stage to its own deployment on its work pool.
        data: Data stage: the raw inputs (folders or globs the new files arrive in), cleaning, dedup, packing.
        training: Continued pretraining of the night.
        nightly: The promotion gate (what a night must not make worse to become tomorrow's base).
        orchestration: The schedule's time zone, retries and the webhook (an empty webhook keeps the file's).
    """
    logger = get_run_logger()
    given = {"data": data, "training": training, "nightly": nightly, "orchestration": orchestration}
    sent = any(v is not None for v in given.values())
    deployed = with_form_defaults(deployment_parameters()) if sent else {}  # its folded form's sections (run_form.py)
    inherited = untouched_form_sections(config, given, deployed) if sent else []
    given.update(dict.fromkeys(inherited))
    cfg = resolve_config(config, overrides, given, stages=nightly_stages())
    run_date = run_date.isoformat() if isinstance(run_date, dt.date) else run_date
    run_date = run_date or night_date(cfg.orchestration.timezone)
    run_id = _night_id(run_date)
    name_upcoming_nights(cfg.orchestration.timezone, logger.warning)  # the one the scheduler added: nightly/<date>
    try:
        with night_lock(cfg, run_id, logger.info):  # taken before listing: two nights never take the same files
            run_id, why = night_run_id(cfg, load_state(cfg), run_id)  # a decided night is never rerun in place
            logger.info(why)
            rename_this_night(run_id, logger.warning)  # nightly/<date>-2: runs of one date told apart
            state = _night(cfg, run_id, dispatch)
            after_night(cfg, run_id, logger)  # nightly.retention: bounded disk (a failure is only a warning)
    except NightBusy as busy:
        logger.warning(str(busy))
        state = Completed(name="Busy", message=str(busy), data={"run_id": None, "new_files": 0, "holder": busy.holder})
    except Exception as err:
        publish_night_summary(cfg, run_id, run_date, "Failed", f"{type(err).__name__}: {err}", {})
        tag_night("Failed", logger)
        raise
    publish_night_summary(cfg, run_id, run_date, state.name, state.message, state.data)
    tag_night(state.name, logger)  # Held and Promoted are both green Completed: the tags tell them apart
    if state.name not in ("Skipped", "Busy"):
        publish_lineage(cfg, logger)
    return state


def _night(cfg, run_id: str, dispatch: bool):
    state = load_state(cfg)
    refuse_decided(cfg, state, run_id)
    files = new_files(cfg, state)
    if not files:
        return Completed(name="Skipped", message="no new raw file since the last successful night",
                         data={"run_id": None, "new_files": 0})
    screened = screen_night(cfg, state, files, run_id, get_run_logger())  # excluded documents, quarantined files
    if not screened.kept_files:
        return screened.tell(_no_new_data(cfg, state, files, run_id, screened.nothing_left()))
    night = deep_update(cfg.model_dump(mode="json"), screened.overrides(cfg, nightly_overrides(cfg, state, files)))
    plan = size_tonight(config_from_dict(night), state)  # nightly.deadline: steps from the last night's measure
    night_cfg = config_from_dict(deep_update(night, {"training": {"steps": plan.steps}} if plan and plan.cut else {}))
    if plan:
        (get_run_logger().warning if plan.worth_saying else get_run_logger().info)(f"{run_id}: {plan.message}")
    start = night_cfg.training.stable_checkpoint or (state.get("latest") or {}).get("checkpoint")
    get_run_logger().info(f"{run_id}: {len(files)} new file(s); continuing from {start or 'the configured base'}"
                          f"{lineage_note(night_cfg)}")
    stages = nightly_stages()
    run = llm_pipeline(config=public_config(night_cfg), run_id=run_id, stages=stages,
                       dispatch=dispatch, notify=False, return_state=True)
    if not run.is_completed() or run.name in NoNewDocuments.NIGHT_STATES:  # the chain ends so on a night's data
        found = no_new_documents(night_cfg, run_id)
        if found is None:
            if (why := data_failure(night_cfg, run_id)) is not None:  # the files' fault: not tomorrow's problem
                return _quarantined(cfg, state, files, run_id, why)
            run.result()  # raises the night's real failure: this flow fails and notifies
        return screened.tell(_no_new_data(cfg, state, files, run_id, {**found, "screen": screened.record}))
    summary = run.result()
    verdict = judge(cfg, evaluate_metrics(night_cfg, run_id), night_scores(night_cfg, run_id))
    decision, decided_by = verdict.decision(cfg.nightly.gate)  # promoted / held / ask (on_investigate's default)
    if decision == "ask":
        decision, decided_by = _ask(cfg, run_id, verdict)
    checkpoint = next_base_checkpoint(cfg, run_id, get_run_logger().info)  # merged once for a sharded run
    publish_night_changes(cfg, (state.get("latest") or {}).get("run_id"), run_id, verdict.to_json())
    if decision == "promoted":  # its documents are "seen before" from now on; a held night's never enter the index
        publish_night_documents(cfg, run_id)
    after = commit_night(cfg, state, files, run_id, checkpoint, night_tokenizer(cfg, run_id), decision=decision,
                         verdict=verdict.to_json(), decided_by=decided_by, heldout=night_heldout(cfg, run_id),
                         record={**schedule_record(night_cfg, run_id), "timing": tonight_timing(night_cfg, run_id, summary),
                                 "screen": screened.record},
                         documents=night_documents(cfg, run_id))
    if decision == "promoted":
        keep_accepted(cfg, run_id, after)  # tomorrow's screen measures against the documents it accepted
    _ask_about_quarantined(cfg, run_id, after)
    return screened.tell(_decided(cfg, run_id, files, checkpoint, summary, verdict, decision, decided_by,
                                  plan.message if plan and plan.worth_saying else None))


PAUSE_GRACE_S = 600  # the pause outlives the night's own deadline by this much
# How often the paused night asks the API whether a person answered (Prefect's default is 10 s): the night goes on
# within 2 s of the click, for one small request every 2 s while it waits.
PAUSE_POLL_S = 2


class Decision(RunInput):
    """The form a held-back night shows in the UI (Prefect pause with wait_for_input)."""

    approve: bool = Field(False, description="Promote tonight's candidate anyway (it becomes tomorrow's base).")
    reason: str = Field("", description="Why (recorded in the nightly state).")
    who: str = Field("", description="Your name (recorded in the nightly state as `unverified: <name>`: the server "
                     "knows no accounts).")


def _ask(cfg, run_id: str, verdict) -> tuple[str, dict]:
    """Wait for a person: approve promotes; reject, or no answer within nightly.gate.ask_timeout_hours, holds."""
    import contextvars

    from prefect.exceptions import FlowPauseTimeout
    from prefect.flow_runs import pause_flow_run, resume_flow_run
    from prefect.runtime import flow_run

    hours = cfg.nightly.gate.ask_timeout_hours
    create_markdown_artifact(key="nightly-gate", markdown=verdict.markdown(run_id, "waiting for a decision"),
                             description=verdict.message(run_id))
    get_run_logger().warning(f"{verdict.message(run_id)}; waiting up to {hours:g} h for a person to approve or "
                             "reject in the Prefect UI (Resume on this flow run)")
    asked_at = dt.datetime.now(dt.timezone.utc).isoformat()
    no_answer = f"no decision within {hours:g} h"
    # The server fails a run whose pause outlived its timeout: the night answers itself (reject) at the deadline,
    # while its pause still holds, and the pause's own timeout is later (only if this process died meanwhile).
    timer = threading.Timer(hours * 3600, contextvars.copy_context().run, args=(
        resume_flow_run, flow_run.id, {"approve": False, "reason": no_answer, "who": ""}))
    timer.daemon = True
    timer.start()
    try:
        with kept_slot_while_paused(get_run_logger().info):  # else the deployment's lease crashes it (pause_lease.py)
            answer = pause_flow_run(wait_for_input=Decision.with_initial_data(
                description=verdict.markdown(run_id, verdict.question)),
                timeout=int(hours * 3600) + PAUSE_GRACE_S, key=f"gate-{run_id}", poll_interval=PAUSE_POLL_S)
    except FlowPauseTimeout:
        return "held", {"who": None, "reason": no_answer, "asked_at": asked_at}
    finally:
        timer.cancel()
    if not answer.approve and answer.reason == no_answer and not answer.who:
        return "held", {"who": None, "reason": no_answer, "asked_at": asked_at}
    # the self-hosted server names no account for an answer: the typed name is recorded as unverified
    return ("promoted" if answer.approve else "held"), approval_record(answer.who, answer.reason, asked_at)


def _decided(cfg, run_id, files, checkpoint, summary, verdict, decision, decided_by, steps_cut=None):
    """The night's end: an artifact with the comparison, the webhook for a held night, Completed Promoted/Held."""
    by = f" (decided by {decided_by['who']}: {decided_by['reason'] or 'no reason given'})" if decided_by else ""
    name = "Promoted" if decision == "promoted" else "Held"
    tail = ("latest moves to it; tomorrow continues from it" if name == "Promoted" else
            f"latest stays; {_held_files(cfg)}; the candidate is kept under `held` in the nightly state "
            f"(promote or reject it: the nightly-decide deployment in the UI, or llm-pipeline nightly promote "
            f"CONFIG --run-id {run_id})")
    message = f"{verdict.message(run_id)}{by}. {name}: {tail}" + (f". Deadline: {steps_cut}" if steps_cut else "")
    get_run_logger().info(message)
    create_markdown_artifact(key="nightly-gate", markdown=verdict.markdown(run_id, name), description=message)
    data = {"run_id": run_id, "new_files": len(files), "files": sorted(files), "checkpoint": checkpoint, "summary": summary,
            "decision": decision, "verdict": verdict.to_json(), "decided_by": decided_by}
    if name == "Held":
        notify_night(secret_value(cfg.orchestration.failure_webhook_url), {
            "flow": "nightly-pretrain", "run_id": run_id, "state": "COMPLETED", "name": "Held", "message": message,
            "failed": [{k: r[k] for k in ("metric", "promoted", "candidate", "change", "budget")}
                       for r in verdict.failed]}, cfg.orchestration.webhook_format)
    return Completed(name=name, message=message, data=data)


def _no_new_data(cfg, state: dict, files: dict[str, int], run_id: str, found: dict):
    """Consume the files, train nothing, and say so (UI artifact, state message, webhook)."""
    consume_without_training(cfg, state, files, run_id, found)
    tail = "files consumed, nothing trained, latest checkpoint unchanged"
    if found.get("kind") == "no_usable_documents":
        name, title = "NoUsableData", "no usable data"
        from pipeline_lib.data.prep import unusable_reasons

        records = found['records']['quarantine.jsonl'] + found['records']['excluded.jsonl']
        if not found["read"]:  # empty files (0 bytes, or blank lines only): no record to reject or name
            message = (f"{run_id}: no usable data: {len(files)} new file(s) of {sum(files.values()):,} bytes in all "
                       f"hold no record; {tail}")
        else:
            message = (f"{run_id}: no usable data: {len(files)} new file(s), {found['read']} records read, all "
                       f"rejected or filtered ({unusable_reasons(found)}); {tail}"
                       + (f". The records and their reasons are in {', '.join(records)}" if records else ""))
        footer = ("If a setting dropped good data (data.text_field, data.filters), fix it and give the files again "
                  "under new names.")
    else:
        name, title = "NoNewData", "no new data"
        message = (f"{run_id}: no new data: {len(files)} new file(s), {found['read']} documents read, "
                   f"{found['duplicates_of_earlier_runs']} duplicates of earlier runs "
                   f"({', '.join(found['earlier_runs'])}), 0 new; {tail}")
        footer = f"Dedup index: `{found['index_uri']}` (lineage `{found['lineage']}`)."
    logger = get_run_logger()
    (logger.warning if name == "NoUsableData" else logger.info)(message)
    create_markdown_artifact(
        key="nightly-no-new-data", description=message,
        markdown="\n".join([f"# {run_id}: {title}", "", message, "", "| file | size |", "|---|---|",
                            *[f"| {u} | {s} |" for u, s in sorted(files.items())], "", footer]))
    payload = {"flow": "nightly-pretrain", "run_id": run_id, "state": "COMPLETED", "name": name,
               "message": message, "new_files": len(files), "counts": found}
    notify_night(secret_value(cfg.orchestration.failure_webhook_url), payload, cfg.orchestration.webhook_format)
    return Completed(name=name, message=message, data={"run_id": run_id, "new_files": len(files),
                                                               "files": sorted(files), "no_new_data": found, "notice": payload})


def _held_files(cfg) -> str:
    if cfg.nightly.on_hold == "drop":
        return "the files are dropped (nightly.on_hold: drop)"
    return (f"the files are carried: tomorrow trains them again with its new files (at most "
            f"{cfg.nightly.max_carries} times: nightly.max_carries)")


def _ask_about_quarantined(cfg, run_id: str, state: dict) -> None:
    """Files held more often than nightly.max_carries are quarantined: the webhook asks a person (state: attention)."""
    files = quarantined_by(state, run_id)
    if files:
        message = (f"{run_id}: {len(files)} file(s) held {cfg.nightly.max_carries + 1} nights running, quarantined: "
                   f"{', '.join(files)}. Look at the held nights' gate artifacts; promote one by hand "
                   "(llm-pipeline nightly promote CONFIG --run-id ID) or give the files again under new names")
        get_run_logger().warning(message)
        notify_night(secret_value(cfg.orchestration.failure_webhook_url), {
            "flow": "nightly-pretrain", "run_id": run_id, "state": "COMPLETED", "name": "Quarantined",
            "message": message, "files": files}, cfg.orchestration.webhook_format)


def _quarantined(cfg, state: dict, files: dict[str, int], run_id: str, why: str):
    """A night that failed on its data: its files (new and carried) are quarantined, latest stays, a person is
    asked; later nights do not fail on the same files."""
    quarantine_night(cfg, state, files, run_id, why, night_documents(cfg, run_id))
    message = (f"{run_id}: quarantined {len(files)} file(s): {why}. Files: {', '.join(sorted(files))}. latest stays; "
               "later nights do not read them again. Fix: look at the files (llm-pipeline doctor CONFIG --run-id "
               f"{run_id} names the documents of the bad batches when the loss guard tripped); if the data is "
               "good and a setting was wrong, fix it and give the files again under new names")
    get_run_logger().warning(message)
    payload = {"flow": "nightly-pretrain", "run_id": run_id, "state": "COMPLETED", "name": "Quarantined",
               "message": message, "files": sorted(files)}
    notify_night(secret_value(cfg.orchestration.failure_webhook_url), payload, cfg.orchestration.webhook_format)
    return Completed(name="Quarantined", message=message, data={"run_id": run_id, "new_files": len(files),
                                                                 "files": sorted(files), "notice": payload})
