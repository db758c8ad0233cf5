"""mindformers callbacks the generated yaml names (registered as CALLBACK on import).

`SaveWeightsAtStep(step, path)` writes the model's weights at one step (a wsd run's stable phase).
`StopAtStep(stop_step)` ends training once the optimizer's `global_step` reaches `stop_step`.
mindformers counts epochs, and its own `TrainCallBack(stop_step)` compares against
`cb_params.cur_step_num`, which restarts at 0 in a resumed run (mindformers does not pass the
resumed step to `Model.train`), so a resumed run would overshoot the budget. `global_step` is
restored from the checkpoint and is what the LR schedule reads, so the budget and the schedule end
together. Steps skipped on loss-scale overflow do not advance `global_step` (they are retried with
new data, like in most trainers).

Limits: needs a wrapper with `.optimizer.global_step` (MFTrainOneStepCell and subclasses); without
one it warns and never stops. Raises ValueError for a non-positive stop_step.
"""
from __future__ import annotations

from mindspore.train.callback import Callback

from mindformers.tools.logger import logger
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister


def _global_step_param(network):
    while network is not None:
        optimizer = getattr(network, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "global_step"):
            return optimizer.global_step
        network = getattr(network, "network", None)
    return None


@MindFormerRegister.register(MindFormerModuleType.CALLBACK)
class StopAtStep(Callback):
    """Request a stop at the end of the step where optimizer global_step >= stop_step."""

    def __init__(self, stop_step: int):
        if not isinstance(stop_step, int) or stop_step < 1:
            raise ValueError(f"StopAtStep.stop_step={stop_step!r}: must be an int >= 1")
        self.stop_step = stop_step
        self._param = None

    def _global_step(self) -> int | None:
        return None if self._param is None else int(self._param.asnumpy().reshape(-1)[0])

    def on_train_begin(self, run_context):
        self._param = _global_step_param(run_context.original_args().train_network)
        if self._param is None:
            logger.warning("StopAtStep: the train network has no optimizer.global_step; the step budget "
                           "%d will not be enforced", self.stop_step)
            return
        start = self._global_step()
        logger.info("StopAtStep: starting at global_step %d, stopping at %d", start, self.stop_step)
        if start >= self.stop_step:
            logger.warning("StopAtStep: global_step %d already reaches the budget %d; stopping after one step",
                           start, self.stop_step)

    def on_train_step_end(self, run_context):
        step = self._global_step()
        if step is not None and step >= self.stop_step:
            logger.info("StopAtStep: global_step %d reached the budget %d, stopping", step, self.stop_step)
            run_context.request_stop()


@MindFormerRegister.register(MindFormerModuleType.CALLBACK)
class SaveWeightsAtStep(Callback):
    """Write the model's weights (model.weights_only: no optimizer or training state) to `path` at the end of the step
    where the optimizer's global_step reaches `step`: a wsd run's stable-phase weights, taken as its decay starts
    (train/lr_schedule.py). Only `rank` writes (the weights of a data-parallel run are the same on every rank). A
    resumed run past `step` finds the file an earlier attempt wrote (it is written under a temporary name and
    renamed, so a file under `path` is whole); the stage checks it is there."""

    def __init__(self, step: int, path: str, rank: int = 0):
        if not isinstance(step, int) or step < 1:
            raise ValueError(f"SaveWeightsAtStep.step={step!r}: must be an int >= 1")
        self.step, self.path, self.rank = step, path, rank
        self._param = None

    def on_train_begin(self, run_context):
        self._param = _global_step_param(run_context.original_args().train_network)

    def on_train_step_end(self, run_context):
        import os

        import mindspore as ms
        from mindspore.communication import get_rank

        from pipeline_lib.model.weights_only import is_model_weight

        if self._param is None or int(self._param.asnumpy().reshape(-1)[0]) != self.step:
            return
        try:
            rank = get_rank()
        except RuntimeError:  # not initialised: a single process
            rank = 0
        if rank != self.rank:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = self.path + ".tmp.ckpt"
        ms.save_checkpoint(run_context.original_args().train_network, tmp, choice_func=is_model_weight)
        os.replace(tmp, self.path)
        logger.info("SaveWeightsAtStep: weights at global_step %d written to %s", self.step, self.path)
