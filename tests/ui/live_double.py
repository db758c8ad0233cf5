"""A pretrain double that trains slowly in view: metrics.jsonl grows step by step with progress ticks,
pauses at PREFLIGHT_PAUSE (within the tiny config's 5 preflight steps; file `release-preflight`) and at PAUSE_AT
until the test has looked at the live artifact and the overview (file `release-pretrain` in the run folder), then
fails after its last step, as a long training that breaks late would."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from pipeline_lib.runtime.contract import StageOutput, StageRun

STEPS, PREFLIGHT_PAUSE, PAUSE_AT = 12, 3, 6


def pretrain(run: StageRun) -> StageOutput:
    out = Path(run.uri)
    out.mkdir(parents=True, exist_ok=True)
    release = Path(run.paths.run_uri) / "release-pretrain"
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as fh:
        for step in range(1, STEPS + 1):
            fh.write(json.dumps({"step": step, "loss": 8.0 * math.exp(-step / 6) + 1.0, "lr": 1e-3 * min(1, step / 4),
                                 "global_norm": 1.2345678, "step_time_ms": 250.0}) + "\n")
            fh.flush()
            run.progress("train", step, STEPS)
            if step in (PREFLIGHT_PAUSE, PAUSE_AT):
                go = release if step == PAUSE_AT else release.with_name("release-preflight")
                deadline = time.time() + 120
                while not go.exists() and time.time() < deadline:
                    time.sleep(0.2)
    raise RuntimeError(f"pretrain: planned failure after step {STEPS} (loss spike)")
