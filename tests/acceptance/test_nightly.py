"""Five nights of `llm-pipeline nightly`, run as a user (or the deployment) runs it, from a fresh copy of the
repository with the shipped tiny config and a relative raw-data folder that grows:

1. good files -> data, pretrain, evaluate run; nothing promoted yet: Promoted; `latest` points at the night's
   checkpoint and the tokenizer beside it;
2. a file of garbage -> the gate finds the candidate worse than night 1 on the same rows: Held, `latest` stays,
   the file is consumed, the message names each metric with both values;
3. good files again -> trained from night 1's checkpoint (not night 2's) with night 1's tokenizer (byte-identical:
   one tokenizer per lineage): Promoted; a run that would continue those weights with another tokenizer is refused;
4. a new file holding only documents seen before -> Completed "NoNewData": nothing trained, the file consumed;
5. nothing new -> Completed "Skipped".
"""
from __future__ import annotations

import json

import pytest

from .conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.train]
FAST = ["training.steps=6", "training.warmup_steps=1", "training.save_steps=3", "training.preflight_steps=0"]
GATE = ["nightly.gate.max_perplexity_increase=0.10"]  # the tiny model's night-to-night noise is a few percent


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


def garbage_lines(n: int = 120, seed: int = 7) -> list[bytes]:
    """A scraper gone wrong: lines of random CJK characters (they pass the cleaning filters as Chinese text)."""
    import random

    rng = random.Random(seed)
    return [json.dumps({"id": f"junk-{i}", "text": "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(160))},
                       ensure_ascii=False).encode() for i in range(n)]


def test_nights_judged_by_the_gate_keep_one_tokenizer(user_repo):
    """good -> Promoted; garbage -> Held (latest stays); good -> Promoted, trained from night 1's weights with night
    1's tokenizer; a run mixing those weights with another tokenizer is refused; duplicates -> NoNewData;
    nothing -> Skipped."""
    raw = user_repo.own("incoming")
    raw.mkdir()
    lines = good_lines()
    (raw / "day1.jsonl").write_bytes(b"\n".join(lines[:250]) + b"\n")
    runs = user_repo.path / "runs"

    def night(date: str) -> str:
        return user_repo.run(["./.venv/bin/llm-pipeline", "nightly", "configs/pipelines/tiny-cpu.yaml",
                              "--run-date", date, "data.inputs=[incoming/*.jsonl]", *FAST, *GATE], timeout=900).stdout

    def state() -> dict:
        return json.loads((runs / "_nightly" / "state.json").read_text())

    def pretrain_metrics(run_id: str) -> dict:
        return json.loads((runs / run_id / "pretrain" / "manifest.json").read_text())["metrics"]

    out = night("2026-11-01")
    assert "Promoted" in out, out[-3000:]
    first = state()
    assert first["latest"]["run_id"] == "nightly-2026-11-01" and first["latest"]["checkpoint"]
    assert [p.rsplit("/", 1)[-1] for p in first["consumed"]] == ["day1.jsonl"]
    trained = runs / "nightly-2026-11-01" / "data" / "tokenizer" / "tokenizer.model"
    beside = runs / "nightly-2026-11-01" / "pretrain" / "checkpoint" / "tokenizer.model"
    assert _sha(beside) == _sha(trained) == pretrain_metrics("nightly-2026-11-01")["tokenizer"]["sha256"]
    assert first["latest"]["tokenizer"] == str(beside.resolve())

    # night 2: a file of garbage. Trained on, the model forgets: the gate holds it, latest stays night 1's
    (raw / "day2.jsonl").write_bytes(b"\n".join(garbage_lines()) + b"\n")
    out = night("2026-11-02")
    second = state()
    verdict = second["history"][-1]["verdict"]
    assert "Held" in out and second["latest"] == first["latest"], (out[-3000:], verdict)
    failed = [r for r in verdict["rows"] if not r["ok"]]
    assert failed and all(f"{r['metric']} {r['promoted']:.4g} -> {r['candidate']:.4g}" in out for r in failed)
    assert [h["run_id"] for h in second["held"]] == ["nightly-2026-11-02"]
    assert any(p.endswith("day2.jsonl") for p in second["consumed"])  # consumed: not retried every night

    # night 3: good documents again, trained from night 1 (the promoted model), with night 1's tokenizer
    (raw / "day3.jsonl").write_bytes(b"\n".join(lines[250:]) + b"\n")
    out = night("2026-11-03")
    third = state()
    assert "Promoted" in out and third["latest"]["run_id"] == "nightly-2026-11-03", (out[-3000:],
                                                                                     third["history"][-1])
    night3 = runs / "nightly-2026-11-03"
    assert _sha(night3 / "data" / "tokenizer" / "tokenizer.model") == _sha(trained)
    assert json.loads((night3 / "data" / "tokenizer" / "tokenizer_config.json").read_text())["source"] \
        == f"loaded from {beside.resolve()}"
    assert pretrain_metrics("nightly-2026-11-03")["base"]["base_checkpoint"] == first["latest"]["checkpoint"]
    assert f"load_checkpoint: {first['latest']['checkpoint']}" in (night3 / "pretrain" / "run.yaml").read_text()
    print("nights:", json.dumps([{"run": h["run_id"], "decision": h["decision"],
                                  "metrics": [(r["metric"], round(r["promoted"], 3), round(r["candidate"], 3))
                                              for r in (h.get("verdict") or {}).get("rows", [])]}
                                 for h in third["history"]], ensure_ascii=False))

    # a run asked to continue night 3 with another tokenizer (a fresh one of a scratch run) is refused before it
    # reads a record, naming the field, both tokenizers and the fix
    user_repo.run(["./.venv/bin/llm-pipeline", "run", "configs/pipelines/tiny-cpu.yaml", "--run-id", "scratch",
                   "--stages", "data", "data.inputs=[incoming/day3.jsonl]", "data.dedup.incremental=false"])
    other = runs / "scratch" / "data" / "tokenizer" / "tokenizer.model"
    assert _sha(other) != _sha(trained)
    refused = user_repo.run(["./.venv/bin/llm-pipeline", "run", "configs/pipelines/tiny-cpu.yaml", "--run-id",
                             "mixed", "--stages", "data,pretrain", "data.inputs=[incoming/day3.jsonl]",
                             "data.dedup.incremental=false", f"model.base_checkpoint={third['latest']['checkpoint']}",
                             f"tokenizer.path={other}", *FAST], check=False)
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert "tokenizer.path=" in refused.stdout and _sha(trained)[:16] in refused.stdout \
        and _sha(other)[:16] in refused.stdout, refused.stdout[-3000:]
    assert not (runs / "mixed" / "pretrain" / "manifest.json").exists()

    (raw / "day4.jsonl").write_bytes(b"\n".join(lines[:40]) + b"\n")  # all seen on night 1
    out = night("2026-11-04")
    assert "NoNewData" in out, out[-3000:]
    fourth = state()
    assert len(fourth["consumed"]) == 4 and fourth["latest"] == third["latest"]
    assert not (runs / "nightly-2026-11-04" / "pretrain" / "manifest.json").exists()

    out = night("2026-11-05")
    assert "Skipped" in out, out[-3000:]
    assert state()["consumed"] == fourth["consumed"] and state()["latest"] == third["latest"]
