"""Generate the mindformers run yaml of a training stage from the typed pipeline config.

What: `build_run_config(cfg, stage=..., dataset_dir=..., output_dir=...)` returns the dict that
`mindformers.tools.MindFormerConfig` loads and `pipeline_lib.train.entry` (or mindformers'
`run_mindformer.py`) runs; `write_run_yaml(cfg, path, run, stage=...)` writes such a dict once (with a
header stating the command and the batch/step arithmetic) into the run folder. Stage "pretrain" is `run_mode: train` over packed
`input_ids`; stage "sft" is a LoRA finetune (`pet_config` under `model.model_config`,
`run_mode: finetune`, `load_checkpoint` = the base checkpoint, columns `input_ids` + `labels`). With
data.packing.document_mask the pretrain columns are `input_ids` + `attention_mask`: mindformers 1.9 passes the
dataset's columns to the network by name (trainer/base_trainer.py:925-926 -> wrapper/wrapper.py:444-449
DataOrderWrapperCell), so the mask reaches LlamaForCausalLM's `attention_mask` argument.

One code path for CPU and Ascend: on CPU only the measured overrides change (config/platform.py), the run
is data parallel (`parallel_mode: 0`), the wrapper is `CPUTrainOneStepCell` (IsFinite overflow
check, in-graph gradient accumulation; `pipeline_lib.train.cpu_wrappers`) and the dataset batch is
micro_batch_size x accumulation; on Ascend it is semi-auto parallel with `MFTrainOneStepCell` and
mindformers' own accumulation (under pipeline parallel the accumulation steps become
`micro_batch_num`, which mindformers uses as the accumulation there).

Steps: mindformers counts epochs, not steps. With a step budget the yaml gets enough epochs over the
data plus a `StopAtStep` callback that stops at the budget's optimizer global_step (mindformers'
`TrainCallBack` counts from 0 again after a resume), and the LR schedule spans exactly that budget;
this needs the number of rows (`train_rows`, else counted from the MindRecord index files).
LR schedule (train/lr_schedule.py): training.lr_schedule=cosine is mindformers' CosineWithWarmUpLR; wsd is our
LineageWSDLR (warm-up continued from training.lineage_steps, a held peak, a final decay of training.decay_steps), and
with training.keep_stable_weights a SaveWeightsAtStep callback writes the weights as the decay starts
(`stable_weights_path`). SFT is always cosine.
The registered names (`CPUTrainOneStepCell`, `StopAtStep`, and the PipelineMetrics / LossGuard callbacks the
train stages append) need `pipeline_lib.train` importable; the yaml's header says which and how.

Precision: the model dtypes and `runner_wrapper.scale_sense` come from the config, where
training.precision derives whatever was left empty (fp16: DynamicLossScaleUpdateCell; bf16/fp32: 1.0).
Data order: `train_dataset.data_loader.shuffle` = training.shuffle with `train_dataset.seed` = run.seed
(the dataset pipeline's seed in mindformers), so a resume's `set_init_step` skip continues the same order.
`context.max_device_memory` is the card minus parallel.device_memory_headroom_gb.

A full checkpoint into a sharded SFT (tensor/pipeline parallel): `auto_trans_ckpt: False` and `load_checkpoint` =
the one full .ckpt. mindformers 1.9 then loads it into the network before the graph is compiled
(trainer/utils.py:466-468: a path `check_path_include_total_ckpt` calls full goes to load_ckpt before compile_model
at :488; load_ckpt -> get_load_checkpoint_result loads the file whole, :692-696, -> load_param_into_net, :762), and
MindSpore slices every parameter that holds data to this rank's piece when it compiles (mindspore/parallel/
_utils.py:231 `_slice_parameter` -> `_load_tensor_by_layout`, :257/:270). `auto_trans_ckpt: True` is for the
other case, shards of another strategy (src_strategy_path_or_dir, :507-523). A path with `rank_<N>` anywhere in
it is not "full" to mindformers (:546-556, the regex `rank_[0-9]+`): it would be loaded after compile into the
already-sliced parameters, so `sft_base_path_issue` refuses it for a sharded SFT.

Limits: no eval dataset/processor sections (evaluation runs elsewhere). SFT has its own steps, learning
rate, warm-up, min_lr, micro batch and accumulation (sft.*) and shares the optimizer betas, precision, loss
scale, clipping, checkpoint cadence and data-loader knobs of `training`. Raises ValueError naming the
argument when the stage or the inputs cannot work.
"""
from __future__ import annotations

import glob
import math
import os
import sqlite3
from pathlib import Path
from typing import Literal

import re

import yaml

from ..config.platform import CPU_RUNNER_OVERRIDES, device_target
from ..config.schema import PipelineConfig, global_batch, sft_accumulation
from ..config.validate import document_mask_issues, lora_model_name
from ..model.llama import llama_model_config
from ..model.token_ids import configured_ids
from ..model.checkpoint_format import yaml_keys as checkpoint_yaml_keys
from .lr_schedule import WSD_CLASS, lr_schedule_section

Stage = Literal["pretrain", "sft"]
CPU_WRAPPER = "CPUTrainOneStepCell"
"""Registered by pipeline_lib.train.cpu_wrappers (the entry module imports it on every rank)."""
STOP_CALLBACK = "StopAtStep"
"""Registered by pipeline_lib.train.mf_callbacks; stops at an optimizer global_step (resume-safe)."""
STABLE_CALLBACK = "SaveWeightsAtStep"
"""Registered by pipeline_lib.train.mf_callbacks; writes a wsd run's stable-phase weights."""
STABLE_WEIGHTS_DIR = "checkpoint/merged"  # beside the weights-only checkpoint (its tokenizer is found from there)


def stable_weights_path(cfg: PipelineConfig, output_dir: str | Path) -> Path:
    """Where a wsd pretrain run with training.keep_stable_weights writes its stable-phase weights. Not in checkpoint/
    itself: mindformers resumes from that folder and would load every .ckpt lying in it (train/stage.py)."""
    return Path(output_dir) / STABLE_WEIGHTS_DIR / f"{cfg.model.name}-stable-weights.ckpt"


def stable_weights_callback(cfg: PipelineConfig, lr_schedule: dict, output_dir: str | Path) -> dict:
    """The callback writing the weights as the decay starts (after lr_schedule's total - decay steps)."""
    step = lr_schedule["total_steps"] - lr_schedule["decay_steps"]
    if step < 1:
        raise ValueError(f"training.keep_stable_weights with a decay over the whole run (training.steps="
                         f"{lr_schedule['total_steps']}, decay {lr_schedule['decay_steps']} steps): there is no "
                         "stable phase to keep; lower training.decay_steps / decay_fraction")
    return {"type": STABLE_CALLBACK, "step": step, "path": str(stable_weights_path(cfg, output_dir))}


def count_mindrecord_rows(dataset_dir: str) -> int:
    """Rows in the MindRecord files of `dataset_dir`, read from their sqlite `.db` index files.

    Raises ValueError when the folder holds no `*.mindrecord*` index file.
    """
    dbs = sorted(glob.glob(os.path.join(dataset_dir, "**", "*.mindrecord*.db"), recursive=True))
    if not dbs:
        raise ValueError(f"dataset_dir={dataset_dir!r}: no MindRecord (*.mindrecord*.db) files found; "
                         "run the data stage first or pass train_rows")
    total = 0
    for db in dbs:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            total += conn.execute("SELECT COUNT(*) FROM INDEXES").fetchone()[0]
    return total


def lora_target_regex(target_modules: list[str]) -> str:
    """Regex mindformers matches (re.match) against each child cell name, e.g. `wq`."""
    return "|".join(rf".*{name}$" for name in target_modules)


def _loss_scale(cfg: PipelineConfig):
    ls = cfg.training.loss_scale
    if ls.type == "dynamic":
        return {"type": "DynamicLossScaleUpdateCell", "loss_scale_value": float(ls.init_value),
                "scale_factor": float(ls.factor), "scale_window": int(ls.window)}
    if ls.type == "static":
        return {"type": "FixedLossScaleUpdateCell", "loss_scale_value": float(ls.init_value)}
    return 1.0


def stage_schedule(cfg: PipelineConfig, stage: Stage) -> dict:
    """The batch, step budget and LR schedule of a stage: `training.*` for pretrain, `sft.*` for SFT."""
    src = cfg.sft if stage == "sft" else cfg.training
    accum = sft_accumulation(cfg) if stage == "sft" else src.gradient_accumulation_steps
    return {"micro": src.micro_batch_size, "accum": accum, "steps": src.steps,
            "learning_rate": src.learning_rate, "warmup_steps": src.warmup_steps, "min_lr": src.min_lr}


def dataset_workers(cfg: PipelineConfig, on_cpu: bool) -> int:
    """training.dataset_workers, else 8 on Ascend (mindformers reference configs) and 2 on CPU (2-core hosts)."""
    return cfg.training.dataset_workers or (2 if on_cpu else 8)


def _model_config(cfg: PipelineConfig, stage: Stage, on_cpu: bool, batch_size: int, token_ids) -> dict:
    mc = {"type": "LlamaConfig", **llama_model_config(cfg, batch_size=batch_size, seq_length=cfg.model.seq_length,
                                                      on_cpu=on_cpu, token_ids=token_ids)}
    p = cfg.parallel
    if p.pipeline_stage > 1:  # mindformers' LayerSetting reads both from the model config
        mc["offset"] = p.pipeline_offset
        mc["pp_interleave_num"] = p.pp_interleave_num
    if stage == "sft":
        s = cfg.sft
        mc["pet_config"] = {"pet_type": "lora", "lora_rank": s.lora_rank, "lora_alpha": s.lora_alpha,
                            "lora_dropout": s.lora_dropout, "target_modules": lora_target_regex(s.target_modules)}
    return mc


def _parallel(cfg: PipelineConfig, on_cpu: bool, accum: int | None) -> tuple[dict, dict]:
    p = cfg.parallel
    micro_batch_num = p.micro_batch_num
    if p.pipeline_stage > 1 and accum is not None:
        # Under pipeline parallel mindformers ignores gradient_accumulation_steps: the pipeline's
        # micro batches are the accumulation (global batch = batch x dp x micro_batch_num).
        if accum % p.pipeline_stage:
            raise ValueError(f"training.gradient_accumulation_steps={accum}: under pipeline parallel it becomes "
                             f"micro_batch_num and must be a multiple of parallel.pipeline_stage={p.pipeline_stage}")
        micro_batch_num = accum
    parallel = {
        # 0 data parallel, 1 semi-auto parallel, 2 auto parallel (strategies by sharding propagation)
        "parallel_mode": 0 if on_cpu else (2 if p.mode == "auto" else 1),
        "gradients_mean": on_cpu,
        "full_batch": not on_cpu,
        "enable_parallel_optimizer": p.optimizer_shard,
        "search_mode": "sharding_propagation",
        # mindformers moves it to <output_dir>/strategy/ckpt_strategy_rank_N.ckpt
        "strategy_ckpt_save_file": "ckpt_strategy.ckpt",
    }
    parallel_config = {
        "data_parallel": p.data_parallel, "model_parallel": p.model_parallel,
        "pipeline_stage": p.pipeline_stage, "micro_batch_num": micro_batch_num,
        "use_seq_parallel": bool(p.use_seq_parallel and not on_cpu), "vocab_emb_dp": True,
        "gradient_aggregation_group": 4,
    }
    if p.pipeline_stage > 1 and p.pp_interleave_num > 1:
        # MindSpore's set_auto_parallel_context(pipeline_config=...); model_config.pp_interleave_num splits the layers
        parallel["pipeline_config"] = {"pipeline_interleave": True, "pipeline_scheduler": "1f1b"}
    return parallel, parallel_config


# select_recompute patterns of the legacy Llama layer (models/llama/llama_transformer.py LLamaDecodeLayer, its
# LLamaAttention / LlamaFeedForward, modules/layers.py Linear). Each names primitives only: mindformers' LayerSetting
# calls `operator.recompute(True)` on a matched attribute, which a Cell (keyword-only recompute) would refuse.
# Measured on mindformers 1.9 (tests/train/test_recompute_yaml.py): the score path's batch_matmul_q_k, softmax and
# batch_matmul fail there ("'bool' object is not callable"), so attention recompute is the flash-attention block:
# Q/K/V projections, the rotary multiply and the flash-attention kernel (config rule: needs use_flash_attention).
ATTENTION_PATTERNS = (r"attention\.w[qkv]\.matmul", r"attention\.apply_rotary_emb\.mul",
                      r"attention\.flash_attention\.flash_attention")
FFN_PATTERNS = (r"feed_forward\.w[13]\.matmul", r"feed_forward\.w1\.activation\.silu", r"feed_forward\.mul")


def recompute_section(cfg: PipelineConfig) -> dict:
    """model.recompute* as mindformers 1.9's recompute_config (TransformerRecomputeConfig, read by LayerSetting):
    full -> recompute; selective -> select_recompute (its default patterns: the FFN's silu and mul); attention /
    ffn -> select_recompute {pattern: layers}; model.recompute_layers -> the per-stage counts in place of True."""
    m, p = cfg.model, cfg.parallel
    which = list(m.recompute_layers) if m.recompute_layers is not None else True
    section = {"recompute": False, "select_recompute": False, "select_comm_recompute": False,
               "parallel_optimizer_comm_recompute": bool(m.comm_recompute and p.optimizer_shard),
               "mp_comm_recompute": True, "recompute_slice_activation": bool(m.recompute_slice_activation)}
    if m.recompute == "full":
        section["recompute"] = which
    elif m.recompute == "selective":
        section["select_recompute"] = which
    elif m.recompute in ("attention", "ffn"):
        patterns = ATTENTION_PATTERNS if m.recompute == "attention" else FFN_PATTERNS
        section["select_recompute"] = {pat: which for pat in patterns}
    if m.comm_recompute and p.use_seq_parallel:
        section["select_comm_recompute"] = True  # its default pattern: the norms' outputs (.*\.norm)
    return section


RANK_PATH = re.compile(r"rank_\d+")  # mindformers 1.9 trainer/utils.py check_path_include_total_ckpt


def sft_base_path_issue(cfg: PipelineConfig, path: str) -> str | None:
    """Why a sharded SFT cannot load the full checkpoint `path` as given (see the module docstring), else None."""
    p = cfg.parallel
    if p.model_parallel * p.pipeline_stage == 1 or not RANK_PATH.search(str(path)):
        return None  # data parallel and single-device ranks load the full file as it is
    return (f"the SFT base {path} has 'rank_<N>' in its path: mindformers 1.9 takes such a file for one rank's shard "
            f"and loads it after compile, into parameters already sliced for parallel.model_parallel="
            f"{p.model_parallel} x parallel.pipeline_stage={p.pipeline_stage}. Fix: point model.base_checkpoint at "
            "the merged full checkpoint (the pretrain stage's checkpoint/merged/), or copy the file to a folder "
            "without rank_<N> in its path")


def build_run_config(cfg: PipelineConfig, *, stage: Stage, dataset_dir: str, output_dir: str,
                     load_checkpoint: str | None = None, resume: bool = False,
                     train_rows: int | None = None,
                     target: str | None = None, extra_callbacks: list[dict] | None = None,
                     token_ids=None) -> dict:
    """The mindformers run config of `stage` as a plain dict.

    `token_ids` (pipeline_lib.model.token_ids.TokenIds) are the tokenizer's special ids: stages pass the ones
    the data stage recorded in tokenizer_config.json; None means `configured_ids(cfg.tokenizer)`.
    `target` overrides the device target
    (default platform.device_target(cfg)). `resume` sets `resume_training` (then `load_checkpoint`
    should be the stage's own checkpoint folder or file). `extra_callbacks` are appended to the yaml's
    `callbacks` (e.g. `pipeline_lib.train.metrics.training_callbacks(...)`; the entry module registers them). Raises ValueError for an unknown stage, an
    SFT run without a base checkpoint, or a dataset too small for one batch.
    """
    if stage not in ("pretrain", "sft"):
        raise ValueError(f"stage={stage!r}: must be 'pretrain' or 'sft'")
    if stage == "sft" and not load_checkpoint:
        raise ValueError("stage='sft' needs load_checkpoint (the pretrained base .ckpt): without it "
                         "mindformers silently finetunes a randomly initialised model")
    if stage == "sft" and not resume and sft_base_path_issue(cfg, load_checkpoint):
        raise ValueError(sft_base_path_issue(cfg, load_checkpoint))
    if token_ids is None:
        token_ids = configured_ids(cfg.tokenizer)
    t = cfg.training
    target = target or device_target(cfg)
    on_cpu = target == "CPU"
    sched = stage_schedule(cfg, stage)
    micro, accum, budget = sched["micro"], sched["accum"], sched["steps"]
    # CPU: the wrapper splits one dataset batch into `accum` micro batches inside the graph.
    batch = micro * accum if on_cpu else micro
    rows_per_step = global_batch(cfg, stage)

    epochs, stop_step = t.epochs, None
    if budget is not None:
        rows = train_rows if train_rows is not None else count_mindrecord_rows(dataset_dir)
        steps_per_epoch = rows // rows_per_step
        if steps_per_epoch < 1:
            raise ValueError(f"dataset_dir={dataset_dir!r} holds {rows} rows, fewer than one optimizer step "
                             f"needs ({rows_per_step} = micro_batch x accumulation x data_parallel)")
        epochs, stop_step = math.ceil(budget / steps_per_epoch), budget
    warmup = min(sched["warmup_steps"], budget) if budget else sched["warmup_steps"]
    lr_schedule = lr_schedule_section(cfg, stage, sched, warmup, budget)

    parallel, parallel_config = _parallel(cfg, on_cpu, accum)
    columns = ["input_ids", "labels"] if stage == "sft" else ["input_ids"]
    if stage == "pretrain" and cfg.data.packing.document_mask:
        issues = document_mask_issues(cfg, target)
        if issues:
            raise ValueError("; ".join(str(i) for i in issues))
        # fed by name (train_dataset.input_columns = construct_args_key) to LlamaForCausalLM(attention_mask=...)
        columns.append("attention_mask")
    name = lora_model_name(cfg) if stage == "sft" else cfg.model.name
    wrapper = {"type": CPU_WRAPPER if on_cpu else "MFTrainOneStepCell", "scale_sense": _loss_scale(cfg),
               "use_clip_grad": True, "max_grad_norm": float(t.grad_clip)}
    if on_cpu:
        wrapper["accumulation_steps"] = accum
    runner = {"epochs": epochs, "batch_size": batch, "sink_mode": True, "sink_size": 1,
              "gradient_accumulation_steps": 1 if on_cpu or cfg.parallel.pipeline_stage > 1 else accum}
    if on_cpu:
        runner.update(CPU_RUNNER_OVERRIDES)
    format_top, format_cb = checkpoint_yaml_keys(cfg)
    ckpt_cb = {"type": "CheckpointMonitor", "prefix": name, "save_checkpoint_steps": t.save_steps,
               "keep_checkpoint_max": t.keep_checkpoint_max, "integrated_save": False, **format_cb}
    if stage == "sft":
        ckpt_cb["save_trainable_params"] = True  # adapter-only copy under checkpoint_trainable/rank_N
    callbacks = [{"type": "MFLossMonitor", "per_print_times": 1}, ckpt_cb]
    if stop_step is not None:
        callbacks.append({"type": STOP_CALLBACK, "stop_step": stop_step})
    if stage == "pretrain" and t.lr_schedule == "wsd" and t.keep_stable_weights:
        callbacks.append(stable_weights_callback(cfg, lr_schedule, output_dir))
    callbacks += [dict(c) for c in extra_callbacks or ()]
    context = {"mode": 0, "device_target": target, "max_call_depth": 10000, "save_graphs": False,
               "device_id": 0}
    if not on_cpu:
        # the card minus parallel's headroom (mindformers' 64 GB reference layouts: "59GB")
        context["max_device_memory"] = f"{cfg.parallel.usable_memory_gb:g}GB"
    return {
        "seed": cfg.run.seed,
        "output_dir": str(output_dir),
        "run_mode": "finetune" if stage == "sft" else "train",
        "load_checkpoint": str(load_checkpoint or ""),
        **format_top,  # training.checkpoint_format (model/checkpoint_format.py)
        # off for every stage: resume loads its own layout's shards, SFT a full file that MindSpore slices at
        # compile (see the module docstring); nothing here hands mindformers shards of another strategy
        "auto_trans_ckpt": False,
        "resume_training": bool(resume),
        "only_save_strategy": False,
        "use_parallel": cfg.parallel.devices > 1,
        "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": name},
        "context": context,
        "parallel": parallel,
        "parallel_config": parallel_config,
        "micro_batch_interleave_num": 1,
        "recompute_config": recompute_section(cfg),
        "runner_config": runner,
        "runner_wrapper": wrapper,
        "optimizer": {"type": "AdamW", "betas": [t.optimizer.beta1, t.optimizer.beta2],
                      "eps": t.optimizer.eps, "weight_decay": t.optimizer.weight_decay},
        "lr_schedule": lr_schedule,
        "model": {"model_config": _model_config(cfg, stage, on_cpu, micro, token_ids),
                  "arch": {"type": "LlamaForCausalLM"}},
        # train_dataset.seed is the seed mindformers gives the dataset pipeline (its shuffle), not the global one.
        "train_dataset": {"data_loader": {"type": "MindDataset", "dataset_dir": str(dataset_dir),
                                          "shuffle": bool(t.shuffle)},
                          "input_columns": columns, "batch_size": batch, "drop_remainder": True,
                          "seed": cfg.run.seed, "num_parallel_workers": dataset_workers(cfg, on_cpu),
                          "python_multiprocessing": False, "repeat": 1, "numa_enable": False,
                          "prefetch_size": t.prefetch_size},
        "train_dataset_task": {"type": "CausalLanguageModelDataset"},
        "do_eval": False,
        "callbacks": callbacks,
        # the profiler runs in the pretrain stage's training launches only (not SFT)
        **profile_keys(cfg, str(output_dir), enabled=stage == "pretrain"),
    }


def profile_keys(cfg: PipelineConfig, output_dir: str, *, enabled: bool = True) -> dict:
    """training.profile as the top-level keys mindformers 1.9 reads (trainer.Trainer._build_profile_cb ->
    core.callback.ProfileMonitor; facts in docs/mindformers-facts.md). The profiler writes
    `<output_dir>/profile/rank_N/`; mindformers counts the window's steps from 1 in each launch."""
    p = cfg.training.profile
    if not (enabled and p.enabled):
        return {"profile": False}
    return {"profile": True, "profile_start_step": p.start_step, "profile_stop_step": p.stop_step,
            "init_start_profile": False, "profile_memory": "memory" in p.record,
            "profile_communication": "communication" in p.record, "with_stack": "stack" in p.record,
            # communication needs level >= 1 (ProfileMonitor raises 0 to 1 itself, with a warning)
            "profiler_level": max(p.level, 1) if "communication" in p.record else p.level,
            "profile_output": output_dir, "profile_rank_ids": None, "profile_pipeline": False,
            "data_simplification": True, "mstx": False}


def _header(cfg: PipelineConfig, run: dict, stage: Stage) -> str:
    r, pc = run["runner_config"], run["parallel_config"]
    accum = run["runner_wrapper"].get("accumulation_steps", r["gradient_accumulation_steps"])
    if pc["pipeline_stage"] > 1:
        accum = pc["micro_batch_num"]
    micro = run["model"]["model_config"]["batch_size"]
    gbs = micro * accum * cfg.parallel.data_parallel
    seq = cfg.model.seq_length
    return (f"# mindformers run config for stage '{stage}', generated by pipeline_lib.train.mindformers_yaml.\n"
            f"# Run: python -m pipeline_lib.train.entry --yaml <this file>   (msrun --worker_num=N ... for N ranks)\n"
            f"# Global batch {gbs} = micro {micro} x accumulation {accum} x data_parallel "
            f"{cfg.parallel.data_parallel}; {gbs * seq} tokens per optimizer step;\n"
            f"# data_parallel={pc['data_parallel']} model_parallel={pc['model_parallel']} "
            f"pipeline_stage={pc['pipeline_stage']}; step budget: {run['lr_schedule']['total_steps']} "
            f"(-1 = epochs x dataset), epochs={r['epochs']}.\n" + _needs_pipeline_lib(run))


PIPELINE_LIB_TYPES = {CPU_WRAPPER: "pipeline_lib.train.cpu_wrappers", STOP_CALLBACK: "pipeline_lib.train.mf_callbacks",
                      STABLE_CALLBACK: "pipeline_lib.train.mf_callbacks", WSD_CLASS: "pipeline_lib.train.mf_lr",
                      "PipelineMetrics": "pipeline_lib.train.callbacks", "LossGuard": "pipeline_lib.train.callbacks"}
"""Types the yaml may name that only exist once these modules are imported (they register with mindformers)."""


def _needs_pipeline_lib(run: dict) -> str:
    named = [run["runner_wrapper"]["type"], run["lr_schedule"]["type"]] + [c["type"] for c in run["callbacks"]]
    ours = [t for t in dict.fromkeys(named) if t in PIPELINE_LIB_TYPES]
    if not ours:
        return ""
    modules = sorted({PIPELINE_LIB_TYPES[t] for t in ours})
    return (f"# Names {', '.join(ours)}: registered on import of {', '.join(modules)}, so pipeline_lib must be\n"
            f"# importable (PYTHONPATH=<this repo>). mindformers' run_mindformer.py does not import it: use the command\n"
            f"# above, or import those modules before building mindformers.Trainer in your own script.\n")


def write_run_yaml(cfg: PipelineConfig, path: str | Path, run: dict, *, stage: Stage) -> Path:
    """Write the run config `run` (build_run_config's dict, patched by the caller) to `path` once, atomically:
    the header comment, then the yaml mindformers loads. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(_header(cfg, run, stage) + yaml.safe_dump(run, sort_keys=False, allow_unicode=True),
                   encoding="utf-8")
    os.replace(tmp, path)
    return path
