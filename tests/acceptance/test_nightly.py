"""Nights of `llm-pipeline nightly`, run as a user (or the deployment) runs it, from a fresh copy of the
repository with the shipped tiny config and a relative raw-data folder that grows:

0. (a manual data run of the same config and file first, as `make demo` makes one: the nightly is its own dedup
   lineage, so night 1 still trains: tests/flows/test_nightly_and_notify.py, on the real data stage in-process);
1. good documents -> Promoted: `latest` points at the night's checkpoint and the tokenizer beside it, and the
   night's held-out split becomes the lineage's fixed reference (`reference_heldout`);
2. a file of garbage (random characters), with the data screen off (nightly.screen.enabled=false: the gate
   behind it) -> trained, but its candidate forgets the domain: the fixed held-out perplexity rises past
   nightly.gate.max_perplexity_increase -> Held: `latest` stays, the file is dropped (nightly.on_hold=drop; the
   default, carry, is tested in tests/flows), the message names the metric, both values and the budget;
   a run that would continue the promoted weights with another tokenizer is refused;
3. other good documents -> Promoted, trained from night 1's stable-phase weights (not night 2's; the lineage
   schedule's warm-up continued at night 1's step count) with night 1's tokenizer (byte-identical: one tokenizer per
   lineage);
4. a file holding only documents seen on night 1, given on night 3's date (a second run of a decided date: the
   night runs as nightly-<date>-2 and night 3's folder is untouched) -> NoNewData: nothing trained, the file
   consumed;
5. a file whose every record is broken -> NoUsableData: consumed (not retried every night), reasons counted;
6. (nothing new -> Skipped, nothing consumed, `latest` unchanged: tests/flows/test_nightly_and_notify.py, in-process:
   the CLI prints a night's end state as nights 1-5 and 7 show);
7. a file of garbage with the data screen on (the default) -> the promoted model and the lineage's n-gram model put
   every document far outside the lineage: the file is quarantined, nothing trains -> NoUsableData, the message
   names the file and the screen's counts (a night whose only file is empty says so: tests/flows/
   test_nightly_and_notify.py, on the real data stage in-process);
8. `llm-pipeline nightly status` prints what became of every file (the screen's file: quarantined) and the share of
   accepted documents that reached the promoted model.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

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


def garbage_lines(n: int = 200, chars: int = 150, seed: int = 7) -> list[bytes]:
    """What a broken scraper returns: valid JSON records of random CJK characters (they pass the filters)."""
    rng = random.Random(seed)
    return [json.dumps({"id": f"junk-{i}", "text": "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(chars))},
                       ensure_ascii=False).encode() for i in range(n)]


def ours(out: str, level: str) -> list[str]:
    """Our terminal lines at `level` (`HH:MM:SS LEVEL ...`, tasks/terminal.py): Prefect's own lines (its shutdown's
    `Still processing items: 1 items remaining...` under load) are not the product's to count."""
    return [ln for ln in out.splitlines() if re.match(rf"\d\d:\d\d:\d\d {level} ", ln)]


def _sha(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def scratch_tokenizer(user_repo, records: list[bytes]) -> Path:
    """The tokenizer a from-scratch data stage of the shipped tiny config trains on `records` (outside the checkout)."""
    from pipeline_lib.config import load_config
    from pipeline_lib.data.tokenizer import train_tokenizer

    cfg = load_config(str(user_repo.path / "configs/pipelines/tiny-cpu.yaml"))
    texts = [json.loads(raw)["text"] for raw in records]
    return Path(train_tokenizer(texts, cfg.tokenizer, user_repo.home / "scratch-tokenizer").model_file)


def test_nights_judged_held_promoted_then_no_new_no_usable_nothing(user_repo):
    raw = user_repo.own("incoming")
    raw.mkdir()
    lines = good_lines()
    (raw / "day1.jsonl").write_bytes(b"\n".join(lines[:250]) + b"\n")
    runs = user_repo.path / "runs"

    def night(date: str, *more: str) -> str:
        return user_repo.run(["./.venv/bin/llm-pipeline", "nightly", "configs/pipelines/tiny-cpu.yaml",
                              "--run-date", date, "data.inputs=[incoming/*.jsonl]", *FAST, *more],
                             timeout=900).stdout

    def state() -> dict:
        return json.loads((runs / "_nightly" / "state.json").read_text())

    def pretrain_metrics(run_id: str) -> dict:
        return json.loads((runs / run_id / "pretrain" / "manifest.json").read_text())["metrics"]

    out = night("2026-11-01")
    assert "nightly Promoted" in out, out[-3000:]
    first = state()
    assert first["latest"]["run_id"] == "nightly-2026-11-01" and first["latest"]["checkpoint"]
    assert [p.rsplit("/", 1)[-1] for p in first["consumed"]] == ["day1.jsonl"]
    assert first["reference_heldout"] == str((runs / "nightly-2026-11-01" / "data" / "mindrecord" / "heldout").resolve())
    trained = runs / "nightly-2026-11-01" / "data" / "tokenizer" / "tokenizer.model"
    beside = runs / "nightly-2026-11-01" / "pretrain" / "checkpoint" / "tokenizer.model"
    assert _sha(beside) == _sha(trained) == pretrain_metrics("nightly-2026-11-01")["tokenizer"]["sha256"]
    assert first["latest"]["tokenizer"] == str(beside.resolve())

    # night 2: garbage. Its own held-out split is garbage too (the candidate does better there) and the tiny
    # tokenizer covers little general Chinese; the lineage's fixed held-out split is what shows the forgetting
    (raw / "day2.jsonl").write_bytes(b"\n".join(garbage_lines()) + b"\n")
    out = night("2026-11-02", "nightly.screen.enabled=false", "nightly.on_hold=drop")
    second = state()
    assert second["latest"] == first["latest"], out[-3000:]
    assert [h["run_id"] for h in second["held"]] == ["nightly-2026-11-02"]
    assert sorted(p.rsplit("/", 1)[-1] for p in second["consumed"]) == ["day1.jsonl", "day2.jsonl"]
    failed = {r["metric"]: r for r in second["history"][-1]["verdict"]["rows"] if not r["ok"]}
    assert "heldout@nightly-2026-11-01 perplexity" in failed, second["history"][-1]
    assert not {"held-out perplexity", "general_zh perplexity"} & set(failed)  # they do not see it (docs/nightly.md)
    row = failed["heldout@nightly-2026-11-01 perplexity"]
    assert row["candidate"] > row["promoted"] * (1 + row["budget"])
    assert "nightly Held" in out and row["metric"] in out and f"{row['promoted']:.4g}" in out \
        and f"{row['candidate']:.4g}" in out and "budget +5.0%" in out, out[-3000:]

    # a run asked to continue the promoted weights with another tokenizer (a fresh one, as a scratch run's data
    # stage trains it on night 3's file: the same trainer and settings, in this process: a CLI run costs 18 s more)
    # is refused before it reads a record, naming the field, both tokenizers and the fix
    (raw / "day3.jsonl").write_bytes(b"\n".join(lines[250:]) + b"\n")
    other = scratch_tokenizer(user_repo, lines[250:])
    assert _sha(other) != _sha(trained)
    refused = user_repo.run(["./.venv/bin/llm-pipeline", "run", "configs/pipelines/tiny-cpu.yaml", "--run-id",
                             "mixed", "--stages", "data,pretrain", "data.inputs=[incoming/day3.jsonl]",
                             "data.dedup.incremental=false", f"model.base_checkpoint={first['latest']['checkpoint']}",
                             f"tokenizer.path={other}", *FAST], check=False)
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert "tokenizer.path=" in refused.stdout and _sha(trained)[:16] in refused.stdout \
        and _sha(other)[:16] in refused.stdout, refused.stdout[-3000:]
    assert not (runs / "mixed" / "pretrain" / "manifest.json").exists()

    # night 3: good documents again -> promoted, continued from night 1 (the held night 2 is not the base)
    out = night("2026-11-03")
    third = state()
    assert "nightly Promoted" in out and third["latest"]["run_id"] == "nightly-2026-11-03", out[-3000:]
    night3 = runs / "nightly-2026-11-03"
    assert _sha(night3 / "data" / "tokenizer" / "tokenizer.model") == _sha(trained)
    assert json.loads((night3 / "data" / "tokenizer" / "tokenizer_config.json").read_text())["source"] \
        == f"loaded from {beside.resolve()}"
    # the lineage schedule (nightly.lr_schedule: lineage in the shipped config): night 3 continues night 1's
    # stable-phase weights (written as its 1-step decay began, after 5 of its 6 steps) at the lineage's step 5, while
    # night 1's decayed weights are `latest` and the `base` night 3 is judged against
    stable = first["latest"]["schedule"]
    assert stable["lineage_steps"] == 5 and stable["stable_step"] == 5 and stable["decay_steps"] == 1
    assert stable["stable_checkpoint"] == pretrain_metrics("nightly-2026-11-01")["stable_checkpoint"]["path"] \
        != first["latest"]["checkpoint"]
    assert pretrain_metrics("nightly-2026-11-03")["base"]["base_checkpoint"] == stable["stable_checkpoint"]
    night3_yaml = (night3 / "pretrain" / "run.yaml").read_text()
    assert f"load_checkpoint: {stable['stable_checkpoint']}" in night3_yaml and "lineage_steps: 5" in night3_yaml
    assert third["latest"]["schedule"]["lineage_steps"] == 10
    assert third["reference_heldout"] == first["reference_heldout"]  # the reference does not move
    changes = (night3 / "changes.md").read_text()  # what changed against the promoted night 1, not the held 2
    assert "nightly-2026-11-01" in changes and "heldout@nightly-2026-11-01" in changes, changes[:2000]
    assert [h["decision"] for h in third["history"]] == ["promoted", "held", "promoted"]

    (raw / "day4.jsonl").write_bytes(b"\n".join(lines[:40]) + b"\n")  # all seen on night 1
    night3_files = {p.resolve(): _sha(p) for p in sorted(night3.rglob("*")) if p.is_file()}
    out = night("2026-11-03")  # a second run of the decided date (a daytime run of the deployment)
    assert "nightly NoNewData" in out and "nightly-2026-11-03-2: no new data" in out, out[-3000:]
    # nothing of night 3 rewritten (nightly.retention's pass after the night may only thin it: its own record)
    after = {p.resolve(): _sha(p) for p in sorted(night3.rglob("*")) if p.is_file()}
    assert {p: h for p, h in after.items() if night3_files.get(p) != h} == {
        p: h for p, h in after.items() if p == (night3 / "retention.json").resolve()}, out[-3000:]
    for kept in (Path(third["latest"]["checkpoint"]), Path(third["latest"]["tokenizer"])):
        assert after[kept] == night3_files[kept]
    assert Path(third["reference_heldout"]).exists()
    # a night that ended as designed: the data stage's finding once, as a WARNING; no ERROR (there were three)
    assert not ours(out, "ERROR") and len(ours(out, "WARNING")) == 1 and "no new document" in out, out[-3000:]
    fourth = state()
    assert fourth["latest"] == third["latest"]  # nothing trained: tomorrow continues from night 3
    assert not (runs / "nightly-2026-11-03-2" / "pretrain" / "manifest.json").exists()

    (raw / "day5.jsonl").write_bytes(b'not json\n{"id": "e", "text": ""}\n{"id": "m"}\n\xff\xfe\n')
    out = night("2026-11-05")
    assert "nightly NoUsableData" in out and "1 bad_json" in out and "quarantine.jsonl" in out, out[-3000:]
    assert not ours(out, "ERROR"), out[-3000:]
    fifth = state()
    assert sorted(p.rsplit("/", 1)[-1] for p in fifth["consumed"]) == [f"day{i}.jsonl" for i in range(1, 6)]
    assert fifth["latest"] == third["latest"]
    # every night that ended is in the history with its decision, the no-train ones too
    assert [h["decision"] for h in fifth["history"]] == ["promoted", "held", "promoted", "no new data",
                                                          "no usable data"]

    (raw / "day7.jsonl").write_bytes(b"\n".join(garbage_lines(seed=8)) + b"\n")
    out = night("2026-11-07")
    assert "nightly NoUsableData" in out and "200 lineage_perplexity" in out, out[-3000:]
    assert "quarantined 1 file(s), left out of tonight's data: day7.jsonl (200/200)" in out, out[-3000:]
    seventh = state()
    assert seventh["latest"] == third["latest"] and not (runs / "nightly-2026-11-07" / "pretrain").exists()
    screen = seventh["history"][-1]["no_new_data"]["screen"]
    assert screen["scorers"]["model"]["what"] == "the promoted model (nightly-2026-11-03)", screen
    assert screen["power"] and screen["quarantined"][0].endswith("day7.jsonl")

    ledger = {u.rsplit("/", 1)[-1]: e for u, e in state()["ledger"].items()}
    assert {f: (e["status"], e.get("into")) for f, e in ledger.items()} == {
        "day1.jsonl": ("trained", "nightly-2026-11-01"), "day2.jsonl": ("dropped", None),
        "day3.jsonl": ("trained", "nightly-2026-11-03"), "day4.jsonl": ("duplicate", None),
        "day5.jsonl": ("unusable", None), "day7.jsonl": ("quarantined", None)}
    assert ledger["day7.jsonl"]["reason"] == "screen: 200 of 200 documents far outside the lineage"
    kept = {f: e["documents"]["kept"] for f, e in ledger.items() if "documents" in e}
    status = user_repo.run(["./.venv/bin/llm-pipeline", "nightly", "status", "configs/pipelines/tiny-cpu.yaml"])
    share = (kept["day1.jsonl"] + kept["day3.jsonl"]) / sum(kept.values())
    assert f"reached the promoted model (nightly-2026-11-03): {share:.1%}" in status.stdout, status.stdout
    assert "dropped" in status.stdout and "trained into nightly-2026-11-03" in status.stdout
