"""validate's warning on a peak learning rate far from the usual one for the model's size (it needs the planner's
parameter count, which config/ may not import)."""
from __future__ import annotations

from ..config.schema import PipelineConfig
from ..planner.params import count_params

# The usual peak learning rate of a model of N parameters: a power law through the published peaks of GPT-3 (Brown et
# al. 2020, Table 2.1: 6.0e-4 at 125M ... 0.6e-4 at 175B, an exponent of -0.32), which also passes near LLaMA / Llama
# 2 (Touvron et al. 2023: 3.0e-4 at 7B and 13B) and Pythia (Biderman et al. 2023: 1.0e-3 at 70M); tiny models
# take 1e-3..3e-3 (the tiny default, 0.35M parameters: 3e-3). Continued pretraining and LoRA finetunes run lower,
# hence a wide band: a warning only past 10x above or 100x below (docs/training-schedule.md).
USUAL_LR_AT_125M, USUAL_LR_EXPONENT = 6e-4, -0.3
LR_FAR_ABOVE, LR_FAR_BELOW = 10.0, 100.0


def usual_peak_lr(params: int) -> float:
    return USUAL_LR_AT_125M * (params / 125e6) ** USUAL_LR_EXPONENT


def lr_range_warnings(cfg: PipelineConfig) -> list[str]:
    n = count_params(cfg.model).total
    usual, out = usual_peak_lr(n), []
    for name in ("training", "sft"):
        lr = getattr(cfg, name).learning_rate
        far = "above" if lr > LR_FAR_ABOVE * usual else "below" if lr < usual / LR_FAR_BELOW else None
        if far:
            out.append(f"{name}.learning_rate={lr:g} is {lr / usual:.3g}x the usual peak for a model of "
                       f"{n / 1e6:,.2f}M parameters (~{usual:.1e}: published peaks fitted as 6e-4 x (N / 125M)^-0.3, "
                       f"docs/training-schedule.md): far {far} it, training "
                       f"{'diverges or skips its updates' if far == 'above' else 'barely moves the weights'}. Fix: set "
                       f"{name}.learning_rate near {usual:.1e} (continued pretraining and LoRA often 1/10 of it), or "
                       "keep it if a run measured it")
    return out
