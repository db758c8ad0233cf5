"""Relative step time of a layout: what the advisor ranks by, with the reasons spelled out.

The yardstick is the ideal step: training FLOPs / (devices x achieved FLOP/s), i.e. perfect
scaling with no recompute, no idle pipeline stages and free communication. Each overhead is a
fraction of that ideal:
  recompute        full: one more forward = 1/3 of forward+backward (+33%); attention: the attention
                   block's forward again (2 x its matmul params + 4*s*h scores per layer and token); ffn:
                   the FFN's forward (2 x its params); selective (the FFN's silu and mul): elementwise,
                   ~0 in FLOPs; scaled by the share of layers model.recompute_layers recomputes
  tensor parallel  per layer and micro batch 4 all-reduces of 2*s*b*h bytes (6 with full recompute), ring cost
                   2*(t-1)/t, on the critical path (Megatron-style TP); sequence parallel swaps each for a
                   reduce-scatter + all-gather of the same volume, and communication recompute adds 2
                   all-gathers ((t-1)/t each) in backward. A group larger than the fast interconnect group
                   (parallel.fast_group_size, else devices_per_node) runs at the inter-node bandwidth
  pipeline bubble  1F1B idles (pp-1)/(m*v+pp-1) of the step (v = pp_interleave_num): compute x (pp-1)/(m*v)
  data parallel    one gradient all-reduce (or reduce-scatter + all-gather) per step, ring cost
                   2*(dp-1)/dp, counted as not overlapped (accumulation runs it after the last
                   micro batch). Optimizer sharding: a gradient reduce-scatter (dp-1)/dp per step plus the
                   weights' all-gather (dp-1)/dp per micro batch (twice with communication recompute): on a
                   slow inter-node link with many micro batches this costs more than the all-reduce it
                   replaces (the field report's warning)
  pipeline p2p     one activation and one gradient of 2*s*b*h bytes per micro batch, stage and chunk
Limits: the hardware numbers are assumptions (Hardware, overridable on the command line) and
only the ratios between candidates matter; kernel efficiency versus micro batch size, overlap
of communication with compute and network contention are not modelled.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .params import ModelShape, attention_params, count_params, ffn_params


@dataclass(frozen=True)
class Hardware:
    tflops: float = 150.0  # achieved 16-bit matmul TFLOP/s per device (about half of a 910B's peak)
    intra_node_gbps: float = 150.0  # effective all-reduce bus bandwidth inside a node, GB/s
    inter_node_gbps: float = 25.0  # per device across nodes (a 200 Gb/s RoCE port), GB/s


@dataclass(frozen=True)
class Cost:
    ideal_s: float
    recompute: float
    tensor_parallel: float
    bubble: float
    data_parallel: float
    pipeline_p2p: float
    bubble_fraction: float = 0.0
    optimizer_shard_comm: float = 0.0  # the parallel optimizer's weight all-gathers (part of data_parallel)  # (pp-1)/(m+pp-1): share of the step the first stage idles

    @property
    def relative(self) -> float:
        return 1.0 + self.recompute + self.tensor_parallel + self.bubble + self.data_parallel + self.pipeline_p2p

    @property
    def step_s(self) -> float:
        return self.ideal_s * self.relative

    def reasons(self) -> list[str]:
        out = []
        if self.recompute:
            out.append(f"recompute +{self.recompute:.0%}")
        if self.bubble:
            out.append(f"bubble {self.bubble_fraction:.0%} idle (+{self.bubble:.0%})")
        if self.tensor_parallel:
            out.append(f"TP all-reduce +{self.tensor_parallel:.1%}")
        if self.data_parallel:
            extra = (f", of which weight all-gathers +{self.optimizer_shard_comm:.1%}"
                     if self.optimizer_shard_comm else "")
            out.append(f"DP grad sync +{self.data_parallel:.1%}{extra}")
        if self.pipeline_p2p:
            out.append(f"PP send/recv +{self.pipeline_p2p:.1%}")
        return out or ["no overhead"]

    def as_dict(self) -> dict:
        return {**asdict(self), "relative": self.relative, "step_s": self.step_s, "reasons": self.reasons()}


def train_flops_per_token(shape: ModelShape, seq_length: int) -> float:
    """6 x matmul parameters (forward 2, backward 4) + attention scores 12*L*s*h (Megatron's s/6h term)."""
    return 6 * count_params(shape).matmul + 12 * shape.num_layers * seq_length * shape.hidden_size


def _ring(n: int) -> float:
    return 2 * (n - 1) / n


def recompute_share(shape: ModelShape, *, seq_length: int, recompute: str, flash_attention: bool) -> float:
    """Extra compute of recomputation as a fraction of the ideal step (all layers recomputed)."""
    flops_tok = train_flops_per_token(shape, seq_length)
    L, s, h = shape.num_layers, seq_length, shape.hidden_size
    if recompute == "full":
        return 1 / 3
    if recompute == "attention":
        return (2 * L * attention_params(shape) + 4 * L * s * h) / flops_tok
    if recompute == "ffn":
        return 2 * L * ffn_params(shape) / flops_tok
    return 0.0  # none; selective = elementwise silu/mul, not matmul FLOPs


def step_cost(shape: ModelShape, *, seq_length: int, global_batch: int, micro_batch_size: int,
              data_parallel: int, model_parallel: int, pipeline_stage: int, micro_batch_num: int,
              recompute: str, flash_attention: bool, gradient_bytes: float, devices_per_node: int,
              hw: Hardware = Hardware(), optimizer_shard: bool = False, weight_bytes: float = 0.0,
              seq_parallel: bool = False, comm_recompute: bool = False, interleave: int = 1,
              fast_group_size: int | None = None, recompute_fraction: float = 1.0) -> Cost:
    s, b, h, L = seq_length, micro_batch_size, shape.hidden_size, shape.num_layers
    dp, t, pp = data_parallel, model_parallel, pipeline_stage
    devices = dp * t * pp
    flops_tok = train_flops_per_token(shape, s)
    ideal = flops_tok * global_batch * s / (devices * hw.tflops * 1e12)
    rec = recompute_share(shape, seq_length=s, recompute=recompute, flash_attention=flash_attention)
    rec *= recompute_fraction
    micro_steps = global_batch // (dp * b)  # micro batches each device runs per step
    intra, inter = hw.intra_node_gbps * 1e9, hw.inter_node_gbps * 1e9
    tp = 0.0
    if t > 1:
        n_ar = 6 if recompute == "full" else 4
        per_layer = n_ar * _ring(t) * 2 * s * b * h
        if seq_parallel and comm_recompute:
            per_layer += 2 * (t - 1) / t * 2 * s * b * h  # the two inputs re-gathered in backward
        tp_bw = intra if t <= (fast_group_size or devices_per_node) else inter
        tp_s = -(-L // pp) * micro_steps * per_layer / tp_bw
        tp = tp_s / ideal
    v = interleave if pp > 1 else 1
    bubble = (1 + rec + tp) * (pp - 1) / (micro_batch_num * v) if pp > 1 else 0.0
    bubble_fraction = (pp - 1) / (micro_batch_num * v + pp - 1)
    dp_cost = shard_cost = 0.0
    if dp > 1:
        # pp is the outermost rank dimension: a stage's dp x mp devices are consecutive ranks.
        bw = intra if dp * t <= devices_per_node else inter
        if optimizer_shard:
            gathers = micro_steps * (2 if comm_recompute else 1)
            shard_cost = gathers * (dp - 1) / dp * weight_bytes / bw / ideal
            dp_cost = (dp - 1) / dp * gradient_bytes / bw / ideal + shard_cost
        else:
            dp_cost = _ring(dp) * gradient_bytes / bw / ideal
    p2p = 0.0
    if pp > 1:
        bw = intra if devices <= devices_per_node else inter
        p2p = v * micro_steps * 2 * 2 * s * b * h / bw / ideal
    return Cost(ideal, rec, tp, bubble, dp_cost, p2p, bubble_fraction, shard_cost)


def cost_options(cfg) -> dict:
    """step_cost's keyword arguments for the knobs of a PipelineConfig beyond the layout's degrees."""
    p, m = cfg.parallel, cfg.model
    pp = p.pipeline_stage
    fraction = 1.0
    if m.recompute_layers is not None and m.recompute != "none":
        from .params import stage_layer_counts
        counts = stage_layer_counts(m.num_layers, pp, p.pipeline_offset, p.pp_interleave_num if pp > 1 else 1) \
            if p.pipeline_offset else [m.num_layers // pp + (1 if i < m.num_layers % pp else 0) for i in range(pp)]
        fraction = sum(min(n, c) for n, c in zip(m.recompute_layers, counts)) / max(1, m.num_layers)
    return dict(optimizer_shard=p.optimizer_shard, seq_parallel=p.use_seq_parallel and p.model_parallel > 1,
                comm_recompute=m.comm_recompute, interleave=p.pp_interleave_num,
                fast_group_size=p.fast_group_size, recompute_fraction=fraction)
