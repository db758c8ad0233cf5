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
        assert json.loads(Path(lock_uri(cfg)).read_text()) == mine
        with pytest.raises(NightBusy) as busy:
            with night_lock(cfg, "nightly-2026-12-02"):
                pass
        assert busy.value.holder == mine
        assert f"another night holds the nightly lock of {tmp_path}: nightly-2026-12-01" in str(busy.value)
        assert "Fix: " in str(busy.value)
        with night_lock(cfg, "nightly-2026-12-01"):  # the same night again (a rerun after a kill) takes it over
            pass
    assert not Path(lock_uri(cfg)).exists()  # given back


def test_a_stale_nightly_lock_is_taken_over(tmp_path):
    import datetime as dt
    import socket
    import subprocess
    import sys

    from pipeline_lib.nightly import LOCK_STALE_HOURS, lock_uri, night_lock

    cfg = cfg_at(str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    now = dt.datetime.now(dt.timezone.utc)
    old = (now - dt.timedelta(hours=LOCK_STALE_HOURS + 1)).isoformat()
    for holder in ({"run_id": "n0", "host": socket.gethostname(), "pid": int(gone), "started_at": now.isoformat()},
                   {"run_id": "n0", "host": "another-host", "pid": 1, "started_at": old}):
        Path(lock_uri(cfg)).parent.mkdir(parents=True, exist_ok=True)
        Path(lock_uri(cfg)).write_text(json.dumps(holder))
        said = []
        with night_lock(cfg, "n1", said.append) as mine:
            assert json.loads(Path(lock_uri(cfg)).read_text()) == mine
        assert said and said[0].startswith("n1: taking over the nightly lock of n0: "), said
