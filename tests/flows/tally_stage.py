"""A stage added by a test (test_adding_a_stage.py): the one module a new stage needs, written to the
contract in pipeline_lib/runtime/contract.py. It tallies the files its upstream data stage recorded;
its row in the stage table also names its input check and its key figures, both here."""
from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline_lib.checks.inputs import InputChecks
from pipeline_lib.config.errors import ConfigIssue
from pipeline_lib.runtime.contract import StageOutput, StageRun
from pipeline_lib.storage import describe_outputs


def run_tally_stage(run: StageRun) -> StageOutput:
    data = run.upstream["data"]  # resolved by the registry from the data stage's manifest
    tally = {"files": len(data.outputs), "bytes": sum(o["size"] for o in data.outputs)}
    Path(run.uri).mkdir(parents=True, exist_ok=True)
    (Path(run.uri) / "tally.json").write_text(json.dumps(tally))
    run.log(f"tally: {tally}")
    return StageOutput(describe_outputs(run.uri, ["tally.json"], run.endpoint), metrics=tally)


def check_tally(c: InputChecks) -> None:
    """An empty input file has nothing to tally: refused before any stage runs."""
    for i, entry in enumerate(c.cfg.data.inputs):
        if os.path.isfile(entry) and os.path.getsize(entry) == 0:
            c.errors.append(ConfigIssue(f"data.inputs[{i}]", entry, "empty: the tally stage has nothing to count",
                                        "remove it from data.inputs or give it documents"))


def tally_figures(metrics: dict) -> list[str]:
    return [f"files tallied {metrics['files']}"] if "files" in metrics else []
