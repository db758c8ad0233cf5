"""planner.disk's month of nights: without retention every night keeps everything; with nightly.retention the
weights of keep_promoted + held_days nights, one night's training checkpoints, the replayed data and every night's
logs."""
from pathlib import Path

from pipeline_lib.config import load_config
from pipeline_lib.planner.disk import month_of_nights, night_disk

SHIPPED_7B = str(Path(__file__).resolve().parents[2] / "configs/pipelines/llama2-7b-4x64gb.yaml")
WEIGHTS_7B = 6_738_415_616 * 4          # Llama-2 7B's published parameter count, fp32
CHECKPOINT_7B = 80_864_182_272          # the 4 rank files of one checkpoint, fp32 weights + AdamW moments (disk test)


def test_a_7b_month_without_and_with_retention():
    cfg = load_config(SHIPPED_7B)  # keep_checkpoint_max 3, 10,000 steps saved every 500: 3 checkpoints stay a night
    night = night_disk(cfg, night_tokens=0)
    assert (night.weights, night.checkpoint, night.kept) == (WEIGHTS_7B, CHECKPOINT_7B, 3)
    month = month_of_nights(cfg, 30, night_tokens=0)
    assert month.without == 30 * (WEIGHTS_7B + 3 * CHECKPOINT_7B + night.small)
    # keep_promoted 3 + held_days 7 weights at most, the newest night's 3 checkpoints, the logs of all 30
    assert month.weights_kept == 10
    assert month.retained == 10 * WEIGHTS_7B + 3 * CHECKPOINT_7B + 30 * night.small
    assert round(month.without / 1e12, 1) == 8.1 and round((month.retained - 30 * night.small) / 1e9) == 512


def test_fewer_saves_than_kept_checkpoints(cfg7b_raw):
    """A checkpoint every save_steps and one at the run's end (MindSpore's checkpoint callback saves the last step):
    600 steps saved every 500 leave 2, 400 steps leave 1, whatever keep_checkpoint_max allows."""
    from pipeline_lib.config import config_from_dict

    for steps, kept in ((600, 2), (400, 1), (1500, 3), (10_000, 3)):
        cfg = config_from_dict({**cfg7b_raw, "training": {**cfg7b_raw["training"], "steps": steps, "save_steps": 500}})
        assert night_disk(cfg, 0).kept == kept, steps


def test_the_lineage_schedule_keeps_two_weights_files_a_night(cfg7b_raw):
    from pipeline_lib.config import config_from_dict

    cfg = config_from_dict({**cfg7b_raw, "nightly": {"lr_schedule": "lineage"}})
    assert night_disk(cfg, 0).weights == 2 * WEIGHTS_7B  # decayed (handed on) + stable-phase (continued)


def test_replayed_data_and_a_short_lineage(cfg7b_raw):
    from pipeline_lib.config import config_from_dict

    cfg = config_from_dict({**cfg7b_raw, "data": {"replay": {"fraction": 0.2}},
                            "nightly": {"retention": {"replay_nights": 5, "keep_promoted": 2, "held_days": 3}}})
    night = night_disk(cfg, night_tokens=1_000_000)
    assert night.data == 1_000_000 * (4 + 1.5)  # MindRecord int32 + cleaned text (the planner's estimates)
    month = month_of_nights(cfg, 30, night_tokens=1_000_000)
    assert month.data_kept == 5 + 3  # the replayed nights + the held ones that may still be promoted
    assert month.retained == 5 * night.weights + night.training + 8 * night.data + 30 * night.small
    short = month_of_nights(cfg, 4, night_tokens=1_000_000)  # within the horizon only optimizer state goes
    assert short.without == 4 * night.total and short.retained == short.without - 3 * night.training
    assert month.horizon == 8 and month.growth == night.small
    every = config_from_dict({**cfg7b_raw, "data": {"replay": {"fraction": 0.2}}})  # replay_nights null
    unbounded = month_of_nights(every, 30, night_tokens=1_000_000)
    assert unbounded.data_kept == 30 and unbounded.growth == unbounded.night.small + unbounded.night.data


def test_plan_prints_the_month(capsys):
    from pipeline_lib.planner.cli import plan_main

    assert plan_main(["--model", SHIPPED_7B, "--night-tokens", "163840000"]) == 0
    out = capsys.readouterr().out
    assert "disk, a month of nights (30 trained nights at this layout; one night leaves weights 27.0 GB, training " \
           "checkpoints 3 x 80.9 GB = 242.6 GB, data 901.1 MB for 163,840,000 new tokens" in out
    assert "  without retention: 30 x 270.5 GB = 8.1 TB" in out
    assert "  with nightly.retention: 513.5 GB = weights of at most 10 nights" in out
