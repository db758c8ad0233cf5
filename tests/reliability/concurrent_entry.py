"""Entry point of one of two runs started at once by test_concurrent_runs.py (a real process each).

    python concurrent_entry.py nightly CONFIG_JSON RUN_DATE     the nightly flow: the real data stage, the stage
                                                                 doubles of tests/flows for training/evaluation
    python concurrent_entry.py data CONFIG_JSON RUN_ID          the data stage alone (run_stage), no Prefect
Prints one line `RESULT <json>` with what the run ended as.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "flows"))  # stage_doubles


def nightly(config: dict, run_date: str) -> dict:
    from pipeline_lib import stages

    for name, spec in list(stages.SPECS.items()):
        if name != "data":
            stages.SPECS[name] = dataclasses.replace(spec, runner=f"stage_doubles:{name}")
    from flows.nightly import nightly as night

    state = night(config=config, run_date=run_date, return_state=True)
    return {"state": state.name, "message": state.message or "", "completed": state.is_completed()}


def data(config: dict, run_id: str) -> dict:
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths

    cfg = config_from_dict(config)
    started = time.time()
    try:
        manifest, _ = run_stage(cfg, RunPaths(cfg.run.output_root, run_id, cfg.run.s3_endpoint_url), "data", workers=1)
    except Exception as err:  # the test decides whether this failure was right
        return {"state": "Failed", "message": f"{type(err).__name__}: {err}", "started": started, "ended": time.time()}
    return {"state": "Completed", "started": started, "ended": time.time()}


if __name__ == "__main__":
    kind, config, arg = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    print("RESULT " + json.dumps({"nightly": nightly, "data": data}[kind](config, arg)), flush=True)
