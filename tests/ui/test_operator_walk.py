"""Issue 30's walk, as an operator does it in the Prefect UI (real server, worker, trainer and chromium at 1,600 px):
a run with a malformed SFT file (refused before data runs), a trainer killed mid-run, the run retried from the UI
(finished stages Cached, one overview card), and a nightly Quick run named by its date in the schedule's zone.

Trains as little as a resume needs: 160 tiny steps (a window to see the Running row), a checkpoint every 20, no
preflight.
"""
import contextvars
import json
import threading
import time

import psutil
import yaml
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

from flows.nightly import night_date
from ui_helpers import CONTENT, ROOT, WINDOW, cli, finished_run, hidden_width, open_artifact_tab

TINY = "configs/pipelines/tiny-cpu.yaml"


def _trainer(run_folder) -> psutil.Process | None:
    """The trainer process of this run (the entry module started with this run's yaml), by its command line."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "pipeline_lib.train.entry" in cmd and str(run_folder) in cmd:
            return proc
    return None


def _kill_trainer_after_a_checkpoint(run_folder, timeout: float = 300) -> None:
    """SIGKILL the trainer, as the OOM killer or a person with kill -9 ends it, once it saved a checkpoint (the
    stage verifies it after the kill: what a resume starts from)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list((run_folder / "pretrain" / "checkpoint").rglob("*.ckpt")) and (proc := _trainer(run_folder)):
            proc.kill()
            return
        time.sleep(0.3)
    raise AssertionError(f"no checkpoint under {run_folder}/pretrain while its trainer ran, within {timeout} s")


def _retried(flow_run_id, timeout: float = 60):
    """Once the worker took the UI's Retry up (the run's second attempt)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run_id)
        if run.run_count >= 2 or not run.state.is_failed():
            return run
        time.sleep(1)
    raise AssertionError(f"the Retry did not start flow run {flow_run_id}: {run.state}")


def _fits(page, name: str, screenshot, content: bool = True) -> None:
    """The page is no wider than the window; on an artifact page (content) nothing in it is cut off either."""
    screenshot(page, name)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= WINDOW
    assert not content or not hidden_width(page), (name, hidden_width(page))


def _parent_errors(flow_run_id, settle: float = 8) -> list[str]:
    """The ERROR lines of the flow run's own log, read again until `settle` s have passed: the worker's log records
    come in batches. 8 s, read at its end: the 10-s window this replaces read last 8 s in, then slept to its end."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterLevel

    deadline = time.time() + settle
    while True:
        with get_client(sync_client=True) as client:
            found = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]),
                                                          level=LogFilterLevel(ge_=40)))
        if time.time() >= deadline:
            return [r.message for r in sorted(found, key=lambda r: r.timestamp)]
        time.sleep(min(2, max(0.0, deadline - time.time())))


def _overview_cards(flow_run_id) -> list:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["run-overview-ui-kill"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


def test_a_malformed_sft_file_fails_the_run_before_data_with_its_records_named(chain_deployment, page, ui_url,
                                                                              screenshot, tmp_path):
    bad = tmp_path / "bad_sft.jsonl"
    bad.write_text('{"prompt": "hi", "response": ""}\nnot json\n{"prompt": "x"}\n', encoding="utf-8")
    out = tmp_path / "runs"
    # a run of the deployment as the UI's form makes it (`--submit` would refuse the file before submitting)
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(chain_deployment[0].id, name="llm-pipeline/ui-badsft", parameters={
            "config": TINY, "run_id": "ui-badsft", "overrides": [f"run.output_root={out}", f"sft.inputs=[{bad}]"]})
    run = finished_run(created.id, 120)
    assert run.state.is_failed() and not (out / "ui-badsft" / "data").exists()  # nothing ran
    page.goto(f"{ui_url}/runs/flow-run/{run.id}")
    page.get_by_role("link", name=f"{ui_url}/artifacts/artifact/", exact=False).first.click()
    page.locator(CONTENT).wait_for()
    text = page.locator(CONTENT).inner_text()
    assert "Failed: sft" in text and "bad_json: 1" in text and f"{bad}:2" in text and "quarantine.jsonl" not in text
    _fits(page, "run-overview-bad-sft", screenshot)  # the error and its Fix wrap: nothing off-screen


def _running_row(flow_run_id, stage: str, timeout: float = 300) -> str:
    """The overview's Running row of `stage` once it shows the stage's live progress (the card's line and link)."""
    deadline, row = time.time() + timeout, ""
    while time.time() < deadline:
        cards = _overview_cards(flow_run_id)
        lines = [line for card in cards for line in (card.data or "").splitlines() if line.startswith(f"| [{stage}]")
                 or line.startswith(f"| **{stage}**")]
        row = lines[0] if lines else row
        if "Running" in row and "live curve: " in row:
            return row
        time.sleep(0.5)
    raise AssertionError(f"no live progress in the overview's {stage} row within {timeout} s: {row!r}")


def test_a_killed_trainer_retried_from_the_ui_shows_cached_stages_in_one_overview(chain_deployment, dispatch_pools,
                                                                                  page, ui_url, screenshot, tmp_path):
    """Dispatched as a team runs it (issue 48 items 3, 6): data on the cpu pool's worker, pretrain on the ascend
    pool's; the parent's overview shows pretrain's live progress read from the worker's card, and the UI's Retry
    reruns pretrain's own failed flow run (one node in the graph)."""
    _, worker_log = chain_deployment
    out = tmp_path / "runs"
    res = cli("run", TINY, "--submit", "--dispatch", "--run-id", "ui-kill", "--stages", "data,pretrain",
              # 160 steps: the Running row must be seen while attempt 1 trains (40 took 16 s in a loaded CI run, over
              # before the worker's first live card reached the parent's overview); the kill follows the first
              # checkpoint (step 20), so attempt 1 trains ~20-40 steps and the retry the rest
              f"run.output_root={out}", "training.steps=160", "training.save_steps=20", "training.preflight_steps=0",
              "training.warmup_steps=2",
              "orchestration.task_retries=0")  # the kill fails the run, whatever the doctor makes of it
    run_id = res.stdout.split("/runs/flow-run/", 1)[1].split()[0]
    row = _running_row(run_id, "pretrain")  # the stage runs on the ascend worker, the overview is the parent's
    assert "training, step " in row and " of 160, loss " in row and "tokens seen" in row and " left" in row, row
    assert "[live curve: pretrain-live](" in row and "/artifacts/artifact/" in row, row
    _kill_trainer_after_a_checkpoint(out / "ui-kill")
    run = finished_run(run_id, 180)
    assert run.state.is_failed(), f"{run.state}\n{worker_log.read_text()[-3000:]}\n{dispatch_pools.read_text()[-3000:]}"
    # issue 48 item 4: the parent's log says the stage's error once (not ERROR, "Finished in state Failed", ERROR)
    page.goto(f"{ui_url}/runs/flow-run/{run_id}")  # a run's page opens on its log
    page.get_by_text("stage 'pretrain' failed (run ui-kill)", exact=False).first.wait_for()
    _fits(page, "run-log-killed", screenshot, content=False)
    errors = _parent_errors(run_id)
    assert len(errors) == 1 and errors[0].startswith("stage 'pretrain' failed (run ui-kill): "), [e[:200] for e in errors]
    assert "/sys/fs/cgroup" not in run.state.message and "memory.events" not in run.state.message

    page.goto(f"{ui_url}/runs/flow-run/{run_id}")
    page.get_by_role("button", name="Retry").first.click()
    page.locator(".p-modal").get_by_role("button", name="Retry").click()  # "Retry llm-pipeline/ui-kill?"
    _retried(run_id)
    run = finished_run(run_id, 300)
    assert run.state.is_completed() and run.run_count == 2, f"{run.state}\n{worker_log.read_text()[-3000:]}"

    # the overview is one click from the run's page: its link is in the run's log (the tab a run page opens on)
    page.goto(f"{ui_url}/runs/flow-run/{run_id}")
    link = page.get_by_role("link", name=f"{ui_url}/artifacts/artifact/", exact=False).first
    link.click()
    page.locator(CONTENT).wait_for()
    text = page.locator(CONTENT).inner_text()
    assert "Cached (finished " in text and "in attempt 1)" in text, text  # data: not redone by the retry
    assert "Cached: finished in an earlier attempt" in text and "so far" not in text
    assert "pretrain\tCompleted" in text or "pretrain Completed" in text.replace("\t", " "), text
    _fits(page, "run-overview-retried", screenshot)
    # a stage row links its run: data's Cached task run of attempt 2
    page.get_by_role("link", name="data", exact=True).first.click()
    page.get_by_text("Cached").first.wait_for()
    assert len(_overview_cards(run_id)) == 1  # one card, updated in place by the retry
    metrics = json.loads((out / "ui-kill" / "pretrain" / "manifest.json").read_text())["metrics"]
    assert metrics["steps"] == 160 and metrics["resumed_from_step"] >= 20  # the retry resumed the killed training
    # the retried stage is one flow run (its attempt 2), green: the graph draws it once
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])))
    assert sorted((c.name, c.state.name, c.run_count, c.work_pool_name) for c in children) == [
        ("data/ui-kill", "Completed", 1, "cpu"), ("pretrain/ui-kill", "Completed", 2, "ascend")]


def test_a_nightly_quick_run_is_named_by_its_date_in_the_schedules_zone(chain_deployment, page, ui_url, screenshot,
                                                                        tmp_path):
    """No new file (an empty inbox): the night ends Skipped in seconds; the name, zone and summary are the point."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    doc = yaml.safe_load((ROOT / TINY).read_text())
    doc["data"]["inputs"] = [str(inbox)]
    doc["run"]["output_root"] = str(tmp_path / "runs")
    mine = tmp_path / "night.yaml"
    mine.write_text(yaml.safe_dump(doc))
    cli("deploy", "--config", str(mine), "--name", "nightly")
    try:
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("nightly-pretrain/nightly")
        assert "Asia/Shanghai" in deployment.description
        page.goto(f"{ui_url}/deployments/deployment/{deployment.id}")
        page.get_by_text("tz:Asia/Shanghai", exact=True).first.wait_for()  # on the page, not only in a tooltip
        _fits(page, "nightly-deployment", screenshot, content=False)
        page.get_by_text("Description", exact=True).first.click()
        page.get_by_text("in Asia/Shanghai", exact=False).first.wait_for()
        page.goto(f"{ui_url}/deployments/deployment/{deployment.id}")
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run"), timeout=60_000) as created:
            page.get_by_role("button", name="Run", exact=True).first.click()
            page.get_by_text("Quick run").first.click()
            page.locator(".p-modal").get_by_role("button", name="Run", exact=True).click()  # its parameters as deployed
        run = finished_run(created.value.json()["id"], 120)
        assert run.state.is_completed() and run.state.name == "Skipped", run.state
        assert run.name == f"nightly/{night_date('Asia/Shanghai')}"
        summary = open_artifact_tab(page, ui_url, run.id, "nightly-summary")
        assert f"Night {night_date('Asia/Shanghai')}: Skipped" in summary and "Asia/Shanghai" in summary
        _fits(page, "nightly-summary", screenshot)
    finally:
        cli("deploy", "--name", "nightly")  # the shipped config again, for the session's other tests


def _nightly_yaml(tmp_path, output_root, inputs) -> str:
    doc = yaml.safe_load((ROOT / TINY).read_text())
    doc["data"]["inputs"] = [str(inputs)]
    doc["run"]["output_root"] = str(output_root)
    path = tmp_path / "night.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_a_held_night_is_told_apart_from_a_promoted_one_and_promoted_from_the_ui(chain_deployment, stage_doubles,
                                                                                 tiny_cfg, monkeypatch, page, ui_url,
                                                                                 screenshot, tmp_path):
    """Issue 48 item 1: two nights (stand-in stages, planned gate scores: tests/flows/test_nightly_gate.py) end
    Promoted and Held; the runs list tells them apart (tags), the nightly-lineage artifact names the live and the held
    night, and the nightly-decide deployment's form (the held night from a list) promotes it through the worker."""
    import dataclasses

    from flows.nightly import nightly
    from pipeline_lib import stages
    from pipeline_lib.nightly import load_state

    monkeypatch.setitem(stages.SPECS, "pretrain", dataclasses.replace(stages.SPECS["pretrain"],
                                                                      runner="stage_doubles:pretrain_with_checkpoint"))
    raw, root = tmp_path / "raw", tmp_path / "runs"
    raw.mkdir()
    root.mkdir()
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.run.output_root = str(root)
    cfg.data.inputs = [str(raw / "*.jsonl")]
    ends = {}

    def nights():
        for date, factor in (("2026-11-01", 1.0), ("2026-11-02", 1.3)):  # +30% perplexity: over the 5% budget
            (raw / f"{date}.jsonl").write_text(json.dumps({"text": f"news of {date}"}) + "\n")
            (root / "gate-plan").write_text(f"{factor} 0.0")
            ends[date] = nightly(config=cfg.model_dump(mode="json"), run_date=date, return_state=True)

    # in a thread of its own: Playwright's event loop on this one turns Prefect's sync calls into coroutines
    thread = threading.Thread(target=contextvars.copy_context().run, args=(nights,))
    thread.start()
    thread.join(300)
    assert [s.name for s in ends.values()] == ["Promoted", "Held"]
    with get_client(sync_client=True) as client:
        flow = client.read_flow_by_name("nightly-pretrain")
    page.goto(f"{ui_url}/flows/flow/{flow.id}")  # the flow's runs: the nights
    page.get_by_text("nightly/2026-11-02").first.wait_for()
    _fits(page, "nightly-runs-held-and-promoted", screenshot, content=False)
    held_row = page.locator(".flow-run-list-item, .state-list-item").filter(has_text="nightly/2026-11-02").first
    assert "nightly/2026-11-02 · HELD, decide" in held_row.inner_text()  # its name, its tags
    assert "HELD" in held_row.inner_text().replace("· HELD", "") and "Held" in held_row.inner_text()
    promoted_row = page.locator(".flow-run-list-item, .state-list-item").filter(has_text="nightly/2026-11-01").first
    assert "promoted" in promoted_row.inner_text() and "HELD" not in promoted_row.inner_text()
    cli("deploy", "--config", _nightly_yaml(tmp_path, root, raw / "*.jsonl"), "--name", "nightly")
    try:
        with get_client(sync_client=True) as client:
            decide = client.read_deployment_by_name("nightly-decide/nightly")
        assert decide.parameter_openapi_schema["properties"]["run_id"]["enum"] == ["nightly-2026-11-02"]

        text = _lineage(page, ui_url, screenshot, "nightly-lineage-held")
        assert "Live night: nightly-2026-11-01" in text and "Held: 1 waiting for a decision" in text, text
        assert "held-out perplexity +30.0%" in text

        page.goto(f"{ui_url}/deployments/deployment/{decide.id}/run")
        from test_run_form import field

        field(page, "run_id").locator(".p-select-button").first.wait_for()  # a choice of the held nights
        _pick(field(page, "run_id"), "nightly-2026-11-02")
        _pick(field(page, "decision"), "promote")
        field(page, "reason").locator("textarea, input").first.fill("the new domain costs held-out perplexity")
        field(page, "who").locator("textarea, input").first.fill("erin")
        _fits(page, "nightly-decide-form", screenshot, content=False)
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run"), timeout=60_000) as created:
            page.get_by_role("button", name="Submit").click()
        assert created.value.ok, created.value.text()[:3000]
        run = finished_run(created.value.json()["id"], 120)
        assert run.state.is_completed() and run.state.name == "PromotedByHand", \
            f"{run.state}\n{chain_deployment[1].read_text()[-3000:]}"
        state = load_state(cfg)
        assert state["latest"]["run_id"] == "nightly-2026-11-02" and state["held"] == []
        assert state["history"][-1]["decided_by"]["who"] == "unverified: erin"

        text = _lineage(page, ui_url, screenshot, "nightly-lineage-decided")
        assert "promoted by hand by unverified: erin" in text and "none waiting for a decision" in text
    finally:
        cli("deploy", "--name", "nightly")  # the shipped config again, for the session's other tests


def _lineage(page, ui_url, screenshot, name: str) -> str:
    """The newest nightly-lineage, as a person finds it: Artifacts, the key's page (its versions, newest first, each
    with its description: the live night and the held ones), the newest version."""
    page.goto(f"{ui_url}/artifacts/key/nightly-lineage")
    newest = page.locator("a[href*='/artifacts/artifact/']").first
    newest.wait_for()
    _fits(page, f"{name}-versions", screenshot, content=False)
    newest.click()
    page.locator(CONTENT).wait_for()
    _fits(page, name, screenshot)
    return page.locator(CONTENT).inner_text()


def _pick(prop, value: str) -> None:
    """Choose `value` in an enum field of the run form (a select of the UI's design system)."""
    native = prop.locator("select")
    if native.count():
        native.first.select_option(value)
        return
    page, control = prop.page, prop.locator("button.p-select-button__control").first
    for _ in range(3):  # headless, a click on the control was seen not to open its options; the space bar does
        control.focus()
        page.keyboard.press(" ")
        option = page.locator(".p-select-option").filter(has_text=value).first
        try:
            option.wait_for(timeout=3_000)
        except Exception:
            page.keyboard.press("Escape")
            continue
        option.click()
        return
    raise AssertionError(f"no option {value!r} in {prop.inner_text()!r}")
