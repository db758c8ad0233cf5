"""Three nights of `llm-pipeline nightly`, run as a user (or the deployment) runs it, from a fresh
copy of the repository with the shipped tiny config and a relative raw-data folder:

1. new files arrive -> data, pretrain, evaluate run; the watermark takes the files, `latest` points
   at the night's checkpoint;
2. a new file holding only documents seen on night 1 -> Completed "NoNewData": nothing trained, the
   file consumed (so night 3 does not retry it), `latest` unchanged;
3. nothing new -> Completed "Skipped".
"""
from __future__ import annotations

import json

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow
FAST = ["training.steps=6", "training.warmup_steps=1", "training.save_steps=3", "training.preflight_steps=0"]


def good_lines() -> list[bytes]:
    out = []
    for raw in (ROOT / "configs/data/tiny_corpus.jsonl").read_bytes().splitlines():
        try:
            if isinstance(json.loads(raw).get("text"), str):
                out.append(raw)
        except (ValueError, AttributeError):
            pass
    return out


def test_three_nights_new_data_then_only_duplicates_then_nothing(user_repo):
    raw = user_repo.path / "incoming"
    raw.mkdir()
    lines = good_lines()
    (raw / "day1.jsonl").write_bytes(b"\n".join(lines[:300]) + b"\n")

    def night(date: str) -> str:
        return user_repo.run(["./.venv/bin/llm-pipeline", "nightly", "configs/pipelines/tiny-cpu.yaml",
                              "--run-date", date, "data.inputs=[incoming/*.jsonl]", *FAST], timeout=900).stdout

    def state() -> dict:
        return json.loads((user_repo.path / "runs" / "_nightly" / "state.json").read_text())

    night("2026-11-01")
    first = state()
    assert first["latest"]["run_id"] == "nightly-2026-11-01" and first["latest"]["checkpoint"]
    assert [p.rsplit("/", 1)[-1] for p in first["consumed"]] == ["day1.jsonl"]
    assert (user_repo.path / "runs" / "nightly-2026-11-01" / "pretrain" / "manifest.json").exists()

    (raw / "day2.jsonl").write_bytes(b"\n".join(lines[:40]) + b"\n")  # all seen on night 1
    out = night("2026-11-02")
    assert "NoNewData" in out, out[-3000:]
    second = state()
    assert sorted(p.rsplit("/", 1)[-1] for p in second["consumed"]) == ["day1.jsonl", "day2.jsonl"]
    assert second["latest"] == first["latest"]  # nothing trained: tomorrow continues from night 1
    assert not (user_repo.path / "runs" / "nightly-2026-11-02" / "pretrain" / "manifest.json").exists()

    out = night("2026-11-03")
    assert "Skipped" in out, out[-3000:]
    assert state()["consumed"] == second["consumed"] and state()["latest"] == first["latest"]
