"""`llm-pipeline run --submit`: start the run as a flow run of the `llm-pipeline/default` deployment.

A run made by plain `llm-pipeline run` executes in this process; Prefect offers Retry in the UI only
for runs of a deployment (a worker must be able to start it again). A submitted run is created on the
server and picked up by a worker of the deployment's pool (`prefect worker start --pool cpu`), so it
can be watched, retried and cancelled from the UI like any deployment run.
"""
from __future__ import annotations

import os

DEPLOYMENT = "llm-pipeline/default"


class SubmitError(RuntimeError):
    pass


def submit_run(config: str, overrides: list[str], run_id: str, stages: list[str], dispatch: bool) -> tuple[str, str]:
    """Create the flow run (it is not waited for). Returns (flow run id, UI URL)."""
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

    # The deployment's parameters pre-fill the run form with its own config's sections, and the server
    # merges a run's parameters over them: None for every section, so this run reads `config` alone.
    params = {"config": config, "overrides": overrides, "run_id": run_id, "stages": stages, "dispatch": dispatch,
              **{name: None for name in form_sections()}}
    try:
        run = run_deployment(DEPLOYMENT, parameters=params, timeout=0, flow_run_name=f"llm-pipeline/{run_id}")
    except ObjectNotFound:
        raise SubmitError(f"no deployment {DEPLOYMENT} on {api}. Fix: `llm-pipeline deploy` (after "
                          "`llm-pipeline pools`), then start a worker: `prefect worker start --pool cpu`") from None
    return str(run.id), f"{api.removesuffix('/api')}/runs/flow-run/{run.id}"
