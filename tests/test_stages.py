"""Stage identity (stages.py): exactly the fields that change a stage's output are in its hash."""
from pipeline_lib.config import config_from_dict
from pipeline_lib.stages import stage_hash


def _changes(stage: str, **sections) -> bool:
    return stage_hash(config_from_dict(sections), stage) != stage_hash(config_from_dict({}), stage)


def test_sft_identity_is_its_own_schedule_not_pretrainings():
    for sft in ({"warmup_steps": 3}, {"min_lr": 1e-6}, {"gradient_accumulation_steps": 2},
                {"guard": {"spike_factor": 3.0}}):
        assert _changes("sft", sft=sft), sft
    for training in ({"warmup_steps": 3}, {"min_lr": 1e-6}, {"guard": {"spike_factor": 3.0}}):
        assert not _changes("sft", training=training), training
    assert _changes("sft", training={"shuffle": False}) and not _changes("sft", sft={"allow_demo_data": True})


def test_data_loader_knobs_that_do_not_change_weights_keep_the_pretrain_identity():
    assert _changes("pretrain", training={"shuffle": False})
    for knob in ({"dataset_workers": 4}, {"prefetch_size": 2}, {"profile": True}):
        assert not _changes("pretrain", training=knob), knob
