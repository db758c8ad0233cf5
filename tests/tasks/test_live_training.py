"""The live training view: re-rendered from the growing metrics.jsonl, rate-limited, kept on failure."""
import json

from pipeline_lib.storage import RunPaths

from tasks.live_training import LiveTraining


def write_steps(path, first, last):
    with open(path, "a") as fh:
        for s in range(first, last + 1):
            fh.write(json.dumps({"step": s, "loss": 5.0 / s, "lr": 1e-3}) + "\n")


def test_updates_while_training_at_most_every_interval_and_once_more_on_failure(tmp_path):
    paths = RunPaths(str(tmp_path / "runs"), "r1")
    folder = tmp_path / "runs" / "r1" / "pretrain"
    folder.mkdir(parents=True)
    published, seen = [], []
    live = LiveTraining("pretrain", paths, lambda *a: seen.append(a), every_s=3600,
                        publish=lambda aid, md, stage: published.append(md) or "a1")
    write_steps(folder / "metrics.jsonl", 1, 2)
    live("train", 2, 10)
    assert len(published) == 1 and "step 2 of 10" in published[0] and "data:image/png;base64," in published[0]
    write_steps(folder / "metrics.jsonl", 3, 4)
    live("train", 4, 10)
    assert len(published) == 1  # within the interval: no new render
    assert seen == [("train", 2, 10), ("train", 4, 10)]  # the progress bar still sees every tick
    live.finish(failed=True)
    assert len(published) == 2 and "failed, step 4 of 10" in published[-1] and "| 4 | 1.25 |" in published[-1]


def test_a_cached_stage_publishes_nothing(tmp_path):
    paths = RunPaths(str(tmp_path / "runs"), "r2")
    folder = tmp_path / "runs" / "r2" / "pretrain"
    folder.mkdir(parents=True)
    write_steps(folder / "metrics.jsonl", 1, 3)  # from the earlier, finished attempt
    published = []
    live = LiveTraining("pretrain", paths, None, publish=lambda aid, md, stage: published.append(md) or "a1")
    live.finish(failed=False)
    assert published == []


def test_the_preflight_is_labelled_as_such_until_its_verdict_and_the_overview_gets_each_update(tmp_path):
    from pipeline_lib.train.preflight import PREFLIGHT_FILE

    paths = RunPaths(str(tmp_path / "runs"), "r3")
    folder = tmp_path / "runs" / "r3" / "pretrain"
    folder.mkdir(parents=True)
    published, told = [], []
    live = LiveTraining("pretrain", paths, None, every_s=0, publish=lambda aid, md, stage: published.append(md) or "a1",
                        tokens_per_step=2048, preflight_steps=5, on_update=lambda *a: told.append(a))
    with open(folder / "metrics.jsonl", "a") as fh:
        for s in (1, 2, 3):
            fh.write(json.dumps({"step": s, "loss": 7.0, "step_time_ms": 500.0}) + "\n")
    live("train", 3, 1200)
    assert "preflight, step 3 of 5 (of 1,200 steps), loss 7, 6,144 tokens seen, about 10 min left" in published[-1]
    assert "training, step" not in published[-1] and "The preflight:" in published[-1]
    assert told[-1][:2] == ("pretrain", "preflight, step 3 of 5 (of 1,200 steps), loss 7, 6,144 tokens seen, "
                                        "about 10 min left")
    (folder / PREFLIGHT_FILE).write_text("{}")  # the verdict: training goes on
    write_steps(folder / "metrics.jsonl", 4, 4)
    live("train", 4, 1200)
    assert "training, step 4 of 1,200" in published[-1] and "8,192 tokens seen" in published[-1]
    assert told[-1][1].startswith("training, step 4 of 1,200")
    # a parent whose stage runs on a worker reads the same line back from the card (flows/dispatch.py)
    from tasks.live_training import card_line

    assert [card_line(md) for md in published[-2:]] == [t[1] for t in told[-2:]]
    assert card_line("# Run `r3`\n\n1 of 2 stages done") is None and card_line(None) is None


def test_the_live_card_prints_its_time_in_utc_labelled_whatever_the_workers_zone(monkeypatch):
    """Issue 48 item 7: every artifact in one zone, labelled (the overview's times are UTC too)."""
    import datetime as dt
    import time

    from tasks.live_training import render

    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    try:
        head = render("pretrain", [{"step": 1, "loss": 2.0}], 10, None, "training").splitlines()[0]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    stamp = head.rsplit("(updated ", 1)[1].rstrip(")")
    assert stamp.endswith(" UTC"), head
    shown = dt.datetime.strptime(stamp[:-4], "%H:%M:%S").time()
    now = dt.datetime.now(dt.timezone.utc)
    apart = (now.hour * 3600 + now.minute * 60 + now.second) - (shown.hour * 3600 + shown.minute * 60 + shown.second)
    assert min(apart % 86400, -apart % 86400) < 120, (stamp, now)  # UTC's clock, not Shanghai's 8 h ahead
