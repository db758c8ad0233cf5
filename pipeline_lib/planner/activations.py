"""Activation memory after Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198), sections 4.1-4.3.

Per transformer layer and micro batch, in bytes (s sequence, b micro batch, h hidden, a heads,
t tensor parallel), with 16-bit activations and 1-byte dropout masks:
  no recompute, t = 1:     s*b*h*(34 + 5*a*s/h)
  no recompute, t > 1:     s*b*h*(10 + 24/t + 5*a*s/(h*t))
  selective recompute:     the attention-score term 5*a*s/h (5*a*s/(h*t)) is dropped
  full recompute:          2*s*b*h (only the layer input is kept)
  flash attention:         never materialises the s x s scores, so the 5*a*s/h term is gone too
Pipeline 1F1B: stage i holds min(pp - i, m) micro batches in flight (section 4.2.3).
Embedding/output (section 4.3): the embedding dropout mask s*b*h per micro batch in flight on the
first stage; on the last stage the final norm and output projection inputs 4*s*b*h and the fp32
logits of the cross entropy 4*s*b*v/t.
Limits: the paper's coefficients are the tested baseline. They include dropout masks (Llama has
none) and a 4h GeLU MLP (Llama uses SwiGLU); both make the estimate err high for Llama, see
docs/planner.md. Sequence parallel is not modelled (the config has no switch for it). fp32
training doubles every 2-byte term (masks included): an approximation.
"""
from __future__ import annotations

RECOMPUTE_MODES = ("none", "selective", "full")


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, *, t: int = 1, recompute: str = "none",
                               flash_attention: bool = False, scale: float = 1.0) -> float:
    """Korthikanti's per-layer activation bytes for one micro batch; `scale` = activation bytes / 2."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r}: expected one of {RECOMPUTE_MODES}")
    sbh = s * b * h
    if recompute == "full":
        return scale * 2 * sbh
    # t = 1 reduces 10 + 24/t to the paper's 34: the same expression covers both cases.
    linear = 10 + 24 / t
    scores = 0.0 if (recompute == "selective" or flash_attention) else 5 * a * s / (h * t)
    return scale * sbh * (linear + scores)


def recompute_workspace_bytes(s: int, b: int, h: int, a: int, *, t: int = 1, recompute: str = "none",
                              flash_attention: bool = False, scale: float = 1.0) -> float:
    """Transient memory of recomputation: one layer's dropped activations, rebuilt in backward.

    Not in the paper's per-layer totals (they count what is stored between forward and backward),
    but it is live at the peak: backward of a recomputed layer needs that layer's activations again.
    """
    kept = activation_bytes_per_layer(s, b, h, a, t=t, recompute=recompute,
                                      flash_attention=flash_attention, scale=scale)
    full = activation_bytes_per_layer(s, b, h, a, t=t, recompute="none",
                                      flash_attention=flash_attention, scale=scale)
    return full - kept


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
