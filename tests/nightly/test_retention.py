"""nightly.retention: the plan on constructed states and folders with known answers, applying it (symbolic links never
followed, a dry run removes nothing, the tombstone and the state), the readers of a thinned night, `llm-pipeline gc`'s
output and exit codes, and the same on S3."""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.nightly import load_state, update_state
from pipeline_lib.nightly.retention import (DATA, TRAINING, WEIGHTS, Folder, after_night, apply_plan, gc, kind_of,
                                            plan_for, plan_retention, removed_by_retention, retention_note)
from pipeline_lib.storage import join, store_for

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 12, 4, 3, 0, tzinfo=dt.timezone.utc)

# A night's folder as the stages leave it (sizes differ per file, so a sum names exactly which files went)
LAYOUT = {
    "pretrain/checkpoint/merged/llama-weights.ckpt": 1000,      # weights
    "pretrain/checkpoint/rank_0/llama_rank_0-1_3.ckpt": 3000,   # training checkpoints (optimizer state)
    "pretrain/checkpoint/rank_0/llama_rank_0-1_6.ckpt": 3001,
    "pretrain/checkpoint/rank_1/llama_rank_1-1_6.ckpt": 3002,
    "pretrain/checkpoint/tokenizer.model": 40,
    "pretrain/manifest.json": 30,
    "pretrain/metrics.jsonl": 31,
    "data/cleaned/part-00000.jsonl.gz": 200,                     # data
    "data/mindrecord/train/shard-00000.mindrecord": 400,
    "data/mindrecord/train/shard-00000.mindrecord.db": 50,
    "data/mindrecord/heldout/shard-00000.mindrecord": 60,
    "data/tokenizer/tokenizer.model": 41,
    "data/manifest.json": 32,
    "data/stats.json": 33,
    "evaluate/metrics.json": 34,
    "logs/pretrain.log": 35,
    "changes.md": 36,
}
BY_KIND = {k: sum(s for rel, s in LAYOUT.items() if kind_of(rel) == k and "heldout" not in rel)
           for k in (WEIGHTS, TRAINING, DATA)}
HELDOUT = "data/mindrecord/heldout"


def test_a_training_checkpoints_optimizer_part_is_a_training_checkpoint():
    assert kind_of("pretrain/checkpoint_optimizer/rank_0/llama_rank_0-1_6.ckpt") == TRAINING
    assert kind_of("pretrain/checkpoint_optimizer/meta.json") is None


def night_id(i: int) -> str:
    return f"nightly-2026-11-{i:02d}"


def cfg_at(root: str, endpoint: str | None = None, **retention):
    return config_from_dict({"run": {"output_root": root, "s3_endpoint_url": endpoint},
                             "nightly": {"retention": retention}})


def history(decisions: dict[int, str], root: str) -> list[dict]:
    return [{"run_id": night_id(i), "decision": d, "files": 1,
             "checkpoint": join(root, night_id(i), "pretrain/checkpoint/merged/llama-weights.ckpt")
             if d in ("promoted", "held") else None} for i, d in decisions.items()]


def make_state(root: str, decisions: dict[int, str], latest: int, held_days_ago: dict[int, float] = ()) -> dict:
    weights = lambda i: join(root, night_id(i), "pretrain/checkpoint/merged/llama-weights.ckpt")  # noqa: E731
    return {"consumed": {}, "history": history(decisions, root),
            "latest": {"run_id": night_id(latest), "checkpoint": weights(latest),
                       "tokenizer": join(root, night_id(latest), "pretrain/checkpoint/tokenizer.model")},
            "reference_heldout": join(root, night_id(1), HELDOUT),
            "held": [{"run_id": night_id(i), "checkpoint": weights(i), "tokenizer": None,
                      "finished_at": (NOW - dt.timedelta(days=days)).isoformat()}
                     for i, days in dict(held_days_ago).items()]}


def folders(nights) -> dict[str, Folder]:
    return {night_id(i): Folder(dict(LAYOUT)) for i in nights}


def write_root(root: Path, state: dict, nights, sampled: bool = True) -> None:
    """The nights' folders, the state, and (sampled) the data screen's sample of each promoted night, as the nightly
    leaves them (screen_sample.keep_accepted at the promotion)."""
    from pipeline_lib.nightly.screen_sample import sample_uri

    for i in nights:
        for rel, size in LAYOUT.items():
            path = root / night_id(i) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * size)
    cfg = cfg_at(str(root))
    update_state(cfg, lambda _: json.loads(json.dumps(state)))
    for night in state["history"] if sampled else []:
        if night["decision"] == "promoted":
            store_for(sample_uri(cfg, night["run_id"])).put_bytes(sample_uri(cfg, night["run_id"]), b"{}\n")


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_size for p in sorted(root.rglob("*"))
            if not p.is_dir() or p.is_symlink()}


# ------------------------------------------------------------------ the plan: known answers

def test_ten_promoted_nights_keep_three_weights_plus_latest_reference_heldout_and_replayed_rows(tmp_path):
    root = str(tmp_path)
    nights = range(1, 11)
    latest = 5  # a person went back to night 5: latest is outside the newest three
    state = make_state(root, {i: "promoted" for i in nights}, latest)
    policy = cfg_at(root, keep_promoted=3, replay_nights=2).nightly.retention
    plan = plan_retention(policy, state, folders(nights), output_root=root, now=NOW, replay_on=True)

    lost_weights = {n.run_id for n in plan.nights if n.remove.get(WEIGHTS)}
    assert lost_weights == {night_id(i) for i in range(1, 8)} - {night_id(latest)}  # the 7 oldest but latest
    lost_optimizer = {n.run_id for n in plan.nights if n.remove.get(TRAINING)}
    assert lost_optimizer == {night_id(i) for i in range(1, 10)}  # only the newest night keeps its optimizer state
    lost_rows = {n.run_id for n in plan.nights if n.remove.get(DATA)}
    assert lost_rows == {night_id(i) for i in range(1, 9)}  # replay reads the newest 2 promoted nights
    first = plan.night(night_id(1))
    assert not any(rel.startswith(HELDOUT) for rel in first.files())  # reference_heldout is never removed
    assert "reference_heldout" in first.pinned[DATA]
    assert plan.night(night_id(2)).remove[DATA].keys() >= {f"{HELDOUT}/shard-00000.mindrecord"}  # not pinned there
    assert plan.night(night_id(latest)).why[WEIGHTS] == "latest"
    # bytes: per night exactly the files of its kinds (sizes differ per file)
    assert plan.night(night_id(3)).bytes() == BY_KIND[WEIGHTS] + BY_KIND[TRAINING] + BY_KIND[DATA] + 60
    assert plan.night(night_id(10)).bytes() == 0
    assert plan.total == sum(n.bytes() for n in plan.nights)


def test_with_replay_off_no_rows_are_kept_but_the_fixed_heldout_split(tmp_path):
    root = str(tmp_path)
    state = make_state(root, {1: "promoted", 2: "promoted"}, 2)
    plan = plan_retention(cfg_at(root).nightly.retention, state, folders([1, 2]), output_root=root, now=NOW)
    assert plan.night(night_id(1)).bytes(DATA) == BY_KIND[DATA]  # the held-out split stays
    assert plan.night(night_id(2)).bytes(DATA) == BY_KIND[DATA] + 60
    assert plan.night(night_id(2)).bytes(WEIGHTS) == 0 and plan.night(night_id(1)).bytes(WEIGHTS) == 0


def test_held_candidates_older_than_held_days_lose_their_weights_and_leave_held(tmp_path):
    root = str(tmp_path)
    decisions = {1: "promoted", 2: "held", 3: "held", 4: "promoted", 5: "held"}
    state = make_state(root, decisions, 4, held_days_ago={2: 10.0, 3: 6.5, 5: 0.2})
    plan = plan_retention(cfg_at(root, held_days=7).nightly.retention, state, folders(decisions), output_root=root,
                          now=NOW)
    assert plan.expire_held == [night_id(2)]
    assert {n.run_id for n in plan.nights if n.remove.get(WEIGHTS)} == {night_id(2)}
    assert "held 6.5 of nightly.retention.held_days=7 days" == plan.night(night_id(3)).why[WEIGHTS]
    # the newest night that trained (a held one) keeps its optimizer state; every other night's goes
    assert {n.run_id for n in plan.nights if not n.remove.get(TRAINING)} == {night_id(5)}


def test_the_newest_trained_night_keeps_its_optimizer_state_after_a_night_that_trained_nothing(tmp_path):
    root = str(tmp_path)
    decisions = {1: "promoted", 2: "promoted", 3: "no new data"}
    state = make_state(root, decisions, 2)
    plan = plan_retention(cfg_at(root).nightly.retention, state, folders(decisions), output_root=root, now=NOW)
    assert not plan.night(night_id(2)).remove.get(TRAINING)
    assert plan.night(night_id(1)).bytes(TRAINING) == BY_KIND[TRAINING]
    assert plan.night(night_id(3)).bytes(WEIGHTS) == BY_KIND[WEIGHTS]  # a folder left by a night that trained nothing


def test_a_kept_nights_weights_are_the_file_its_history_names_even_a_rank_file(tmp_path):
    """An earlier version's night handed on a rank file: for the newest keep_promoted nights that file stays."""
    root = str(tmp_path)
    state = make_state(root, {1: "promoted", 2: "promoted", 3: "promoted"}, 3)
    for night in state["history"]:
        night["checkpoint"] = join(root, night["run_id"], "pretrain/checkpoint/rank_0/llama_rank_0-1_6.ckpt")
    plan = plan_retention(cfg_at(root, keep_promoted=2).nightly.retention, state, folders([1, 2, 3]),
                          output_root=root, now=NOW)
    assert set(plan.night(night_id(2)).remove[TRAINING]) == {"pretrain/checkpoint/rank_0/llama_rank_0-1_3.ckpt",
                                                            "pretrain/checkpoint/rank_1/llama_rank_1-1_6.ckpt"}
    assert "rank_0/llama_rank_0-1_6.ckpt" in " ".join(plan.night(night_id(1)).remove[TRAINING])


def test_a_path_another_part_of_the_nightly_keeps_on_latest_is_pinned(tmp_path):
    """commit_night's `record` (the schedule's, the screen's ...) may name a file of a night: it stays."""
    root = str(tmp_path)
    state = make_state(root, {1: "promoted", 2: "held", 3: "promoted"}, 1, held_days_ago={2: 1})
    stable = join(root, night_id(1), "pretrain/checkpoint/rank_0/llama_rank_0-1_3.ckpt")
    state["latest"]["schedule"] = {"continue_from": [stable], "note": "not/a/path"}
    plan = plan_retention(cfg_at(root).nightly.retention, state, folders([1, 2, 3]), output_root=root, now=NOW)
    assert set(plan.night(night_id(1)).remove[TRAINING]) == {"pretrain/checkpoint/rank_0/llama_rank_0-1_6.ckpt",
                                                            "pretrain/checkpoint/rank_1/llama_rank_1-1_6.ckpt"}
    assert plan.night(night_id(1)).pinned[TRAINING] == "named on latest in the nightly state"


def test_a_running_night_and_an_undecided_folder_are_not_touched(tmp_path):
    root = str(tmp_path)
    state = make_state(root, {1: "promoted", 2: "promoted"}, 2)
    plan = plan_retention(cfg_at(root).nightly.retention, state, folders([1, 2, 3]), output_root=root, now=NOW,
                          running=night_id(1))
    assert plan.night(night_id(1)) is None and "nightly lock" in plan.untouched[night_id(1)]
    assert plan.night(night_id(3)) is None  # in no history entry: failed and resumable, or running
    assert plan.total == plan.night(night_id(2)).bytes()


# ------------------------------------------------------------------ applying it

def test_gc_removes_what_the_plan_says_and_leaves_a_tombstone_and_a_state_entry(tmp_path):
    root = tmp_path / "runs"
    nights = range(1, 6)
    write_root(root, make_state(str(root), {i: "promoted" for i in nights}, 5), nights)
    cfg = cfg_at(str(root), keep_promoted=2)
    before = snapshot(root)
    planned = plan_for(cfg, now=NOW)
    applied = gc(cfg, log=lambda line: None)
    after = snapshot(root)
    gone = {p for p in before if p not in after and not p.startswith("_nightly/")}  # (state generations rotate)
    assert gone == {f"{n.run_id}/{rel}" for n in planned.nights for rel in n.files()}
    assert applied.total == sum(before[p] for p in gone) == planned.total
    assert (root / night_id(1) / "pretrain/checkpoint/tokenizer.model").exists()  # small files stay
    assert (root / night_id(1) / HELDOUT / "shard-00000.mindrecord").exists()
    assert not (root / night_id(1) / "pretrain/checkpoint/rank_0").exists()  # emptied folders go too
    assert (root / night_id(5) / "pretrain/checkpoint/rank_0/llama_rank_0-1_6.ckpt").exists()
    stone = json.loads((root / night_id(2) / "retention.json").read_text())
    assert stone["removed"][WEIGHTS]["bytes"] == BY_KIND[WEIGHTS] and "removing" not in stone["removed"][WEIGHTS]
    assert removed_by_retention(cfg, night_id(4)).keys() == {TRAINING, DATA}
    entry = load_state(cfg)["retention"][-1]
    assert entry["status"] == "done" and entry["freed"] == applied.total
    assert entry["nights"] == {r: b for r, b in applied.freed.items()}
    again = gc(cfg, log=lambda line: None)  # nothing left to remove
    runs = lambda files: {p: s for p, s in files.items() if not p.startswith("_nightly")}  # noqa: E731
    assert again.total == 0 and runs(snapshot(root)) == runs(after)


def test_a_promoted_nights_cleaned_text_stays_until_the_data_screen_sampled_it(tmp_path):
    from pipeline_lib.nightly.screen_sample import sample_uri

    root = tmp_path / "runs"
    write_root(root, make_state(str(root), {1: "promoted", 2: "promoted"}, 2), [1, 2], sampled=False)
    cfg = cfg_at(str(root))
    plan = plan_for(cfg, now=NOW)
    assert plan.unsampled == [night_id(1), night_id(2)] and plan.total == BY_KIND[TRAINING]
    assert plan.night(night_id(1)).why[DATA] == "the data screen has not sampled its accepted documents yet"
    store_for(sample_uri(cfg, night_id(1))).put_bytes(sample_uri(cfg, night_id(1)), b"{}\n")
    assert plan_for(cfg, now=NOW).night(night_id(1)).bytes(DATA) == BY_KIND[DATA]
    cfg.nightly.screen.enabled = False  # no screen: nothing waits for a sample
    assert plan_for(cfg, now=NOW).unsampled == []


def test_a_dry_run_removes_nothing_and_writes_nothing(tmp_path):
    root = tmp_path / "runs"
    write_root(root, make_state(str(root), {1: "promoted", 2: "promoted"}, 2), [1, 2])
    cfg = cfg_at(str(root))
    before, state = snapshot(root), load_state(cfg)
    applied = gc(cfg, dry_run=True)
    assert applied.plan.total > 0 and applied.total == 0
    assert snapshot(root) == before and load_state(cfg) == state


def test_a_link_inside_a_run_folder_pointing_outside_is_not_followed(tmp_path):
    root, outside = tmp_path / "runs", tmp_path / "precious"
    write_root(root, make_state(str(root), {1: "promoted", 2: "promoted"}, 2), [1, 2])
    outside.mkdir()
    (outside / "llama_rank_0-1_6.ckpt").write_bytes(b"x" * 3001)
    (outside / "keep.ckpt").write_bytes(b"y" * 7)
    night = root / night_id(1) / "pretrain/checkpoint"
    (night / "rank_0/elsewhere.ckpt").symlink_to(outside / "keep.ckpt")
    (night / "rank_7").symlink_to(outside, target_is_directory=True)
    cfg = cfg_at(str(root))
    plan = plan_for(cfg, now=NOW)
    assert set(plan.night(night_id(1)).links) == {"pretrain/checkpoint/rank_0/elsewhere.ckpt",
                                                   "pretrain/checkpoint/rank_7"}
    assert not any("rank_7" in rel or "elsewhere" in rel for rel in plan.night(night_id(1)).files())

    # after the plan, a folder on the way of a planned file is swapped for a link to a look-alike outside
    rank0 = night / "rank_0"
    moved = tmp_path / "moved-rank_0"
    rank0.rename(moved)
    rank0.symlink_to(outside, target_is_directory=True)
    applied = apply_plan(cfg, plan, log=lambda line: None)
    assert (outside / "llama_rank_0-1_6.ckpt").stat().st_size == 3001 and (outside / "keep.ckpt").exists()
    assert any("rank_0 on its way is a symbolic link" in r for r in applied.refused), applied.refused
    assert (moved / "llama_rank_0-1_6.ckpt").exists()  # the real one was not reached through the link either
    assert os.path.islink(night / "rank_7") and os.path.islink(rank0)  # links are left as they are


@pytest.mark.parametrize("cut", ["before the second file", "after the last file"])
def test_a_pass_cut_short_says_so_and_the_next_pass_finishes_it(tmp_path, monkeypatch, cut):
    from pipeline_lib.nightly import retention
    from pipeline_lib.nightly.retention import removed_lines

    root = tmp_path / "runs"
    write_root(root, make_state(str(root), {1: "promoted", 2: "promoted"}, 2), [1, 2])
    cfg = cfg_at(str(root))
    real, calls = retention._unlink_local, []
    night1_files = len(plan_for(cfg, now=NOW).night(night_id(1)).files())

    def dies(*args):  # the process is stopped mid-pass
        calls.append(args)
        if cut == "before the second file" and len(calls) == 2:
            raise KeyboardInterrupt
        real(*args)
        if cut == "after the last file" and len(calls) == night1_files:
            raise KeyboardInterrupt

    monkeypatch.setattr(retention, "_unlink_local", dies)
    with pytest.raises(KeyboardInterrupt):
        gc(cfg, log=lambda line: None)
    said = removed_by_retention(cfg, night_id(1))
    assert any(e.get("removing") for e in said.values())
    assert any("was interrupted (the next pass finishes it)" in line for line in removed_lines(cfg, night_id(1)))
    assert load_state(cfg)["retention"][-1]["status"] == "removing"
    monkeypatch.setattr(retention, "_unlink_local", real)
    gc(cfg, log=lambda line: None)
    said = removed_by_retention(cfg, night_id(1))
    assert not any(e.get("removing") for e in said.values())
    assert sum(e["bytes"] for e in said.values()) == BY_KIND[TRAINING] + BY_KIND[DATA]
    assert not (root / night_id(1) / "pretrain/checkpoint/rank_0").exists()
    assert [e["status"] for e in load_state(cfg)["retention"]] == ["removing", "done"]


def test_a_planned_file_changed_since_the_plan_is_refused(tmp_path):
    root = tmp_path / "runs"
    write_root(root, make_state(str(root), {1: "promoted", 2: "promoted"}, 2), [1, 2])
    cfg = cfg_at(str(root))
    plan = plan_for(cfg, now=NOW)
    grown = root / night_id(1) / "data/cleaned/part-00000.jsonl.gz"
    grown.write_bytes(b"z" * 999)
    applied = apply_plan(cfg, plan, log=lambda line: None)
    assert grown.exists() and any("999 bytes, the plan saw 200" in r for r in applied.refused)
    said = removed_by_retention(cfg, night_id(1))[DATA]  # the tombstone names only what went
    assert "data/cleaned/part-00000.jsonl.gz" not in said["files"] and "removing" not in said
    assert said["files"] == ["data/mindrecord/train/shard-00000.mindrecord",
                             "data/mindrecord/train/shard-00000.mindrecord.db"]


def test_a_night_promoted_by_hand_after_the_plan_keeps_its_weights(tmp_path):
    """The intent is re-planned on the newest state in the same conditional write: a held candidate promoted
    between the plan and the removal is latest by then, and its weights stay."""
    root = tmp_path / "runs"
    decisions = {1: "promoted", 2: "held", 3: "promoted"}
    write_root(root, make_state(str(root), decisions, 3, held_days_ago={2: 30}), decisions)
    cfg = cfg_at(str(root), held_days=7)
    plan = plan_for(cfg, now=NOW)
    assert plan.night(night_id(2)).remove.get(WEIGHTS)
    from pipeline_lib.nightly import promote_held

    promote_held(cfg, night_id(2), who="ops", reason="fine after all")
    apply_plan(cfg, plan, log=lambda line: None)
    assert (root / night_id(2) / "pretrain/checkpoint/merged/llama-weights.ckpt").exists()
    assert load_state(cfg)["latest"]["run_id"] == night_id(2)


def test_an_expired_held_night_can_no_longer_be_promoted(tmp_path):
    from pipeline_lib.nightly import NotHeld, promote_held

    root = tmp_path / "runs"
    decisions = {1: "promoted", 2: "held", 3: "held"}
    write_root(root, make_state(str(root), decisions, 1, held_days_ago={2: 8, 3: 1}), decisions)
    cfg = cfg_at(str(root), held_days=7)
    gc(cfg, log=lambda line: None)
    assert [h["run_id"] for h in load_state(cfg)["held"]] == [night_id(3)]
    with pytest.raises(NotHeld):
        promote_held(cfg, night_id(2), who="ops", reason="too late")
    assert load_state(cfg)["retention"][-1]["expired_held"] == [night_id(2)]


def test_a_failed_pass_after_a_night_is_a_warning(tmp_path):
    root = tmp_path / "runs"
    write_root(root, make_state(str(root), {1: "promoted", 2: "promoted"}, 2), [1, 2])
    cfg = cfg_at(str(root))
    for gen in (root / "_nightly/state").iterdir():
        gen.write_text("{not json")

    class Log:
        def __init__(self):
            self.warnings, self.infos = [], []

        def warning(self, line):
            self.warnings.append(line)

        def info(self, line):
            self.infos.append(line)

    log = Log()
    assert after_night(cfg, night_id(3), log) is None
    assert len(log.warnings) == 1 and "llm-pipeline gc CONFIG" in log.warnings[0]
    off = cfg_at(str(root), gc_after_night=False)
    assert after_night(off, night_id(3), log) is None and len(log.warnings) == 1


# ------------------------------------------------------------------ what reads a thinned night

def test_replay_skips_nights_whose_rows_retention_removed_and_status_says_why(tmp_path):
    from pipeline_lib.nightly.tonight import replay_runs

    root = tmp_path / "runs"
    nights = range(1, 5)
    write_root(root, make_state(str(root), {i: "promoted" for i in nights}, 4), nights)
    cfg = config_from_dict({"run": {"output_root": str(root)}, "data": {"replay": {"fraction": 0.2}},
                            "nightly": {"retention": {"replay_nights": 2}}})
    state = load_state(cfg)
    assert replay_runs(cfg, state) == [night_id(3), night_id(4)]
    gc(cfg, log=lambda line: None)
    everyone = cfg.model_copy(deep=True)
    everyone.nightly.retention.replay_nights = None  # replay would read every night, but 1 and 2 lost their rows
    assert replay_runs(everyone, state) == [night_id(3), night_id(4)]
    note = retention_note(cfg, night_id(1), "pretrain", "output missing: checkpoint/rank_0/llama_rank_0-1_3.ckpt")
    assert note.startswith("finished; its training checkpoints were removed by nightly.retention on ")
    assert retention_note(cfg, night_id(4), "pretrain", "output missing: checkpoint/rank_0/x.ckpt") is None


# ------------------------------------------------------------------ the command

def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pipeline_lib.cli", "gc", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_gc_command_prints_per_night_and_total_and_its_exit_codes(tmp_path):
    root = tmp_path / "runs"
    nights = range(1, 5)
    write_root(root, make_state(str(root), {i: "promoted" for i in nights}, 4), nights)
    config = "configs/pipelines/tiny-cpu.yaml"
    dry = run_cli(config, f"run.output_root={root}", "nightly.retention.keep_promoted=2", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    night1 = BY_KIND[WEIGHTS] + BY_KIND[TRAINING] + BY_KIND[DATA]
    night2 = night1 + 60
    night3 = BY_KIND[TRAINING] + BY_KIND[DATA] + 60
    night4 = BY_KIND[DATA] + 60
    total = night1 + night2 + night3 + night4
    lines = dry.stdout.splitlines()
    assert lines[1].startswith(f"  {night_id(1)}: would free {night1 / 1e3:.1f} kB: training checkpoints 9.0 kB")
    assert lines[2].startswith(f"  {night_id(2)}: would free {night2 / 1e3:.1f} kB")
    files = (1 + 3 + 3) + (1 + 3 + 3 + 1) + (3 + 3 + 1) + (3 + 1)  # weights, training, data (+ held-out) per night
    assert lines[-1] == f"total: would free {total / 1e3:.1f} kB ({total:,} bytes in {files} file(s)) -- dry run: " \
                        "nothing was removed"
    assert (root / night_id(1) / "pretrain/checkpoint/merged/llama-weights.ckpt").exists()

    done = run_cli(config, f"run.output_root={root}", "nightly.retention.keep_promoted=2")
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == f"total: freed {total / 1e3:.1f} kB ({total:,} bytes)"
    bad = run_cli(config, f"run.output_root={root}", "nightly.retention.keep_promoted=0")
    assert bad.returncode == 2 and "nightly.retention.keep_promoted" in bad.stderr and bad.stdout == ""


# ------------------------------------------------------------------ S3

def test_gc_on_an_s3_output_root(s3_bucket):
    bucket, endpoint = s3_bucket
    root = f"{bucket}/runs"
    cfg = cfg_at(root, endpoint, keep_promoted=1)
    store = store_for(root, endpoint)
    nights = (1, 2, 3)
    for i in nights:
        for rel, size in LAYOUT.items():
            store.put_bytes(join(root, night_id(i), rel), b"x" * size)
    state = make_state(root, {i: "promoted" for i in nights}, 3)
    update_state(cfg, lambda _: state)
    from pipeline_lib.nightly.screen_sample import sample_uri

    for i in nights:  # the data screen sampled each promoted night
        store.put_bytes(sample_uri(cfg, night_id(i)), b"{}\n")
    dry = gc(cfg, dry_run=True)
    assert dry.total == 0 and len(store.list(root + "/")) == 3 * len(LAYOUT) + 2 + 3  # + the state, its copy, samples
    applied = gc(cfg, log=lambda line: None)
    assert applied.total == dry.plan.total == (2 * (BY_KIND[WEIGHTS] + BY_KIND[TRAINING]) + 3 * BY_KIND[DATA]
                                               + 2 * 60)
    left = set(store.list(root + "/"))
    assert join(root, night_id(1), HELDOUT, "shard-00000.mindrecord") in left
    assert join(root, night_id(3), "pretrain/checkpoint/merged/llama-weights.ckpt") in left
    assert join(root, night_id(3), "pretrain/checkpoint/rank_1/llama_rank_1-1_6.ckpt") in left
    assert join(root, night_id(2), "pretrain/checkpoint/merged/llama-weights.ckpt") not in left
    assert join(root, night_id(1), "evaluate/metrics.json") in left
    assert removed_by_retention(cfg, night_id(2)).keys() == {WEIGHTS, TRAINING, DATA}
    assert load_state(cfg)["retention"][-1]["freed"] == applied.total
