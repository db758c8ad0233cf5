"""Browser fixtures: Debian's chromium driven by Playwright against the real Prefect server of the session.

Playwright's own browser download cannot work here (no internet but PyPI/Debian), so the browser is
the system chromium (`make setup` installs it with apt-get when root). Without it, or without the
playwright package, every UI test is skipped with the reason.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prefect import get_client
from process_groups import stop_worker
from suite_rules import machine_skip
from ui_helpers import BIN, ROOT, cli

CHROMIUM = os.environ.get("LLM_PIPELINE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
VIEWPORT = {"width": 1600, "height": 1000}
MAX_SHOT_HEIGHT = 1599  # issue 48: screenshots under 1,600 px tall

# The stage doubles and the tiny config of the flow tests, reused as they are (not copied).
_spec = importlib.util.spec_from_file_location("flows_test_fixtures", Path(__file__).parents[1] / "flows" / "conftest.py")
_flows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_flows)
stage_doubles = _flows.stage_doubles
tiny_cfg = _flows.tiny_cfg
# the doubles are named "stage_doubles:<stage>": their module must be importable from here too
_FLOWS_DIR = str(Path(__file__).parents[1] / "flows")


@pytest.fixture(autouse=True)
def _doubles_importable(monkeypatch):
    monkeypatch.syspath_prepend(_FLOWS_DIR)


@pytest.fixture(scope="module")
def browser():
    """Per test module, not per session: Playwright's sync API keeps an event loop on this thread while it
    runs, and Prefect's sync/async calls (State.result) then return coroutines in later tests."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        machine_skip("playwright is not installed: pip install -c constraints.txt -e '.[test]'")
    if not os.path.exists(CHROMIUM):
        machine_skip(f"no chromium at {CHROMIUM}: `make setup` installs Debian's chromium when run as root "
                    "(or apt-get install chromium; LLM_PIPELINE_CHROMIUM=<path> for another build)")
    with sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def ui_url(prefect_server) -> str:
    """The Prefect UI of the session's server (the API URL without /api)."""
    return prefect_server.removesuffix("/api")


@pytest.fixture
def screenshot(tmp_path):
    """screenshot(page, name) -> path of a full-page PNG (at most MAX_SHOT_HEIGHT tall) under this test's tmp folder
    (screens/).
    LLM_PIPELINE_SCREENSHOTS=<folder> also copies each one there (docs/img holds the README's)."""
    folder = tmp_path / "screens"
    keep = os.environ.get("LLM_PIPELINE_SCREENSHOTS")

    def take(page, name: str) -> Path:
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.png"
        # the whole page, cut at MAX_SHOT_HEIGHT: a shot that tall is read, a longer one is scrolled past
        height = min(page.evaluate("() => document.documentElement.scrollHeight"), MAX_SHOT_HEIGHT)
        page.screenshot(path=str(path), full_page=True, clip={"x": 0, "y": 0, "width": VIEWPORT["width"],
                                                              "height": height})
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(keep) / path.name)
        return path

    return take


@pytest.fixture
def page(browser, tmp_path, request):
    """A 1,600 x 1,000 page; on a failed test its last view is saved as screens/failure.png."""
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        (tmp_path / "screens").mkdir(exist_ok=True)
        try:
            pg.screenshot(path=str(tmp_path / "screens" / "failure.png"), full_page=True)
        except Exception:
            pass
    context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep


@pytest.fixture(scope="module")
def chain_deployment(prefect_server, tmp_path_factory):
    """llm-pipeline/default as `llm-pipeline deploy` makes it, and a worker of its pool."""
    cli("pools")
    cli("deploy", "--name", "llm-pipeline/default")
    log = tmp_path_factory.mktemp("worker") / "cpu.log"
    env = dict(os.environ, LLM_PIPELINE_HOME=str(ROOT), PREFECT_WORKER_QUERY_SECONDS="1")
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "cpu", "--type", "process"],
                              cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("llm-pipeline/default")
    # what `prefect deploy` made of the flow's signature: a typed field per config section
    assert {"run", "data", "training", "orchestration"} <= set(deployment.parameter_openapi_schema["properties"])
    assert "DataConfig" in deployment.parameter_openapi_schema["definitions"]
    yield deployment, log
    stop_worker(worker)


@pytest.fixture(scope="module")
def dispatch_pools(chain_deployment, tmp_path_factory):
    """The chain's dispatch as a team runs it: the data and pretrain stage deployments, and a worker of the `ascend`
    pool (training stages) beside chain_deployment's `cpu` one. Yields the ascend worker's log."""
    cli("deploy", "--name", "data-flow/default", "--name", "pretrain-flow/default")  # prefect names them by function
    log = tmp_path_factory.mktemp("ascend-worker") / "ascend.log"
    env = dict(os.environ, LLM_PIPELINE_HOME=str(ROOT), PREFECT_WORKER_QUERY_SECONDS="1")
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "ascend", "--type", "process"],
                              cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    yield log
    stop_worker(worker)
