"""Training-step wrapper for CPU runs, registered with mindformers as a WRAPPER.

What: `CPUTrainOneStepCell` is mindformers' `MFTrainOneStepCell` with two CPU fixes:
- the overflow check uses `IsFinite` over the gradients (the stock cell uses the Ascend-only
  `NPUGetFloatStatusV2`), so loss scaling (static, dynamic or the constant 1) works on CPU;
- `accumulation_steps=K` splits each dataset batch into K micro batches inside the graph and sums
  their gradients (divided by K through the grad-scale factor). mindformers ignores
  `gradient_accumulation_steps` outside semi-auto parallel, which CPU cannot run. With unmasked
  rows (pretraining) the update equals the full-batch update; with masked SFT labels it is the mean of
  per-micro-batch means (as in most accumulation implementations).

`cpu_barrier` stands in for `mindspore.communication.comm_func.barrier` on CPU: mindformers 1.9 calls that barrier
when a multi-rank run resumes from a checkpoint (trainer/utils.py, utils/load_checkpoint_utils.py, ...), and MindSpore
2.9 has no CPU kernel for it ("Unsupported op [Barrier] on CPU"; its pynative all_reduce fails the same way:
"Create kernelmod for op InnerCommAllReduce failed"), while a graph-mode AllReduce of one value works (measured with
two msrun CPU ranks). Importing this module routes those modules' `barrier` through it; on any other device target
the original barrier runs.

The generated yaml names it `runner_wrapper.type: CPUTrainOneStepCell`; `pipeline_lib.train.entry`
imports this module on every rank before the Trainer builds the wrapper.

Limits: legacy (non-mcore) models only; `calculate_per_token_loss` with accumulation is refused.
Raises ValueError for a bad `accumulation_steps` or a batch it does not divide (at graph build).
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import ops
from mindspore.common.tensor import Tensor
from mindspore.context import ParallelMode

import mindspore as ms
from mindspore import nn
from mindspore.communication import comm_func

from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
from mindformers.wrapper.wrapper import MFTrainOneStepCell

_nonfinite = ops.MultitypeFuncGraph("_pipeline_nonfinite")


@_nonfinite.register("Tensor")
def _nonfinite_tensor(grad):
    # 1.0 when any element is inf/nan, else 0.0; shape (1,) so AddN can sum the flags.
    bad = ops.logical_not(ops.IsFinite()(grad).all())
    return ops.reshape(ops.cast(bad, mstype.float32), (1,))


@MindFormerRegister.register(MindFormerModuleType.WRAPPER)
class CPUTrainOneStepCell(MFTrainOneStepCell):
    """MFTrainOneStepCell with an IsFinite overflow check and in-graph gradient accumulation."""

    def __init__(self, network, optimizer, accumulation_steps: int = 1, **kwargs):
        if not isinstance(accumulation_steps, int) or isinstance(accumulation_steps, bool) or accumulation_steps < 1:
            raise ValueError(f"runner_wrapper.accumulation_steps={accumulation_steps!r}: must be an int >= 1")
        super().__init__(network, optimizer, **kwargs)
        if accumulation_steps > 1 and self.calculate_per_token_loss:
            raise ValueError("runner_wrapper.accumulation_steps > 1 with calculate_per_token_loss is not supported "
                             "on CPU; set calculate_per_token_loss: False")
        self.accumulation_steps = accumulation_steps
        self.accum_factor = Tensor([float(accumulation_steps)], dtype=mstype.float32)
        self.distributed = self.parallel_mode != ParallelMode.STAND_ALONE
        self.flag_allreduce = ops.AllReduce() if self.distributed else None

    def get_overflow_status(self, status, compute_output):
        """True when any gradient holds inf/nan (summed over ranks in data parallel)."""
        flags = ops.AddN()(self.hyper_map(_nonfinite, compute_output))
        flag = ops.reshape(flags, ())
        if self.distributed:
            flag = self.flag_allreduce(flag)
        return flag >= 1.0

    def grads_for_legacy(self, scaling_sens, *inputs):
        """Loss and summed gradients over `accumulation_steps` micro batches; factor K un-sums them."""
        if self.accumulation_steps == 1:
            return super().grads_for_legacy(scaling_sens, *inputs)
        steps = self.accumulation_steps
        batch = inputs[0].shape[0]
        if batch % steps:
            raise ValueError(f"dataset batch {batch} is not divisible by runner_wrapper.accumulation_steps={steps}")
        micro = batch // steps
        loss_sum = None
        grads_sum = None
        for i in range(steps):
            part = tuple(x[i * micro:(i + 1) * micro] for x in inputs)
            loss = self.network(*part)
            sens = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
            grads = self.grad(self.network, self.weights)(*part, sens)
            if grads_sum is None:
                loss_sum, grads_sum = loss, grads
            else:
                loss_sum = loss_sum + loss
                grads_sum = self.hyper_map(ops.add, grads_sum, grads)
        return loss_sum / steps, grads_sum, self.accum_factor


class _AllReduceOne(nn.Cell):
    def __init__(self):
        super().__init__()
        self.op = ops.AllReduce()

    def construct(self, x):
        return self.op(x)


_ORIGINAL_BARRIER = comm_func.barrier
_barrier_cell: _AllReduceOne | None = None


def cpu_barrier(*args, **kwargs):
    """Every rank waits here for every other (see the module docstring)."""
    global _barrier_cell
    if ms.get_context("device_target") != "CPU":
        return _ORIGINAL_BARRIER(*args, **kwargs)
    from mindspore.parallel._auto_parallel_context import auto_parallel_context

    # mindformers may call it while full_batch is set outside (semi-)auto parallel, which refuses any graph compile
    context = auto_parallel_context()
    full_batch = context.get_full_batch()
    context.set_full_batch(False)
    try:
        if _barrier_cell is None:
            _barrier_cell = _AllReduceOne()
        _barrier_cell(Tensor([1.0], mstype.float32)).asnumpy()  # asnumpy waits for the collective to finish
    finally:
        context.set_full_batch(full_batch)
    return None


def _route_barriers() -> None:
    import importlib

    comm_func.barrier = cpu_barrier  # mindformers/utils/parallel_utils.py looks it up there at call time
    for name in ("mindformers.trainer.utils", "mindformers.utils.load_checkpoint_utils", "mindformers.version_control",
                 "mindformers.core.callback.callback"):  # these imported the name itself
        module = importlib.import_module(name)
        if getattr(module, "barrier", None) is _ORIGINAL_BARRIER:
            module.barrier = cpu_barrier


_route_barriers()
