"""deployments/__init__.py: the stage deployments and pools come from the stage table's rows."""
import dataclasses

from deployments import POOL_ENV, pool_names, render_prefect_file
from pipeline_lib import stages


def _stage_pools() -> dict:
    return {d["entrypoint"].rsplit(":", 1)[1].removesuffix("_flow"): d["work_pool"]
            for d in render_prefect_file()["deployments"] if d["entrypoint"].startswith("flows/stage_flows.py:")}


def test_one_deployment_per_row_on_the_rows_pool_with_the_pools_environment():
    pools = _stage_pools()
    assert list(pools) == list(stages.SPECS)
    for name, spec in stages.SPECS.items():
        assert pools[name]["name"] == spec.pool
        assert pools[name].get("job_variables", {}).get("env") == POOL_ENV.get(spec.pool)


def test_the_pool_column_moves_a_stage_and_names_a_new_pool(monkeypatch):
    monkeypatch.setitem(stages.SPECS, "export", dataclasses.replace(stages.SPECS["export"], pool="cpu-large"))
    assert _stage_pools()["export"] == {"name": "cpu-large"}
    assert pool_names() == ["cpu", "ascend", "cpu-large"]  # `llm-pipeline pools` creates it


def test_pools_no_worker_polls_are_named_with_their_deployments_and_the_fix():
    from deployments import render_prefect_file, unserved_pools

    doc = render_prefect_file()
    lines = unserved_pools(doc, {"cpu": 1, "ascend": 0})
    assert lines == ["pretrain/default, sft/default, evaluate/default, export/default: Not Ready in the UI: no worker "
                     "polls work pool 'ascend'. Start a worker on work pool `ascend` (`prefect worker start --pool "
                     "ascend` on each Ascend node)."]
    assert unserved_pools(doc, {"cpu": 2, "ascend": 1}) == []
    assert unserved_pools(doc, {"ascend": 1})[0].startswith("llm-pipeline/default, nightly-pretrain/nightly, "
                                                            "nightly-decide/nightly, data/default: ")
    pretrain = next(d for d in doc["deployments"] if d["entrypoint"].endswith(":pretrain_flow"))
    assert "Needs a worker on work pool `ascend`" in pretrain["description"]
