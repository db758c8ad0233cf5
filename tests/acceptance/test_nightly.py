"""Four nights of `llm-pipeline nightly`, run as a user (or the deployment) runs it, from a fresh
copy of the repository with the shipped tiny config and a relative raw-data folder:

1. new files arrive -> data, pretrain, evaluate run; the watermark takes the files, `latest` points
   at the night's checkpoint and the tokenizer beside it;
2. other new documents -> trained from night 1's checkpoint with night 1's tokenizer (byte-identical: one
   tokenizer per lineage); a run that would continue those weights with another tokenizer is refused;
3. a new file holding only documents seen on night 1 -> Completed "NoNewData": nothing trained, the
   file consumed (so night 4 does not retry it), `latest` unchanged;
4. nothing new -> Completed "Skipped".
"""
from __future__ import annotations

import json

import pytest

from .conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.train]
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


def _sha(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_nights_keep_one_tokenizer_then_only_duplicates_then_nothing(user_repo):
    raw = user_repo.own("incoming")
    raw.mkdir()
    lines = good_lines()
    (raw / "day1.jsonl").write_bytes(b"\n".join(lines[:250]) + b"\n")
    runs = user_repo.path / "runs"

    def night(date: str) -> str:
        return user_repo.run(["./.venv/bin/llm-pipeline", "nightly", "configs/pipelines/tiny-cpu.yaml",
                              "--run-date", date, "data.inputs=[incoming/*.jsonl]", *FAST], timeout=900).stdout

    def state() -> dict:
        return json.loads((runs / "_nightly" / "state.json").read_text())

    def pretrain_metrics(run_id: str) -> dict:
        return json.loads((runs / run_id / "pretrain" / "manifest.json").read_text())["metrics"]

    night("2026-11-01")
    first = state()
    assert first["latest"]["run_id"] == "nightly-2026-11-01" and first["latest"]["checkpoint"]
    assert [p.rsplit("/", 1)[-1] for p in first["consumed"]] == ["day1.jsonl"]
    trained = runs / "nightly-2026-11-01" / "data" / "tokenizer" / "tokenizer.model"
    beside = runs / "nightly-2026-11-01" / "pretrain" / "checkpoint" / "tokenizer.model"
    assert _sha(beside) == _sha(trained) == pretrain_metrics("nightly-2026-11-01")["tokenizer"]["sha256"]
    assert first["latest"]["tokenizer"] == str(beside.resolve())

    # night 2: other documents; a tokenizer trained on them would differ. It continues night 1's weights with
    # night 1's tokenizer, byte for byte
    (raw / "day2.jsonl").write_bytes(b"\n".join(lines[250:]) + b"\n")
    night("2026-11-02")
    second = state()
    assert second["latest"]["run_id"] == "nightly-2026-11-02"
    night2 = runs / "nightly-2026-11-02"
    assert _sha(night2 / "data" / "tokenizer" / "tokenizer.model") == _sha(trained)
    assert json.loads((night2 / "data" / "tokenizer" / "tokenizer_config.json").read_text())["source"] \
        == f"loaded from {beside.resolve()}"
    assert pretrain_metrics("nightly-2026-11-02")["base"]["base_checkpoint"] == first["latest"]["checkpoint"]
    assert f"load_checkpoint: {first['latest']['checkpoint']}" in (night2 / "pretrain" / "run.yaml").read_text()
    assert pretrain_metrics("nightly-2026-11-02")["tokenizer"]["sha256"] == _sha(trained)

    # a run asked to continue night 2 with another tokenizer (here a fresh one of a scratch run) is refused
    # before it reads a record, naming the field, both tokenizers and the fix
    user_repo.run(["./.venv/bin/llm-pipeline", "run", "configs/pipelines/tiny-cpu.yaml", "--run-id", "scratch",
                   "--stages", "data", "data.inputs=[incoming/day2.jsonl]", "data.dedup.incremental=false"])
    other = runs / "scratch" / "data" / "tokenizer" / "tokenizer.model"
    assert _sha(other) != _sha(trained)
    refused = user_repo.run(["./.venv/bin/llm-pipeline", "run", "configs/pipelines/tiny-cpu.yaml", "--run-id",
                             "mixed", "--stages", "data,pretrain", "data.inputs=[incoming/day2.jsonl]",
                             "data.dedup.incremental=false", f"model.base_checkpoint={second['latest']['checkpoint']}",
                             f"tokenizer.path={other}", *FAST], check=False)
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert "tokenizer.path=" in refused.stdout and _sha(trained)[:16] in refused.stdout \
        and _sha(other)[:16] in refused.stdout, refused.stdout[-3000:]
    assert not (runs / "mixed" / "pretrain" / "manifest.json").exists()

    (raw / "day3.jsonl").write_bytes(b"\n".join(lines[:40]) + b"\n")  # all seen on night 1
    out = night("2026-11-03")
    assert "NoNewData" in out, out[-3000:]
    third = state()
    assert sorted(p.rsplit("/", 1)[-1] for p in third["consumed"]) == ["day1.jsonl", "day2.jsonl", "day3.jsonl"]
    assert third["latest"] == second["latest"]  # nothing trained: tomorrow continues from night 2
    assert not (runs / "nightly-2026-11-03" / "pretrain" / "manifest.json").exists()

    out = night("2026-11-04")
    assert "Skipped" in out, out[-3000:]
    assert state()["consumed"] == third["consumed"] and state()["latest"] == second["latest"]
