"""Nightly continued pretraining: new raw data since the last good night -> data (incremental
dedup against everything seen) -> pretrain from last night's checkpoint -> evaluate side by side
with last night. The watermark and `latest` pointer move only when every stage succeeded."""
from __future__ import annotations

import datetime as dt

from prefect import flow, get_run_logger
from prefect.states import Completed

from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly import commit_night, deep_update, load_state, new_files, nightly_overrides
from pipeline_lib.stages import available
from pipeline_lib.storage import RunPaths, read_manifest

from flows.common import resolve_config
from flows.notify import notify_failure
from flows.pipeline import llm_pipeline

NIGHT_STAGES = ["data", "pretrain", "evaluate"]


def _night_id(run_date: str | None) -> str:
    return f"nightly-{run_date or dt.date.today().isoformat()}"


@flow(name="nightly-pretrain", flow_run_name="nightly/{run_date}", log_prints=True,
      on_failure=[notify_failure], on_crashed=[notify_failure])
def nightly(config: str | dict, overrides: list[str] | None = None, run_date: str | None = None,
            dispatch: bool = False) -> dict:
    logger = get_run_logger()
    run_date = run_date or dt.date.today().isoformat()
    cfg = resolve_config(config, overrides)
    state = load_state(cfg)
    files = new_files(cfg, state)
    if not files:
        return Completed(name="Skipped", message="no new raw data since the last successful night",
                         data={"run_id": None, "new_files": 0})
    run_id = _night_id(run_date)
    night_cfg = config_from_dict(deep_update(cfg.model_dump(mode="json"), nightly_overrides(state, files)))
    logger.info(f"{run_id}: {len(files)} new file(s); continuing from "
                f"{(state.get('latest') or {}).get('checkpoint') or 'the configured base'}")
    stages = [s for s in NIGHT_STAGES if available(s)]
    summary = llm_pipeline(config=night_cfg.model_dump(mode="json"), run_id=run_id, stages=stages,
                           dispatch=dispatch)
    pretrain = read_manifest(RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url).stage_uri("pretrain"),
                             cfg.run.s3_endpoint_url)
    checkpoint = (pretrain.metrics or {}).get("latest_checkpoint") if pretrain else None
    commit_night(cfg, state, files, run_id, checkpoint)
    return {"run_id": run_id, "new_files": len(files), "checkpoint": checkpoint, "summary": summary}
