"""`llm-pipeline run --submit`: a run of the deployment (retryable in the UI), against a real server."""
import pytest
from prefect import get_client

from flows import cli


@pytest.fixture(scope="module")
def deployment(prefect_server):
    from flows.pipeline import llm_pipeline

    return llm_pipeline.to_deployment(name="default", parameters={"config": "configs/pipelines/tiny-cpu.yaml"}).apply()


def test_submit_creates_a_deployment_run_with_the_settings_and_returns(deployment, capsys, tmp_path):
    code = cli.main(["run", "configs/pipelines/tiny-cpu.yaml", "--submit", "--stages", "data", "--run-id", "sub-1",
                     f"run.output_root={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0, out
    run_id = out.split("/runs/flow-run/", 1)[1].split()[0]
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    assert run.deployment_id == deployment  # a deployment run: the UI offers Retry for it
    assert run.name == "llm-pipeline/sub-1" and run.state.is_scheduled()
    assert run.parameters["run_id"] == "sub-1" and run.parameters["stages"] == ["data"]
    assert run.parameters["overrides"] == [f"run.output_root={tmp_path}"]


def test_submit_without_a_deployment_says_how_to_make_one(prefect_server, capsys, monkeypatch):
    import flows.submit

    monkeypatch.setattr(flows.submit, "DEPLOYMENT", "llm-pipeline/not-deployed")
    assert cli.main(["run", "configs/pipelines/tiny-cpu.yaml", "--submit"]) == 2
    assert "Fix: `llm-pipeline deploy`" in capsys.readouterr().err


def test_submit_without_a_server_says_so(monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert cli.main(["run", "configs/pipelines/tiny-cpu.yaml", "--submit"]) == 2
    assert "PREFECT_API_URL is not set" in capsys.readouterr().err


def test_submit_refuses_a_secret_given_as_an_override(monkeypatch, capsys):
    """The overrides become the submitted run's parameters as given: a webhook token would be stored there."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    hook = "orchestration.failure_webhook_url=https://hooks.example.com/T0KEN"
    assert cli.main(["run", "configs/pipelines/tiny-cpu.yaml", "--submit", hook]) == 2
    err = capsys.readouterr().err
    assert "orchestration.failure_webhook_url" in err and "env:NAME" in err and "T0KEN" not in err


def _runs_named(name: str) -> list:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))


def test_submitting_the_same_run_id_again_retries_that_flow_run(deployment, capsys, tmp_path):
    from prefect.states import Failed

    argv = ["run", "configs/pipelines/tiny-cpu.yaml", "--submit", "--stages", "data", "--run-id", "sub-2",
            f"run.output_root={tmp_path}"]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out.split("/runs/flow-run/", 1)[1].split()[0]
    # still scheduled (no worker here): a second submit leaves it alone, no second flow run
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "not resubmitted (already Scheduled)" in out and first in out
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(first, Failed(message="planned"), force=True)
    # failed: the resume retries the same flow run (as the UI's Retry), with the settings given now
    assert cli.main(argv + ["--stages", "data,pretrain"]) == 0
    out = capsys.readouterr().out
    assert "retried the flow run of run sub-2: " in out and first in out
    runs = _runs_named("llm-pipeline/sub-2")
    assert [str(r.id) for r in runs] == [first]
    assert runs[0].state.name == "AwaitingRetry" and runs[0].state.is_scheduled()
    assert runs[0].parameters["stages"] == ["data", "pretrain"]
