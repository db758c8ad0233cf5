"""nightly.deadline through the nightly flow on a real Prefect server (stand-in stages): a night records what it
measured; the next night, too close to its deadline for its configured steps, trains fewer and says so."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from flows.nightly import nightly
from pipeline_lib.nightly import load_state

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server", "stage_doubles")]


def test_a_night_near_its_deadline_cuts_its_steps_from_last_nights_measure(night_on_raw):
    cfg, raw = night_on_raw
    cfg.orchestration.timezone = "UTC"
    cfg.nightly.deadline = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=3)).strftime("%H:%M")

    (raw / "a.jsonl").write_text(json.dumps({"text": "the first night"}) + "\n")
    first = nightly(config=cfg.model_dump(mode="json"), run_date="2026-12-01", return_state=True)
    assert first.name == "Promoted", first.message
    assert "Deadline" not in first.message  # nothing measured yet: the configured steps
    timing = load_state(cfg)["latest"]["timing"]
    assert timing["steps"] == cfg.training.steps and timing["pretrain_s"] > 0 and timing["step_s"] > 0

    (raw / "b.jsonl").write_text(json.dumps({"text": "the second night"}) + "\n")
    cfg.training.steps = 10**9  # far more than fit in the 2-3 minutes left at last night's pace
    second = nightly(config=cfg.model_dump(mode="json"), run_date="2026-12-02", return_state=True)
    assert second.name == "Promoted", second.message
    assert f"Deadline: steps cut {10**9} -> " in second.message, second.message
    trained = json.loads((Path(cfg.run.output_root) / "nightly-2026-12-02" / "pretrain" / "out.json").read_text())
    assert 10 < trained["steps"] < 10**9  # the stand-in pretrain ran with tonight's cut steps
    history = load_state(cfg)["history"]
    assert history[-1]["timing"]["steps"] == trained["steps"]
