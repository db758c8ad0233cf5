"""A stage added by a test (test_adding_a_stage.py): the one module a new stage needs, written to the
contract in pipeline_lib/runtime/contract.py. It tallies the files its upstream data stage recorded."""
from __future__ import annotations

import json
from pathlib import Path

from pipeline_lib.runtime.contract import StageOutput, StageRun
from pipeline_lib.storage import describe_outputs


def run_tally_stage(run: StageRun) -> StageOutput:
    data = run.upstream["data"]  # resolved by the registry from the data stage's manifest
    tally = {"files": len(data.outputs), "bytes": sum(o["size"] for o in data.outputs)}
    Path(run.uri).mkdir(parents=True, exist_ok=True)
    (Path(run.uri) / "tally.json").write_text(json.dumps(tally))
    run.log(f"tally: {tally}")
    return StageOutput(describe_outputs(run.uri, ["tally.json"], run.endpoint), metrics=tally)
