"""Stage identity (stages.py): exactly the fields that change a stage's output are in its hash; the same
input files reached through another folder keep the stage's identity."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from pipeline_lib import stages
from pipeline_lib.config import config_from_dict
from pipeline_lib.config.identity import stage_hash

ROOT = Path(__file__).resolve().parents[1]


def _copy_inputs(dest: Path) -> dict:
    (dest / "eval").mkdir(parents=True)
    shutil.copy(ROOT / "configs/data/tiny_sft.jsonl", dest / "tiny_sft.jsonl")
    shutil.copy(ROOT / "configs/eval/domain_qa.jsonl", dest / "eval" / "domain_qa.jsonl")
    return {"sft": {"inputs": [str(dest / "tiny_sft.jsonl")]},
            "evaluate": {"prompt_files": [str(dest / "eval" / "domain_qa.jsonl")]}}


def test_sft_and_evaluate_identity_follow_file_contents_not_their_folder(tmp_path):
    a, b = config_from_dict(_copy_inputs(tmp_path / "a")), config_from_dict(_copy_inputs(tmp_path / "b"))
    for stage in ("sft", "evaluate"):
        assert stage_hash(a, stage) == stage_hash(b, stage)
    (tmp_path / "b" / "tiny_sft.jsonl").write_text('{"prompt": "p", "response": "r"}\n')
    assert stage_hash(a, "sft") != stage_hash(b, "sft")  # edited data: the stage reruns




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


def test_a_row_naming_a_function_that_does_not_exist_fails_naming_the_entry(monkeypatch):
    bad = dataclasses.replace(stages.SPECS["data"], figures="pipeline_lib.key_figures:no_such_figures")
    monkeypatch.setitem(stages.SPECS, "data", bad)
    with pytest.raises(AttributeError, match=r"'pipeline_lib.key_figures:no_such_figures'.*Fix: name an existing"):
        stages.key_figures("data", {"tokens": 1})


def test_unmet_upstream_names_the_stage_the_run_lacks_and_the_fix(tmp_path):
    from pipeline_lib.storage import Manifest, RunPaths, write_manifest

    paths = RunPaths(str(tmp_path), "r1")
    assert stages.unmet_upstream(paths, ["data", "pretrain", "evaluate"]) is None  # data runs first
    why = stages.unmet_upstream(paths, ["pretrain"])
    assert "stage 'pretrain' reads the 'data' stage's output" in why and "run r1 has no finished 'data'" in why
    assert "--stages data,pretrain" in why
    assert "--stages data,pretrain,sft,export" in stages.unmet_upstream(paths, ["export"])
    write_manifest(paths.stage_uri("data"), Manifest("data", "r1", "h"))
    assert stages.unmet_upstream(paths, ["pretrain", "evaluate"]) is None  # data finished earlier in the run
    assert "'sft' stage" in stages.unmet_upstream(paths, ["export"])
