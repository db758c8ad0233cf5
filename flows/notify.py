"""Notices to orchestration.failure_webhook_url (off by default): a failed run (the run, the failed
stage, the error, the doctor's category and first remedy), and a nightly that found no new data (state NoNewData, with
the counts) or was held back by its gate (state Held, with each metric over budget)."""
from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request

from pipeline_lib.chat_webhooks import chat_body
from pipeline_lib.config import config_from_dict, load_config
from pipeline_lib.config.secrets import redact_url, secret_value, webhook_problem
from pipeline_lib.doctor.retry import parse_headline


def _webhook(parameters: dict) -> tuple[str | None, str]:
    """(the webhook URL, orchestration.webhook_format) of a run's config; (None, auto) when it does not load."""
    config = parameters.get("config")
    try:
        cfg = config_from_dict(config) if isinstance(config, dict) else load_config(config,
                                                                                   parameters.get("overrides") or [])
    except Exception:
        return None, "auto"
    return secret_value(cfg.orchestration.failure_webhook_url), cfg.orchestration.webhook_format


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
    url, fmt = _webhook(flow_run.parameters)
    _post(url, failure_payload(flow, flow_run, state), fmt=fmt)


def notify_night(url: str | None, payload: dict, fmt: str = "auto") -> None:
    """A night that ended without a failure but needs a person to know: {flow, run_id, state: COMPLETED, name:
    NoNewData (with its counts) or Held (with the metrics over budget), message} to the webhook, if set, shaped
    for its chat tool (`fmt`: orchestration.webhook_format)."""
    _post(url, payload, fmt=fmt)


DEADLINE_S = 10.0  # the whole POST, headers dripped by a slow server included


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 30x is an answer, not a delivery: following it would resend (as a GET) to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect {code} not followed", headers, fp)


def _post(url: str | None, payload: dict, deadline_s: float = DEADLINE_S, fmt: str = "auto") -> bool:
    """POST `payload` to the webhook; True when it answered 2xx within DEADLINE_S. A notice never masks the real
    failure and never shows the URL (its token) or an error that may quote it: the log gets the scheme and host.
    `deadline_s` bounds the whole exchange (urllib's timeout is per socket read: a dripping server resets it).
    `fmt` (orchestration.webhook_format) shapes the body for Feishu, DingTalk or WeCom (pipeline_lib/chat_webhooks)."""
    if not url:
        return False
    problem = webhook_problem(url)
    if problem:
        print(f"webhook not posted: {problem}")
        return False
    payload = chat_body(fmt, url, payload)
    outcome: dict = {}

    def send() -> None:
        try:
            req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.build_opener(_NoRedirects).open(req, timeout=deadline_s) as answer:
                outcome["status"] = answer.status
        except urllib.error.HTTPError as err:
            outcome["error"] = f"HTTP {err.code}"
        except Exception as err:  # noqa: BLE001 (the class name only: a message may quote the URL)
            outcome["error"] = type(err).__name__

    sender = threading.Thread(target=send, name="webhook", daemon=True)
    sender.start()
    sender.join(deadline_s)
    if sender.is_alive():
        outcome["error"] = f"no answer within {deadline_s:g} s"
    if "error" in outcome or not 200 <= outcome.get("status", 0) < 300:
        print(f"webhook {redact_url(url)} not reached: {outcome.get('error') or outcome.get('status')}")
        return False
    return True
