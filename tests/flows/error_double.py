"""A pretrain double that fails as a full disk does (the doctor knows it: disk_full), after a few log lines."""
from __future__ import annotations

from pipeline_lib.runtime.contract import StageOutput, StageRun

MESSAGE = "[Errno 28] No space left on device: 'checkpoint_0-10_1.ckpt'"


def pretrain(run: StageRun) -> StageOutput:
    run.log("saving checkpoint at step 10")
    raise OSError(MESSAGE)
