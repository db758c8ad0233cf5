"""Secret config values: moved out of the parameters flows pass on, read back where used, redacted in messages."""
from __future__ import annotations

import json
import os

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.config.errors import ConfigError
from pipeline_lib.config.secrets import public_config, redact_url, secret_value

HOOK = "https://hooks.example.com/services/T0KEN-abc?key=s3cr3t"


def test_public_config_moves_the_webhook_url_into_the_environment(monkeypatch):
    cfg = config_from_dict({"orchestration": {"failure_webhook_url": HOOK}})
    public = public_config(cfg)
    ref = public["orchestration"]["failure_webhook_url"]
    assert ref.startswith("env:LLM_PIPELINE_SECRET_") and "T0KEN" not in json.dumps(public)
    assert os.environ[ref.removeprefix("env:")] == HOOK
    again = config_from_dict(public)  # a flow resolving the parameters gets the reference, and reads it back
    assert secret_value(again.orchestration.failure_webhook_url) == HOOK
    assert public_config(again) == public  # a reference stays a reference
    monkeypatch.delenv(ref.removeprefix("env:"))


def test_a_config_may_name_the_variable_itself(monkeypatch):
    monkeypatch.setenv("LLM_PIPELINE_SECRET_MY_HOOK", HOOK)
    cfg = config_from_dict({"orchestration": {"failure_webhook_url": "env:LLM_PIPELINE_SECRET_MY_HOOK"}})
    assert public_config(cfg)["orchestration"]["failure_webhook_url"] == "env:LLM_PIPELINE_SECRET_MY_HOOK"
    assert secret_value("env:LLM_PIPELINE_SECRET_MY_HOOK") == HOOK
    assert secret_value("env:LLM_PIPELINE_SECRET_UNSET") is None
    assert secret_value(None) is None and public_config(config_from_dict({}))["orchestration"][
        "failure_webhook_url"] is None


def test_env_reads_only_the_secret_prefix_and_urls_are_http(monkeypatch):
    """A deployment form's `env:AWS_SECRET_ACCESS_KEY` would post the worker's S3 key to a URL of its choosing;
    a value without a scheme raised urllib's `unknown url type: '<the value>'` into the UI's log."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-K7MDENG")
    assert secret_value("env:AWS_SECRET_ACCESS_KEY") is None
    for value in ("env:AWS_SECRET_ACCESS_KEY", "ftp://hooks.example.com/T0KEN", "file:///etc/passwd",
                  "T0KEN-no-scheme", "https:///T0KEN"):
        with pytest.raises(ConfigError) as caught:
            config_from_dict({"orchestration": {"failure_webhook_url": value}})
        text = str(caught.value)
        assert "orchestration.failure_webhook_url" in text and "T0KEN" not in text and "/etc/passwd" not in text
        assert "wJalr" not in text
    assert "LLM_PIPELINE_SECRET_" in str(caught.value) or "http(s)" in str(caught.value)


def test_redact_url_keeps_scheme_and_host_only():
    assert redact_url(HOOK) == "https://hooks.example.com/..."
    assert redact_url("http://user:pw@127.0.0.1:8080/hook/T?x=1") == "http://127.0.0.1:8080/..."


def test_secret_overrides_finds_literal_secrets_only():
    from pipeline_lib.config.secrets import secret_overrides

    assert secret_overrides([f"orchestration.failure_webhook_url={HOOK}", "training.steps=3",
                             "orchestration.failure_webhook_url=env:LLM_PIPELINE_SECRET_HOOK", "orchestration.failure_webhook_url="]) == \
        ["orchestration.failure_webhook_url"]


def test_secret_overrides_are_judged_by_what_they_set_not_by_their_text():
    """`orchestration={failure_webhook_url: ...}` and a spaced key slipped past the refusal of --submit."""
    from pipeline_lib.config.secrets import secret_overrides

    for given in ([f"orchestration={{failure_webhook_url: '{HOOK}'}}"], [f" orchestration . failure_webhook_url ={HOOK}"]):
        assert secret_overrides(given) == ["orchestration.failure_webhook_url"], given
    assert secret_overrides(["orchestration={failure_webhook_url: env:LLM_PIPELINE_SECRET_X}"]) == []


HOSTILE_URLS = ("https://[host/T0KEN-abc", "https://[::1/T0KEN-abc", "https://hooks.example.com:99999/T0KEN-abc",
                "https://hooks.example.com:0/T0KEN-abc", "https://hooks.example.com:8x/T0KEN-abc",
                "https://]host[/T0KEN-abc", "\x00://\udcff/T0KEN-abc", "https://ho st/T0KEN-abc")


def test_redact_url_never_raises_and_never_shows_the_path():
    """An unclosed IPv6 bracket made urllib raise inside the validation error path (the chained error, with the
    URL, reached Prefect's log table at ERROR); a port above 65535 raised in the failure hook."""
    for url in HOSTILE_URLS + (12345, b"https://h/T0KEN-abc", "://", "[", "https://h:65536"):
        shown = redact_url(url)
        assert isinstance(shown, str) and "T0KEN" not in shown, (url, shown)
    assert redact_url("https://[::1]:8443/T0KEN") == "https://::1:8443/..."
    assert redact_url("https://hooks.example.com:99999/T0KEN") == "https://hooks.example.com/..."


def _logged(err: BaseException) -> str:
    """What a log handler writes of `err` with its traceback: every chained cause and context it prints (the outer
    traceback is dropped: its source lines are this test's, which hold the URL)."""
    import traceback

    return "".join(traceback.format_exception(type(err), err.with_traceback(None), None))


def test_a_hostile_webhook_url_is_refused_at_load_without_the_url_anywhere_in_the_error_chain():
    for url in HOSTILE_URLS:
        with pytest.raises(ConfigError) as caught:
            config_from_dict({"orchestration": {"failure_webhook_url": url}})
        everything = _logged(caught.value)
        assert "T0KEN" not in everything and "orchestration.failure_webhook_url" in everything, (url, everything)
        assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(ConfigError, match="port is not a number from 1 to 65535"):
        config_from_dict({"orchestration": {"failure_webhook_url": "https://hooks.example.com:99999/T0KEN"}})


def test_an_override_of_a_secret_that_is_not_yaml_is_not_echoed():
    from pipeline_lib.config.load import parse_override

    with pytest.raises(ConfigError) as caught:
        parse_override("orchestration.failure_webhook_url=[https://h/T0KEN-abc")
    everything = _logged(caught.value)
    assert "T0KEN" not in everything and "orchestration.failure_webhook_url" in everything


def test_validate_refuses_a_webhook_port_out_of_range_with_exit_2():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-m", "pipeline_lib.cli", "validate", "configs/pipelines/tiny-cpu.yaml",
                          "orchestration.failure_webhook_url=https://hooks.example.com:70000/T0KEN-abc"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "orchestration.failure_webhook_url" in res.stderr and "65535" in res.stderr
    assert "T0KEN" not in res.stdout + res.stderr and "Traceback" not in res.stderr


def test_the_failure_hook_with_a_bad_port_from_the_environment_neither_posts_nor_raises(capsys, monkeypatch):
    """An `env:` webhook is resolved only when a run fails: a port above 65535 there raised in the failure hook."""
    from flows.notify import _post

    for url in ("https://hooks.example.com:99999/T0KEN-abc", "https://[host/T0KEN-abc"):
        assert _post(url, {"flow": "f"}) is False
        said = capsys.readouterr().out
        assert "webhook not posted" in said and "T0KEN" not in said


def test_the_s3_endpoint_port_is_checked_at_load():
    from pipeline_lib.config import config_from_dict as load

    assert load({"run": {"s3_endpoint_url": "http://127.0.0.1:9000"}}).run.s3_endpoint_url == "http://127.0.0.1:9000"
    for url, said in (("http://127.0.0.1:70000", "port is not a number from 1 to 65535"),
                      ("127.0.0.1:9000", "not an http(s) URL with a host"), ("http://[::1", "not an http(s) URL")):
        with pytest.raises(ConfigError) as caught:
            load({"run": {"s3_endpoint_url": url}})
        assert f"run.s3_endpoint_url={url!r}" in str(caught.value) and said in str(caught.value)
