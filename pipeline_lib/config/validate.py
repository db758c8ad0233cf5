"""Cross-field rules checked before anything runs.

Each rule returns ConfigIssues naming the field, its value, the broken relation and the fix.
`validate(cfg)` raises ConfigError with all of them; `check(cfg)` returns them. These rules are
pure (no file or network access) and need no stage code; the rules that read files or ask a stage
(the input files, the tokenizer's ids, the data filters) are in pipeline_lib/checks/, which the CLI
runs once before any flow. A rule a stage also enforces at run time lives here and the stage calls it
(one source of truth), e.g. `preflight_steps_issues`, `profile_issues`, `base_weights_issues`.
"""
from __future__ import annotations

from ..storage.store import is_remote
from .errors import ConfigError, ConfigIssue
from .platform import device_target
from .schema import DTYPE_FIELDS, PipelineConfig, global_batch, precision_dtypes, sft_accumulation, wsd_decay_steps
from .stage_scope import ignored_note, scope


def _batch(cfg: PipelineConfig) -> list[ConfigIssue]:
    """A stated global_batch_size only checks the derived one (schema.global_batch)."""
    issues = []
    for name, stage, accum in (("training", "pretrain", cfg.training.gradient_accumulation_steps),
                               ("sft", "sft", sft_accumulation(cfg))):
        section, want = getattr(cfg, name), global_batch(cfg, stage)
        if section.global_batch_size not in (None, want):
            issues.append(ConfigIssue(
                f"{name}.global_batch_size", section.global_batch_size,
                f"the global batch is derived: micro_batch_size x gradient_accumulation_steps x data_parallel = "
                f"{section.micro_batch_size} x {accum} x {cfg.parallel.data_parallel} = {want}",
                f"remove {name}.global_batch_size (it is derived) or set {name}.global_batch_size={want}; to change "
                f"the batch, change {name}.micro_batch_size / {name}.gradient_accumulation_steps"))
    return issues


def _devices(cfg: PipelineConfig) -> list[ConfigIssue]:
    p = cfg.parallel
    used = p.data_parallel * p.model_parallel * p.pipeline_stage
    if used != p.devices:
        return [ConfigIssue(
            "parallel.devices", p.devices,
            f"data_parallel x model_parallel x pipeline_stage = {p.data_parallel} x {p.model_parallel} x "
            f"{p.pipeline_stage} = {used} devices, not {p.devices}",
            f"set parallel.devices={used} or change the parallel degrees so their product is {p.devices}")]
    return []


def _pipeline(cfg: PipelineConfig) -> list[ConfigIssue]:
    p, m = cfg.parallel, cfg.model
    issues = []
    if p.pipeline_stage > 1 and p.micro_batch_num % p.pipeline_stage:
        issues.append(ConfigIssue(
            "parallel.micro_batch_num", p.micro_batch_num,
            f"must be a multiple of pipeline_stage={p.pipeline_stage} (else stages idle every step)",
            f"set parallel.micro_batch_num to {p.pipeline_stage * max(1, -(-p.micro_batch_num // p.pipeline_stage))}"))
    gas = cfg.training.gradient_accumulation_steps
    if p.pipeline_stage > 1 and gas % p.micro_batch_num:
        # mindformers feeds micro_batch_num micro batches through the pipeline per step: they are
        # the accumulation, so our global-batch formula only holds if gas covers them.
        issues.append(ConfigIssue(
            "training.gradient_accumulation_steps", gas,
            f"under pipeline parallel the {p.micro_batch_num} pipeline micro batches are the accumulation; "
            f"gradient_accumulation_steps must be a multiple of parallel.micro_batch_num={p.micro_batch_num}",
            f"set training.gradient_accumulation_steps={p.micro_batch_num * max(1, gas // p.micro_batch_num)}"))
    if m.num_layers < p.pipeline_stage:
        issues.append(ConfigIssue(
            "parallel.pipeline_stage", p.pipeline_stage,
            f"more pipeline stages than model.num_layers={m.num_layers}: a stage would hold no layer",
            f"set parallel.pipeline_stage <= {m.num_layers}"))
    return issues


def _heads(cfg: PipelineConfig) -> list[ConfigIssue]:
    p, m = cfg.parallel, cfg.model
    mp = f"not divisible by parallel.model_parallel={p.model_parallel}"
    checks = (  # (field, value, remainder that must be 0, relation, fix)
        ("model.num_heads", m.num_heads, m.num_heads % p.model_parallel, mp,
         "choose a model_parallel that divides num_heads"),
        ("model.n_kv_heads", m.kv_heads, m.kv_heads % p.model_parallel, mp,
         "choose a model_parallel that divides n_kv_heads"),
        ("model.hidden_size", m.hidden_size, m.hidden_size % m.num_heads,
         f"not divisible by model.num_heads={m.num_heads}", f"use a hidden_size that is a multiple of {m.num_heads}"),
        ("model.n_kv_heads", m.kv_heads, m.num_heads % m.kv_heads,
         f"model.num_heads={m.num_heads} is not a multiple of it (grouped-query attention)",
         "use an n_kv_heads that divides num_heads"),
        ("model.intermediate_size", m.intermediate_size, m.intermediate_size % p.model_parallel, mp,
         "use an intermediate_size that is a multiple of model_parallel"),
    )
    return [ConfigIssue(field, value, why, fix) for field, value, rest, why, fix in checks if rest]


def _headroom(cfg: PipelineConfig) -> list[ConfigIssue]:
    p = cfg.parallel
    if p.usable_memory_gb <= 0:
        return [ConfigIssue("parallel.device_memory_headroom_gb", p.headroom_gb,
                            f"leaves nothing of parallel.device_memory_gb={p.device_memory_gb:g}",
                            "set a headroom below device_memory_gb (5 on 64 GB cards) or leave it empty")]
    return []


def _tp_inside_node(cfg: PipelineConfig) -> list[ConfigIssue]:
    p = cfg.parallel
    if p.model_parallel > p.devices_per_node:
        return [ConfigIssue("parallel.model_parallel", p.model_parallel,
                            f"tensor parallel across nodes (devices_per_node={p.devices_per_node}): every layer "
                            "would all-reduce over the inter-node network",
                            f"keep model_parallel <= {p.devices_per_node} and use pipeline_stage or data_parallel "
                            "across nodes")]
    return []


def _precision(cfg: PipelineConfig) -> list[ConfigIssue]:
    """training.precision is the one knob; explicit model dtypes and loss scales must agree with it."""
    t, m = cfg.training, cfg.model
    issues = []
    if t.precision == "fp16" and t.loss_scale.type == "none":
        issues.append(ConfigIssue("training.loss_scale.type", "none",
                                  "fp16 without loss scaling underflows small gradients to zero",
                                  "set training.loss_scale.type=dynamic (mindformers' DynamicLossScaleUpdateCell; "
                                  "or leave it empty: fp16 derives dynamic)"))
    if t.precision == "bf16" and not (t.loss_scale.type == "none" or
                                      (t.loss_scale.type == "static" and t.loss_scale.init_value == 1)):
        issues.append(ConfigIssue("training.loss_scale.type", t.loss_scale.type,
                                  "bf16 has fp32's exponent range and uses a constant loss scale of 1",
                                  "set training.loss_scale.type=none (or static with init_value=1), or leave it empty"))
    want = precision_dtypes(t.precision)["compute_dtype"]
    if m.compute_dtype != want:
        issues.append(ConfigIssue("model.compute_dtype", m.compute_dtype,
                                  f"training.precision={t.precision} means {want} matmuls; the two would disagree "
                                  "(loss scale, planner and checkpoints follow training.precision)",
                                  f"leave model.compute_dtype empty, or set training.precision="
                                  f"{ {v: k for k, v in _COMPUTE.items()}[m.compute_dtype] }"))
    for name in DTYPE_FIELDS[1:]:
        value = getattr(m, name)
        if value not in ("float32", m.compute_dtype):
            # mindformers builds it, but no reference config mixes float16 and bfloat16 in one network:
            # every cast between them loses range (fp16) or mantissa (bf16).
            issues.append(ConfigIssue(f"model.{name}", value,
                                      f"neither float32 nor model.compute_dtype={m.compute_dtype}: mixes "
                                      "float16 and bfloat16 in one network",
                                      f"set model.{name} to float32 or {m.compute_dtype}, or leave it empty"))
    if m.use_flash_attention and m.compute_dtype == "float32" and device_target(cfg) != "CPU":
        # mindformers' FlashAttention (FlashAttentionScore) takes float16/bfloat16 q/k/v only.
        issues.append(ConfigIssue("model.use_flash_attention", True,
                                  "mindformers' FlashAttentionScore takes float16/bfloat16 inputs only, and "
                                  "model.compute_dtype is float32",
                                  "set training.precision=bf16, or model.use_flash_attention=false"))
    return issues


_COMPUTE = {p: precision_dtypes(p)["compute_dtype"] for p in ("fp32", "bf16", "fp16")}


def lora_model_name(cfg: PipelineConfig) -> str:
    return cfg.sft.model_name or f"{cfg.model.name}_lora"


# No rule on model.name / sft.model_name being distinct or unused: in mindformers 1.9 they only become
# `trainer.model_name` (a log label; the run yaml is a full config, so no bundled config is looked up by
# it) and the checkpoint prefix (base and LoRA checkpoints live in different stage folders). The clash
# users report, "'aimv2' is already used by a Transformers config", is raised by Hugging Face
# transformers' `AutoConfig.register` when code registers a custom config under a built-in model type;
# neither pipeline_lib nor mindformers 1.9 calls it (mindformers' own AutoConfig.register writes only
# mindformers' CONFIG_MAPPING, and we never call that either). tests/config/test_validate.py checks
# both facts.


def _lora(cfg: PipelineConfig) -> list[ConfigIssue]:
    if cfg.sft.lora_rank > cfg.model.hidden_size:
        return [ConfigIssue("sft.lora_rank", cfg.sft.lora_rank,
                            f"larger than model.hidden_size={cfg.model.hidden_size}",
                            "use a rank well below hidden_size (4-64)")]
    bad = [t for t in cfg.sft.target_modules if t not in LORA_TARGETS]
    if bad:
        return [ConfigIssue("sft.target_modules", bad, f"unknown projection(s); known: {sorted(LORA_TARGETS)}",
                            "use mindformers Llama names such as wq, wk, wv, wo, w1, w2, w3")]
    return []


LORA_TARGETS = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}
DEMO_SFT_DATA = "configs/data/tiny_sft.jsonl"


def is_tiny_demo(cfg: PipelineConfig) -> bool:
    """The demo scale (a smoke-test model no wider than 512), where the bundled toy SFT file is fine."""
    return cfg.model.hidden_size <= 512


def _sft(cfg: PipelineConfig) -> list[ConfigIssue]:
    """SFT's own schedule and batch (it no longer borrows training.*), and its data."""
    s, p = cfg.sft, cfg.parallel
    issues = []
    if s.warmup_steps >= s.steps:
        issues.append(ConfigIssue("sft.warmup_steps", s.warmup_steps,
                                  f"not below sft.steps={s.steps}: the whole finetune would be warm-up",
                                  f"set sft.warmup_steps to about {max(1, s.steps // 20)} (5% of sft.steps)"))
    accum = sft_accumulation(cfg)
    if p.pipeline_stage > 1 and accum % p.pipeline_stage:
        issues.append(ConfigIssue(
            "sft.gradient_accumulation_steps", accum,
            f"under pipeline parallel it becomes micro_batch_num and must be a multiple of "
            f"parallel.pipeline_stage={p.pipeline_stage}",
            f"set sft.gradient_accumulation_steps={p.pipeline_stage * max(1, accum // p.pipeline_stage)}"))
    demo = [i for i in s.inputs if i.replace("\\", "/").endswith(DEMO_SFT_DATA)]
    if demo and not s.allow_demo_data and not is_tiny_demo(cfg):
        issues.append(ConfigIssue("sft.inputs", demo,
                                  "the bundled demo file (a handful of toy samples) would finetune a "
                                  f"hidden_size={cfg.model.hidden_size} model (demo scale is <= 512)",
                                  "point sft.inputs at your instruction data, or set sft.allow_demo_data=true "
                                  "if this is really meant"))
    return issues

def _schedule(cfg: PipelineConfig) -> list[ConfigIssue]:
    """The learning-rate schedules (training.*, sft.*): a floor above the peak, a wsd whose warm-up and decay do not fit
    the run, wsd-only settings under cosine, and a lineage schedule the stage cannot keep (docs/training-schedule.md)."""
    t, issues = cfg.training, []
    for name, s in (("training", t), ("sft", cfg.sft)):
        if s.min_lr > s.learning_rate:
            issues.append(ConfigIssue(f"{name}.min_lr", s.min_lr,
                                      f"above the peak {name}.learning_rate={s.learning_rate:g}: the decay would "
                                      "raise the learning rate",
                                      f"set {name}.min_lr below {name}.learning_rate (about 1/10 to 1/100 of it, "
                                      f"e.g. {s.learning_rate / 10:g}), or raise {name}.learning_rate"))
    if t.lr_schedule == "cosine":
        for field, value, default in (("lineage_steps", t.lineage_steps, 0),
                                      ("keep_stable_weights", t.keep_stable_weights, False)):
            if value != default:
                issues.append(ConfigIssue(f"training.{field}", value, "applies to training.lr_schedule=wsd only: a "
                                          "cosine run has no stable phase to continue",
                                          f"set training.lr_schedule=wsd, or remove training.{field}"))
        return issues
    if t.steps is None:
        return issues + [ConfigIssue("training.lr_schedule", "wsd", "training.steps is null (the run lasts "
                                     "training.epochs): wsd places its decay at the end of a known step budget",
                                     "set training.steps, or training.lr_schedule=cosine")]
    decay = wsd_decay_steps(t)
    warmup_left = max(0, t.warmup_steps - t.lineage_steps)
    if warmup_left + decay > t.steps:
        field, value = ("training.decay_steps", t.decay_steps) if t.decay_steps else \
            ("training.decay_fraction", t.decay_fraction)
        done = f" (of training.warmup_steps={t.warmup_steps}, training.lineage_steps={t.lineage_steps} done)" \
            if t.lineage_steps else ""
        issues.append(ConfigIssue(field, value,
                                  f"the decay ({decay} steps) and the warm-up left ({warmup_left} steps{done}) do not "
                                  f"fit in training.steps={t.steps}: the run would decay before it reached the peak",
                                  f"make warmup_steps + decay steps <= training.steps: e.g. training.decay_steps="
                                  f"{max(1, t.steps - warmup_left) // 2 or 1}, or a shorter training.warmup_steps, or "
                                  "more training.steps"))
    elif t.keep_stable_weights and decay >= t.steps:
        issues.append(ConfigIssue("training.keep_stable_weights", True,
                                  f"the decay spans the whole run (training.steps={t.steps}): no stable phase to keep",
                                  "lower training.decay_steps / decay_fraction"))
    return issues


def _lineage_schedule(cfg: PipelineConfig) -> list[ConfigIssue]:
    p = cfg.parallel
    if cfg.nightly.lr_schedule == "lineage" and p.model_parallel * p.pipeline_stage > 1:
        # the stable-phase weights are written by one rank (train/mf_callbacks.py SaveWeightsAtStep): whole only when
        # every rank holds the whole model
        return [ConfigIssue("nightly.lr_schedule", "lineage",
                            f"the stable-phase weights are written by one rank, which holds the whole model only "
                            f"without tensor/pipeline parallel (parallel.model_parallel={p.model_parallel}, "
                            f"pipeline_stage={p.pipeline_stage})",
                            "set nightly.lr_schedule=per_run for this layout")]
    return []


MIN_PREFLIGHT_STEPS = 3  # the preflight judges the loss trend from thirds of its steps


def preflight_steps_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    steps = cfg.training.preflight_steps
    if 0 < steps < MIN_PREFLIGHT_STEPS:
        return [ConfigIssue("training.preflight_steps", steps,
                            f"the preflight needs at least {MIN_PREFLIGHT_STEPS} steps to judge the loss trend",
                            f"set training.preflight_steps >= {MIN_PREFLIGHT_STEPS} (e.g. 10), or 0 to skip it")]
    return []


def profile_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    """training.profile's window: start_step < stop_step <= training.steps (mindformers' ProfileMonitor silently
    resets a reversed window to 1..10, and a window past the last step never finishes its analysis)."""
    p, steps = cfg.training.profile, cfg.training.steps
    if not p.enabled:
        return []
    if p.start_step >= p.stop_step:
        fix = (f"set training.profile.start_step below {p.stop_step} (e.g. {max(1, p.stop_step - 4)}) or raise "
               "training.profile.stop_step" if p.stop_step > 1 else "raise training.profile.stop_step (e.g. 6)")
        return [ConfigIssue("training.profile.start_step", p.start_step,
                            f"must be < training.profile.stop_step={p.stop_step}", fix)]
    if steps is not None and p.stop_step > steps:
        return [ConfigIssue("training.profile.stop_step", p.stop_step, f"exceeds training.steps={steps}",
                            f"set training.profile.stop_step <= {steps} (and start_step below it), or raise "
                            "training.steps")]
    return []


def base_weights_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    m = cfg.model
    if m.base_checkpoint and m.hf_checkpoint:
        return [ConfigIssue("model.hf_checkpoint", m.hf_checkpoint,
                            f"model.base_checkpoint={m.base_checkpoint!r} is set too: the base weights would "
                            "come from two places", "keep one of model.base_checkpoint and model.hf_checkpoint")]
    return []


def document_mask_issues(cfg: PipelineConfig, target: str | None = None) -> list[ConfigIssue]:
    """Where data.packing.document_mask cannot work (the pretrain yaml builder refuses the same; facts and source
    lines of mindformers 1.9 in docs/mindformers-facts.md, "Packed documents"). `target`: the device the
    training runs on, default what run.device_target resolves to."""
    if not cfg.data.packing.document_mask:
        return []
    target = target or device_target(cfg)
    m, issues = cfg.model, []
    if m.use_flash_attention and target != "CPU":
        issues.append(ConfigIssue(
            "data.packing.document_mask", True,
            f"with model.use_flash_attention on {target}, mindformers 1.9's Llama hands the attention_mask to "
            "FlashAttentionScore, which reads every nonzero entry as 'discard' (mindformers/modules/"
            "flash_attention.py:92), i.e. this mask's allowed positions; mindformers' own route for packed "
            "documents in Llama (use_eod_attn_mask_compression with an actual_seq_len column, models/llama/"
            "llama.py:115) needs the per-batch offsets its dataset adds only when the data_loader section names "
            "create_compressed_eod_mask (dataset/causal_language_model_dataset.py:40-53, 121-138), a key "
            "MindDataset does not accept: not wired here, and not testable without an Ascend card",
            "set data.packing.document_mask=false, or model.use_flash_attention=false with training.precision=fp32 "
            "(mindformers' plain attention: seq_length^2 scores per head in memory)"))
    if m.compute_dtype != "float32":
        issues.append(ConfigIssue(
            "data.packing.document_mask", True,
            f"mindformers adds the mask to the attention scores in model.compute_dtype={m.compute_dtype} "
            "(models/llama/llama_transformer.py:722); next to the mask's 255 a float16 score moves in steps of "
            "0.125 and a bfloat16 one in steps of 1, which blurs attention",
            "set training.precision=fp32, or data.packing.document_mask=false"))
    return issues


def _cpu(cfg: PipelineConfig) -> list[ConfigIssue]:
    if device_target(cfg) != "CPU":
        return []
    p = cfg.parallel
    issues = []
    for field in ("model_parallel", "pipeline_stage"):
        value = getattr(p, field)
        if value > 1:
            issues.append(ConfigIssue(f"parallel.{field}", value,
                                      "tensor/pipeline parallel needs Ascend (MindSpore refuses SEMI_AUTO_PARALLEL "
                                      "on CPU); planning this layout is fine, running it here is not",
                                      f"run on an Ascend pool, or set parallel.{field}=1 for a CPU run "
                                      "(llm-pipeline plan still plans the real layout)"))
    bf16 = [f for f in DTYPE_FIELDS if getattr(cfg.model, f) == "bfloat16"]
    if bf16:
        # measured: the tiny Llama's graph fails to compile ("Select CPU operator[Reshape] fail ... BFloat16");
        # fp16 (with its dynamic loss scale, CPUTrainOneStepCell's IsFinite check) and fp32 train on CPU.
        field = "training.precision" if cfg.training.precision == "bf16" else f"model.{bf16[0]}"
        issues.append(ConfigIssue(field, "bf16" if field == "training.precision" else "bfloat16",
                                  "MindSpore 2.9's CPU kernels have no bfloat16 (e.g. Reshape): the graph "
                                  "does not compile on CPU",
                                  "set training.precision=fp32 (or fp16) for a CPU run; bf16 is for Ascend"))
    if cfg.training.checkpoint_format == "safetensors" and p.devices > 1:
        # measured with msrun dp2: mindformers/checkpoint/sharded_tensor.py:440 raises at the first save
        issues.append(ConfigIssue("training.checkpoint_format", "safetensors",
                                  f"Checkpoint 2.0 with {p.devices} ranks on CPU fails at the first save: mindformers "
                                  "1.9 describes each rank's shards from MindSpore's parallel strategy "
                                  "(get_strategy_metadata), which a CPU data-parallel run does not have",
                                  "set training.checkpoint_format=ckpt for a multi-rank CPU run, or "
                                  "parallel.devices=1; on Ascend (semi-auto parallel) it applies"))
    return issues


def _replay(cfg: PipelineConfig) -> list[ConfigIssue]:
    runs = cfg.data.replay.runs
    twice = sorted({r for r in runs if runs.count(r) > 1})
    if twice:
        return [ConfigIssue("data.replay.runs", list(runs), f"names {', '.join(twice)} more than once (a run's rows "
                            "are one pool; the sample already repeats rows when the pool is short)",
                            "list each run once")]
    return []


def checkpoint_format_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    """training.async_save exists only in Checkpoint 2.0: mindformers 1.9 passes it to the legacy .ckpt writer too
    (MindSpore's ModelCheckpoint), but nothing there marks a step complete, so a checkpoint still being written could
    be verified, resumed from or handed over."""
    t = cfg.training
    if t.async_save and t.checkpoint_format != "safetensors":
        return [ConfigIssue("training.async_save", t.async_save,
                            f"asynchronous saving needs Checkpoint 2.0 (training.checkpoint_format=safetensors, whose "
                            f"tracker file names a step only once every rank wrote it); training.checkpoint_format="
                            f"{t.checkpoint_format}",
                            "set training.checkpoint_format=safetensors, or training.async_save=false")]
    if t.checkpoint_format == "safetensors" and cfg.parallel.num_nodes > 1:
        return [ConfigIssue("training.checkpoint_format", t.checkpoint_format,
                            f"a run over {cfg.parallel.num_nodes} nodes publishes each node's rank_N checkpoint files "
                            "into the stage folder; Checkpoint 2.0's iteration folders (one per step for all ranks, "
                            "the tracker, common.json on rank 0) are not published across nodes yet",
                            "set training.checkpoint_format=ckpt for a multi-node run")]
    upload = t.upload_checkpoints if t.upload_checkpoints is not None else is_remote(cfg.run.output_root)
    if t.checkpoint_format == "safetensors" and upload:
        return [ConfigIssue("training.checkpoint_format", t.checkpoint_format,
                            "uploading checkpoints to the run store (training.upload_checkpoints, on by default with an "
                            "s3:// run.output_root) copies per-rank .ckpt files; a Checkpoint 2.0 step (iteration folder, "
                            "tracker, common.json) is not uploaded yet, so a retry elsewhere could not resume",
                            "set training.checkpoint_format=ckpt for a remote run store, or keep run.output_root local")]
    return []


RULES = (_batch, _replay, _devices, _pipeline, _heads, _headroom, _tp_inside_node, _precision, _lora, _sft, _schedule,
         _lineage_schedule,
         preflight_steps_issues, profile_issues, base_weights_issues, document_mask_issues,
         checkpoint_format_issues)


def warnings(cfg: PipelineConfig) -> list[str]:
    """Settings that run but do not do what their name says (validate prints them; exit code stays 0)."""
    p = cfg.parallel
    out = []
    if p.optimizer_shard and p.data_parallel == 1:
        # mindformers' enable_parallel_optimizer shards optimizer states over the data-parallel group only.
        out.append("parallel.optimizer_shard=true has no effect with parallel.data_parallel=1: mindformers shards "
                   "optimizer states across the data-parallel group, which is one device here (the planner "
                   "counts no saving). Fix: set optimizer_shard=false, or use data_parallel > 1")
    t = cfg.training
    if is_remote(cfg.run.output_root) and "upload_checkpoints" in t.model_fields_set \
            and not t.upload_checkpoints:
        out.append(f"training.upload_checkpoints=false with a remote run store (run.output_root="
                   f"{cfg.run.output_root}): the checkpoints stay on the training machine, so a retry on another "
                   "machine finds none and restarts from step 0. Fix: remove training.upload_checkpoints (on by "
                   "default for an s3:// run) or set it to true")
    d = cfg.data
    seq = cfg.model.seq_length
    if d.packing.document_mask and seq > 512:
        # the mask is stored, int32 (MindRecord has no uint8), seq_length^2 per row (docs/mindformers-facts.md)
        out.append(f"data.packing.document_mask=true at model.seq_length={seq}: every packed row carries a "
                   f"{4 * seq * seq / (1 << 20):g} MiB attention_mask next to its {4 * (seq + 1) / 1024:g} KiB of "
                   "tokens, in the MindRecord files and in each training batch. Fix: a shorter seq_length, or "
                   "data.packing.document_mask=false")
    if d.dask_address and d.executor != "dask":
        out.append(f"data.dask_address={d.dask_address} has no effect with data.executor={d.executor}: only the dask "
                   "executor sends work to a Dask scheduler. Fix: set data.executor=dask, or remove data.dask_address")
    r = d.replay
    if r.fraction > 0 and not r.runs and not r.sources:
        out.append(f"data.replay.fraction={r.fraction} with no data.replay.runs and no data.replay.sources: nothing to "
                   "replay, unless the nightly fills data.replay.runs with its promoted nights (it does from the second "
                   "night on). Fix: for a single run, name earlier runs in data.replay.runs or a general corpus in "
                   "data.replay.sources")
    return out


def check(cfg: PipelineConfig, *, for_run: bool = True, stages=None) -> list[ConfigIssue]:
    """The issues of the stages a command runs (stages None: every stage; config/stage_scope.py)."""
    issues = [i for rule in RULES for i in rule(cfg)]
    if for_run:
        issues += _cpu(cfg)
    return scope(issues, stages)[0]


def ignored_issues(cfg: PipelineConfig, stages, *, for_run: bool = True) -> list[ConfigIssue]:
    """Warnings naming each issue left out because only stages the command does not run would meet it."""
    issues = [i for rule in RULES for i in rule(cfg)] + (_cpu(cfg) if for_run else [])
    return [ignored_note(i, stages) for i in scope(issues, stages)[1]]


def validate(cfg: PipelineConfig, *, for_run: bool = True, stages=None) -> PipelineConfig:
    issues = check(cfg, for_run=for_run, stages=stages)
    if issues:
        raise ConfigError(issues)
    return cfg
