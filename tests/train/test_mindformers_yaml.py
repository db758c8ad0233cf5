"""The generated mindformers yaml: loads with MindFormerConfig and carries the pipeline config's values.

mindformers is imported once per session (~5-8 s); everything else is plain dict checks.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
import yaml

from pipeline_lib.config import config_from_dict
from pipeline_lib.config.load import load_config
from pipeline_lib.train.mindformers_yaml import (build_run_config, count_mindrecord_rows, lora_target_regex,
                                                  write_run_yaml)
from pipeline_lib.config.platform import CPU_MODEL_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mf_config():
    """mindformers.tools.MindFormerConfig (env for logs is set by tests/conftest.py)."""
    from mindformers.tools import MindFormerConfig

    return MindFormerConfig


def cpu_cfg(**sections):
    sections.setdefault("run", {})["device_target"] = "CPU"
    return config_from_dict(sections)


def write_and_load(mf_config, tmp_path, cfg, stage="pretrain", **kw):
    kw.setdefault("dataset_dir", str(tmp_path / "data"))
    kw.setdefault("output_dir", str(tmp_path / "out"))
    kw.setdefault("train_rows", 256)
    path = write_run_yaml(cfg, tmp_path / f"{stage}.yaml", build_run_config(cfg, stage=stage, **kw), stage=stage)
    return path, mf_config(str(path))


def test_pretrain_cpu_yaml_loads_with_pipeline_values(mf_config, tmp_path):
    cfg = cpu_cfg(model={"name": "tiny_x", "n_kv_heads": 2, "rms_norm_eps": 1e-6},
                  training={"steps": 30, "learning_rate": 2e-3, "warmup_steps": 4, "min_lr": 1e-5,
                            "save_steps": 10, "keep_checkpoint_max": 2, "grad_clip": 0.5,
                            "optimizer": {"beta2": 0.99, "eps": 1e-7, "weight_decay": 0.05}},
                  tokenizer={"pad_id": 0, "bos_id": 2, "eos_id": 3})
    path, mf = write_and_load(mf_config, tmp_path, cfg)
    assert path.read_text().startswith("# mindformers run config for stage 'pretrain'")
    assert mf.run_mode == "train" and mf.seed == cfg.run.seed
    assert mf.output_dir == str(tmp_path / "out") and mf.load_checkpoint == "" and mf.resume_training is False
    assert mf.context.mode == 0 and mf.context.device_target == "CPU"
    assert "max_device_memory" not in yaml.safe_load(path.read_text())["context"]  # mindformers fills a default
    assert mf.parallel.parallel_mode == 0 and mf.use_parallel is False
    mc = mf.model.model_config
    assert mf.model.arch.type == "LlamaForCausalLM" and mc.type == "LlamaConfig"
    for key, want in {"seq_length": 64, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "n_kv_heads": 2,
                      "intermediate_size": 176, "vocab_size": 2048, "rms_norm_eps": 1e-6, "pad_token_id": 0,
                      "bos_token_id": 2, "eos_token_id": 3, "compute_dtype": "float32", "use_past": False}.items():
        assert mc[key] == want, key
    for key, want in CPU_MODEL_OVERRIDES.items():
        assert mc[key] == want, key
    assert "pet_config" not in mc
    assert mf.runner_config.sink_mode is False and mf.runner_config.batch_size == 4
    assert mf.runner_config.epochs == 1  # 256 rows / 4 per step = 64 steps per epoch >= 30
    assert mf.runner_wrapper.type == "CPUTrainOneStepCell" and mf.runner_wrapper.accumulation_steps == 1
    assert mf.runner_wrapper.scale_sense == 1.0 and mf.runner_wrapper.max_grad_norm == 0.5
    assert mf.optimizer.type == "AdamW" and list(mf.optimizer.betas) == [0.9, 0.99]
    assert mf.optimizer.eps == 1e-7 and mf.optimizer.weight_decay == 0.05
    assert (mf.lr_schedule.type, mf.lr_schedule.learning_rate, mf.lr_schedule.lr_end) == ("CosineWithWarmUpLR", 2e-3, 1e-5)
    assert (mf.lr_schedule.warmup_steps, mf.lr_schedule.total_steps) == (4, 30)
    ds = mf.train_dataset
    assert ds.data_loader.type == "MindDataset" and ds.data_loader.dataset_dir == str(tmp_path / "data")
    assert ds.data_loader.shuffle is True and ds.seed == cfg.run.seed and list(ds.input_columns) == ["input_ids"]
    assert ds.batch_size == 4 and ds.drop_remainder is True
    callbacks = {c["type"]: c for c in mf.callbacks}
    assert callbacks["CheckpointMonitor"]["save_checkpoint_steps"] == 10
    assert callbacks["CheckpointMonitor"]["keep_checkpoint_max"] == 2
    assert callbacks["CheckpointMonitor"]["prefix"] == "tiny_x"
    assert callbacks["StopAtStep"]["stop_step"] == 30 and "MFLossMonitor" in callbacks


def test_sft_yaml_is_a_lora_finetune_from_the_base(mf_config, tmp_path):
    cfg = cpu_cfg(sft={"lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["wq", "wv", "w2"],
                       "steps": 12, "learning_rate": 1e-3, "micro_batch_size": 2})
    _, mf = write_and_load(mf_config, tmp_path, cfg, stage="sft", load_checkpoint="/ckpt/base.ckpt")
    assert mf.run_mode == "finetune" and mf.load_checkpoint == "/ckpt/base.ckpt"
    assert mf.trainer.model_name == "tiny_llama_lora"
    pet = mf.model.model_config.pet_config
    assert (pet.pet_type, pet.lora_rank, pet.lora_alpha, pet.lora_dropout) == ("lora", 4, 8.0, 0.1)
    assert pet.target_modules == lora_target_regex(["wq", "wv", "w2"])
    assert list(mf.train_dataset.input_columns) == ["input_ids", "labels"]
    assert mf.train_dataset.batch_size == 2 and mf.lr_schedule.learning_rate == 1e-3
    assert mf.lr_schedule.total_steps == 12
    ckpt = next(c for c in mf.callbacks if c["type"] == "CheckpointMonitor")
    # SFT's own schedule and accumulation, not the pretraining run's
    cfg = cpu_cfg(training={"warmup_steps": 50, "min_lr": 1e-4, "gradient_accumulation_steps": 3,
                            "global_batch_size": 12},
                  sft={"steps": 40, "warmup_steps": 4, "min_lr": 2e-6, "micro_batch_size": 2,
                       "gradient_accumulation_steps": 2})
    run = build_run_config(cfg, stage="sft", dataset_dir="d", output_dir="o", load_checkpoint="/b.ckpt",
                           train_rows=400)
    assert (run["lr_schedule"]["warmup_steps"], run["lr_schedule"]["lr_end"]) == (4, 2e-6)
    assert run["runner_wrapper"]["accumulation_steps"] == 2 and run["train_dataset"]["batch_size"] == 4
    assert ckpt["save_trainable_params"] is True and ckpt["prefix"] == "tiny_llama_lora"


def test_sft_without_base_checkpoint_is_refused(tmp_path):
    with pytest.raises(ValueError, match="load_checkpoint"):
        build_run_config(cpu_cfg(), stage="sft", dataset_dir=str(tmp_path), output_dir=str(tmp_path), train_rows=64)


def test_lora_regex_matches_only_the_named_projections():
    rx = lora_target_regex(["wq", "wo", "w1"])
    assert [n for n in ("wq", "wk", "wv", "wo", "w1", "w2", "w3", "wq_extra") if re.match(rx, n)] == ["wq", "wo", "w1"]


def test_resume_and_cpu_accumulation(mf_config, tmp_path):
    cfg = cpu_cfg(training={"micro_batch_size": 2, "gradient_accumulation_steps": 3, "global_batch_size": 6,
                            "steps": 50})
    _, mf = write_and_load(mf_config, tmp_path, cfg, load_checkpoint="/run/pretrain/checkpoint", resume=True,
                           train_rows=120)
    assert mf.resume_training is True and mf.load_checkpoint == "/run/pretrain/checkpoint"
    # the CPU wrapper splits a 6-row batch into 3 micro batches; mindformers' own accumulation stays off
    assert mf.runner_wrapper.accumulation_steps == 3 and mf.runner_config.gradient_accumulation_steps == 1
    assert mf.runner_config.batch_size == 6 and mf.train_dataset.batch_size == 6
    assert mf.runner_config.epochs == 3  # 120 rows // 6 = 20 steps per epoch; 50 steps need 3 epochs


@pytest.mark.parametrize("loss_scale, want", [
    ({"type": "none"}, 1.0),
    ({"type": "static", "init_value": 1024}, {"type": "FixedLossScaleUpdateCell", "loss_scale_value": 1024.0}),
    ({"type": "dynamic", "init_value": 4096, "factor": 2, "window": 50},
     {"type": "DynamicLossScaleUpdateCell", "loss_scale_value": 4096.0, "scale_factor": 2.0, "scale_window": 50}),
])
def test_loss_scale_section(loss_scale, want, tmp_path):
    cfg = cpu_cfg(training={"loss_scale": loss_scale, "precision": "fp16" if loss_scale["type"] != "none" else "fp32"})
    run = build_run_config(cfg, stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path), train_rows=64)
    assert run["runner_wrapper"]["scale_sense"] == want


@pytest.mark.parametrize("precision, compute, scale", [
    ("fp32", "float32", 1.0),
    ("bf16", "bfloat16", 1.0),
    ("fp16", "float16", {"type": "DynamicLossScaleUpdateCell", "loss_scale_value": 65536.0, "scale_factor": 2.0,
                         "scale_window": 1000}),
])
def test_precision_drives_dtypes_and_loss_scale(precision, compute, scale, mf_config, tmp_path):
    cfg = config_from_dict({"run": {"device_target": "Ascend"}, "training": {"precision": precision}})
    _, mf = write_and_load(mf_config, tmp_path, cfg)
    mc = mf.model.model_config
    assert mc.compute_dtype == compute
    assert (mc.param_init_type, mc.layernorm_compute_type, mc.softmax_compute_type, mc.rotary_dtype) == \
        ("float32",) * 4
    assert mf.runner_wrapper.scale_sense == scale


def test_ascend_yaml_uses_semi_auto_parallel_and_stock_wrapper(mf_config, tmp_path):
    cfg = load_config(ROOT / "configs/pipelines/llama2-7b-4x64gb.yaml")
    path, mf = write_and_load(mf_config, tmp_path, cfg, train_rows=100_000)
    assert mf.context.device_target == "Ascend" and mf.context.max_device_memory == "59GB"  # 64 - 5 headroom
    assert mf.parallel.parallel_mode == 1 and mf.parallel.full_batch is True and mf.use_parallel is True
    assert mf.parallel.enable_parallel_optimizer is False  # dp1: no data-parallel group to shard over
    pc = mf.parallel_config
    assert (pc.data_parallel, pc.model_parallel, pc.pipeline_stage, pc.micro_batch_num) == (1, 2, 2, 4)
    assert mf.runner_wrapper.type == "MFTrainOneStepCell" and "accumulation_steps" not in mf.runner_wrapper
    assert mf.runner_config.sink_mode is True and mf.runner_config.batch_size == 1
    assert mf.recompute_config.recompute is True
    mc = mf.model.model_config
    assert mc.use_flash_attention is True and mc.compute_dtype == "bfloat16" and "use_rope_slice" not in mc
    assert "Global batch 4 = micro 1 x accumulation 4 x data_parallel 1" in path.read_text()


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs/pipelines").glob("*.yaml")))
def test_every_shipped_pipeline_config_generates_loadable_yaml(name, mf_config, tmp_path):
    cfg = load_config(ROOT / "configs/pipelines" / name)
    for stage in ("pretrain", "sft"):
        _, mf = write_and_load(mf_config, tmp_path, cfg, stage=stage, load_checkpoint="/base.ckpt",
                               train_rows=1_000_000)
        assert mf.model.model_config.seq_length == cfg.model.seq_length


def test_dataset_knobs_reach_the_yaml(tmp_path):
    kw = dict(stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path), train_rows=64)
    ascend = build_run_config(config_from_dict({"run": {"device_target": "Ascend", "seed": 99}}), **kw)["train_dataset"]
    assert ascend["data_loader"]["shuffle"] is True and ascend["seed"] == 99
    assert (ascend["num_parallel_workers"], ascend["prefetch_size"]) == (8, 1)  # mindformers reference configs
    cpu = build_run_config(cpu_cfg(training={"shuffle": False, "dataset_workers": 3, "prefetch_size": 2,
                                             "profile": True}), **kw)
    assert cpu["train_dataset"]["data_loader"]["shuffle"] is False and cpu["profile"] is True
    assert (cpu["train_dataset"]["num_parallel_workers"], cpu["train_dataset"]["prefetch_size"]) == (3, 2)
    assert build_run_config(cpu_cfg(), **kw)["train_dataset"]["num_parallel_workers"] == 2


def _epoch_orders(mf_config, tmp_path, data_dir, *, seed, shuffle=True, skip=0, epochs=2):
    """Row markers of every batch, per epoch, as mindformers builds the train dataset from our yaml
    (`skip` = the dataset.set_init_step(n) mindformers' resume_training does)."""
    from mindformers.dataset import build_dataset, check_dataset_config

    cfg = cpu_cfg(run={"seed": seed}, training={"shuffle": shuffle, "steps": 6})
    run = build_run_config(cfg, stage="pretrain", dataset_dir=str(data_dir), output_dir=str(tmp_path / "out"),
                           train_rows=24)
    path = write_run_yaml(cfg, tmp_path / f"order-{seed}-{shuffle}-{skip}.yaml", run, stage="pretrain")
    mf = mf_config(str(path))
    check_dataset_config(mf)
    dataset = build_dataset(mf.train_dataset_task)
    if skip:
        dataset.set_init_step(skip)
    it = dataset.create_tuple_iterator(num_epochs=epochs, output_numpy=True)
    return [[int(row) for batch in it for row in batch[0][:, 0]] for _ in range(epochs - skip // 6)]


def test_seeded_shuffle_is_reproducible_and_resume_skip_continues_it(mf_config, tmp_path):
    import numpy as np

    from pipeline_lib.data.packing import write_mindrecord

    data = tmp_path / "data"
    data.mkdir()
    rows = np.tile(np.arange(65, dtype=np.int32), (24, 1))
    rows[:, 0] = np.arange(24)  # row marker: its index in file order
    write_mindrecord(data / "a.mindrecord", rows[:13])
    write_mindrecord(data / "b.mindrecord", rows[13:])
    first = _epoch_orders(mf_config, tmp_path, data, seed=7)
    assert first == _epoch_orders(mf_config, tmp_path, data, seed=7)  # same seed, same order (both epochs)
    assert first[0] != list(range(24)) and sorted(first[0]) == list(range(24)) and first[1] != first[0]
    assert _epoch_orders(mf_config, tmp_path, data, seed=8) != first
    assert _epoch_orders(mf_config, tmp_path, data, seed=7, shuffle=False) == [list(range(24))] * 2
    # resume: skipping k consumed batches continues the uninterrupted order, also across an epoch boundary
    assert _epoch_orders(mf_config, tmp_path, data, seed=7, skip=3) == [first[0][12:], first[1]]
    assert _epoch_orders(mf_config, tmp_path, data, seed=7, skip=8) == [first[1][8:]]


def test_too_few_rows_for_one_step(tmp_path):
    with pytest.raises(ValueError, match="fewer than one optimizer step"):
        build_run_config(cpu_cfg(), stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path),
                         train_rows=3)


def test_rows_are_counted_from_mindrecord_index_files(tmp_path):
    for shard, rows in (("a.mindrecord0", 5), ("a.mindrecord1", 7)):
        with sqlite3.connect(tmp_path / f"{shard}.db") as conn:
            conn.execute("CREATE TABLE INDEXES (ROW_ID INTEGER PRIMARY KEY)")
            conn.executemany("INSERT INTO INDEXES VALUES (?)", [(i,) for i in range(rows)])
    assert count_mindrecord_rows(str(tmp_path)) == 12
    with pytest.raises(ValueError, match="no MindRecord"):
        count_mindrecord_rows(str(tmp_path / "empty"))


def test_header_names_what_needs_pipeline_lib(tmp_path):
    from pipeline_lib.train.metrics import training_callbacks

    extra = training_callbacks("o", tokens_per_step=256, batch_size=4, data_parallel=1)
    run = build_run_config(cpu_cfg(), stage="pretrain", dataset_dir="d", output_dir="o", train_rows=64,
                           extra_callbacks=extra)
    path = write_run_yaml(cpu_cfg(), tmp_path / "run.yaml", run, stage="pretrain")
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    assert "# Names CPUTrainOneStepCell, StopAtStep, PipelineMetrics, LossGuard: registered on import of " \
           "pipeline_lib.train.callbacks, pipeline_lib.train.cpu_wrappers, pipeline_lib.train.mf_callbacks" in header
    assert "run_mindformer.py does not import it" in header
    epochs_only = config_from_dict({"run": {"device_target": "Ascend"}, "training": {"steps": None}})
    run = build_run_config(epochs_only, stage="pretrain", dataset_dir="d", output_dir="o")
    path = write_run_yaml(epochs_only, tmp_path / "plain.yaml", run, stage="pretrain")
    assert "# Names" not in path.read_text()  # stock mindformers types only: runs with any mindformers launcher


def test_written_yaml_is_plain_yaml(tmp_path):
    run = build_run_config(cpu_cfg(), stage="pretrain", dataset_dir="d", output_dir="o", train_rows=64)
    path = write_run_yaml(cpu_cfg(), tmp_path / "run.yaml", run, stage="pretrain")
    assert yaml.safe_load(path.read_text())["runner_config"]["sink_mode"] is False


def test_special_ids_come_from_the_tokenizer_not_the_config_defaults(llama2_tokenizer, tmp_path):
    """A Llama-2 tokenizer (unk 0, bos 1, eos 2, no pad piece) gives bos 1 / eos 2 / pad 0 in every stage's yaml;
    the stages pass the ids the data stage recorded, which win over anything implied by the config."""
    from pipeline_lib.model.token_ids import TokenIds

    cfg = cpu_cfg(tokenizer={"path": str(llama2_tokenizer)}, model={"vocab_size": 1024}, sft={"template": "llama2"})
    for stage, kw in (("pretrain", {}), ("sft", {"load_checkpoint": "/base.ckpt"})):
        mc = build_run_config(cfg, stage=stage, dataset_dir=str(tmp_path), output_dir=str(tmp_path), train_rows=64,
                              **kw)["model"]["model_config"]
        assert (mc["bos_token_id"], mc["eos_token_id"], mc["pad_token_id"]) == (1, 2, 0), stage
    recorded = TokenIds(pad_id=5, unk_id=0, bos_id=1, eos_id=2)
    mc = build_run_config(cpu_cfg(), stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path),
                          train_rows=64, token_ids=recorded)["model"]["model_config"]
    assert (mc["bos_token_id"], mc["eos_token_id"], mc["pad_token_id"]) == (1, 2, 5)
    mc = build_run_config(cpu_cfg(), stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path),
                          train_rows=64)["model"]["model_config"]
    assert (mc["bos_token_id"], mc["eos_token_id"], mc["pad_token_id"]) == (2, 3, 0)  # a trained tokenizer's


def test_profile_section_maps_to_the_keys_mindformers_reads(tmp_path):
    import inspect

    from mindformers.trainer.trainer import Trainer

    kw = dict(dataset_dir=str(tmp_path), output_dir=str(tmp_path / "out"), train_rows=64)
    cfg = cpu_cfg(training={"steps": 10, "warmup_steps": 2, "profile": {
        "enabled": True, "start_step": 3, "stop_step": 7, "record": ["memory", "communication"], "level": 0}})
    run = build_run_config(cfg, stage="pretrain", **kw)
    keys = {k: v for k, v in run.items() if k.startswith("profile") or k in (
        "init_start_profile", "profiler_level", "with_stack", "data_simplification", "mstx")}
    assert keys["profile"] is True and (keys["profile_start_step"], keys["profile_stop_step"]) == (3, 7)
    assert keys["profile_memory"] is True and keys["profile_communication"] is True and keys["with_stack"] is False
    assert keys["profiler_level"] == 1  # communication needs level >= 1
    assert keys["profile_output"] == str(tmp_path / "out")
    # every key we write is one mindformers 1.9 reads when it builds its ProfileMonitor (from its own source)
    source = inspect.getsource(Trainer._build_profile_cb)
    assert {k for k in keys if f"self.config.{k}" not in source} == set()
    # SFT and a run with profiling off get no profiler
    assert build_run_config(cfg, stage="sft", load_checkpoint="/base.ckpt", **kw)["profile"] is False
    off = build_run_config(cpu_cfg(), stage="pretrain", **kw)
    assert off["profile"] is False and "profile_start_step" not in off


def test_the_shipped_7b_sft_loads_the_full_base_for_mindspore_to_slice(tmp_path):
    """mp2 x pp2 SFT from one full checkpoint: auto_trans_ckpt off and load_checkpoint the full file, which mindformers
    1.9's own test calls full (so it is loaded before compile and MindSpore slices it: docs/mindformers-facts.md); a
    base with rank_<N> in its path is refused for a sharded layout and staged without it by the SFT stage."""
    from mindformers.trainer.utils import check_path_include_total_ckpt

    from pipeline_lib.train.mindformers_yaml import sft_base_path_issue
    from pipeline_lib.train.sft_stage import _unranked

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "configs/pipelines/llama2-7b-4x64gb.yaml"))
    base = "/work/runs/llama2-7b/night-1/pretrain/checkpoint/merged/llama2_7b_cpt-ab12cd34.ckpt"
    run = build_run_config(cfg, stage="sft", dataset_dir=str(tmp_path), output_dir=str(tmp_path / "o"),
                           load_checkpoint=base, train_rows=4096)
    assert run["run_mode"] == "finetune" and run["auto_trans_ckpt"] is False and run["load_checkpoint"] == base
    assert run["use_parallel"] is True and run["load_ckpt_format"] == "ckpt"
    assert (run["parallel_config"]["model_parallel"], run["parallel_config"]["pipeline_stage"]) == (2, 2)
    assert run["parallel"]["parallel_mode"] == 1  # semi-auto parallel: parameters are sliced at compile
    assert check_path_include_total_ckpt(base) and sft_base_path_issue(cfg, base) is None
    ranked = "/work/runs/llama2-7b/night-1/pretrain/checkpoint/rank_0/llama2_7b_cpt-1_100.ckpt"
    assert not check_path_include_total_ckpt(ranked)  # mindformers' view: one rank's shard
    with pytest.raises(ValueError, match=r"rank_<N>.*parallel.model_parallel=2 x parallel.pipeline_stage=2.*Fix: "
                                         r"point model.base_checkpoint"):
        build_run_config(cfg, stage="sft", dataset_dir=str(tmp_path), output_dir=str(tmp_path / "o"),
                         load_checkpoint=ranked, train_rows=4096)
    src = tmp_path / "pretrain" / "checkpoint" / "rank_0" / "base.ckpt"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"weights")
    staged = _unranked(src, tmp_path / "sft" / "_inputs")
    assert staged.read_bytes() == b"weights" and sft_base_path_issue(cfg, str(staged)) is None
    assert check_path_include_total_ckpt(str(staged))


def test_document_mask_adds_the_attention_mask_column_to_pretrain_only(mf_config, tmp_path):
    _, off = write_and_load(mf_config, tmp_path / "off", cpu_cfg())
    assert off.train_dataset.input_columns == ["input_ids"]
    masked = cpu_cfg(data={"packing": {"document_mask": True}})
    _, mf = write_and_load(mf_config, tmp_path / "on", masked)
    # mindformers feeds the columns to LlamaForCausalLM by these names (construct_args_key = input_columns)
    assert mf.train_dataset.input_columns == ["input_ids", "attention_mask"]
    assert mf.model.model_config.use_flash_attention is False
    sft = build_run_config(masked, stage="sft", dataset_dir=str(tmp_path), output_dir=str(tmp_path),
                           load_checkpoint=str(tmp_path / "base.ckpt"), train_rows=256)
    assert sft["train_dataset"]["input_columns"] == ["input_ids", "labels"]


def test_document_mask_with_flash_attention_is_refused_by_the_yaml_builder(tmp_path):
    cfg = config_from_dict({"run": {"device_target": "Ascend"}, "data": {"packing": {"document_mask": True}},
                            "model": {"use_flash_attention": True}, "training": {"precision": "bf16"}})
    with pytest.raises(ValueError, match=r"data.packing.document_mask=True: with model.use_flash_attention on Ascend"):
        build_run_config(cfg, stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path), train_rows=256)
    # the same config built for a CPU target (flash attention forced off) still refuses bfloat16
    with pytest.raises(ValueError, match="compute_dtype=bfloat16"):
        build_run_config(cfg, stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path), train_rows=256,
                         target="CPU")
