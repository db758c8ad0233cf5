"""Nothing the product starts calls out (flows/offline.py, pyproject.toml [tool.prefect.*]), and the guard the README
walk runs under (tests/offline/sitecustomize.py) refuses and records every connection but loopback."""
import os
import subprocess
import sys
from pathlib import Path

from flows.offline import TELEMETRY_OFF, telemetry_off

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "tests" / "offline"
SETTINGS = ("from prefect.settings import get_current_settings as g; s = g(); "
            "print(s.server.analytics_enabled, s.cloud.enable_orchestration_telemetry, "
            "s.telemetry.enable_resource_metrics)")


def clean_env(**extra) -> dict:
    """A user's environment: none of the suite's PREFECT_* / DO_NOT_TRACK settings."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "DO_NOT_TRACK"}
    return {**keep, "PREFECT_HOME": extra.pop("home"), **extra}


def test_telemetry_off_sets_what_is_unset_and_keeps_what_the_environment_says():
    env = {"PREFECT_SERVER_ANALYTICS_ENABLED": "true"}
    telemetry_off(env)
    assert env == {**TELEMETRY_OFF, "PREFECT_SERVER_ANALYTICS_ENABLED": "true"}


def test_a_prefect_process_started_from_the_project_root_has_telemetry_off(tmp_path):
    """`prefect server start` from the root (the README's UI command): its analytics heartbeat to sens-o-matic.prefect.io
    is off by pyproject.toml alone; from elsewhere Prefect's defaults hold (what a team's server must set itself)."""
    here = subprocess.run([sys.executable, "-c", SETTINGS], cwd=ROOT, env=clean_env(home=str(tmp_path)),
                          capture_output=True, text=True, timeout=60)
    assert here.stdout.split() == ["False", "False", "False"], here.stderr
    elsewhere = subprocess.run([sys.executable, "-c", SETTINGS], cwd=tmp_path, env=clean_env(home=str(tmp_path)),
                               capture_output=True, text=True, timeout=60)
    assert elsewhere.stdout.split()[0] == "True", elsewhere.stderr


def test_the_cli_turns_telemetry_off_from_any_directory(tmp_path):
    code = "import flows.cli, os; " + SETTINGS + "; print(os.environ['DO_NOT_TRACK'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                         env=clean_env(home=str(tmp_path), PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["False", "False", "False", "1"], out.stderr


def test_the_guard_refuses_and_records_public_addresses_and_lets_loopback_through(tmp_path):
    log = tmp_path / "outbound.log"
    code = """
import socket
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
socket.create_connection(server.getsockname(), 2).close()
socket.getaddrinfo("localhost", 80)
for attempt in (lambda: socket.socket().connect(("192.0.2.1", 443)),  # an address: no lookup first
                lambda: socket.create_connection(("sens-o-matic.prefect.io", 443), 2)):
    try:
        attempt()
    except ConnectionRefusedError as err:
        print("refused", err)
"""
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(GUARD),
                                                           "LLM_PIPELINE_OUTBOUND_LOG": str(log)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused outbound connection refused by the test's guard") == 2, out.stdout
    recorded = log.read_text().splitlines()
    assert len(recorded) == 2 and "connect '192.0.2.1':443" in recorded[0]
    assert "getaddrinfo 'sens-o-matic.prefect.io':443" in recorded[1]
