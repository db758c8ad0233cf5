"""The real data stage as Prefect tasks mapped over shards, against a real Prefect server."""
import json
import time
from pathlib import Path

import pytest
from prefect import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

from flows.pipeline import llm_pipeline
from pipeline_lib.config import load_config

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_mapped_data_stage_matches_local_pool_and_skips_on_rerun(tmp_path):
    base = [f"run.output_root={tmp_path}", "data.docs_per_shard=150"]
    mapped = load_config("configs/pipelines/tiny-cpu.yaml", base + ["data.executor=prefect"])
    state = llm_pipeline(config=mapped.model_dump(mode="json"), run_id="mapped", stages=["data"], return_state=True)
    assert state.is_completed(), state.message
    data = Path(tmp_path) / "mapped" / "data"
    stats = json.loads((data / "stats.json").read_text())
    assert stats["balanced"] and stats["total"]["read"] > 0
    plan_shards = stats["shards"] if isinstance(stats.get("shards"), int) else None

    # Task runs reach the server as events (eventually consistent): poll briefly.
    deadline = time.time() + 60
    while True:
        with get_client(sync_client=True) as client:
            names = [tr.name for tr in client.read_task_runs(
                task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="data/mapped/prep-")))]
        prep_runs = [n for n in names if n.startswith("data/mapped/prep-")]
        if len(prep_runs) >= 2 or time.time() > deadline:
            break
        time.sleep(1)
    assert len(prep_runs) >= 2, names  # one task run per shard
    if plan_shards:
        assert len(prep_runs) == plan_shards

    with get_client(sync_client=True) as client:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["data-stats"])))
    assert arts and arts[0].type == "table"
    assert "TOTAL" in str(arts[0].data) and str(stats["total"]["read"]) in str(arts[0].data)

    # Same output as the local process-pool executor (output does not depend on how work is spread).
    # A separate output root: the persistent dedup index under the first one has seen every document.
    local = load_config("configs/pipelines/tiny-cpu.yaml", [f"run.output_root={tmp_path}/other", "data.docs_per_shard=150",
                                                            "data.executor=local", "data.num_workers=1"])
    assert llm_pipeline(config=local.model_dump(mode="json"), run_id="local", stages=["data"],
                        return_state=True).is_completed()
    m_mapped = json.loads((data / "manifest.json").read_text())
    m_local = json.loads((Path(tmp_path) / "other" / "local" / "data" / "manifest.json").read_text())
    # stats.json names the run; MindRecord .db index files embed their own path.
    strip = lambda m: {o["path"]: o["sha256"] for o in m["outputs"]  # noqa: E731
                       if not o["path"].endswith(".db") and o["path"] != "stats.json"}
    assert strip(m_mapped) == strip(m_local)
    local_stats = json.loads((Path(tmp_path) / "other" / "local" / "data" / "stats.json").read_text())
    assert local_stats["total"] == stats["total"]

    again = llm_pipeline(config=mapped.model_dump(mode="json"), run_id="mapped", stages=["data"], return_state=True)
    assert again.result()["stages"]["data"]["state"] == "cached"
