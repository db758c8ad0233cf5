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
