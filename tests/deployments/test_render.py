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
