"""Parallel-layout advisor: enumerate layouts, drop what does not fit or breaks a rule, rank the rest.

A layout is (data_parallel, model_parallel, pipeline_stage, micro_batch_num, micro_batch_size,
recompute, optimizer_shard) with dp x mp x pp = devices and global batch = micro batch x
accumulation x dp. Under pipeline parallel the micro batches are the accumulation: micro_batch_num
is a multiple of pp that divides gradient_accumulation_steps.
Every candidate is checked with the config's own rules (`check(cfg, for_run=False)`) plus one of
ours: a tensor-parallel group must not straddle two nodes. Survivors that fit in device memory are
ranked: those that leave 10% of memory free first, then by relative step time (cost.py), then
the larger micro batch, then less memory. A family (dp, mp, pp, sharding) with no
survivor gets one Rejection that says why, e.g. "needs 112.5 GB > 64 GB".
Limits: micro batch sizes above `max_micro_batch_size` are not tried; interleave, sequence parallel,
per-layer recompute lists and communication recompute are taken from the config as they are (not
enumerated; `plan` compares the recompute granularities for the config's own layout, planner.oom);
ZeRO stages 2/3 are not layout knobs here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config.schema import PipelineConfig, global_batch, headroom_gb
from ..config.validate import check
from .cost import Cost, Hardware, cost_options, step_cost
from .memory import DEFAULT_RESERVE_BYTES, GB, MemoryBreakdown, estimate
from .params import ModelShape, ParamCount, count_params, default_offset


@dataclass(frozen=True)
class Layout:
    data_parallel: int
    model_parallel: int
    pipeline_stage: int
    micro_batch_num: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    recompute: str
    optimizer_shard: bool

    @property
    def family(self) -> tuple[int, int, int, bool]:
        return self.data_parallel, self.model_parallel, self.pipeline_stage, self.optimizer_shard

    def family_name(self) -> str:
        dp, mp, pp, shard = self.family
        if mp == pp == 1:
            return f"data parallel + optimizer sharding (dp={dp})" if shard else f"pure data parallel (dp={dp})"
        return f"dp{dp} x mp{mp} x pp{pp}" + (" + optimizer sharding" if shard else "")

    def apply(self, cfg: PipelineConfig) -> PipelineConfig:
        """`cfg` with this layout's parallel, batch and recompute fields."""
        keep_lists = self.pipeline_stage == cfg.parallel.pipeline_stage  # offset / recompute lists are per stage
        par = cfg.parallel.model_copy(update=dict(
            devices=self.data_parallel * self.model_parallel * self.pipeline_stage,
            data_parallel=self.data_parallel, model_parallel=self.model_parallel,
            pipeline_stage=self.pipeline_stage, micro_batch_num=self.micro_batch_num,
            optimizer_shard=self.optimizer_shard,
            **({} if keep_lists else dict(
                pp_interleave_num=cfg.parallel.pp_interleave_num if self.pipeline_stage > 1 else 1,
                pipeline_offset=default_offset(cfg.model.num_layers, self.pipeline_stage,
                                               cfg.parallel.pp_interleave_num if self.pipeline_stage > 1 else 1)))))
        tr = cfg.training.model_copy(update=dict(
            micro_batch_size=self.micro_batch_size, gradient_accumulation_steps=self.gradient_accumulation_steps))
        model = cfg.model.model_copy(update=dict(
            recompute=self.recompute,
            recompute_layers=cfg.model.recompute_layers if keep_lists else None))
        return cfg.model_copy(update=dict(parallel=par, training=tr, model=model))

    @classmethod
    def of(cls, cfg: PipelineConfig) -> "Layout":
        p, t = cfg.parallel, cfg.training
        return cls(p.data_parallel, p.model_parallel, p.pipeline_stage, p.micro_batch_num, t.micro_batch_size,
                   t.gradient_accumulation_steps, cfg.model.recompute, p.optimizer_shard)


@dataclass
class Candidate:
    layout: Layout
    memory: MemoryBreakdown
    cost: Cost
    capacity_bytes: float
    issues: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes

    @property
    def ok(self) -> bool:
        return self.fits and not self.issues


@dataclass
class Rejection:
    family: str
    reason: str
    closest: Candidate | None = None


@dataclass(frozen=True)
class PlanRequest:
    devices: int
    devices_per_node: int
    device_memory_gb: float
    seq_length: int | None = None  # None: the config's model.seq_length
    global_batch: int | None = None  # None: the config's (schema.global_batch)
    reserve_gb: float = DEFAULT_RESERVE_BYTES / GB
    max_micro_batch_size: int = 8
    hardware: Hardware = Hardware()
    headroom_gb: float | None = None  # None: parallel's default rule for this card (schema.headroom_gb)

    @property
    def usable_gb(self) -> float:
        """The budget a layout must fit: the card minus the headroom (what max_device_memory gets)."""
        return self.device_memory_gb - headroom_gb(self.device_memory_gb, self.headroom_gb)


@dataclass
class Plan:
    request: PlanRequest
    config: PipelineConfig  # the input config with the request applied
    params: ParamCount
    ranked: list[Candidate]
    rejected: list[Rejection]
    current: Candidate
    model_issues: list[str]

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(devices: int, global_batch: int, *, flash_attention: bool = False,
                      max_micro_batch_size: int = 8):
    """Every layout to consider, including ones the rules will refuse (they get a reason)."""
    # the layer-level choices; attention / ffn granularity is compared for the chosen layout (planner.oom)
    modes = ["none", "selective", "full"]
    for dp in _divisors(devices):
        for mp in _divisors(devices // dp):
            pp = devices // (dp * mp)
            per_dp = global_batch // dp
            sizes = [b for b in _divisors(per_dp) if b <= max_micro_batch_size] if per_dp else []
            for mbs in sizes or [1]:
                ga = max(1, per_dp // mbs)
                nums = [m for m in _divisors(ga) if m % pp == 0] if pp > 1 else [1]
                for m in nums or [ga]:
                    for rec in modes:
                        for shard in ((False, True) if dp > 1 else (False,)):
                            yield Layout(dp, mp, pp, m, mbs, ga, rec, shard)


def with_request(cfg: PipelineConfig, req: PlanRequest) -> PipelineConfig:
    """`cfg` with the request applied; the target global batch is stated as training.global_batch_size, so
    every layout applied to it is checked against the target (validate.py) while choosing its own batch."""
    model = cfg.model.model_copy(update=dict(seq_length=req.seq_length or cfg.model.seq_length))
    tr = cfg.training.model_copy(update=dict(global_batch_size=req.global_batch or global_batch(cfg)))
    par = cfg.parallel.model_copy(update=dict(devices=req.devices, devices_per_node=req.devices_per_node,
                                              device_memory_gb=req.device_memory_gb,
                                              device_memory_headroom_gb=req.headroom_gb))
    return cfg.model_copy(update=dict(model=model, training=tr, parallel=par))


def _model_issues(cfg: PipelineConfig) -> set[str]:
    """Issues that no layout can fix: those of the config on a trivially valid single device."""
    one = Layout(1, 1, 1, 1, 1, cfg.training.global_batch_size, cfg.model.recompute, False)
    return {str(i) for i in check(one.apply(cfg), for_run=False)}


def evaluate(cfg: PipelineConfig, layout: Layout, req: PlanRequest, ignore: set[str] = frozenset()) -> Candidate:
    cand_cfg = layout.apply(cfg)
    issues = [str(i) for i in check(cand_cfg, for_run=False) if str(i) not in ignore]
    p = cand_cfg.parallel
    if p.devices_per_node % p.model_parallel and p.model_parallel <= p.devices_per_node:
        issues.append(f"parallel.model_parallel={p.model_parallel}: tensor-parallel groups would straddle "
                      f"nodes of {p.devices_per_node} devices. Fix: use a model_parallel that divides "
                      "devices_per_node")
    mem = estimate(cand_cfg, reserve_bytes=req.reserve_gb * GB)
    cost = step_cost(ModelShape.from_config(cfg.model), seq_length=cfg.model.seq_length,
                     global_batch=cfg.training.global_batch_size, micro_batch_size=layout.micro_batch_size,
                     data_parallel=layout.data_parallel, model_parallel=layout.model_parallel,
                     pipeline_stage=layout.pipeline_stage, micro_batch_num=layout.micro_batch_num,
                     recompute=layout.recompute, flash_attention=cfg.model.use_flash_attention,
                     gradient_bytes=mem.gradients, devices_per_node=req.devices_per_node, hw=req.hardware,
                     weight_bytes=mem.weights, **cost_options(cand_cfg))
    return Candidate(layout, mem, cost, req.usable_gb * GB, issues)


def _why_not(name: str, cands: list[Candidate], capacity_gb: float) -> Rejection:
    valid = [c for c in cands if not c.issues]
    if not valid:
        first = cands[0]
        return Rejection(name, f"breaks the config rules: {first.issues[0]}", first)
    c = min(valid, key=lambda c: c.memory.total)
    g = c.memory.gb()
    top = sorted((k for k in g if k != "total"), key=lambda k: -g[k])[:4]
    terms = ", ".join(f"{k.replace('_', ' ')} {g[k]:.1f}" for k in top)
    reason = (f"needs {g['total']:.1f} GB > {capacity_gb:g} GB per device even at its smallest "
              f"(recompute {c.layout.recompute}, micro batch {c.layout.micro_batch_size}): {terms} GB; "
              f"model states alone are {c.memory.model_states / GB:.1f} GB")
    return Rejection(name, reason, c)


COMFORT = 0.9  # above 90% of device memory a layout is one allocator hiccup away from an OOM


def rank_key(c: Candidate) -> tuple:
    """Layouts with headroom (<= COMFORT of memory) first; then step time; on a tie the larger
    micro batch (fewer accumulation steps: better kernel efficiency, and CPU runs ignore
    accumulation), then less memory."""
    return not comfortable(c), round(c.cost.relative, 3), -c.layout.micro_batch_size, c.memory.total


def comfortable(c: Candidate) -> bool:
    return c.memory.total <= COMFORT * c.capacity_bytes


def plan(cfg: PipelineConfig, req: PlanRequest) -> Plan:
    """Rank every layout of `req.devices` devices for the model and batch in `cfg`."""
    base = with_request(cfg, req)
    ignore = _model_issues(base)
    layouts = enumerate_layouts(req.devices, base.training.global_batch_size,
                                flash_attention=base.model.use_flash_attention,
                                max_micro_batch_size=req.max_micro_batch_size)
    cands = [evaluate(base, lay, req, ignore) for lay in layouts]
    ranked = sorted((c for c in cands if c.ok), key=rank_key)
    families: dict[tuple, list[Candidate]] = {}
    for c in cands:
        families.setdefault(c.layout.family, []).append(c)
    rejected = [_why_not(fc[0].layout.family_name(), fc, req.usable_gb)
                for fam, fc in families.items() if not any(c.ok for c in fc)]
    current = evaluate(base, Layout.of(base), req, ignore)
    used = current.layout.data_parallel * current.layout.model_parallel * current.layout.pipeline_stage
    if used != req.devices:
        current.issues.append(f"uses {used} devices, the plan is for {req.devices}")
    return Plan(req, base, count_params(base.model), ranked, rejected, current, sorted(ignore))
