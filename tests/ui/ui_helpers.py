"""What the browser tests share: the CLI as a user runs it, waiting for a flow run, and what a 1,600 px window
cannot show (content wider than it shows)."""
import os
import subprocess
import sys
import time
from pathlib import Path

from prefect import get_client

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WINDOW = 1600
# what the UI puts around an artifact: the left navigation and the details column
CONTENT = ".artifact-data-markdown"


def cli(*args):
    env = dict(os.environ, LLM_PIPELINE_HOME=str(ROOT))
    res = subprocess.run([str(BIN / "llm-pipeline"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def finished_run(flow_run_id: str, timeout: float):
    """The flow run, once final (by id: other tests of the session submit runs of the same deployment, so "the
    latest run of the deployment" may be theirs)."""
    deadline = time.time() + timeout
    with get_client(sync_client=True) as client:  # one client for the wait: each new one builds an SSL context
        while time.time() < deadline:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final():
                return run
            time.sleep(0.5)  # found final 0.25 s after it ended, on average (0.5 s at one poll a second)
    raise AssertionError(f"flow run {flow_run_id} not finished after {timeout} s: {run.state}")


def open_artifact_tab(page, ui_url: str, flow_run_id, key: str) -> str:
    """As a user does: the flow run's page, its Artifacts tab, the card `key`; returns the artifact's text.
    The page is loaded again once when the card did not show: on a busy machine the tab's list was seen to stay
    empty for 30 s (its first request answered before the run's artifacts were readable), and a person would
    reload too."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in (1, 2):
        page.goto(f"{ui_url}/runs/flow-run/{flow_run_id}")
        page.get_by_role("tab", name="Artifacts").or_(page.get_by_text("Artifacts", exact=True)).first.click()
        card = page.get_by_text(key, exact=True).first
        try:
            card.click(timeout=20_000 if attempt == 1 else 30_000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    page.locator(CONTENT).wait_for()
    return page.locator(CONTENT).inner_text()


def hidden_width(page) -> list:
    """Elements of the page content whose content is wider than they show (scrolled or cut off), and the
    page's own width: what a user at a 1,600 px window cannot see without scrolling sideways."""
    return page.evaluate("""() => {
        const out = [];
        for (const el of document.querySelectorAll('main *, .p-layout-default__main *, .artifact-data-markdown *')) {
            const ov = getComputedStyle(el).overflowX;
            if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 2 && ['auto', 'scroll', 'hidden'].includes(ov))
                out.push(`${el.tagName.toLowerCase()}.${el.className} ${el.scrollWidth}>${el.clientWidth}`);
        }
        if (document.documentElement.scrollWidth > window.innerWidth) out.push(`page ${document.documentElement.scrollWidth}`);
        return out; }""")


def overflow(page) -> dict:
    """Widths of the artifact content: scrollWidth > clientWidth means a part is off-screen."""
    return page.evaluate(f"""() => {{ const el = document.querySelector('{CONTENT}');
        return {{scroll: el.scrollWidth, client: el.clientWidth, page: document.documentElement.scrollWidth}}; }}""")
