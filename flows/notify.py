"""Failure notice: POST the run, the failed stage and the error to a webhook (off by default)."""
from __future__ import annotations

import json
import re
import urllib.request

from pipeline_lib.config import config_from_dict, load_config


def _webhook_url(parameters: dict) -> str | None:
    config = parameters.get("config")
    try:
        cfg = config_from_dict(config) if isinstance(config, dict) else load_config(config,
                                                                                   parameters.get("overrides") or [])
    except Exception:
        return None
    return cfg.orchestration.failure_webhook_url


def failure_payload(flow, flow_run, state) -> dict:
    message = state.message or ""
    found = re.search(r"stage '(\w+)' failed", message)
    stage = found.group(1) if found else None
    return {"flow": flow.name, "flow_run": flow_run.name, "flow_run_id": str(flow_run.id),
            "run_id": flow_run.parameters.get("run_id"), "stage": stage, "state": state.type.value,
            "error": message}


def notify_failure(flow, flow_run, state) -> None:
    url = _webhook_url(flow_run.parameters)
    if not url:
        return
    body = json.dumps(failure_payload(flow, flow_run, state)).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        urllib.request.urlopen(req, timeout=10).close()
    except Exception as err:  # a notice must never mask the real failure
        print(f"failure webhook {url} not reached: {err}")
