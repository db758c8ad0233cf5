"""The nightly runs nightly.retention after it decides, on a real Prefect server with stand-in stages: two promoted
nights with keep_promoted 1 leave the first night without its checkpoint (its tombstone and the state say so), while
tonight's, untouched by its own pass, stays."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.nightly import nightly
from pipeline_lib.nightly import load_state

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("prefect_server", "stage_doubles")]


def test_the_second_night_thins_the_first_after_its_decision(night_on_raw):
    cfg, raw = night_on_raw
    cfg.nightly.retention.keep_promoted = 1
    root = Path(cfg.run.output_root)
    ckpt = lambda date: root / f"nightly-{date}" / "pretrain/checkpoint/rank_0/double_rank_0-1_1.ckpt"  # noqa: E731
    dates = ("2026-12-01", "2026-12-02")
    for date in dates:
        (raw / f"{date}.jsonl").write_text(json.dumps({"text": f"news of {date}"}) + "\n")
        state = nightly(config=cfg.model_dump(mode="json"), run_date=date, return_state=True)
        assert state.name == "Promoted", state.message
        assert ckpt(date).exists()  # tonight's own folder is never thinned by its own pass
    assert not ckpt(dates[0]).exists() and ckpt(dates[1]).exists()
    stone = json.loads((root / f"nightly-{dates[0]}" / "retention.json").read_text())
    assert stone["removed"]["training checkpoints"]["files"] == ["pretrain/checkpoint/rank_0/double_rank_0-1_1.ckpt"]
    passes = load_state(cfg)["retention"]  # the first night's pass had no decided night but its own: no entry
    assert [p["status"] for p in passes] == ["done"]
    assert passes[0]["nights"] == {f"nightly-{dates[0]}": len(f"weights of nightly-{dates[0]}")}
