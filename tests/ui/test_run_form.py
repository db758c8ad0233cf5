"""The typed run form: a custom run of the llm-pipeline/default deployment from the Prefect UI.

Real parts end to end: `llm-pipeline pools` + `llm-pipeline deploy` against the session's server, a
`prefect worker start --pool cpu` process, chromium filling the deployment's custom run form. Only the
data stage runs (the tiny corpus), to stay well under two minutes.
"""
import time

from pipeline_lib.config import load_config
from pipeline_lib.stages import stage_done
from pipeline_lib.storage import RunPaths

from ui_helpers import ROOT, finished_run

TINY = ROOT / "configs/pipelines/tiny-cpu.yaml"


def field(scope, label: str):
    """The form property labelled `label` within `scope` (its own property: sections nest properties)."""
    xpath = (f"xpath=.//span[@class='schema-form-property__label' and (normalize-space(.)='{label}' or "
             f"normalize-space(.)='{label} (Optional)')]/ancestor::div[contains(concat(' ', @class, ' '), "
             "' schema-form-property ')][1]")
    return scope.locator(xpath).first


def test_a_custom_run_from_the_form_with_two_changed_fields_completes_with_them(chain_deployment, page, ui_url,
                                                                                 screenshot, tmp_path):
    deployment, worker_log = chain_deployment
    out = tmp_path / "runs"
    page.goto(f"{ui_url}/deployments/deployment/{deployment.id}/run")
    field(page, "run_id").wait_for()
    page.wait_for_load_state("networkidle")
    # issue 48: the per-run fields first, each section closed (the form was 33,447 px with every section open)
    height = page.evaluate("() => document.querySelector('.flow-run-create-form-v2').getBoundingClientRect().height")
    assert height < 3000, height
    screenshot(page, "run-form-folded")
    data = field(page, "data")
    data.get_by_role("button", name="DataConfig", exact=True).click()  # opened at the deployment's config file
    # a plain number field (docs_per_shard is nullable since shards are sized by bytes: another widget)
    docs = field(data, "data.shard_mb").locator("input")
    docs.wait_for()
    assert float(docs.input_value()) == 64  # pre-filled with the shipped config
    assert field(data, "data.docs_per_shard").locator("input").first.input_value() == "200"  # the file's, not None
    field(page, "run").get_by_role("button", name="RunConfig", exact=True).click()
    assert field(field(page, "run"), "run.output_root").locator("textarea, input").first.input_value() == "runs"

    field(page, "run_id").locator("textarea, input").first.fill("form-1")
    stages = field(page, "stages")
    stages.get_by_role("button", name="list", exact=True).click()
    stages.get_by_role("button", name="Add item").click()
    stages.locator("textarea, input").last.fill("data")
    field(field(page, "run"), "run.output_root").locator("textarea, input").first.fill(str(out))
    docs.fill("32")  # the two changed fields
    threshold = field(field(data, "data.dedup"), "data.dedup.threshold").locator("input")
    threshold.fill("0.7")
    docs.scroll_into_view_if_needed()
    screenshot(page, "run-form")
    page.wait_for_load_state("networkidle")  # the form's own requests (schema validation) done, on a busy machine too
    for _ in range(3):
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run"), timeout=60_000) as created:
            page.get_by_role("button", name="Submit").click()
        # 503: the server's SQLite was busy (a loaded machine); Prefect's own client retries it, the UI leaves
        # it to the user, who clicks Submit again: the form keeps its values.
        if created.value.status != 503:
            break
        time.sleep(2)
    assert created.value.ok, f"{created.value.status}: {created.value.text()[:3000]}"

    run = finished_run(created.value.json()["id"], 150)
    assert run.state.is_completed(), f"{run.state.message}\n{worker_log.read_text()[-3000:]}"
    assert run.parameters["data"]["shard_mb"] == 32 and run.parameters["stages"] == ["data"]
    # The run used both changes: its data stage is the one `llm-pipeline run` makes with the same overrides.
    cli_cfg = load_config(TINY, [f"run.output_root={out}", "data.shard_mb=32", "data.dedup.threshold=0.7"])
    paths = RunPaths(str(out), "form-1", None)
    assert stage_done(cli_cfg, paths, "data")[0]
    assert not stage_done(load_config(TINY, [f"run.output_root={out}"]), paths, "data")[0]
    page.goto(f"{ui_url}/runs/flow-run/{run.id}")
    page.get_by_text("llm-pipeline/form-1").first.wait_for()
    screenshot(page, "run-from-form")
