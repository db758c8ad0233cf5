"""Secret config values never go where we write (Prefect parameters, logs, artifacts, yaml, reports).

`orchestration.failure_webhook_url` is one: a webhook URL usually carries its token. A config may name
it as `env:NAME` (read from the environment of the process that posts: the way to give a worker the
secret; NAME must start with LLM_PIPELINE_SECRET_), or as the URL itself (http or https only): then `public_config(cfg)`, the config as the JSON dict flows pass on as
parameters, moves the URL into this process's environment (inherited by its subprocesses, never
written) and puts `env:NAME` in its place. Overrides are parameters of a submitted run as they are:
`secret_overrides(overrides)` finds a literal secret among them (`--submit` refuses it). `secret_value(value)` reads either form back, where the
secret is used; `redact_url(url)` is what a message may say about it (scheme and host only).
S3 credentials are never config values: boto3 reads them from its own environment and files.
"""
from __future__ import annotations

import hashlib
import os
import re
import urllib.parse

SECRET_FIELDS = (("orchestration", "failure_webhook_url"),)
ENV_REF = "env:"
# `env:` reads only variables meant as secrets: a config (or a deployment form) must not make a worker post
# any variable of its environment (AWS_SECRET_ACCESS_KEY, ...) to a URL of its choosing
ENV_PREFIX = "LLM_PIPELINE_SECRET_"
_ENV_NAME = re.compile(rf"^{ENV_PREFIX}[A-Za-z0-9_]+$")
WEBHOOK_SCHEMES = ("https", "http")


def webhook_problem(value: str) -> str | None:
    """Why `value` is not a usable orchestration.failure_webhook_url (None when it is); never quotes it."""
    if value.startswith(ENV_REF):
        if not _ENV_NAME.match(value[len(ENV_REF):]):
            return (f"an env: reference must name a variable starting with {ENV_PREFIX} (e.g. "
                    f"env:{ENV_PREFIX}WEBHOOK); other variables of the worker are never read")
        return None
    parts = urllib.parse.urlsplit(value)
    if parts.scheme.lower() not in WEBHOOK_SCHEMES or not parts.hostname:
        return "not an http(s) URL with a host (the value is a secret: not shown)"
    return None


def public_config(cfg) -> dict:
    """cfg.model_dump(mode="json") with each secret value replaced by an `env:NAME` reference."""
    out = cfg.model_dump(mode="json")
    for section, name in SECRET_FIELDS:
        value = out.get(section, {}).get(name)
        if isinstance(value, str) and value and not value.startswith(ENV_REF):
            var = f"LLM_PIPELINE_SECRET_{hashlib.sha256(value.encode()).hexdigest()[:12].upper()}"
            os.environ[var] = value
            out[section][name] = ENV_REF + var
    return out


def secret_overrides(overrides) -> list[str]:
    """The dotted names of secret fields that the overrides set to a literal (not `env:NAME`), judged on what the
    overrides make of a config, not on their text: `orchestration={failure_webhook_url: ...}` or a spaced key set
    the field as well as `orchestration.failure_webhook_url=...` does."""
    from .load import apply_overrides

    from .errors import ConfigError

    out = []
    for item in overrides or []:  # each one: all of them are stored as parameters, a later one does not hide it
        try:
            merged = apply_overrides({}, [item])
        except ConfigError:  # not an override at all: loading the config names the problem
            continue
        for section, name in SECRET_FIELDS:
            value = merged.get(section).get(name) if isinstance(merged.get(section), dict) else None
            if isinstance(value, str) and value.strip() and not value.strip().startswith(ENV_REF) \
                    and f"{section}.{name}" not in out:
                out.append(f"{section}.{name}")
    return out


def secret_value(value: str | None) -> str | None:
    """The secret itself: `value`, or the environment variable an `env:NAME` value names (None if unset)."""
    if isinstance(value, str) and value.startswith(ENV_REF):
        name = value[len(ENV_REF):]
        return (os.environ.get(name) or None) if _ENV_NAME.match(name) else None
    return value


def redacted(value) -> str:
    """What an error message may show of a secret field's value."""
    if isinstance(value, str) and value.startswith(ENV_REF):
        return value  # a reference names a variable, not its content
    return redact_url(value) if isinstance(value, str) and "://" in value else "(a secret: not shown)"


def redact_url(url: str | None) -> str:
    """scheme://host[:port]/... : a URL as a message may show it, without its path, query or user info."""
    if not url:
        return str(url)
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}/..."
