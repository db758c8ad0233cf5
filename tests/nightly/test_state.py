"""pipeline_lib.nightly's state: nights that commit at once both land; an earlier version's state.json is read."""
import json
import multiprocessing
from pathlib import Path

from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly import commit_night, load_state, state_uri


def cfg_at(root: str):
    return config_from_dict({"run": {"output_root": root}})


def commit_nights(root: str, who: str, n: int) -> None:
    cfg = cfg_at(root)
    for i in range(n):  # each night read the state at its start, before the other's commits
        commit_night(cfg, load_state(cfg), {f"/raw/{who}{i}.jsonl": i}, f"{who}-{i}", None)


def test_two_nights_committing_at_once_both_land(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=commit_nights, args=(str(tmp_path), who, 10)) for who in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    state = load_state(cfg_at(str(tmp_path)))
    assert sorted(state["consumed"]) == sorted(f"/raw/{w}{i}.jsonl" for w in "ab" for i in range(10))
    assert len(state["history"]) == 20
    assert json.loads(Path(state_uri(cfg_at(str(tmp_path)))).read_text()) == state  # the readable copy


def test_the_state_json_of_an_earlier_version_is_read_and_carried_on(tmp_path):
    cfg = cfg_at(str(tmp_path))
    old = {"consumed": {"/raw/old.jsonl": 3}, "latest": {"run_id": "n0", "checkpoint": "c"}, "history": []}
    Path(state_uri(cfg)).parent.mkdir(parents=True)
    Path(state_uri(cfg)).write_text(json.dumps(old))
    assert load_state(cfg) == old
    commit_night(cfg, old, {"/raw/new.jsonl": 1}, "n1", None)
    assert sorted(load_state(cfg)["consumed"]) == ["/raw/new.jsonl", "/raw/old.jsonl"]


def test_the_nightly_lock_is_held_by_one_night_and_names_its_holder(tmp_path):
    import pytest

    from pipeline_lib.nightly import NightBusy, lock_uri, night_lock

    cfg = cfg_at(str(tmp_path))
    with night_lock(cfg, "nightly-2026-12-01") as mine:
        assert json.loads(Path(lock_uri(cfg)).read_text()).items() >= mine.items()
        with pytest.raises(NightBusy) as busy:
            with night_lock(cfg, "nightly-2026-12-02"):
                pass
        assert busy.value.holder.items() >= mine.items()
        assert f"another night holds the nightly lock of {tmp_path}: nightly-2026-12-01" in str(busy.value)
        assert "Fix: " in str(busy.value)
    assert not Path(lock_uri(cfg)).exists()  # given back


def test_a_stale_nightly_lock_is_taken_over(tmp_path):
    import datetime as dt
    import socket
    import subprocess
    import sys

    from pipeline_lib.nightly import LOCK_STALE_SECONDS, lock_uri, night_lock

    cfg = cfg_at(str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    now = dt.datetime.now(dt.timezone.utc)
    old = (now - dt.timedelta(seconds=LOCK_STALE_SECONDS + 60)).isoformat()
    for holder in ({"run_id": "n0", "host": socket.gethostname(), "pid": int(gone), "started_at": now.isoformat()},
                   {"run_id": "n1", "host": "another-host", "pid": 1, "started_at": now.isoformat()},  # a rerun
                   {"run_id": "n0", "host": "another-host", "pid": 1, "started_at": old, "heartbeat_at": old}):
        Path(lock_uri(cfg)).parent.mkdir(parents=True, exist_ok=True)
        Path(lock_uri(cfg)).write_text(json.dumps(holder))
        said = []
        with night_lock(cfg, "n1", said.append) as mine:
            assert json.loads(Path(lock_uri(cfg)).read_text()).items() >= mine.items()
        assert said and said[0].startswith(f"n1: taking over the nightly lock of {holder['run_id']}: "), said


def test_the_nightly_lock_holder_keeps_it_fresh(tmp_path, monkeypatch):
    """A long night is never taken for a dead one: the holder rewrites heartbeat_at while it runs."""
    import time

    from pipeline_lib.nightly import lock as nightly

    monkeypatch.setattr(nightly, "LOCK_HEARTBEAT_SECONDS", 0.05)
    cfg = cfg_at(str(tmp_path))
    with nightly.night_lock(cfg, "n1") as mine:
        first = json.loads(Path(nightly.lock_uri(cfg)).read_text())["heartbeat_at"]
        time.sleep(0.3)
        later = json.loads(Path(nightly.lock_uri(cfg)).read_text())
    assert later["heartbeat_at"] > first and later["started_at"] == mine["started_at"]


def test_a_live_holder_on_this_host_keeps_the_lock_even_for_the_same_night(tmp_path):
    """Two runs of one date at once on one host: the second must not take the live first one's lock."""
    import socket
    import subprocess
    import sys

    import pytest

    from pipeline_lib.nightly import NightBusy, lock_uri, night_lock

    cfg = cfg_at(str(tmp_path))
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        Path(lock_uri(cfg)).parent.mkdir(parents=True, exist_ok=True)
        Path(lock_uri(cfg)).write_text(json.dumps({"run_id": "n1", "host": socket.gethostname(), "pid": live.pid,
                                                   "pid_started": __import__("psutil").Process(live.pid).create_time(),
                                                   "started_at": "2026-12-01T02:00:00+00:00"}))
        with pytest.raises(NightBusy):
            with night_lock(cfg, "n1"):
                pass
    finally:
        live.kill()
        live.wait()


def test_the_first_promoted_night_fixes_the_lineage_reference_and_tonight_scores_it(tmp_path):
    from pipeline_lib.nightly import nightly_overrides

    cfg = cfg_at(str(tmp_path))
    commit_night(cfg, {}, {"/raw/a.jsonl": 1}, "n1", "c1", decision="held", heldout="/runs/n1/heldout")
    assert "reference_heldout" not in load_state(cfg)  # a held night is not the lineage's reference
    commit_night(cfg, load_state(cfg), {"/raw/b.jsonl": 1}, "n2", "c2", heldout="/runs/n2/heldout")
    commit_night(cfg, load_state(cfg), {"/raw/c.jsonl": 1}, "n3", "c3", heldout="/runs/n3/heldout")
    state = load_state(cfg)
    assert state["reference_heldout"] == "/runs/n2/heldout"  # the first promoted night's, and it stays
    tonight = nightly_overrides(config_from_dict({"run": {"output_root": str(tmp_path), "name": "tiny"},
                                                  "evaluate": {"reference_heldout": ["/mine/heldout"]}}),
                                state, {"/raw/d.jsonl": 1})
    assert tonight["evaluate"]["reference_heldout"] == ["/mine/heldout", "/runs/n2/heldout"]
    assert tonight["model"]["base_checkpoint"] == "c3"


def test_the_nightly_is_its_own_dedup_lineage_unless_one_is_named(tmp_path):
    from pipeline_lib.nightly import nightly_overrides

    own = nightly_overrides(config_from_dict({"run": {"name": "tiny-cpu"}}), {}, {"/raw/a.jsonl": 1})
    # a manual run of tiny-cpu is another lineage; the night's segment is published when it is promoted
    assert own["data"]["dedup"] == {"lineage": "tiny-cpu-nightly", "defer_publish": True}
    named = nightly_overrides(config_from_dict({"data": {"dedup": {"lineage": "shared"}}}), {}, {"/raw/a.jsonl": 1})
    assert named["data"]["dedup"] == {"defer_publish": True}


def test_replay_draws_on_the_promoted_nights_whose_data_stage_is_still_there(tmp_path):
    from pipeline_lib.nightly import commit_night, consume_without_training, nightly_overrides, promoted_nights

    cfg = cfg_at(str(tmp_path))
    commit_night(cfg, load_state(cfg), {"/raw/1.jsonl": 1}, "n1", "c1")
    commit_night(cfg, load_state(cfg), {"/raw/2.jsonl": 1}, "n2", "c2", decision="held")
    consume_without_training(cfg, load_state(cfg), {"/raw/3.jsonl": 1}, "n3", {"kept": 0})
    commit_night(cfg, load_state(cfg), {"/raw/4.jsonl": 1}, "n4", "c4")
    commit_night(cfg, load_state(cfg), {"/raw/5.jsonl": 1}, "n5", "c5")
    for run_id in ("n1", "n2", "n4"):  # n5's data folder is gone (cleaned up)
        (tmp_path / run_id / "data").mkdir(parents=True)
        (tmp_path / run_id / "data" / "manifest.json").write_text("{}")
    state = load_state(cfg)
    assert promoted_nights(state) == ["n1", "n4", "n5"]
    assert [h["decision"] for h in state["history"]] == ["promoted", "held", "no new data", "promoted", "promoted"]
    assert "replay" not in nightly_overrides(cfg, state, {"/raw/6.jsonl": 1})["data"]  # data.replay off
    on = config_from_dict({"run": {"output_root": str(tmp_path)}, "data": {"replay": {"fraction": 0.3, "runs": ["r0"]}}})
    assert nightly_overrides(on, state, {"/raw/6.jsonl": 1})["data"]["replay"] == {"runs": ["r0", "n1", "n4"]}


def test_a_night_of_unusable_records_is_recorded_as_such_and_moves_nothing_but_the_watermark(tmp_path):
    from pipeline_lib.nightly import commit_night, consume_without_training

    cfg = cfg_at(str(tmp_path))
    commit_night(cfg, load_state(cfg), {"/raw/1.jsonl": 1}, "n1", "c1")
    consume_without_training(cfg, load_state(cfg), {"/raw/2.jsonl": 5}, "n2", {"kind": "no_usable_documents", "kept": 0})
    state = load_state(cfg)
    assert state["history"][-1]["decision"] == "no usable data" and state["latest"]["run_id"] == "n1"
    assert state["consumed"] == {"/raw/1.jsonl": 1, "/raw/2.jsonl": 5}


def test_a_rejected_held_night_leaves_held_and_latest_stays(tmp_path):
    from pipeline_lib.nightly import NotHeld, commit_night, load_state, reject_held

    cfg = cfg_at(str(tmp_path))
    commit_night(cfg, load_state(cfg), {"a.jsonl": 1}, "n1", "/ck1")
    commit_night(cfg, load_state(cfg), {"b.jsonl": 1}, "n2", "/ck2", decision="held")
    state = reject_held(cfg, "n2", who="carol", reason="bad scrape")
    assert state["held"] == [] and state["latest"]["run_id"] == "n1"
    assert state["history"][-1]["decision"] == "rejected by hand"
    assert state["history"][-1]["decided_by"]["who"] == "carol"
    assert state["ledger"]["b.jsonl"]["status"] == "carried"  # the data was not judged: it trains tomorrow
    try:
        reject_held(cfg, "n2", who="carol", reason="again")
    except NotHeld as err:
        assert "held: none" in str(err)
    else:
        raise AssertionError("a night no longer held was rejected twice")
