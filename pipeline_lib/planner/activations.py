"""Activation memory after Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198), sections 4.1-4.3.

Per transformer layer and micro batch, in bytes (s sequence, b micro batch, h hidden, a heads,
t tensor parallel), with 16-bit activations and 1-byte dropout masks:
  no recompute, t = 1:     s*b*h*(34 + 5*a*s/h)
  no recompute, t > 1:     s*b*h*(10 + 24/t + 5*a*s/(h*t))
  selective (the paper's): the attention-score term 5*a*s/h (5*a*s/(h*t)) is dropped (here: `attention`
                           drops it with the rest of the attention block; mindformers' select_recompute
                           default is the FFN activation instead, see below)
  full recompute:          2*s*b*h (only the layer input is kept)
  flash attention:         never materialises the s x s scores, so the 5*a*s/h term is gone too
Pipeline 1F1B: stage i holds min(pp - i, m) micro batches in flight (section 4.2.3).
Embedding/output (section 4.3): the embedding dropout mask s*b*h per micro batch in flight on the
first stage; on the last stage the final norm and output projection inputs 4*s*b*h and the fp32
logits of the cross entropy 4*s*b*v/t.
Granularity (mindformers recompute_config; the paper's terms split by block, in units of s*b*h with
r = 1/t under sequence parallel, else 1):
  attention block  2r (input) + 1r (dropout mask) + 8/t (Q, K, V, projection input) + scores 5*a*s/(h*t)
  FFN block        2r (input) + 1r (dropout mask) + 8/t (first linear output) + 8/t (activation output)
  norms            4r
  none = the sum (t = 1: 34 + 5as/h; sequence parallel: 34/t + 5as/(ht), the paper's 4.2.2 figure)
  selective        mindformers' select_recompute default: the FFN activation (silu, mul) is rebuilt: - 8/t
  attention        the attention block is rebuilt from its kept input: - (1r + 8/t + scores)
  ffn              the FFN block is rebuilt from its kept input: - (1r + 16/t)
  full             the layer input only: 2 (2/t under sequence parallel or recompute_slice_activation)
Sequence parallel without communication recompute: the all-gathered inputs of the attention and the
FFN stay in memory at full size, + 4*(1 - 1/t) (the paper's 34/t assumes they are re-gathered).
Limits: the paper's coefficients are the tested baseline. They include dropout masks (Llama has
none) and a 4h GeLU MLP (Llama uses SwiGLU); both make the estimate err high for Llama, see
docs/planner.md. fp32 training doubles every 2-byte term (masks included): an approximation.
"""
from __future__ import annotations

RECOMPUTE_MODES = ("none", "selective", "attention", "ffn", "full")


def _parts(s: int, h: int, a: int, *, t: int, flash_attention: bool, seq_parallel: bool) -> dict[str, float]:
    """The per-layer terms above, in units of s*b*h."""
    r = 1 / t if seq_parallel else 1.0
    scores = 0.0 if flash_attention else 5 * a * s / (h * t)
    return {"r": r, "scores": scores, "attention": 3 * r + 8 / t + scores, "ffn": 3 * r + 16 / t, "norms": 4 * r}


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, *, t: int = 1, recompute: str = "none",
                               flash_attention: bool = False, scale: float = 1.0, seq_parallel: bool = False,
                               slice_activation: bool = False, comm_recompute: bool = False) -> float:
    """Korthikanti's per-layer activation bytes for one micro batch; `scale` = activation bytes / 2."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r}: expected one of {RECOMPUTE_MODES}")
    sbh = s * b * h
    if recompute == "full":
        return scale * 2 * sbh / (t if (seq_parallel or slice_activation) else 1)
    p = _parts(s, h, a, t=t, flash_attention=flash_attention, seq_parallel=seq_parallel)
    units = p["attention"] + p["ffn"] + p["norms"]
    if recompute == "selective":
        units -= 8 / t
    elif recompute == "attention":
        units -= p["r"] + 8 / t + p["scores"]
    elif recompute == "ffn":
        units -= p["r"] + 16 / t
    if seq_parallel and t > 1 and not comm_recompute:
        units += 4 * (1 - 1 / t)
    return scale * sbh * units


def recompute_workspace_bytes(s: int, b: int, h: int, a: int, *, t: int = 1, recompute: str = "none",
                              flash_attention: bool = False, scale: float = 1.0, **kw) -> float:
    """Transient memory of recomputation: one layer's dropped activations, rebuilt in backward.

    Not in the paper's per-layer totals (they count what is stored between forward and backward),
    but it is live at the peak: backward of a recomputed layer needs that layer's activations again.
    """
    kept = activation_bytes_per_layer(s, b, h, a, t=t, recompute=recompute,
                                      flash_attention=flash_attention, scale=scale, **kw)
    full = activation_bytes_per_layer(s, b, h, a, t=t, recompute="none",
                                      flash_attention=flash_attention, scale=scale, **kw)
    return max(0.0, full - kept)


def interleave_factor(pipeline_stage: int, interleave: int) -> float:
    """Interleaved 1F1B keeps more in flight on the first stage: x (1 + (p - 1) / (p * v)) (Korthikanti 4.2.3)."""
    if interleave <= 1 or pipeline_stage <= 1:
        return 1.0
    return 1 + (pipeline_stage - 1) / (pipeline_stage * interleave)


def micro_batches_in_flight(pipeline_stage: int, micro_batch_num: int, stage: int = 0) -> int:
    """1F1B: stage i runs pp - i warm-up forwards before its first backward, capped by m.

    Without pipeline parallelism (pp = 1) accumulation runs one micro batch at a time.
    """
    if not 0 <= stage < pipeline_stage:
        raise ValueError(f"stage={stage} outside 0..{pipeline_stage - 1}")
    return max(1, min(pipeline_stage - stage, micro_batch_num))


def embedding_bytes(s: int, b: int, h: int, *, in_flight: int, scale: float = 1.0) -> float:
    """First stage: the embedding dropout mask (1 byte per element) per micro batch in flight."""
    return scale * s * b * h * in_flight


def output_layer_bytes(s: int, b: int, h: int, v: int, *, t: int = 1, scale: float = 1.0) -> float:
    """Last stage: final norm input 2sbh + output projection input 2sbh + fp32 logits 4sbv/t."""
    # The logits are fp32 in every precision (the loss upcasts), so `scale` applies to the sbh part.
    return scale * 4 * s * b * h + 4 * s * b * v / t
