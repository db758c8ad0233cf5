"""Nightly continued pretraining: new raw data since the last good night -> data (incremental
dedup against everything seen) -> pretrain from last night's checkpoint -> evaluate side by side
with last night. The watermark and `latest` pointer move only when every stage succeeded.

Final states: Completed "Busy" (another night holds this output root's nightly lock: this one did
nothing, the message names the holder), Completed "Skipped" (no new file), Completed "NoNewData" (new files, but every
document in them was seen before: they are consumed, nothing is trained, a markdown artifact and
the webhook say so), Completed (trained), or Failed (watermark unchanged, webhook notice)."""
from __future__ import annotations

import datetime as dt

from prefect import flow, get_run_logger
from prefect.states import Completed

from pipeline_lib.config import config_from_dict
from pipeline_lib.config.secrets import public_config, secret_value
from pipeline_lib.nightly import (NightBusy, commit_night, consume_without_training, deep_update, load_state,
                                  new_files, next_base_checkpoint, night_lock, night_tokenizer, nightly_overrides, no_new_documents)
from pipeline_lib.storage.names import BadName, check_name
from pipeline_lib.stages import SPECS

from flows.common import resolve_config
from flows.notify import notify_failure, notify_no_new_data
from flows.pipeline import llm_pipeline

def check_run_date(run_date: str) -> str:
    """A night's date is a calendar date (it names the run nightly-<date>: never a path)."""
    try:
        return dt.date.fromisoformat(check_name("--run-date", run_date, "give the night's date, YYYY-MM-DD")).isoformat()
    except ValueError as err:
        if isinstance(err, BadName):
            raise
        raise BadName("--run-date", run_date, "give the night's date, YYYY-MM-DD") from None


def _night_id(run_date: str | None) -> str:
    return f"nightly-{check_run_date(run_date) if run_date else dt.date.today().isoformat()}"


@flow(name="nightly-pretrain", flow_run_name="nightly/{run_date}", log_prints=True,
      on_failure=[notify_failure], on_crashed=[notify_failure])
def nightly(config: str | dict, overrides: list[str] | None = None, run_date: str | None = None,
            dispatch: bool = False) -> dict:
    logger = get_run_logger()
    run_date = run_date or dt.date.today().isoformat()
    cfg = resolve_config(config, overrides)
    run_id = _night_id(run_date)
    try:
        with night_lock(cfg, run_id, logger.info):  # taken before listing: two nights never take the same files
            return _night(cfg, run_id, dispatch)
    except NightBusy as busy:
        logger.warning(str(busy))
        return Completed(name="Busy", message=str(busy), data={"run_id": None, "new_files": 0, "holder": busy.holder})


def _night(cfg, run_id: str, dispatch: bool):
    state = load_state(cfg)
    files = new_files(cfg, state)
    if not files:
        return Completed(name="Skipped", message="no new raw file since the last successful night",
                         data={"run_id": None, "new_files": 0})
    night_cfg = config_from_dict(deep_update(cfg.model_dump(mode="json"), nightly_overrides(state, files)))
    get_run_logger().info(f"{run_id}: {len(files)} new file(s); continuing from "
                          f"{(state.get('latest') or {}).get('checkpoint') or 'the configured base'}")
    stages = [s for s, spec in SPECS.items() if spec.nightly]
    run = llm_pipeline(config=public_config(night_cfg), run_id=run_id, stages=stages,
                       dispatch=dispatch, notify=False, return_state=True)
    if not run.is_completed():
        found = no_new_documents(night_cfg, run_id)
        if found is None:
            run.result()  # raises the night's real failure: this flow fails and notifies
        return _no_new_data(cfg, state, files, run_id, found)
    summary = run.result()
    checkpoint = next_base_checkpoint(cfg, run_id, get_run_logger().info)  # merged once for a sharded run
    commit_night(cfg, state, files, run_id, checkpoint, night_tokenizer(cfg, run_id))
    return {"run_id": run_id, "new_files": len(files), "checkpoint": checkpoint, "summary": summary}


def _no_new_data(cfg, state: dict, files: dict[str, int], run_id: str, found: dict):
    """Consume the files, train nothing, and say so (UI artifact, state message, webhook)."""
    from prefect.artifacts import create_markdown_artifact

    consume_without_training(cfg, state, files, run_id, found)
    message = (f"{run_id}: no new data: {len(files)} new file(s), {found['read']} documents read, "
               f"{found['duplicates_of_earlier_runs']} duplicates of earlier runs ({', '.join(found['earlier_runs'])}), "
               f"0 new; files consumed, nothing trained, latest checkpoint unchanged")
    get_run_logger().info(message)
    create_markdown_artifact(
        key="nightly-no-new-data", description=message,
        markdown="\n".join([f"# {run_id}: no new data", "", message, "", "| file | size |", "|---|---|",
                            *[f"| {u} | {s} |" for u, s in sorted(files.items())], "",
                            f"Dedup index: `{found['index_uri']}` (lineage `{found['lineage']}`)."]))
    payload = {"flow": "nightly-pretrain", "run_id": run_id, "state": "COMPLETED", "name": "NoNewData",
               "message": message, "new_files": len(files), "counts": found}
    notify_no_new_data(secret_value(cfg.orchestration.failure_webhook_url), payload)
    return Completed(name="NoNewData", message=message, data={"run_id": run_id, "new_files": len(files),
                                                               "no_new_data": found, "notice": payload})
