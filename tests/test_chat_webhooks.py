"""pipeline_lib/chat_webhooks.py: the bodies Feishu, DingTalk and WeCom robots accept, from the night's own webhook
(flows/notify.py) and from the Prefect notification block `llm-pipeline deploy` makes (deployments/automations.py),
each POSTed to a real receiver on 127.0.0.1."""
from __future__ import annotations

import pytest

from pipeline_lib.chat_webhooks import chat_body, resolve_format
from webhook_receiver import WebhookReceiver

HELD = {"flow": "nightly-pretrain", "run_id": "nightly-2026-12-04", "state": "COMPLETED", "name": "Held",
        "message": "general_zh perplexity +12% over the 5% budget"}
TEXT = "[llm-pipeline] Held nightly-2026-12-04: general_zh perplexity +12% over the 5% budget"


@pytest.mark.parametrize("url,tool", [
    ("https://open.feishu.cn/open-apis/bot/v2/hook/abc", "feishu"),
    ("https://open.larksuite.com/open-apis/bot/v2/hook/abc", "feishu"),
    ("https://oapi.dingtalk.com/robot/send?access_token=abc", "dingtalk"),
    ("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=abc", "wecom"),
    ("https://hooks.example.com/feishu", "json"),  # the tool's name in a path is not its host
    (None, "json")])
def test_auto_tells_the_chat_tools_by_their_webhook_host(url, tool):
    assert resolve_format("auto", url) == tool
    assert resolve_format("wecom", url) == "wecom"  # a set format wins (a proxy in front of a robot)


@pytest.mark.parametrize("fmt,expected", [
    ("feishu", {"msg_type": "text", "content": {"text": TEXT}}),
    ("dingtalk", {"msgtype": "text", "text": {"content": TEXT}}),
    ("wecom", {"msgtype": "text", "text": {"content": TEXT}}),
    ("json", HELD)])
def test_the_nights_own_notice_and_the_automations_block_post_the_tools_shape(fmt, expected):
    from deployments.automations import custom_webhook
    from flows.notify import _post

    with WebhookReceiver() as hook:
        assert _post(hook.url, HELD, fmt=fmt) is True
        custom_webhook(hook.url, fmt).notify(HELD["message"], subject="Held nightly-2026-12-04")
    night, automation = hook.received
    assert night == expected
    if fmt == "json":
        assert automation == {"flow": "nightly-pretrain", "source": "prefect-automation",
                              "name": "Held nightly-2026-12-04", "message": HELD["message"]}
    else:  # the same message shape, the subject where the night puts its state and run
        assert automation == expected


def test_a_failed_run_names_its_fix_in_the_chat_text():
    body = chat_body("dingtalk", None, {"flow": "llm-pipeline", "run_id": "r1", "state": "FAILED",
                                        "error": "stage 'pretrain' failed: out of memory", "remedy": "lower batch_size"})
    assert body["text"]["content"] == ("[llm-pipeline] FAILED r1: stage 'pretrain' failed: out of memory\n"
                                       "Fix: lower batch_size")
