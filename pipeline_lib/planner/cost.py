"""Relative step time of a layout: what the advisor ranks by, with the reasons spelled out.

The yardstick is the ideal step: training FLOPs / (devices x achieved FLOP/s), i.e. perfect
scaling with no recompute, no idle pipeline stages and free communication. Each overhead is a
fraction of that ideal:
  recompute        full: one more forward = 1/3 of forward+backward (+33%); selective: the
                   attention-score forward 4*L*s*h per token (0 with flash attention)
  tensor parallel  per layer and micro batch 4 all-reduces of 2*s*b*h bytes (6 with full
                   recompute), ring cost 2*(t-1)/t, on the critical path (Megatron-style TP)
  pipeline bubble  1F1B idles (pp-1)/(m+pp-1) of the step: compute x (pp-1)/m extra
  data parallel    one gradient all-reduce (or reduce-scatter + all-gather) per step, ring cost
                   2*(dp-1)/dp, counted as not overlapped (accumulation runs it after the last
                   micro batch)
  pipeline p2p     one activation and one gradient of 2*s*b*h bytes per micro batch and stage
Limits: the hardware numbers are assumptions (Hardware, overridable on the command line) and
only the ratios between candidates matter; kernel efficiency versus micro batch size, overlap
of communication with compute and network contention are not modelled.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .params import ModelShape, count_params


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
    bubble_fraction: float = 0.0  # (pp-1)/(m+pp-1): share of the step the first stage idles

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
            out.append(f"DP grad sync +{self.data_parallel:.1%}")
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


def step_cost(shape: ModelShape, *, seq_length: int, global_batch: int, micro_batch_size: int,
              data_parallel: int, model_parallel: int, pipeline_stage: int, micro_batch_num: int,
              recompute: str, flash_attention: bool, gradient_bytes: float, devices_per_node: int,
              hw: Hardware = Hardware()) -> Cost:
    s, b, h, L = seq_length, micro_batch_size, shape.hidden_size, shape.num_layers
    dp, t, pp = data_parallel, model_parallel, pipeline_stage
    devices = dp * t * pp
    flops_tok = train_flops_per_token(shape, s)
    ideal = flops_tok * global_batch * s / (devices * hw.tflops * 1e12)
    if recompute == "full":
        rec = 1 / 3
    elif recompute == "selective" and not flash_attention:
        rec = 4 * L * s * h / flops_tok
    else:
        rec = 0.0
    micro_steps = global_batch // (dp * b)  # micro batches each device runs per step
    intra, inter = hw.intra_node_gbps * 1e9, hw.inter_node_gbps * 1e9
    tp = 0.0
    if t > 1:
        n_ar = 6 if recompute == "full" else 4
        tp_s = -(-L // pp) * micro_steps * n_ar * _ring(t) * 2 * s * b * h / intra
        tp = tp_s / ideal
    bubble = (1 + rec + tp) * (pp - 1) / micro_batch_num if pp > 1 else 0.0
    bubble_fraction = (pp - 1) / (micro_batch_num + pp - 1)
    dp_cost = 0.0
    if dp > 1:
        # pp is the outermost rank dimension: a stage's dp x mp devices are consecutive ranks.
        bw = intra if dp * t <= devices_per_node else inter
        dp_cost = _ring(dp) * gradient_bytes / bw / ideal
    p2p = 0.0
    if pp > 1:
        bw = intra if devices <= devices_per_node else inter
        p2p = micro_steps * 2 * 2 * s * b * h / bw / ideal
    return Cost(ideal, rec, tp, bubble, dp_cost, p2p, bubble_fraction)
