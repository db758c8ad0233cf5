"""`llm-pipeline run --submit`: start the run as a flow run of the `llm-pipeline/default` deployment.

A run made by plain `llm-pipeline run` executes in this process; Prefect offers Retry in the UI only
for runs of a deployment (a worker must be able to start it again). A submitted run is created on the
server and picked up by a worker of the deployment's pool (`prefect worker start --pool cpu`), so it
can be watched, retried and cancelled from the UI like any deployment run.

Submitting a run id that already has a flow run of the deployment does not make a second one: a
finished (failed, crashed, cancelled, completed) run is retried as the UI's Retry does (state
AwaitingRetry, same flow run, the given settings), one still scheduled or running is left alone.
"""
from __future__ import annotations

import os

from flows.run_history import base_name, flow_runs_of

DEPLOYMENT = "llm-pipeline/default"


class SubmitError(RuntimeError):
    pass


def submit_run(config: str, overrides: list[str], run_id: str, stages: list[str],
               dispatch: bool) -> tuple[str, str, str]:
    """Create the flow run, or retry the run id's existing one (not waited for).
    Returns (flow run id, UI URL, what was done: "submitted", "retried" or its current state)."""
    from pipeline_lib.config.secrets import secret_overrides

    for key in secret_overrides(overrides):  # the overrides are stored as the run's parameters, as given
        raise SubmitError(f"{key}: a secret given as an override would be stored in the submitted run's "
                          "parameters. Fix: set it in the config file, or export it on the worker and pass "
                          f"{key}=env:NAME")
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        raise SubmitError("--submit needs a Prefect server: PREFECT_API_URL is not set. Fix: start one "
                          "(`prefect server start`), export PREFECT_API_URL=http://<host>:4200/api, then "
                          "`llm-pipeline pools` and `llm-pipeline deploy`, and start a worker: "
                          "`prefect worker start --pool cpu`")
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    from pipeline_lib.config.form import form_sections

    # The server merges a run's parameters over the deployment's, which pre-filled the sections in deployments made
    # before the folded form (flows/run_form.py): None for every section, so this run reads `config` alone.
    params = {"config": config, "overrides": overrides, "run_id": run_id, "stages": stages, "dispatch": dispatch,
              **{name: None for name in form_sections()}}
    try:
        existing = _existing_run(run_id)
        if existing is not None:
            action = _retry(existing, params)
            return str(existing.id), _url(api, existing.id), action
        run = run_deployment(DEPLOYMENT, parameters=params, timeout=0, flow_run_name=base_name(run_id))
    except ObjectNotFound:
        raise SubmitError(f"no deployment {DEPLOYMENT} on {api}. Fix: `llm-pipeline deploy` (after "
                          "`llm-pipeline pools`), then start a worker: `prefect worker start --pool cpu`") from None
    return str(run.id), _url(api, run.id), "submitted"


def _url(api: str, flow_run_id) -> str:
    return f"{api.removesuffix('/api')}/runs/flow-run/{flow_run_id}"


def _existing_run(run_id: str):
    """The latest flow run of the deployment for this run id, or None."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
        runs = [r for r in flow_runs_of(run_id, client) if r.deployment_id == deployment.id]
    return runs[-1] if runs else None


def _retry(run, params: dict) -> str:
    """What the UI's Retry does, with this submit's settings; a run not finished yet is left as it is."""
    from prefect import get_client
    from prefect.states import AwaitingRetry

    if run.state is None or not run.state.is_final():
        return f"already {run.state_name or 'created'}"
    with get_client(sync_client=True) as client:
        client.update_flow_run(run.id, parameters=params)
        client.set_flow_run_state(run.id, AwaitingRetry(message="Resumed by `llm-pipeline run --submit`"), force=True)
    return "retried"
