"""What a user sees in the Prefect UI (real server, Debian chromium at 1,600 x 1,000).

The pipeline's orchestration is real; the stages are the doubles of tests/flows (and an evaluate
double that renders the real report), because how the UI shows a run is the point here, not training.
"""
import dataclasses
from pathlib import Path

import pytest
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterName

from flows.pipeline import llm_pipeline
from pipeline_lib import stages
from ui_helpers import CONTENT, WINDOW, hidden_width, open_artifact_tab, overflow

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server", "stage_doubles")]

STAGES = ("data", "pretrain", "sft", "evaluate", "export")
TABS = 4  # artifact views open at once (tabs of the test's browser context)


@pytest.fixture
def eval_double(monkeypatch):
    monkeypatch.setitem(stages.SPECS, "evaluate",
                        dataclasses.replace(stages.SPECS["evaluate"], runner="eval_double:evaluate"))


def run_pipeline(cfg, run_id: str, fail: str | None = None):
    if fail:
        run_dir = Path(cfg.run.output_root) / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / f"fail-{fail}").write_text("ValueError 1")
    return llm_pipeline(config=cfg.model_dump(mode="json"), run_id=run_id, return_state=True)


def flow_run_id(name: str):
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    assert len(runs) == 1, [r.name for r in runs]
    return runs[0].id


def artifact_id(key: str, flow_run_name: str):
    """The artifact `key` published by that flow run. Not "the last of the key": the server sorts by random
    UUID, and other tests on the session's server (e.g. the acceptance run) publish the same keys."""
    fr = flow_run_id(flow_run_name)
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    mine = [a for a in found if a.flow_run_id == fr]
    assert len(mine) == 1, (key, flow_run_name, [(a.flow_run_id, a.created) for a in found])
    return mine[0].id


def run_artifacts(run_id: str) -> list:
    """Every artifact the run's flow runs (the parent and its stage flows) published."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"/{run_id}")))
        ids = {r.id for r in runs}
        return [a for a in client.read_artifacts() if a.flow_run_id in ids]


def open_overview(page, ui_url: str, run_id: str) -> str:
    """As a user does: the parent run's page, its Artifacts tab, the overview card. Returns the text."""
    return open_artifact_tab(page, ui_url, flow_run_id(f"llm-pipeline/{run_id}"), f"run-overview-{run_id}")


def test_parent_overview_shows_every_stage_and_the_evaluation_fits_the_window(tiny_cfg, eval_double, page,
                                                                               ui_url, screenshot):
    state = run_pipeline(tiny_cfg, "ui-ok")
    assert state.is_completed(), state.message
    text = open_overview(page, ui_url, "ui-ok")
    for stage in STAGES:
        assert stage in text
    assert text.count("Completed") == len(STAGES) and "file://" not in page.content()
    assert "perplexity base 80.12" in text  # key figures straight from the stages' manifests
    shot = screenshot(page, "run-overview")
    widths = overflow(page)
    assert widths["scroll"] <= widths["client"] and widths["page"] <= WINDOW, widths

    page.goto(f"{ui_url}/artifacts/artifact/{artifact_id('evaluate-report', 'evaluate/ui-ok')}")
    page.get_by_text("Evaluation of run ui-ok").first.wait_for(timeout=30_000)  # this run's report, rendered
    report = page.locator(CONTENT).inner_text()
    assert report.index("Checkpoints") < report.index("80.123") < report.index("p-resume")  # perplexity on top
    assert report.index("p-resume") < report.index("p-ckpt")
    widths = overflow(page)
    screenshot(page, "evaluation-view")
    assert widths["scroll"] <= widths["client"] and widths["page"] <= WINDOW, widths
    assert shot.exists()
    with get_client(sync_client=True) as client:  # browsers refuse file:// links from a page: none anywhere
        assert not [a.key for a in client.read_artifacts() if "file://" in str(a.data)]
    # every artifact the run published fits the window: nothing wider than it shows
    wide = {}
    artifacts = run_artifacts("ui-ok")
    assert len(artifacts) >= len(STAGES), [a.key for a in artifacts]
    # TABS views at a time, each in a tab of its own: each still waits for its network to be idle for 500 ms (the
    # content rendered), but those waits overlap instead of adding up (26 artifacts: 13 s of them in a row)
    tabs = [page] + [page.context.new_page() for _ in range(TABS - 1)]
    for first in range(0, len(artifacts), TABS):
        batch = list(zip(artifacts[first:first + TABS], tabs))
        for art, tab in batch:
            tab.goto(f"{ui_url}/artifacts/artifact/{art.id}", wait_until="commit")
        for art, tab in batch:
            tab.get_by_text(str(art.id)).first.wait_for(timeout=30_000)  # the header names the artifact shown
            tab.wait_for_load_state("networkidle", timeout=30_000)
            if found := hidden_width(tab):
                wide[f"{art.key} ({art.type})"] = found
    for tab in tabs[1:]:
        tab.close()
    assert not wide, wide


def test_failing_stage_shows_its_error_in_the_overview_and_a_rerun_shows_cached(tiny_cfg, page, ui_url,
                                                                                 screenshot):
    state = run_pipeline(tiny_cfg, "ui-fail", fail="sft")
    assert state.is_failed()
    text = open_overview(page, ui_url, "ui-fail")
    assert "Failed: sft" in text and "ValueError: sft: planned ValueError" in text
    assert "Not run" in text and "after the failure of sft" in text  # evaluate, export
    screenshot(page, "run-overview-failed")

    again = llm_pipeline(config=tiny_cfg.model_dump(mode="json"), run_id="ui-fail", return_state=True)
    assert again.is_completed(), again.message
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(
            any_=["llm-pipeline/ui-fail (resume 1)"])))  # a resume is a flow run of its own name
    assert len(runs) == 1
    text = open_artifact_tab(page, ui_url, runs[0].id, "run-overview-ui-fail")
    assert text.count("Cached") >= 3  # the legend, data and pretrain (not redone)
    assert "Earlier flow runs of this run" in text and "llm-pipeline/ui-fail (Failed)" in text
    screenshot(page, "run-overview-resumed")
    href = page.get_by_role("link", name="llm-pipeline/ui-fail", exact=True).get_attribute("href")
    assert href == f"{ui_url}/runs/flow-run/{flow_run_id('llm-pipeline/ui-fail')}"
    page.goto(href)  # the earlier flow run's page opens
    page.get_by_text("llm-pipeline/ui-fail", exact=True).first.wait_for()


def test_live_loss_curve_exists_before_training_ends_and_is_kept_on_failure(tiny_cfg, monkeypatch, page, ui_url,
                                                                             screenshot):
    import contextvars
    import threading
    import time

    import tasks.live_training

    monkeypatch.setattr(tasks.live_training, "LIVE_EVERY_S", 0.0)  # every tick (the default is 30 s)
    monkeypatch.setitem(stages.SPECS, "pretrain",
                        dataclasses.replace(stages.SPECS["pretrain"], runner="live_double:pretrain"))
    result = {}
    context = contextvars.copy_context()  # the session's Prefect settings (this server) in the worker thread too
    worker = threading.Thread(target=lambda: context.run(lambda: result.update(state=llm_pipeline(
        config=tiny_cfg.model_dump(mode="json"), run_id="ui-live", stages=["data", "pretrain"], return_state=True))))
    worker.start()
    release = Path(tiny_cfg.run.output_root) / "ui-live" / "release-pretrain"

    def live_at(text: str):
        deadline, live = time.time() + 120, None
        while time.time() < deadline and live is None:  # the double holds at steps 3 and 6 of 12 until released
            with get_client(sync_client=True) as client:
                found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["pretrain-live"])))
            live = next((a for a in found if text in str(a.data)), None)
            if live is None:  # not after the card was found: the double waits at its step for the test
                time.sleep(0.5)
        assert live is not None, f"no live artifact saying {text!r} while training"
        return live

    try:
        live = live_at("step 3 of 5")  # within tiny-cpu's 5 preflight steps: said so, not "training"
        page.goto(f"{ui_url}/artifacts/artifact/{live.id}")
        page.locator(f"{CONTENT} img").first.wait_for()
        screenshot(page, "live-preflight")
        assert "preflight, step 3 of 5 (of 12 steps), loss" in page.locator(CONTENT).inner_text()
        release.with_name("release-preflight").write_text("go")
        live = live_at("step 6 of 12")
        page.goto(f"{ui_url}/artifacts/artifact/{live.id}")
        img = page.locator(f"{CONTENT} img").first
        img.wait_for()
        assert page.evaluate("(el) => el.naturalWidth", img.element_handle()) > 100  # the PNG decodes
        screenshot(page, "live-training")
        assert "training, step 6 of 12" in page.locator(CONTENT).inner_text()
        # the parent's overview, refreshed with the card: the Running row's progress and a link to the card
        text = open_overview(page, ui_url, "ui-live")
        screenshot(page, "overview-running")
        row = next(line for line in text.splitlines() if line.startswith("pretrain"))
        assert "Running" in row and "since " in row and "training, step 6 of 12, loss " in row, row
        assert "about 2 s left" in row and "tokens seen" in row, row  # 6 steps left at 250 ms a step
        assert "so far" not in text and "updated " in text
        link = page.get_by_role("link", name="live curve: pretrain-live").get_attribute("href")
        assert link == f"{ui_url}/artifacts/artifact/{live.id}"  # one click to the curve
    finally:
        release.parent.mkdir(parents=True, exist_ok=True)
        release.with_name("release-preflight").write_text("go")
        release.write_text("go")
        worker.join(180)
    assert result["state"].is_failed()
    page.goto(f"{ui_url}/artifacts/artifact/{live.id}")  # the live card again (the overview was the last page)
    page.locator(f"{CONTENT} img").first.wait_for()
    text = page.locator(CONTENT).inner_text()
    assert "failed, step 12 of 12" in text  # the curve up to the failure stays
    screenshot(page, "live-training-failed")
