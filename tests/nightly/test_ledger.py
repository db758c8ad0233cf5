"""The nightly ledger: what became of every raw file (trained, carried, dropped, quarantined, duplicate, unusable),
the carry policy, promotion by hand, the share of accepted documents that reached the promoted model, and the run
ids of a date's nights."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly import (commit_night, consume_without_training, load_state, new_files, promote_held,
                                  quarantine_night)
from pipeline_lib.nightly.ledger import quarantined_by, reached_share, render_ledger


def cfg_at(tmp_path: Path, **nightly):
    raw = tmp_path / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    return config_from_dict({"run": {"output_root": str(tmp_path / "runs")}, "data": {"inputs": [str(raw / "*.jsonl")]},
                             "nightly": nightly})


def arrive(tmp_path: Path, name: str, n: int = 3) -> str:
    path = tmp_path / "raw" / name
    path.write_text("".join(json.dumps({"text": f"{name} {i}"}) + "\n" for i in range(n)))
    return str(path)


def docs(kept: int, duplicates: int = 0, filtered: int = 0, rejected: int = 0) -> dict:
    return {"kept": kept, "duplicates": duplicates, "filtered": filtered, "rejected": rejected}


def night(cfg, run_id: str, decision: str, documents: dict | None = None, **kw) -> dict:
    state = load_state(cfg)
    files = new_files(cfg, state)
    return commit_night(cfg, state, files, run_id, f"/ckpt/{run_id}", decision=decision,
                        documents=documents if documents is not None else {u: docs(10) for u in files}, **kw)


def test_a_held_nights_files_come_back_until_trained(tmp_path):
    cfg = cfg_at(tmp_path)
    a = arrive(tmp_path, "a.jsonl")
    night(cfg, "n1", "held")
    state = load_state(cfg)
    assert state["ledger"][a] | {} == {"size": Path(a).stat().st_size, "nights": ["n1"], "status": "carried",
                                       "carries": 1, "documents": docs(10)}
    assert a not in state["consumed"]
    b = arrive(tmp_path, "b.jsonl")
    assert sorted(new_files(cfg, state)) == [a, b]  # the carried file with tonight's new one
    night(cfg, "n2", "promoted")
    state = load_state(cfg)
    assert {u: (e["status"], e.get("into"), e["nights"]) for u, e in state["ledger"].items()} == {
        a: ("trained", "n2", ["n1", "n2"]), b: ("trained", "n2", ["n2"])}
    assert new_files(cfg, state) == {} and sorted(state["consumed"]) == [a, b]
    assert reached_share(state) == {"trained": 20, "carried": 0, "dropped": 0, "quarantined_after_carry": 0,
                                    "share": 1.0}


def test_a_file_held_more_than_max_carries_times_is_quarantined_and_asks_for_a_person(tmp_path):
    cfg = cfg_at(tmp_path, max_carries=2)
    a = arrive(tmp_path, "a.jsonl")
    for i, run_id in enumerate(["n1", "n2"], start=1):
        night(cfg, run_id, "held")
        assert load_state(cfg)["ledger"][a]["carries"] == i
    b = arrive(tmp_path, "b.jsonl")
    state = night(cfg, "n3", "held")  # a's third hold; b's first
    entry = state["ledger"][a]
    assert (entry["status"], entry["reason"], entry["nights"]) == ("quarantined", "carried 2 times, held every time",
                                                                   ["n1", "n2", "n3"])
    assert state["ledger"][b]["status"] == "carried" and quarantined_by(state, "n3") == [a]
    assert state["consumed"] == {a: Path(a).stat().st_size}  # not read again; b comes back
    assert list(new_files(cfg, state)) == [b]
    assert [(x["run_id"], x["files"]) for x in state["attention"]] == [("n3", [a])]
    # 10 documents of a lost after carrying, 10 of b still carried, none trained
    assert reached_share(state) == {"trained": 0, "carried": 10, "dropped": 0, "quarantined_after_carry": 10,
                                    "share": 0.0}


def test_max_carries_zero_quarantines_at_the_first_hold_and_drop_consumes(tmp_path):
    zero = cfg_at(tmp_path / "zero", max_carries=0)
    a = arrive(tmp_path / "zero", "a.jsonl")
    assert night(zero, "n1", "held")["ledger"][a]["reason"] == "carried 0 times, held every time"
    drop = cfg_at(tmp_path / "drop", on_hold="drop")
    d = arrive(tmp_path / "drop", "d.jsonl")
    state = night(drop, "n1", "held")
    assert state["ledger"][d]["status"] == "dropped" and d in state["consumed"] and "attention" not in state


def test_a_file_that_kept_no_document_is_duplicate_or_unusable_whatever_the_decision(tmp_path):
    cfg = cfg_at(tmp_path)
    dup, bad, good = (arrive(tmp_path, n) for n in ("dup.jsonl", "bad.jsonl", "good.jsonl"))
    state = night(cfg, "n1", "held", {dup: docs(0, duplicates=3), bad: docs(0, filtered=2, rejected=1),
                                      good: docs(3)})
    assert [state["ledger"][u]["status"] for u in (dup, bad, good)] == ["duplicate", "unusable", "carried"]
    assert sorted(state["consumed"]) == sorted([dup, bad])


def test_nights_that_train_nothing_mark_their_files(tmp_path):
    cfg = cfg_at(tmp_path)
    a = arrive(tmp_path, "a.jsonl")
    consume_without_training(cfg, load_state(cfg), new_files(cfg, load_state(cfg)), "n1", {"kind": "all_seen"})
    b = arrive(tmp_path, "b.jsonl")
    consume_without_training(cfg, load_state(cfg), new_files(cfg, load_state(cfg)), "n2",
                             {"kind": "no_usable_documents"})
    c = arrive(tmp_path, "c.jsonl")
    quarantine_night(cfg, load_state(cfg), new_files(cfg, load_state(cfg)), "n3", "preflight failed: loss did not fall")
    state = load_state(cfg)
    assert [state["ledger"][u]["status"] for u in (a, b, c)] == ["duplicate", "unusable", "quarantined"]
    assert state["ledger"][c]["reason"] == "preflight failed: loss did not fall"
    assert [h["decision"] for h in state["history"]] == ["no new data", "no usable data", "quarantined"]
    assert new_files(cfg, state) == {} and state["attention"][0]["files"] == [c]


def test_promoting_a_held_night_by_hand_trains_its_files_and_keeps_its_record(tmp_path):
    cfg = cfg_at(tmp_path)
    a = arrive(tmp_path, "a.jsonl")
    night(cfg, "n1", "held", record={"screen": {"excluded": 4}}, heldout="/runs/n1/heldout")
    promote_held(cfg, "n1", who="alice", reason="fine")
    state = load_state(cfg)
    assert state["latest"]["screen"] == {"excluded": 4} and state["latest"]["run_id"] == "n1"
    assert "verdict" not in state["latest"] and state["reference_heldout"] == "/runs/n1/heldout"
    assert state["history"][-1]["screen"] == {"excluded": 4}
    assert (state["ledger"][a]["status"], state["ledger"][a]["into"]) == ("trained", "n1")
    assert new_files(cfg, state) == {}


def test_the_share_counts_accepted_documents_only(tmp_path):
    state = {"ledger": {
        "t": {"status": "trained", "nights": ["n1"], "documents": docs(30, duplicates=70)},
        "c": {"status": "carried", "carries": 1, "nights": ["n2"], "documents": docs(10)},
        "q": {"status": "quarantined", "carries": 2, "nights": ["n1"], "documents": docs(20)},
        "g": {"status": "quarantined", "reason": "preflight", "nights": ["n3"], "documents": docs(500)},  # not after carrying
        "u": {"status": "unusable", "nights": ["n3"], "documents": docs(0, rejected=9)}}}
    assert reached_share(state)["share"] == pytest.approx(30 / 60)
    text = render_ledger(state)
    assert "50.0% (30 trained / 60: 10 carried, 0 dropped, 20 quarantined after carrying)" in text
    assert "carried (1)" in text and "quarantined (preflight)" in text


def test_nightly_status_prints_the_ledger_and_exits_2_on_a_config_error(tmp_path, capsys):
    from flows.cli import nightly_main

    cfg = cfg_at(tmp_path)
    a = arrive(tmp_path, "a.jsonl")
    night(cfg, "n1", "held")
    night(cfg, "n2", "held")
    night(cfg, "n3", "held")
    root = f"run.output_root={tmp_path / 'runs'}"
    assert nightly_main(["status", "configs/pipelines/tiny-cpu.yaml", root]) == 0
    out = capsys.readouterr().out
    assert f"{a}  quarantined (carried 2 times, held every time)  n1, n2, n3  10" in out, out
    assert "accepted documents that reached the promoted model (none): 0.0%" in out
    assert "attention (1):" in out and "n3: 1 file(s) held 3 nights running" in out
    assert nightly_main(["status", "configs/pipelines/tiny-cpu.yaml", root, "nightly.max_carries=-1"]) == 2
    assert "nightly.max_carries" in capsys.readouterr().err


def test_a_decided_date_gets_the_next_id_and_a_failed_night_is_resumed(tmp_path):
    from pipeline_lib.nightly.night_ids import NightDecided, night_run_id, refuse_decided

    cfg = cfg_at(tmp_path)
    assert night_run_id(cfg, {}, "nightly-2026-12-01")[0] == "nightly-2026-12-01"
    state = {"history": [{"run_id": "nightly-2026-12-01", "decision": "promoted"},
                         {"run_id": "nightly-2026-12-01-2", "decision": "no new data"}],
             "latest": {"run_id": "nightly-2026-12-01"}}
    assert night_run_id(cfg, state, "nightly-2026-12-01") == ("nightly-2026-12-01-3", "nightly-2026-12-01-3: "
                                                              "nightly-2026-12-01 .. nightly-2026-12-01-2 already decided")
    (tmp_path / "runs" / "nightly-2026-12-01-3" / "data").mkdir(parents=True)  # it failed, nothing decided
    (tmp_path / "runs" / "nightly-2026-12-01-3" / "data" / "stats.json").write_text("{}")
    assert night_run_id(cfg, state, "nightly-2026-12-01")[0] == "nightly-2026-12-01-3"
    refuse_decided(cfg, state, "nightly-2026-12-01-3")  # a failed night may resume in place
    with pytest.raises(NightDecided, match="it is `latest`"):
        refuse_decided(cfg, state, "nightly-2026-12-01")
    with pytest.raises(NightDecided, match="ended in a decision"):
        refuse_decided(cfg, state, "nightly-2026-12-01-2")
    reference = {"reference_heldout": str((tmp_path / "runs" / "n0" / "data" / "mindrecord" / "heldout").resolve())}
    with pytest.raises(NightDecided, match="fixed held-out split"):
        refuse_decided(config_from_dict({"run": {"output_root": str(tmp_path / "runs")}}), reference, "n0")


@pytest.mark.parametrize("report, guard, expected", [
    ({"ok": False, "crash": None, "problems": ["loss rose over 8 steps (...): lower training.learning_rate"]}, False,
     "preflight failed on tonight's documents: loss rose over 8 steps"),
    ({"ok": False, "crash": "Killed", "problems": ["the trainer failed within the preflight's steps: Killed"]}, False,
     None),  # a killed trainer is not the data's
    ({"ok": False, "crash": None, "problems": ["peak host memory 9.1 GB over the limit"]}, False, None),
    (None, True, "the loss guard stopped training: loss guard stopped training at step 7"),
    (None, False, None),  # a failure that left nothing of the kind (a full disk)
])
def test_a_failure_is_the_datas_only_when_the_preflight_or_guard_judged_its_loss(tmp_path, report, guard, expected):
    from pipeline_lib.nightly.documents import data_failure

    cfg = cfg_at(tmp_path)
    stage = tmp_path / "runs" / "n1" / "pretrain"
    stage.mkdir(parents=True)
    if report is not None:
        (stage / "preflight.json").write_text(json.dumps(report))
    if guard:
        (stage / "work" / "guard").mkdir(parents=True)
        (stage / "work" / "guard" / "rank_0.json").write_text(json.dumps(
            {"message": "loss guard stopped training at step 7\nbatch documents ..."}))
    assert (data_failure(cfg, "n1") or "").startswith(expected or "") and (data_failure(cfg, "n1") is None) == (
        expected is None)


def test_no_run_redoes_the_data_or_pretrain_stage_of_a_decided_night(tmp_path):
    import pickle

    from pipeline_lib.nightly.night_ids import NightDecided, refuse_redo_in_decided_night

    cfg = cfg_at(tmp_path)
    arrive(tmp_path, "a.jsonl")
    night(cfg, "nightly-2026-12-01", "promoted")
    for stage in ("data", "pretrain"):
        with pytest.raises(NightDecided) as refused:
            refuse_redo_in_decided_night(cfg, "nightly-2026-12-01", stage)
        assert f"refusing to redo its {stage} stage" in str(refused.value) and "Fix: " in str(refused.value)
    assert str(pickle.loads(pickle.dumps(refused.value))) == str(refused.value)  # crosses a process as it is
    refuse_redo_in_decided_night(cfg, "nightly-2026-12-01", "evaluate")  # scoring it again writes no file it hands on
    refuse_redo_in_decided_night(cfg, "nightly-2026-12-02", "data")  # not decided: a failed night resumes


def test_a_file_the_screen_quarantined_is_quarantined_whatever_the_night_decided(tmp_path):
    cfg = cfg_at(tmp_path)
    good, junk = arrive(tmp_path, "good.jsonl"), arrive(tmp_path, "junk.jsonl")
    screen = {"quarantined": [junk], "files": {junk: {"screened": 3, "excluded": 3}}}
    state = night(cfg, "n1", "held", {good: docs(3)}, record={"screen": screen})
    assert state["ledger"][good]["status"] == "carried"
    assert (state["ledger"][junk]["status"], state["ledger"][junk]["reason"]) == (
        "quarantined", "screen: 3 of 3 documents far outside the lineage")
    assert list(new_files(cfg, state)) == [good]  # the junk is not read again
    only_junk = arrive(tmp_path, "junk2.jsonl")
    consume_without_training(cfg, load_state(cfg), {only_junk: 5}, "n2",
                             {"kind": "no_usable_documents", "screen": {"quarantined": [only_junk]}})
    assert load_state(cfg)["ledger"][only_junk]["reason"] == "screen: far outside the lineage"
