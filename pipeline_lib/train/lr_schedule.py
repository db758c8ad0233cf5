"""The learning-rate schedule of a training stage: what the mindformers yaml's `lr_schedule` says, and its value per step.

Two schedules (training.lr_schedule; SFT is always cosine):
- cosine: mindformers' own `CosineWithWarmUpLR` (linear warm-up from 0 over warmup_steps, then a half cosine from the
  peak to min_lr over the rest of the run).
- wsd (warmup-stable-decay): our `LineageWSDLR` (train/mf_lr.py registers it with mindformers). mindformers 1.9's own
  `WarmUpStableDecayLR` does not fit: its decay is linear only, it cannot start the warm-up part-way (a lineage that
  warmed up in earlier runs), and with warmup_steps=0 its stable phase computes `lr * step / step`, NaN at step 0.

`Wsd.lr(step)` is the schedule in plain Python (no MindSpore): the reference the MindSpore cell is tested against,
step by step. `step` is mindformers' optimizer `global_step` before the update, 0 for a run's first update:
- held rate: `learning_rate * min(1, (lineage_steps + min(step, stable_step)) / warmup_steps)` (learning_rate when
  warmup_steps is 0): the warm-up goes on where the lineage left it, then holds the peak;
- decay: the last `decay_steps` updates (steps stable_step .. total_steps-1, k = 1..decay_steps of them) go from the
  held rate to min_lr: `floor + (held - floor) * f(k / decay_steps)`, f = 1 - p (linear) or (1 + cos(pi p)) / 2
  (cosine), floor = min(min_lr, held); the run's last update is at min_lr.
`stable_step = total_steps - decay_steps`: the weights after that many updates are the stable-phase weights (the
`SaveWeightsAtStep` callback writes them); the next run of a lineage starts from them with
lineage_steps + stable_step as its own lineage_steps, so the held rates of the runs join into one warm-up and plateau.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

WSD_CLASS = "LineageWSDLR"
"""Registered by pipeline_lib.train.mf_lr (the entry module imports it in every trainer process)."""


@dataclass(frozen=True)
class Wsd:
    learning_rate: float
    min_lr: float
    warmup_steps: int
    total_steps: int
    decay_steps: int
    lineage_steps: int = 0
    shape: str = "linear"

    def __post_init__(self):
        if not 1 <= self.decay_steps <= self.total_steps:
            raise ValueError(f"decay_steps={self.decay_steps}: must be between 1 and total_steps={self.total_steps}")
        if self.shape not in ("linear", "cosine"):
            raise ValueError(f"shape={self.shape!r}: must be 'linear' or 'cosine'")

    @property
    def stable_step(self) -> int:
        """Updates before the decay starts: the stable-phase weights are the weights after this many steps."""
        return self.total_steps - self.decay_steps

    def held(self, step: int) -> float:
        at = self.lineage_steps + min(step, self.stable_step)
        return self.learning_rate * (min(1.0, at / self.warmup_steps) if self.warmup_steps else 1.0)

    def lr(self, step: int) -> float:
        held = self.held(step)
        k = step - self.stable_step + 1
        if k <= 0:
            return held
        p = min(1.0, k / self.decay_steps)
        f = 1.0 - p if self.shape == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
        floor = min(self.min_lr, held)
        return floor + (held - floor) * f

    def yaml_section(self) -> dict:
        return {"type": WSD_CLASS, "learning_rate": self.learning_rate, "lr_end": self.min_lr,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps, "decay_steps": self.decay_steps,
                "lineage_steps": self.lineage_steps, "decay_shape": self.shape}

    @classmethod
    def from_training(cls, t, total_steps: int) -> "Wsd":
        from ..config.schema import wsd_decay_steps

        return cls(t.learning_rate, t.min_lr, t.warmup_steps, total_steps, min(wsd_decay_steps(t, total_steps),
                   total_steps), t.lineage_steps, t.decay_shape)


def lr_schedule_section(cfg, stage: str, sched: dict, warmup: int, budget: int | None) -> dict:
    """The yaml's `lr_schedule` of `stage` (sched: mindformers_yaml.stage_schedule). wsd needs a step budget
    (validate refuses wsd without training.steps)."""
    if stage == "pretrain" and cfg.training.lr_schedule == "wsd":
        if budget is None:
            raise ValueError("training.lr_schedule=wsd needs training.steps (the decay is placed at the end of a "
                             "known step budget)")
        return Wsd.from_training(cfg.training, budget).yaml_section()
    return {"type": "CosineWithWarmUpLR", "learning_rate": sched["learning_rate"], "lr_end": sched["min_lr"],
            "warmup_steps": warmup, "total_steps": budget if budget is not None else -1}
