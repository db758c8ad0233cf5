"""Self-hosted Prefect automations of the nightly deployment, made by `llm-pipeline deploy` (idempotent: one
automation per name, updated in place on re-deploy).

- `llm-pipeline nightly late` (only with nightly.deadline): a proactive event trigger. After a nightly flow run
  enters Running, Prefect expects one of its final-state events within the window from the schedule's start
  (orchestration.nightly_cron) to the deadline; when none arrives (still running, paused for a person, stuck) it
  sends a notification.
- `llm-pipeline nightly crashed` (and `... failed or held`): a reactive trigger on the nightly's Crashed (Failed,
  Held) state events. A crashed night's process may be dead and unable to post its own webhook (one that lived to
  run its on_crashed hook posts too: a crash may be told twice); Failed and Held are posted by the night itself to
  orchestration.failure_webhook_url, so they get an automation only when the team's own notification block is
  something else.

The notifications go through the notification block named NOTIFY_BLOCK: the team's own (any Prefect notification
block: Slack, Teams, a custom webhook ... made in the UI), or, when the config has orchestration.failure_webhook_url,
a Custom Webhook block made from it whose URL is kept in the block's secrets (never printed, never in a parameter)."""
from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

NOTIFY_BLOCK = "llm-pipeline-nightly"
NIGHTLY = "nightly-pretrain/nightly"
LATE, CRASHED = "llm-pipeline nightly late", "llm-pipeline nightly crashed"
# Every final state a nightly ends in, as the event Prefect emits for it (prefect.flow-run.<state name>): the
# nightly's Completed states carry their own names (flows/nightly.py), so `Completed` alone would never match one.
NIGHT_ENDS = ("Promoted", "Held", "Quarantined", "Skipped", "Busy", "NoNewData", "NoUsableData", "Completed", "Failed",
              "Crashed", "Cancelled")


def nightly_window(cron: str, timezone: str, deadline: str, now: dt.datetime | None = None) -> dt.timedelta:
    """From the schedule's next start to the deadline that follows it (02:00 -> 07:00: 5 h)."""
    from prefect._vendor.croniter import croniter  # what Prefect's own cron schedules use

    from pipeline_lib.nightly.deadline import deadline_at

    zone = ZoneInfo(timezone)
    local = (now or dt.datetime.now(dt.timezone.utc)).astimezone(zone).replace(tzinfo=None)
    start = croniter(cron, local).get_next(dt.datetime).replace(tzinfo=zone)
    return deadline_at(deadline, timezone, start) - start


def custom_webhook(url: str, fmt: str = "auto"):
    """A Custom Webhook block (unsaved) posting like the night's own webhook, in the shape of its chat tool
    (orchestration.webhook_format: Feishu, DingTalk, WeCom or JSON; pipeline_lib/chat_webhooks.py); the URL sits
    in the block's secrets and is filled in only when Prefect sends."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    from pipeline_lib.chat_webhooks import block_template

    return CustomWebhookNotificationBlock(name="llm-pipeline nightly", url="{{webhook_url}}",
                                          secrets={"webhook_url": url}, json_data=block_template(fmt, url))


def webhook_block(url: str, name: str = NOTIFY_BLOCK, fmt: str = "auto"):
    """custom_webhook saved over any block of that name: its id."""
    return custom_webhook(url, fmt).save(name, overwrite=True)


def team_block(client, name: str = NOTIFY_BLOCK):
    """The id of the notification block of that name the team made (any type), else None."""
    for doc in client.read_block_documents():
        if doc.name == name:
            return doc.id
    return None


def _upsert(client, automation) -> str:
    """Create the automation, or update the one of its name (and drop any duplicate): 'created' or 'updated'."""
    found = client.read_automations_by_name(automation.name)
    if not found:
        client.create_automation(automation)
        return "created"
    client.update_automation(found[0].id, automation)
    for extra in found[1:]:
        client.delete_automation(extra.id)
    return "updated"


def _drop(client, name: str) -> bool:
    found = client.read_automations_by_name(name)
    for old in found:
        client.delete_automation(old.id)
    return bool(found)


def nightly_automations(deployment_id, block_id, deadline: str | None, window: dt.timedelta | None,
                        own_block: bool, tag: str = "") -> list[tuple[str, object]]:
    """(name, AutomationCore) of the nightly's automations: the late one when there is a deadline, the crashed one
    (Failed and Held too when the block is the team's own). `tag` suffixes the names (tests)."""
    from prefect.automations import AutomationCore, EventTrigger, Posture, SendNotification

    related = {"prefect.resource.id": f"prefect.deployment.{deployment_id}", "prefect.resource.role": "deployment"}
    run = "{{ labels.prefect.resource.id }}"
    out = []
    if deadline and window is not None:
        hours = window.total_seconds() / 3600
        out.append((LATE + tag, AutomationCore(
            name=LATE + tag, description=f"The nightly has not ended {hours:g} h after it started (deadline "
            f"{deadline}, nightly.deadline): made by llm-pipeline deploy", enabled=True,
            trigger=EventTrigger(posture=Posture.Proactive, after={"prefect.flow-run.Running"},
                                 expect={f"prefect.flow-run.{s}" for s in NIGHT_ENDS}, match_related=related,
                                 for_each={"prefect.resource.id"}, threshold=1, within=window),
            actions=[SendNotification(block_document_id=block_id, subject="NotDoneByDeadline",
                                      body=f"the nightly run {run} has not ended {hours:g} h after it started: its "
                                           f"deadline {deadline} has passed (still running, paused for a person, or "
                                           "stuck); see it in the Prefect UI")])))
    states = ("Crashed",) if not own_block else ("Crashed", "Failed", "Held")
    out.append((CRASHED + tag, AutomationCore(
        name=CRASHED + tag, description=f"A nightly run ended {', '.join(states)}: made by llm-pipeline deploy",
        enabled=True,
        trigger=EventTrigger(posture=Posture.Reactive, expect={f"prefect.flow-run.{s}" for s in states},
                             match_related=related, for_each={"prefect.resource.id"}, threshold=1,
                             within=dt.timedelta(0)),
        actions=[SendNotification(block_document_id=block_id, subject="{{ event.event.split('.')[-1] }}",
                                  body=f"the nightly run {run} ended {{{{ event.event.split('.')[-1] }}}}"
                                       "{{ ': ' ~ event.payload.validated_state.message if event.payload."
                                       "validated_state and event.payload.validated_state.message else '' }}")])))
    return out


def ensure_nightly_automations(cfg, deployment: str = NIGHTLY, tag: str = "", log=print) -> list[str]:
    """Make (or update) the nightly's automations on the API this process talks to; returns the lines it printed.
    Nothing is made without a notification block (the line says how to give one)."""
    from prefect import get_client

    from pipeline_lib.config.secrets import secret_value

    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        log(line)

    given = cfg.orchestration.failure_webhook_url
    url = secret_value(given) if given else None
    if given and not url:  # an env: reference (a name, not the secret) whose variable this process lacks
        say(f"orchestration.failure_webhook_url={given}: that variable is not set where `deploy` runs; looking for "
            f"the team's notification block {NOTIFY_BLOCK!r} instead")
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        if url:
            from pipeline_lib.chat_webhooks import resolve_format

            fmt = resolve_format(cfg.orchestration.webhook_format, url)
            block_id, own = webhook_block(url, fmt=fmt), False
            say(f"notification block {NOTIFY_BLOCK!r}: a Custom Webhook to orchestration.failure_webhook_url "
                f"(kept in the block's secrets), posting {fmt} (orchestration.webhook_format)")
        else:
            block_id, own = team_block(client), True
            if block_id is None:
                say(f"no automations: no notification block {NOTIFY_BLOCK!r} and no orchestration.failure_webhook_url. "
                    f"Fix: set the webhook in the config, or make a notification block named {NOTIFY_BLOCK} in the "
                    "Prefect UI (Blocks), and deploy again")
                return lines
            say(f"notification block {NOTIFY_BLOCK!r}: the team's own")
        deadline = cfg.nightly.deadline
        window = (nightly_window(cfg.orchestration.nightly_cron, cfg.orchestration.timezone, deadline)
                  if deadline else None)
        wanted = nightly_automations(dep.id, block_id, deadline, window, own, tag)
        for name, automation in wanted:
            say(f"automation {name!r}: {_upsert(client, automation)}")
        if not deadline and _drop(client, LATE + tag):
            say(f"automation {LATE + tag!r}: deleted (no nightly.deadline)")
    return lines
