"""Secret config values never go where we write (Prefect parameters, logs, artifacts, yaml, reports).

`orchestration.failure_webhook_url` is one: a webhook URL usually carries its token. A config may name
it as `env:NAME` (read from the environment of the process that posts: the way to give a worker the
secret), or as the URL itself: then `public_config(cfg)`, the config as the JSON dict flows pass on as
parameters, moves the URL into this process's environment (inherited by its subprocesses, never
written) and puts `env:NAME` in its place. Overrides are parameters of a submitted run as they are:
`secret_overrides(overrides)` finds a literal secret among them (`--submit` refuses it). `secret_value(value)` reads either form back, where the
secret is used; `redact_url(url)` is what a message may say about it (scheme and host only).
S3 credentials are never config values: boto3 reads them from its own environment and files.
"""
from __future__ import annotations

import hashlib
import os
import urllib.parse

SECRET_FIELDS = (("orchestration", "failure_webhook_url"),)
ENV_REF = "env:"


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
    """The dotted keys of `key=value` overrides that set a secret field to a literal (not `env:NAME`)."""
    names = {".".join(f) for f in SECRET_FIELDS}
    out = []
    for item in overrides or []:
        key, _, value = str(item).partition("=")
        if key.strip() in names and value.strip() and not value.strip().startswith(ENV_REF):
            out.append(key.strip())
    return out


def secret_value(value: str | None) -> str | None:
    """The secret itself: `value`, or the environment variable an `env:NAME` value names (None if unset)."""
    if isinstance(value, str) and value.startswith(ENV_REF):
        return os.environ.get(value[len(ENV_REF):]) or None
    return value


def redact_url(url: str | None) -> str:
    """scheme://host[:port]/... : a URL as a message may show it, without its path, query or user info."""
    if not url:
        return str(url)
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}/..."
