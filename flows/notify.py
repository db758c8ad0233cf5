"""Notices to orchestration.failure_webhook_url (off by default): a failed run (the run, the failed
stage, the error, the doctor's category and first remedy), and a nightly that found no new data (state NoNewData, with the counts)."""
from __future__ import annotations

import json
import re
import urllib.request

from pipeline_lib.config import config_from_dict, load_config
from pipeline_lib.config.secrets import redact_url, secret_value
from pipeline_lib.doctor.retry import parse_headline


def _webhook_url(parameters: dict) -> str | None:
    config = parameters.get("config")
    try:
        cfg = config_from_dict(config) if isinstance(config, dict) else load_config(config,
                                                                                   parameters.get("overrides") or [])
    except Exception:
        return None
    return secret_value(cfg.orchestration.failure_webhook_url)


def failure_payload(flow, flow_run, state) -> dict:
    message = state.message or ""
    found = re.search(r"stage '(\w+)' failed", message)
    stage = found.group(1) if found else None
    doctor = parse_headline(message)  # the failure's category and first remedy (pipeline_lib.doctor)
    return {"flow": flow.name, "flow_run": flow_run.name, "flow_run_id": str(flow_run.id),
            "run_id": flow_run.parameters.get("run_id"), "stage": stage, "state": state.type.value,
            "error": message, "category": doctor.get("category"), "remedy": doctor.get("remedy")}


def notify_failure(flow, flow_run, state) -> None:
    if flow_run.parameters.get("notify") is False:  # a parent flow (the nightly) reports instead
        return
    _post(_webhook_url(flow_run.parameters), failure_payload(flow, flow_run, state))


def notify_no_new_data(url: str | None, payload: dict) -> None:
    """{flow, run_id, state: COMPLETED, name: NoNewData, message, counts} to the webhook, if set."""
    _post(url, payload)


def _post(url: str | None, payload: dict) -> None:
    if not url:
        return
    body = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        urllib.request.urlopen(req, timeout=10).close()
    except Exception as err:  # a notice must never mask the real failure
        # neither the URL (its token) nor the error (urllib may quote the URL) goes to the log
        print(f"webhook {redact_url(url)} not reached: {type(err).__name__}")
