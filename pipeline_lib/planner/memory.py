"""Per-device memory of a training layout, term by term (formulas and sources: docs/planner.md).

`estimate(cfg)` reads a PipelineConfig; `estimate_numbers(shape, ...)` takes plain numbers.
Both return the MemoryBreakdown of the heaviest pipeline stage (the first or the last: the
first holds the most micro batches in flight and the embedding, the last the output head and
the logits; middle stages never exceed the first).
Model states follow the mixed-precision convention of the ZeRO paper: 2 bytes of weights,
2 bytes of gradients and K = 12 bytes of AdamW state (fp32 master copy + two moments) per
parameter under fp16/bf16; fp32 training keeps 4 + 4 + 8. Optimizer sharding divides the
optimizer term by the data-parallel degree (ZeRO stage 1).
Limits: an estimate, not a measurement. Communication buffers and the framework reserve are
documented assumptions, not derived from MindSpore internals; fragmentation is not modelled.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..config.schema import PipelineConfig
from .activations import (activation_bytes_per_layer, embedding_bytes, interleave_factor, micro_batches_in_flight,
                          output_layer_bytes, recompute_workspace_bytes)
from .params import ModelShape, layers_on_stage, stage_params

GB = 1e9  # the config's device_memory_gb is in 1e9 bytes
# Bytes per parameter of (weights, gradients, optimizer states) for AdamW.
STATE_BYTES = {"fp16": (2, 2, 12), "bf16": (2, 2, 12), "fp32": (4, 4, 8)}
# Runtime context, collective-library buffers, kernel workspaces: a round, documented guess.
DEFAULT_RESERVE_BYTES = 2.0 * GB
# One gradient fusion bucket in flight for the data-parallel all-reduce / reduce-scatter.
GRAD_BUCKET_BYTES = 0.5 * GB
TERMS = ("weights", "gradients", "optimizer_states", "activations", "embedding_output",
         "recompute_workspace", "comm_buffers", "framework_reserve")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device, one field per term; `total` is their sum."""

    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    embedding_output: float
    recompute_workspace: float
    comm_buffers: float
    framework_reserve: float
    stage: int = 0
    params_on_device: int = 0
    layers_on_stage: int = 0
    micro_batches_in_flight: int = 1
    total: float = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "total", sum(getattr(self, t) for t in TERMS))

    @property
    def model_states(self) -> float:
        return self.weights + self.gradients + self.optimizer_states

    def terms(self) -> dict[str, float]:
        return {t: getattr(self, t) for t in TERMS}

    def as_dict(self) -> dict:
        return asdict(self)

    def gb(self) -> dict[str, float]:
        return {**{t: v / GB for t, v in self.terms().items()}, "total": self.total / GB}


def model_state_bytes(params: float, precision: str = "bf16", *, data_parallel: int = 1,
                      optimizer_shard: bool = False) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) in bytes for `params` parameters on one device."""
    if precision not in STATE_BYTES:
        raise ValueError(f"precision={precision!r}: expected one of {sorted(STATE_BYTES)}")
    w, g, o = STATE_BYTES[precision]
    shards = data_parallel if optimizer_shard else 1
    return params * w, params * g, params * o / shards


def comm_buffer_bytes(*, s: int, b: int, h: int, data_parallel: int, model_parallel: int,
                      pipeline_stage: int, gradient_bytes: float, scale: float = 1.0) -> float:
    """Buffers the collectives hold at the peak (an assumption, see docs/planner.md)."""
    total = 0.0
    if data_parallel > 1:
        total += min(gradient_bytes, GRAD_BUCKET_BYTES)
    if model_parallel > 1:
        total += scale * 2 * s * b * h  # output of one tensor-parallel all-reduce
    if pipeline_stage > 1:
        total += scale * 2 * 2 * s * b * h  # one activation send + one gradient receive
    return total


def stage_breakdown(shape: ModelShape, *, stage: int, seq_length: int, micro_batch_size: int,
                    data_parallel: int = 1, model_parallel: int = 1, pipeline_stage: int = 1,
                    micro_batch_num: int = 1, recompute: str = "none", flash_attention: bool = False,
                    optimizer_shard: bool = False, precision: str = "bf16",
                    reserve_bytes: float = DEFAULT_RESERVE_BYTES, seq_parallel: bool = False,
                    slice_activation: bool = False, comm_recompute: bool = False, recompute_layers=None,
                    offset=0, interleave: int = 1) -> MemoryBreakdown:
    """`recompute_layers`: per stage, how many of its layers get `recompute` (None: all); the rest keep everything.
    `offset`/`interleave`: mindformers' per-stage layer offset and pp_interleave_num (params.stage_layer_counts)."""
    s, b, h, a, t = seq_length, micro_batch_size, shape.hidden_size, shape.num_heads, model_parallel
    scale = 2.0 if precision == "fp32" else 1.0  # Korthikanti counts 2-byte activations
    params = stage_params(shape, pipeline_stage=pipeline_stage, model_parallel=t, stage=stage, offset=offset,
                          interleave=interleave)
    weights, grads, optim = model_state_bytes(params, precision, data_parallel=data_parallel,
                                              optimizer_shard=optimizer_shard)
    layers = layers_on_stage(shape.num_layers, pipeline_stage, stage, offset, interleave)
    in_flight = micro_batches_in_flight(pipeline_stage, micro_batch_num, stage)
    kw = dict(t=t, flash_attention=flash_attention, scale=scale, seq_parallel=seq_parallel,
              slice_activation=slice_activation, comm_recompute=comm_recompute)
    recomputed = layers if recompute_layers is None else min(layers, recompute_layers[stage])
    per_mb = (activation_bytes_per_layer(s, b, h, a, recompute=recompute, **kw) * recomputed
              + activation_bytes_per_layer(s, b, h, a, recompute="none", **kw) * (layers - recomputed))
    acts = per_mb * in_flight * (interleave_factor(pipeline_stage, interleave) if stage == 0 else 1.0)
    emb_out = 0.0
    if stage == 0:
        emb_out += embedding_bytes(s, b, h, in_flight=in_flight, scale=scale)
    if stage == pipeline_stage - 1:
        emb_out += output_layer_bytes(s, b, h, shape.vocab_size, t=t, scale=scale)
    workspace = recompute_workspace_bytes(s, b, h, a, recompute=recompute, **kw) if recomputed else 0.0
    comm = comm_buffer_bytes(s=s, b=b, h=h, data_parallel=data_parallel, model_parallel=t,
                             pipeline_stage=pipeline_stage, gradient_bytes=grads, scale=scale)
    if optimizer_shard and data_parallel > 1 and not comm_recompute:
        # parallel optimizer: the weights are all-gathered before use; without parallel_optimizer_comm_recompute
        # the gathered copy of one layer is kept for its backward (an assumption, docs/planner.md)
        comm += weights / max(1, layers)
    return MemoryBreakdown(weights, grads, optim, acts, emb_out, workspace, comm, reserve_bytes,
                           stage=stage, params_on_device=params, layers_on_stage=layers,
                           micro_batches_in_flight=in_flight)


def estimate_numbers(shape: ModelShape, **kw) -> MemoryBreakdown:
    """The peak stage's breakdown; keyword arguments as in `stage_breakdown` (without `stage`).

    Even layers: the first or the last stage (middle stages never exceed the first); with a layer offset or
    per-stage recompute lists every stage is computed (a middle stage may hold the most)."""
    pp = kw.get("pipeline_stage", 1)
    uneven = kw.get("offset") or kw.get("recompute_layers") is not None
    stages = set(range(pp)) if uneven else {0, pp - 1}
    return max((stage_breakdown(shape, stage=i, **kw) for i in sorted(stages)), key=lambda m: m.total)


def layout_kwargs(cfg: PipelineConfig) -> dict:
    """The knobs of `estimate_numbers` as a PipelineConfig sets them."""
    p, m, t = cfg.parallel, cfg.model, cfg.training
    return dict(seq_length=m.seq_length, micro_batch_size=t.micro_batch_size, data_parallel=p.data_parallel,
                model_parallel=p.model_parallel, pipeline_stage=p.pipeline_stage,
                micro_batch_num=p.micro_batch_num, recompute=m.recompute,
                flash_attention=m.use_flash_attention, optimizer_shard=p.optimizer_shard,
                precision=t.precision, seq_parallel=p.use_seq_parallel and p.model_parallel > 1,
                slice_activation=m.recompute_slice_activation, comm_recompute=m.comm_recompute,
                recompute_layers=m.recompute_layers, offset=p.pipeline_offset,
                interleave=p.pp_interleave_num if p.pipeline_stage > 1 else 1)


def estimate(cfg: PipelineConfig, *, reserve_bytes: float = DEFAULT_RESERVE_BYTES) -> MemoryBreakdown:
    """Predicted per-device peak of the layout in `cfg` (pretraining; LoRA SFT needs less)."""
    return estimate_numbers(ModelShape.from_config(cfg.model), reserve_bytes=reserve_bytes,
                            **layout_kwargs(cfg))
