"""A failing stage's error in the Prefect log: once, with our message (the doctor's category and remedy) first."""
import dataclasses

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId

from flows.pipeline import llm_pipeline
from pipeline_lib import stages

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server", "stage_doubles")]


def logs_by_flow_run(run_id: str) -> dict:
    """{flow run name: its log records, oldest first} for the parent run and its stage flows (task logs included)."""
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)  # the log records still on their way to the server
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=run_id)))
        return {r.name: sorted(client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id]))),
                               key=lambda rec: rec.timestamp) for r in runs}


def errors(records) -> list[str]:
    return [r.message for r in records if r.level >= 40]


def test_a_failing_stage_logs_its_error_once_with_the_doctor_first(tiny_cfg, monkeypatch):
    from error_double import MESSAGE

    monkeypatch.setitem(stages.SPECS, "pretrain",
                        dataclasses.replace(stages.SPECS["pretrain"], runner="error_double:pretrain"))
    state = llm_pipeline(config=tiny_cfg.model_dump(mode="json"), run_id="r-errlog", stages=["data", "pretrain"],
                         return_state=True)
    assert state.is_failed()
    logs = logs_by_flow_run("r-errlog")
    stage_errors = errors(logs["pretrain/r-errlog"])  # the stage flow's page: its task's lines and its own
    assert stage_errors and stage_errors[0].startswith("doctor: disk_full in pretrain: "), stage_errors
    assert "\npretrain failed: OSError: " + MESSAGE in stage_errors[0]
    assert sum(m.count(MESSAGE) for m in stage_errors) == 1, stage_errors
    parent_errors = errors(logs["llm-pipeline/r-errlog"])
    assert len(parent_errors) == 1 and parent_errors[0].startswith("stage 'pretrain' failed (run r-errlog): OSError: ")
    assert MESSAGE in parent_errors[0] and "doctor: disk_full" in parent_errors[0]
    assert not [m for m in stage_errors + parent_errors if "Traceback" in m]
    # the full traceback is in the stage's log file, which the error line names, and so does the parent's message
    log_file = stage_errors[0].split("\nfull log: ", 1)[1].split()[0]
    assert "Traceback (most recent call last)" in open(log_file).read()
    assert f"\nfull log: {log_file}" in parent_errors[0]
    assert "finished stages are not redone" in stage_errors[0]  # not retried: says how to resume
    assert "not retried (retrying the same config cannot fix disk_full); resume with `llm-pipeline run CONFIG " \
           "--run-id r-errlog`" in stage_errors[0]


def test_an_unexpected_error_keeps_prefects_traceback():
    """Only errors we reported (or our own one-line ones) lose the engine's traceback."""
    import logging

    from tasks.error_log import OurErrorsOnce

    try:
        raise KeyError("a bug")
    except KeyError as exc:
        bug = exc
    record = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "Encountered %r", (bug,),
                               (type(bug), bug, bug.__traceback__))
    assert OurErrorsOnce().filter(record) and record.exc_info is not None
    bug.reported_by_stage = True
    assert not OurErrorsOnce().filter(record)
