"""Out-of-memory remedies by phase, with the planner's figures for the run's own config.

The field report's order: memory that runs out
- at initialization (weights, gradients and optimizer states are laid out before the first step) -> shard the model:
  more model parallel / pipeline stages for the same devices, or optimizer sharding;
- in the forward pass (activations pile up) -> recompute (finer or coarser), sequence parallel, a sliced kept input;
- in the backward pass (gradients meet the activations still held) -> the accumulation settings: a smaller micro
  batch with more accumulation steps (same global batch), fewer pipeline micro batches in flight.
`oom_remedies(cfg)` returns, per phase, each alternative the config rules accept, with its predicted peak per device
(memory.estimate) and relative step time (cost.step_cost), cheapest first among those that fit.
`remedy_lines(cfg)` is the text `llm-pipeline plan` prints; the doctor's device-OOM advice takes the same entries.
Pure arithmetic on the config (no MindSpore).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config.schema import PipelineConfig, global_batch
from ..config.validate import check
from .cost import Hardware, cost_options, step_cost
from .memory import GB, estimate
from .params import ModelShape, default_offset

PHASES = ("initialization", "forward", "backward")


@dataclass(frozen=True)
class Remedy:
    phase: str
    change: str  # what it does, in words
    overrides: tuple[str, ...]  # dotted key=value, as `llm-pipeline run CONFIG key=value` takes them
    peak_gb: float
    step_x: float  # relative step time (1.0 = the ideal step)
    fits: bool


def _with(cfg: PipelineConfig, overrides: dict[str, dict]) -> PipelineConfig:
    return cfg.model_copy(update={sec: getattr(cfg, sec).model_copy(update=vals) for sec, vals in overrides.items()})


def _step_x(cfg: PipelineConfig) -> float:
    p, m, t = cfg.parallel, cfg.model, cfg.training
    mem = estimate(cfg)
    return step_cost(ModelShape.from_config(m), seq_length=m.seq_length, global_batch=global_batch(cfg),
                     micro_batch_size=t.micro_batch_size, data_parallel=p.data_parallel,
                     model_parallel=p.model_parallel, pipeline_stage=p.pipeline_stage,
                     micro_batch_num=p.micro_batch_num, recompute=m.recompute, flash_attention=m.use_flash_attention,
                     gradient_bytes=mem.gradients, devices_per_node=p.devices_per_node, hw=Hardware(),
                     weight_bytes=mem.weights, **cost_options(cfg)).relative


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v).replace(" ", "")


def _layouts(cfg: PipelineConfig):
    """Same devices, more model sharding (mp x pp grows): the initialization remedies."""
    p, t = cfg.parallel, cfg.training
    n, shard = p.devices, p.model_parallel * p.pipeline_stage
    for mp in (d for d in range(1, n + 1) if n % d == 0):
        for pp in (d for d in range(1, n // mp + 1) if (n // mp) % d == 0):
            dp = n // (mp * pp)
            if mp * pp <= shard or (mp, pp) == (p.model_parallel, p.pipeline_stage):
                continue
            accum = t.gradient_accumulation_steps * p.data_parallel // dp  # the same global batch
            par = {"data_parallel": dp, "model_parallel": mp, "pipeline_stage": pp,
                   "micro_batch_num": accum if pp > 1 else 1, "optimizer_shard": p.optimizer_shard and dp > 1,
                   "pipeline_offset": default_offset(cfg.model.num_layers, pp), "pp_interleave_num": 1}
            yield (f"dp{dp} x mp{mp} x pp{pp}", {"parallel": par, "training": {"gradient_accumulation_steps": accum},
                                                 "model": {"recompute_layers": None}})
    if p.data_parallel > 1 and not p.optimizer_shard:
        yield "optimizer sharding", {"parallel": {"optimizer_shard": True}}


def _forward(cfg: PipelineConfig):
    m, p = cfg.model, cfg.parallel
    for mode in ("selective", "ffn", "attention", "full"):
        if mode != m.recompute:
            yield f"recompute {mode}", {"model": {"recompute": mode, "recompute_layers": None,
                                                  "recompute_slice_activation": False}}
    if m.recompute_layers is not None:
        yield f"recompute {m.recompute} on every layer", {"model": {"recompute_layers": None}}
    if p.model_parallel > 1 and not p.use_seq_parallel:
        yield "sequence parallel", {"parallel": {"use_seq_parallel": True}}
    if m.recompute == "full" and p.model_parallel > 1 and not m.recompute_slice_activation \
            and m.recompute_layers is None:
        yield "slice the kept layer input", {"model": {"recompute_slice_activation": True}}


def _backward(cfg: PipelineConfig):
    t, p = cfg.training, cfg.parallel
    b = t.micro_batch_size
    if b > 1:
        for smaller in (d for d in range(b - 1, 0, -1) if b % d == 0):
            accum = t.gradient_accumulation_steps * (b // smaller)
            over = {"training": {"micro_batch_size": smaller, "gradient_accumulation_steps": accum}}
            if p.pipeline_stage > 1:
                over["parallel"] = {"micro_batch_num": accum}
            yield f"micro batch {smaller} x accumulation {accum}", over
            break


def _overrides(over: dict[str, dict]) -> tuple[str, ...]:
    return tuple(f"{sec}.{k}={_fmt(v) if v is not None else 'null'}" for sec, vals in over.items()
                 for k, v in vals.items())


def oom_remedies(cfg: PipelineConfig, *, per_phase: int = 3) -> dict[str, list[Remedy]]:
    usable = cfg.parallel.usable_memory_gb
    current = estimate(cfg).total / GB
    out: dict[str, list[Remedy]] = {}
    known = {str(i) for i in check(cfg, for_run=False)}  # the config's own issues are not the remedy's
    for phase, source in zip(PHASES, (_layouts, _forward, _backward)):
        found = []
        for change, over in source(cfg):
            alt = _with(cfg, over)
            if {str(i) for i in check(alt, for_run=False)} - known:
                continue  # a change the config rules refuse is no remedy
            peak = estimate(alt).total / GB
            if peak >= current - 1e-9:
                continue
            changed = {sec: {k: v for k, v in vals.items() if getattr(getattr(cfg, sec), k) != v}
                       for sec, vals in over.items()}
            found.append(Remedy(phase, change, _overrides({s: v for s, v in changed.items() if v}), peak,
                                _step_x(alt), peak <= usable))
        found.sort(key=lambda r: (not r.fits, r.step_x if r.fits else r.peak_gb))
        out[phase] = found[:per_phase]
    return out


PHASE_TITLES = {"initialization": "at initialization (model states): shard the model",
                "forward": "in the forward pass (activations): recompute",
                "backward": "in the backward pass: accumulation settings"}


def remedy_lines(cfg: PipelineConfig) -> list[str]:
    cur = estimate(cfg).total / GB
    usable = cfg.parallel.usable_memory_gb
    lines = [f"Out of memory? Remedies by phase for this config (now {cur:.1f} GB per device of {usable:g} GB usable; "
             "each with its predicted peak and step time):"]
    for phase, remedies in oom_remedies(cfg).items():
        lines.append(f"  {PHASE_TITLES[phase]}:")
        if not remedies:
            lines.append("    (nothing the config rules accept needs less)")
        for r in remedies:
            lines.append(f"    {r.change:<34} {r.peak_gb:6.1f} GB{'' if r.fits else ' (does not fit)':<16} "
                         f"step x{r.step_x:.2f}   {' '.join(r.overrides)}")
    return lines


def granularity_lines(cfg: PipelineConfig) -> list[str]:
    """Activation memory per device of each recompute choice at the config's own layout."""
    m = cfg.model
    rows = []
    for mode in ("none", "selective", "ffn", "attention", "full"):
        alt = _with(cfg, {"model": {"recompute": mode, "recompute_layers": None if mode == "none" else m.recompute_layers,
                                    "recompute_slice_activation": m.recompute_slice_activation and mode == "full"}})
        mem = estimate(alt)
        note = "" if not check(alt, for_run=False) else "  (refused by the config rules here)"
        mark = " <- this config" if mode == m.recompute else ""
        rows.append(f"  {mode:<10} activations {mem.activations / GB:6.2f} GB, peak {mem.total / GB:6.1f} GB, "
                    f"step x{_step_x(alt):.2f}{mark}{note}")
    p = cfg.parallel
    lines = [f"Recompute choices at this layout (activations of the peak stage, {p.micro_batch_num} micro batch(es), "
             f"sequence parallel {'on' if p.use_seq_parallel and p.model_parallel > 1 else 'off'}):"] + rows
    if p.model_parallel > 1:
        other = _with(cfg, {"parallel": {"use_seq_parallel": not p.use_seq_parallel}})
        lines.append(f"  sequence parallel {'off' if p.use_seq_parallel else 'on'}: activations "
                     f"{estimate(other).activations / GB:.2f} GB, peak {estimate(other).total / GB:.1f} GB")
    if p.mode == "auto":
        lines.append("  parallel.mode=auto: these figures are the semi_auto layout of the same degrees; sharding "
                     "propagation picks each operator's strategy at compile time, which the planner cannot predict "
                     "(it may redistribute tensors and add communication the figures do not show)")
    return lines
