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
    try:  # urllib raises on an unclosed IPv6 bracket; its message would be the least of it, the value is a secret
        parts = urllib.parse.urlsplit(value)
        host = parts.hostname
    except ValueError:
        return "not a URL (an unclosed [ of an IPv6 host?) (the value is a secret: not shown)"
    if parts.scheme.lower() not in WEBHOOK_SCHEMES or not host:
        return "not an http(s) URL with a host (the value is a secret: not shown)"
    if not _HOST.fullmatch(host):
        return "its host is not a DNS name or an IP address (the value is a secret: not shown)"
    port = url_port_problem(parts)
    if port:
        return f"{port} (the value is a secret: not shown)"
    return None


def url_port_problem(parts: urllib.parse.SplitResult) -> str | None:
    """Why the port of a split URL is unusable (urllib raises only when `.port` is read: at post time), else None."""
    try:
        port = parts.port
    except ValueError:
        return "its port is not a number from 1 to 65535: fix the port after the host's ':'"
    if port == 0:
        return "its port is 0: fix the port after the host's ':' (1 to 65535)"
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
    """scheme://host[:port]/... : a URL as a message may show it, without its path, query or user info.
    Never raises (it runs inside error paths: an exception there would chain the error that quotes the URL): what
    does not parse, or parses into a host or scheme that is not one, is shown as `?`."""
    if not url:
        return str(url)
    try:
        parts = urllib.parse.urlsplit(str(url))
        scheme, host = parts.scheme, parts.hostname or ""
    except (ValueError, TypeError):
        return "?://?/... (not a URL)"
    try:
        port = parts.port
    except ValueError:
        port = None
    scheme = scheme if _SCHEME.fullmatch(scheme) else "?"
    host = host if _HOST.fullmatch(host) else "?"
    return f"{scheme}://{host}{f':{port}' if port else ''}/..."


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,15}")
_HOST = re.compile(r"[A-Za-z0-9._:%-]{1,253}")  # a DNS name or an IP address (IPv6 without its brackets)
