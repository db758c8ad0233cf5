"""The body a webhook POST carries, in the shape the receiving chat tool accepts (orchestration.webhook_format).

A chat robot's incoming webhook refuses a JSON object of its own choosing: Feishu/Lark wants `{"msg_type": "text",
"content": {"text": ...}}`, DingTalk and WeCom `{"msgtype": "text", "text": {"content": ...}}` (their custom-robot
documentation). `json` posts the pipeline's own object (flow, run_id, state, name, message, ...) for a receiver of
the team's. `auto` tells the three chat tools by their webhook hosts and posts `json` to any other. The same shapes
are the body templates of the Prefect notification block `llm-pipeline deploy` makes (deployments/automations.py),
so a night's own notices and the server's automations read alike. Plain Python: no Prefect.
"""
from __future__ import annotations

import urllib.parse

FORMATS = ("auto", "json", "feishu", "dingtalk", "wecom")
# The hosts of each tool's robot webhooks (a URL the team pastes from the group's robot settings).
HOSTS = {"feishu": ("open.feishu.cn", "open.larksuite.com"), "dingtalk": ("oapi.dingtalk.com",),
         "wecom": ("qyapi.weixin.qq.com",)}
# A first word every message starts with: DingTalk's "custom keywords" security setting needs a word the robot
# must find in every message (set it to this), and a chat reader sees at once who speaks.
PREFIX = "[llm-pipeline]"


def resolve_format(fmt: str, url: str | None) -> str:
    """The tool a webhook URL belongs to for `auto` (json for a host that is none of them), else `fmt`."""
    if fmt != "auto":
        return fmt
    try:
        host = (urllib.parse.urlsplit(url or "").hostname or "").lower()
    except ValueError:  # no URL to tell by (webhook_problem says what is wrong with it)
        return "json"
    return next((tool for tool, hosts in HOSTS.items() if host in hosts), "json")


def chat_text(payload: dict) -> str:
    """One readable text of a notice: who speaks, which run, what happened (the message has the details)."""
    what = payload.get("name") or payload.get("state") or "notice"
    run = payload.get("run_id") or payload.get("flow_run") or payload.get("flow") or ""
    message = payload.get("message") or payload.get("error") or ""
    remedy = f"\nFix: {payload['remedy']}" if payload.get("remedy") else ""
    return f"{PREFIX} {what}{f' {run}' if run else ''}: {message}{remedy}".rstrip(": ")


def shaped(tool: str, text: str) -> dict:
    """The body of a text message to `tool` (feishu, dingtalk, wecom)."""
    if tool == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if tool in ("dingtalk", "wecom"):
        return {"msgtype": "text", "text": {"content": text}}
    raise ValueError(f"orchestration.webhook_format={tool!r}: not a chat tool (one of {', '.join(FORMATS)})")


def chat_body(fmt: str, url: str | None, payload: dict) -> dict:
    """What to POST for `payload` under orchestration.webhook_format `fmt` to `url`."""
    tool = resolve_format(fmt, url)
    return payload if tool == "json" else shaped(tool, chat_text(payload))


def block_template(fmt: str, url: str | None) -> dict:
    """The json_data of a Prefect Custom Webhook block posting like chat_body: `{{subject}}` is what happened
    (the state, NotDoneByDeadline), `{{body}}` the automation's text with the run."""
    tool = resolve_format(fmt, url)
    if tool == "json":
        return {"flow": "nightly-pretrain", "source": "prefect-automation", "name": "{{subject}}",
                "message": "{{body}}"}
    return shaped(tool, f"{PREFIX} {{{{subject}}}}: {{{{body}}}}")
