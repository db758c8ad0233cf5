"""Stage engines for the failure-path tests: `data` succeeds; `pretrain` launches a real trainer process through
pipeline_lib.train.runner.launch_trainer that is SIGKILLed, as the kernel OOM killer does, and counts attempts."""
from __future__ import annotations

import json
from pathlib import Path

from pipeline_lib.runtime.contract import StageOutput, StageRun
from pipeline_lib.storage import describe_outputs


def data(run: StageRun) -> StageOutput:
    uri = Path(run.uri)
    uri.mkdir(parents=True, exist_ok=True)
    (uri / "out.json").write_text(json.dumps({"stage": "data"}))
    return StageOutput(describe_outputs(str(uri), ["out.json"]), metrics={})


def pretrain(run: StageRun) -> StageOutput:
    from pipeline_lib.train.runner import launch_trainer

    out = Path(run.uri)
    out.mkdir(parents=True, exist_ok=True)
    counter = out.parent / "attempts-pretrain"
    counter.write_text(str(int(counter.read_text()) + 1 if counter.exists() else 1))
    yaml_path = out / "run.yaml"
    yaml_path.write_text("{}\n")
    launch_trainer(run.cfg, yaml_path, out, 0, run.log, entry_module="tests.doctor.sigkill_entry")
    raise AssertionError("the trainer was expected to die")
