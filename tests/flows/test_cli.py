"""flows/cli.py: the embedded Prefect API server does not outlive a SIGKILLed `llm-pipeline`."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # runs the CLI or flows end to end (servers, workers, subprocesses)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_embedded_api_server_ends_and_frees_its_port_when_the_cli_is_killed(sigkill_parent):
    alive, fields = sigkill_parent("""
import time, urllib.request
from flows.cli import embedded_api

with embedded_api() as api:
    urllib.request.urlopen(api.server.api_url + "/health", timeout=10).read()  # up and answering
    print("READY", api.server.server_process.pid, f"port={api.server.port}", flush=True)
    time.sleep(300)
""", within=10)
    assert alive == [], "the embedded API server outlived the killed CLI"
    port = int(fields[1].removeprefix("port="))
    with socket.socket() as s:  # nothing answers there any more
        assert s.connect_ex(("127.0.0.1", port)) != 0
    with socket.socket() as s:  # and a new server can listen on it (SO_REUSEADDR, as uvicorn: the health
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # check's connection may be in TIME_WAIT)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_embedded_api_boots_while_the_cli_works_and_stops_without_waiting(monkeypatch):
    """launch() returns at once (the config loads while the server boots); entering waits for it;
    leaving sends SIGTERM and returns without waiting for the server's shutdown."""
    import threading
    import time
    import urllib.request

    from prefect.settings import get_current_settings

    from flows.cli import embedded_api

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    heartbeat_before = get_current_settings().flows.heartbeat_frequency  # this worker's (see prefect_server)
    t0 = time.monotonic()
    api = embedded_api().launch()
    launched, proc, api_url = time.monotonic() - t0, api.server.server_process, api.server.api_url
    assert launched < 1.5 and proc.poll() is None
    with api:
        urllib.request.urlopen(api.server.api_url + "/health", timeout=10).read()
        # it holds none of the CLI's pipes: whoever reads the CLI's output sees its end with the CLI's
        assert {os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in (0, 1, 2)} == {"/dev/null"}
        # a thread started without the CLI's context (a worker's output reader logging to the run) sees it
        # too, rather than starting Prefect's own ephemeral server (one the CLI could not stop)
        seen = []
        reader = threading.Thread(target=lambda: seen.append(get_current_settings().api.url))
        reader.start()
        reader.join()
        assert seen == [api.server.api_url]
        # no flow-run heartbeats towards a server that ends with the CLI (each flow's end waited on one)
        assert get_current_settings().flows.heartbeat_frequency is None
        t0 = time.monotonic()
    assert proc.wait(timeout=20) is not None  # it ends on its own
    assert "PREFECT_API_URL" not in __import__("os").environ
    assert get_current_settings().api.url != api_url  # the process-global settings restored
    assert get_current_settings().flows.heartbeat_frequency == heartbeat_before


def test_embedded_api_is_not_started_when_prefect_api_url_is_set(monkeypatch):
    from flows.cli import embedded_api

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    with embedded_api().launch() as api:
        assert api.server is None


def test_an_orphaned_embedded_server_stops_by_itself():
    """Belt and braces for the parent-death signal: the server polls its parent and stops once orphaned."""
    import time

    import psutil

    code = ("import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-m', 'flows.embedded_server', "
            "'0', str(os.getpid())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)")
    pid = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the orphaned embedded server is still running"
        time.sleep(0.2)


def test_the_embedded_api_answers_only_its_own_processes(tmp_path, monkeypatch):
    """Any local account could read every flow-run parameter and artifact of the embedded API by scanning
    127.0.0.1:8000-8999: it now requires a per-run credential that only this process and its children hold."""
    import urllib.error
    import urllib.request

    from flows.cli import embedded_api

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with embedded_api() as api:
        url = api.server.api_url
        assert urllib.request.urlopen(url + "/health", timeout=10).status == 200  # liveness stays open
        for path in ("/flow_runs/filter", "/artifacts/filter", "/variables/filter"):
            req = urllib.request.Request(url + path, data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(req, timeout=10)
            assert caught.value.code == 401, path
        assert os.environ["PREFECT_API_AUTH_STRING"] == api.server.auth  # what children inherit
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            client.read_flow_runs()  # our own client gets in
    assert "PREFECT_API_AUTH_STRING" not in os.environ


def test_run_turns_the_collector_back_on_however_it_ends(tmp_path, monkeypatch):
    """`run` switches the garbage collector off while it imports Prefect and the flows (flows/cli.py
    _imports_done): a refused config must not leave it off in the calling process."""
    import gc

    from flows import cli

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # no embedded server for a refusal
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {docs_per_shard: -3}\n")
    assert gc.isenabled()
    assert cli.main(["run", str(bad), "--stages", "data"]) == 2
    assert gc.isenabled()
    assert cli.main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert gc.isenabled()


def test_run_of_a_stage_whose_upstream_the_run_lacks_exits_2_before_anything_runs(tmp_path, monkeypatch, capsys):
    """`run CONFIG --run-id NEW --stages pretrain` once said "done" with pretrain "missing" and exit 0."""
    from flows.cli import run_main

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # never reached: refused before the flow
    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "pipelines", "tiny-cpu.yaml")
    assert run_main([config, f"run.output_root={tmp_path}", "--run-id", "fresh", "--stages", "pretrain"]) == 2
    err = capsys.readouterr().err
    assert "run fresh has no finished 'data' stage" in err and "--stages data,pretrain" in err
    assert not (tmp_path / "fresh").exists()
