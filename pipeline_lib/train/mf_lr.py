"""`LineageWSDLR`: the warmup-stable-decay schedule (train/lr_schedule.py, `Wsd.lr`) as a MindSpore cell, registered
with mindformers as an LR class on import (the generated yaml names it `lr_schedule.type: LineageWSDLR`; the entry
module imports this module in every trainer process).

The graph is branch-free (min/max clamps), so graph mode compiles it as one expression of global_step; the same
arithmetic as `Wsd.lr`, in float32 (tests/train/test_mf_lr.py compares them step by step).
"""
from __future__ import annotations

import math

import mindspore.common.dtype as mstype
from mindspore.common.tensor import Tensor
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from mindspore.ops import operations as P

from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

from .lr_schedule import Wsd


@MindFormerRegister.register(MindFormerModuleType.LR)
class LineageWSDLR(LearningRateSchedule):
    """Warm up (continuing a lineage's warm-up at lineage_steps), hold learning_rate, decay to lr_end over the last
    decay_steps of total_steps (decay_shape linear or cosine)."""

    def __init__(self, learning_rate: float, lr_end: float, warmup_steps: int, total_steps: int, decay_steps: int,
                 lineage_steps: int = 0, decay_shape: str = "linear", **kwargs):
        super().__init__()
        spec = Wsd(float(learning_rate), float(lr_end), int(warmup_steps), int(total_steps), int(decay_steps),
                   int(lineage_steps), decay_shape)  # checks the arguments
        self.cosine = spec.shape == "cosine"
        f32 = mstype.float32
        self.peak = Tensor(spec.learning_rate, f32)
        self.lr_end = Tensor(spec.min_lr, f32)
        self.lineage = Tensor(float(spec.lineage_steps), f32)
        self.stable = Tensor(float(spec.stable_step), f32)
        self.decay = Tensor(float(spec.decay_steps), f32)
        self.warmup = Tensor(float(max(spec.warmup_steps, 1)), f32)
        # without a warm-up the held rate is the peak from the first step (the ratio's floor is 1)
        self.ratio_floor = Tensor(0.0 if spec.warmup_steps else 1.0, f32)
        self.one = Tensor(1.0, f32)
        self.zero = Tensor(0.0, f32)
        self.pi = Tensor(math.pi, f32)
        self.minimum, self.maximum, self.cos, self.cast = P.Minimum(), P.Maximum(), P.Cos(), P.Cast()
        self.kwargs = kwargs

    def construct(self, global_step):
        step = self.cast(global_step, mstype.float32)
        at = self.lineage + self.minimum(step, self.stable)
        ratio = self.minimum(self.one, self.maximum(at / self.warmup, self.ratio_floor))
        held = self.peak * ratio
        p = self.minimum(self.one, self.maximum(self.zero, (step - self.stable + self.one) / self.decay))
        if self.cosine:
            f = 0.5 * (self.one + self.cos(self.pi * p))
        else:
            f = self.one - p
        floor = self.minimum(self.lr_end, held)
        return floor + (held - floor) * f
