"""The end-to-end flow against a real Prefect server: retries, resume, skip, artifacts."""
import os
from pathlib import Path

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

from flows.pipeline import llm_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server", "stage_doubles")]


def task_runs_of(flow_run_name: str) -> dict:
    """{task run name: task run} of every flow run with that name (subflows included)."""
    with get_client(sync_client=True) as client:
        parents = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
        assert parents, flow_run_name
        out = {}
        for tr in client.read_task_runs():
            out.setdefault(tr.name, []).append(tr)
        return out


def run(cfg, run_id, stages=None):
    return llm_pipeline(config=cfg.model_dump(mode="json"), run_id=run_id, stages=stages, return_state=True)


def test_transient_failure_is_retried_then_succeeds(tiny_cfg):
    run_dir = Path(tiny_cfg.run.output_root) / "r-retry"
    run_dir.mkdir(parents=True)
    (run_dir / "fail-data").write_text("ConnectionError 1")
    state = run(tiny_cfg, "r-retry", ["data"])
    assert state.is_completed(), state.message
    assert (run_dir / "attempts-data").read_text() == "2"
    tr = task_runs_of("llm-pipeline/r-retry")["data/r-retry"][-1]
    assert tr.run_count == 2 and tr.state.is_completed()


def test_data_error_is_not_retried(tiny_cfg):
    run_dir = Path(tiny_cfg.run.output_root) / "r-noretry"
    run_dir.mkdir(parents=True)
    (run_dir / "fail-data").write_text("ValueError 5")
    state = run(tiny_cfg, "r-noretry", ["data"])
    assert state.is_failed()
    assert (run_dir / "attempts-data").read_text() == "1"
    assert "planned ValueError" in state.message or "planned ValueError" in str(state.result(raise_on_failure=False))


def test_failed_stage_resumes_and_finished_stages_are_not_redone(tiny_cfg):
    run_dir = Path(tiny_cfg.run.output_root) / "r-resume"
    run_dir.mkdir(parents=True)
    (run_dir / "fail-sft").write_text("ValueError 1")
    first = run(tiny_cfg, "r-resume")
    assert first.is_failed()
    mtimes = {s: os.stat(run_dir / s / "manifest.json").st_mtime_ns for s in ("data", "pretrain")}
    assert not (run_dir / "sft" / "manifest.json").exists()

    second = run(tiny_cfg, "r-resume")
    assert second.is_completed(), second.message
    summary = second.result()
    assert summary["stages"]["data"]["state"] == "cached"
    assert summary["stages"]["pretrain"]["state"] == "cached"
    assert summary["stages"]["sft"]["state"] == "completed"
    # Not executed again: attempt counters and manifest mtimes unchanged.
    assert (run_dir / "attempts-data").read_text() == "1"
    assert (run_dir / "attempts-pretrain").read_text() == "1"
    assert (run_dir / "attempts-sft").read_text() == "2"
    assert {s: os.stat(run_dir / s / "manifest.json").st_mtime_ns for s in ("data", "pretrain")} == mtimes
    # And the Prefect API agrees: the rerun's data/pretrain task runs did not run (Cached).
    runs = task_runs_of("llm-pipeline/r-resume")
    for stage in ("data", "pretrain"):
        names = sorted(tr.state.name for tr in runs[f"{stage}/r-resume"])
        assert names[0] == "Cached", names  # a cache hit, or the manifest rule's own "Cached" state
        assert "Completed" in names and len(names) == 2
    assert sorted(tr.state.name for tr in runs["sft/r-resume"]) == ["Completed", "Failed"]


def test_a_resume_is_a_flow_run_of_its_own_name_linked_to_the_earlier_one(tiny_cfg):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    run_dir = Path(tiny_cfg.run.output_root) / "r-named"
    run_dir.mkdir(parents=True)
    (run_dir / "fail-pretrain").write_text("ValueError 1")
    assert run(tiny_cfg, "r-named", ["data", "pretrain"]).is_failed()
    assert run(tiny_cfg, "r-named", ["data", "pretrain"]).is_completed()
    assert run(tiny_cfg, "r-named", ["data"]).is_completed()
    with get_client(sync_client=True) as client:
        runs = {r.name: r for r in client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="llm-pipeline/r-named")))}
        overview = max(client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
            any_=["run-overview-r-named"]))), key=lambda a: a.created)
    assert sorted(runs) == ["llm-pipeline/r-named", "llm-pipeline/r-named (resume 1)",
                            "llm-pipeline/r-named (resume 2)"]
    assert overview.flow_run_id == runs["llm-pipeline/r-named (resume 2)"].id
    earlier = overview.data.split("Earlier flow runs of this run", 1)[1]
    for name in ("llm-pipeline/r-named", "llm-pipeline/r-named (resume 1)"):
        assert f"[{name}](http" in earlier and f"/runs/flow-run/{runs[name].id})" in earlier
    assert "(Failed)" in earlier and "(Completed)" in earlier


def test_changed_config_reruns_only_affected_stages(tiny_cfg):
    assert run(tiny_cfg, "r-change", ["data", "pretrain"]).is_completed()
    changed = tiny_cfg.model_copy(deep=True)
    changed.training.steps = 61  # matters to pretrain, not to data
    summary = run(changed, "r-change", ["data", "pretrain"]).result()
    assert summary["stages"]["data"]["state"] == "cached"
    assert summary["stages"]["pretrain"]["state"] == "completed"


def test_artifacts_are_published(tiny_cfg):
    assert run(tiny_cfg, "r-art", ["data"]).is_completed()
    with get_client(sync_client=True) as client:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["data-summary",
                                                                                              "data-outputs"])))
    assert {a.key for a in arts} == {"data-summary", "data-outputs"}
    assert any(a.type == "table" for a in arts)


def test_training_stage_holds_the_node_training_slot(tiny_cfg, monkeypatch):
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from tasks.stage_task import node_limit_name

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=node_limit_name(), limit=1))
    monkeypatch.setenv("LLM_PIPELINE_TEST_RECORD_SLOTS", "1")
    assert run(tiny_cfg, "r-slot", ["data", "pretrain"]).is_completed()
    import json

    seen = json.loads((Path(tiny_cfg.run.output_root) / "r-slot" / "slots-pretrain.json").read_text())
    assert seen == {"limit": 1, "active_slots": 1}
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(node_limit_name()).active_slots == 0
        client.delete_global_concurrency_limit_by_name(node_limit_name())


def test_without_the_node_limit_a_training_stage_says_so_once_at_info_not_prefects_warning(tiny_cfg):
    """The embedded API of `make demo` has no node limit: Prefect's own answer was a WARNING per training stage in
    the user's terminal."""
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId

    from tasks.stage_task import node_limit_name

    state = run(tiny_cfg, "r-nolimit", ["data", "pretrain"])
    assert state.is_completed(), state.message
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        task_run = task_runs_of("llm-pipeline/r-nolimit")["pretrain/r-nolimit"][-1]
        logs = client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run.id])))
    said = [r for r in logs if node_limit_name() in r.message]
    assert [r.level for r in said] == [20], [(r.level, r.message) for r in said]
    assert "llm-pipeline pools" in said[0].message
    assert not [r for r in logs if "do not exist" in r.message]


def test_a_retry_of_the_same_flow_run_shows_cached_stages_in_one_overview(tiny_cfg):
    """What the UI's Retry does (the flow run set to AwaitingRetry, run again: attempt 2 of the same flow run):
    Prefect hands back the finished stages' subflows without running them; the overview and the task runs still
    say Cached, and the run keeps one overview artifact, updated in place."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, TaskRunFilter, TaskRunFilterFlowRunId
    from prefect.flow_engine import run_flow_sync
    from prefect.states import AwaitingRetry

    run_dir = Path(tiny_cfg.run.output_root) / "r-uiretry"
    run_dir.mkdir(parents=True)
    (run_dir / "fail-pretrain").write_text("ValueError 1")
    params = {"config": tiny_cfg.model_dump(mode="json"), "run_id": "r-uiretry", "stages": ["data", "pretrain", "sft"]}
    with get_client(sync_client=True) as client:
        fr = client.create_flow_run(llm_pipeline, parameters=params)
    assert run_flow_sync(llm_pipeline, flow_run=fr, parameters=params, return_type="state").is_failed()
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(fr.id, AwaitingRetry(), force=True)
        fr = client.read_flow_run(fr.id)
    state = run_flow_sync(llm_pipeline, flow_run=fr, parameters=params, return_type="state")
    assert state.is_completed(), state.message
    assert (run_dir / "attempts-data").read_text() == "1" and (run_dir / "attempts-pretrain").read_text() == "2"
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[fr.id])))
        cards = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["run-overview-r-uiretry"])))
    cached = [t for t in tasks if t.name == "data/r-uiretry"]
    assert [t.state.name for t in cached] == ["Cached"] and "in attempt 1" in cached[0].state.message
    assert len(cards) == 1, [c.id for c in cards]  # one card, updated in place by attempt 2
    text = cards[0].data
    assert "| Cached (finished " in text and " UTC in attempt 1) |" in text and "Cached: finished in" in text
    assert "so far" not in text and "| Completed |" in text
    # each stage row links its own run: the Cached task run of this attempt, pretrain's flow run
    assert f"[data]({prefect_ui()}/runs/task-run/{cached[0].id})" in text
    pretrain_runs = [r for r in _flow_runs("pretrain/r-uiretry") if r.state.is_completed()]
    assert f"[pretrain]({prefect_ui()}/runs/flow-run/{pretrain_runs[0].id})" in text
    # issue 48 item 6, the run graph: the retried stage once, green (its failed flow run of attempt 1 run again, not a
    # red one kept beside a new one), and no arrow from the Cached node across its label to the next stage
    with get_client(sync_client=True) as client:
        graph = client._client.get(f"/flow_runs/{fr.id}/graph-v2").json()
    nodes = [node for _, node in graph["nodes"]]
    assert [(n["label"], n["state_type"]) for n in nodes if "pretrain" in n["label"]] == \
        [("pretrain / pretrain/r-uiretry", "COMPLETED")], [(n["label"], n["state_type"]) for n in nodes]
    assert len(_flow_runs("pretrain/r-uiretry")) == 1 and pretrain_runs[0].run_count == 2
    assert [n["kind"] for n in nodes if n["label"] == "data/r-uiretry"] == ["task-run"]  # the Cached record
    assert not any(n["parents"] for n in nodes), [(n["label"], n["parents"]) for n in nodes]


def prefect_ui() -> str:
    from prefect.settings import get_current_settings

    return str(get_current_settings().ui_url).rstrip("/")


def _flow_runs(name: str) -> list:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))


def test_malformed_sft_file_is_refused_before_the_first_stage(tiny_cfg, tmp_path):
    """A run that never went through `validate` (a UI or worker run): the chain parses the SFT records before data runs
    and fails in seconds, naming the reasons with their counts and the first record of each."""
    import time

    bad = tmp_path / "bad_sft.jsonl"
    bad.write_text('{"prompt": "hi", "response": ""}\nnot json\n{"prompt": "x"}\n', encoding="utf-8")
    cfg = tiny_cfg.model_copy(update={"sft": tiny_cfg.sft.model_copy(update={"inputs": [str(bad)]})})
    started = time.monotonic()
    state = run(cfg, "r-badsft")
    assert state.is_failed() and time.monotonic() - started < 20
    message = state.message
    assert "sft inputs refused before any stage ran" in message
    assert "3 of 3 records are malformed (" in message and "bad_json: 1" in message and "empty_response: 1" in message
    assert f"empty_response at {bad}:1 (field response)" in message and f"bad_json at {bad}:2" in message
    assert not (Path(tiny_cfg.run.output_root) / "r-badsft" / "data").exists()  # nothing ran
