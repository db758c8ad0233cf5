"""MindSpore callbacks that run inside the trainer: exact per-step metrics and a NaN / loss-spike guard.

What:
- `PipelineMetrics` appends one record per step to `<output_dir>/metrics.jsonl` (layout and keys in
  `pipeline_lib.train.metrics`): loss, overflow, loss scale, learning rate and global norm come straight
  from the train wrapper's outputs (`MFTrainOneStepCell` / `CPUTrainOneStepCell` return
  `(loss, overflow, loss_scale, lr, global_norm)`), step time from this process's clock: `step_time_ms` from the
  step's begin to its loss being ready (the step's compute, and its collectives where there are any) and
  `data_wait_ms` from the previous step's end to this step's begin (the dataset fetch plus the callbacks after
  this one, e.g. a checkpoint save; None for an attempt's first step). The MindSpore 2.9 profiler on CPU records
  op times and memory but no step boundaries or dataset waits, so this split is measured here. A resumed
  trainer's first record supersedes the earlier attempt's rows from its step on (`metrics.MetricsFile`).
- `PipelineMetrics` also writes every rank's heartbeat (`heartbeat/rank_N.json`: last finished step, the step
  under way, pid, host; train.heartbeat) at train begin, each step's begin and end, and train end: the hang
  watchdog's input.
- `LossGuard` stops training at the first step whose loss is not finite, or exceeds `spike_factor` x the
  mean of the previous `window` finite losses. It writes `<output_dir>/guard/rank_N.json` (step, loss, the
  running mean, lr, loss scale, global norm, the dataset rows of the batch and the source documents packed in them)
  and raises `LossGuardError`, so the process exits non-zero and the launcher raises `GuardTripped`. The rows are
  found by the batch's content in the train MindRecord files (train.batch_docs; exact also with training.shuffle
  on), the documents through the data stage's rows-to-documents sidecars; unshuffled, `metrics.batch_rows` gives
  the rows by position as well.

Both are registered with mindformers (module type CALLBACK): the run yaml lists them (`metrics.
training_callbacks`) and the trainer process must import this module before building the Trainer.

Why they hook the checkpoint callback: mindformers sorts its own callbacks first and appends any other type
after `CheckpointMonitor`, so a plain guard would run after the bad step was already saved. At train begin each
of these callbacks registers itself on every `ModelCheckpoint` of the run, which then runs them (metrics
first, guard second) before saving; each runs once per step either way.

Test hook: `LLM_PIPELINE_INJECT_NAN_STEP=k` (optionally `LLM_PIPELINE_INJECT_NAN_RANK=r`) makes `LossGuard` fill
the first trainable float parameter with NaN at the start of step k, so the real forward produces a NaN loss
and every part after it (wrapper overflow check, guard, launcher) runs as in a real divergence. Never set it
in production: it corrupts the weights.

Loss under pipeline parallel: metrics.jsonl is written by the first rank of the last stage and both callbacks
record the loss normalised as mindformers' MFLossMonitor does (metrics.LossRule, passed from the run yaml as
`loss_rule`; the raw value stays as `loss_raw`); the guard runs only on last-stage ranks.

Limits: the loss is the rank-local loss (data parallel ranks see different batches; every rank runs the
guard). In sink mode one "step" is a sink of several steps. Raises ValueError for bad arguments.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import deque

import numpy as np
from mindspore import Tensor
from mindspore.train.callback import Callback, ModelCheckpoint

from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

from .heartbeat import Heartbeat
from .metrics import LossRule, MetricsFile, batch_rows, guard_diagnosis_path, metrics_path

INJECT_NAN_ENV = "LLM_PIPELINE_INJECT_NAN_STEP"
INJECT_NAN_RANK_ENV = "LLM_PIPELINE_INJECT_NAN_RANK"


class LossGuardError(RuntimeError):
    """Raised inside the trainer when the guard stops training."""


def _value(x):
    if x is None:
        return None
    if isinstance(x, Tensor):
        x = x.asnumpy()
    arr = np.asarray(x)
    if arr.dtype == np.bool_:
        return bool(arr.all())
    return float(arr.astype(np.float64).mean()) if arr.size else None


def step_outputs(net_outputs) -> dict:
    """loss, overflow, loss_scale, lr, global_norm from a train wrapper's outputs (missing ones are None)."""
    outs = list(net_outputs) if isinstance(net_outputs, (tuple, list)) else [net_outputs]
    names = ("loss", "overflow", "loss_scale", "lr", "global_norm")
    return {name: _value(outs[i]) if i < len(outs) else None for i, name in enumerate(names)}


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the world size (0, 1 outside a distributed run)."""
    try:
        from mindspore.communication import get_group_size, get_rank

        return int(get_rank()), int(get_group_size())
    except Exception:  # communication not initialised: a single-process run
        return 0, 1


class _BeforeCheckpoint(Callback):
    """Runs `step_end_once` at most once per step, and before any checkpoint callback of the run.

    Also knows the global data step: a resumed mindformers run restarts `cur_step_num` at 0 (it skips the
    consumed batches in the dataset instead), and the resumed step count sits in the checkpoint callback's
    `_append_step_num` (what it adds to name `step_num` in the next checkpoint). `initial_step` overrides it.
    """

    priority = 0  # lower runs first among these callbacks

    def __init__(self, initial_step: int | None = None):
        super().__init__()
        self._done_step = None
        self.initial_step = initial_step
        self.step_offset = initial_step or 0

    def data_step(self, cb) -> int:
        """1-based count of batches consumed so far, across resumes (the `step_num` in mindformers ckpts)."""
        return self.step_offset + int(cb.cur_step_num)

    def on_train_begin(self, run_context):
        cb_params = run_context.original_args()
        self._done_step = None
        if self.initial_step is None:
            self.step_offset = int(cb_params.get("initial_step") or 0)
        for cb in cb_params.get("list_callback") or []:
            if not isinstance(cb, ModelCheckpoint):
                continue
            if self.initial_step is None and not self.step_offset:
                self.step_offset = int(getattr(cb, "_append_step_num", 0) or 0)
            if not hasattr(cb, "_pipeline_first"):
                original = cb.on_train_step_end
                cb._pipeline_first = []

                def run_first(ctx, _cb=cb, _original=original):
                    for early in sorted(_cb._pipeline_first, key=lambda c: c.priority):
                        early.on_train_step_end(ctx)
                    _original(ctx)

                cb.on_train_step_end = run_first  # instance attribute: the callback manager calls this
            if self not in cb._pipeline_first:
                cb._pipeline_first.append(self)

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        if step != self._done_step:
            self._done_step = step
            self.step_end_once(run_context)

    def step_end_once(self, run_context):
        raise NotImplementedError


@MindFormerRegister.register(MindFormerModuleType.CALLBACK)
class PipelineMetrics(_BeforeCheckpoint):
    """Writes metrics.jsonl (rank 0, or every rank with all_ranks=True). tokens_per_step is the global
    token count of one optimizer step; None derives it from the batch shape x world size."""

    priority = 0

    def __init__(self, output_dir: str, tokens_per_step: int | None = None, all_ranks: bool = False,
                 initial_step: int | None = None, loss_rule: dict | None = None, **kwargs):
        super().__init__(initial_step)
        self.rule = LossRule(**(loss_rule or {}))
        if tokens_per_step is not None and tokens_per_step <= 0:
            raise ValueError(f"tokens_per_step={tokens_per_step!r}: must be > 0 or None")
        self.output_dir, self.tokens_per_step, self.all_ranks = output_dir, tokens_per_step, all_ranks
        self.file: MetricsFile | None = None
        self.heartbeat: Heartbeat | None = None
        self._t0 = time.perf_counter()
        self._last_end: float | None = None  # when the previous step's record was taken (None: first step)
        self._wait_ms: float | None = None

    def on_train_begin(self, run_context):
        super().on_train_begin(run_context)
        rank, world = rank_and_size()
        self.heartbeat = Heartbeat(self.output_dir, rank)
        self.heartbeat.begin(self.step_offset)
        # metrics.jsonl is the loss rank's (a last-stage rank under pipeline parallel: LossRule)
        loss_rank = self.rule.loss_rank(world)
        if rank == loss_rank or self.all_ranks:
            self.file = MetricsFile(metrics_path(self.output_dir, 0 if rank == loss_rank else rank))
        import mindspore

        # device memory after launch, for planner_check.json (MindSpore keeps no pool statistics on CPU)
        self._device_stats = mindspore.get_context("device_target") == "Ascend"

    def on_train_step_begin(self, run_context):
        if self.heartbeat is not None:
            self.heartbeat.step_begins(self.data_step(run_context.original_args()))
        self._t0 = time.perf_counter()
        # between the previous step's end and this begin: the next batch from the dataset pipeline, plus the
        # callbacks that run after this one (checkpoint saving on save steps, the loss monitor's log line)
        self._wait_ms = None if self._last_end is None else (self._t0 - self._last_end) * 1000

    def _tokens(self, cb) -> int | None:
        if self.tokens_per_step:
            return self.tokens_per_step
        element = cb.get("train_dataset_element")
        if not element or len(element[0].shape) != 2:
            return None
        rows, length = element[0].shape
        return rows * (length - 1) * rank_and_size()[1]  # rows hold seq_length + 1 tokens

    def step_end_once(self, run_context):
        cb = run_context.original_args()
        if self.heartbeat is not None:
            self.heartbeat.step_ends(self.data_step(cb))
        if self.file is None:
            return
        out = step_outputs(cb.net_outputs)  # reading the loss waits for the step: time after it
        ms = (time.perf_counter() - self._t0) * 1000
        out["loss_raw"], out["loss"] = out["loss"], self.rule.normalise(out["loss"])
        tokens = self._tokens(cb)
        self.file.write({"step": self.data_step(cb), "epoch": int(cb.cur_epoch_num),
                         "step_in_epoch": (self.data_step(cb) - 1) % int(cb.batch_num) + 1, **out,
                         "step_time_ms": round(ms, 3), "tokens_per_s": tokens / (ms / 1000) if tokens else None,
                         "data_wait_ms": None if self._wait_ms is None else round(self._wait_ms, 3),
                         "rank": rank_and_size()[0], "time": time.time(), "source": "callback",
                         **self._device_memory()})
        self._last_end = time.perf_counter()

    def _device_memory(self) -> dict:
        if not getattr(self, "_device_stats", False):
            return {}
        from ..planner.readings import device_memory_stats, ms_peak_bytes

        peak = ms_peak_bytes(device_memory_stats())
        return {"device_max_reserved_bytes": peak} if peak else {}

    def on_train_end(self, run_context):
        if self.heartbeat is not None:
            self.heartbeat.train_ends()
        if self.file is not None:
            self.file.close()


@MindFormerRegister.register(MindFormerModuleType.CALLBACK)
class LossGuard(_BeforeCheckpoint):
    """Stops training on a non-finite loss or a spike; see the module docstring."""

    priority = 1

    def __init__(self, output_dir: str, spike_factor: float = 5.0, window: int = 20, batch_size: int | None = None,
                 data_parallel: int | None = None, num_rows: int | None = None, initial_step: int | None = None,
                 shuffle_seed: int | None = None, loss_rule: dict | None = None, dataset_dir: str | None = None,
                 **kwargs):
        super().__init__(initial_step)
        self.rule = LossRule(**(loss_rule or {}))
        self.dataset_dir = dataset_dir  # the train MindRecord files and their sidecars: the batch's documents
        self.shuffle_seed = shuffle_seed  # set when the dataset is shuffled: file rows cannot be named then
        if spike_factor <= 1:
            raise ValueError(f"spike_factor={spike_factor!r}: must be > 1 (training.guard.spike_factor)")
        if window < 2:
            raise ValueError(f"window={window!r}: must be >= 2 (training.guard.window)")
        self.output_dir, self.spike_factor, self.window = output_dir, float(spike_factor), int(window)
        self.batch_size, self.data_parallel, self.num_rows = batch_size, data_parallel, num_rows
        self.losses: deque[float] = deque(maxlen=self.window)
        inject = os.environ.get(INJECT_NAN_ENV)
        self.inject_step = int(inject) if inject else None
        inject_rank = os.environ.get(INJECT_NAN_RANK_ENV)
        self.inject_rank = int(inject_rank) if inject_rank else None

    def on_train_step_begin(self, run_context):
        cb = run_context.original_args()
        rank = rank_and_size()[0]
        if self.data_step(cb) == self.inject_step and self.inject_rank in (None, rank):
            for param in cb.train_network.trainable_params():
                if np.issubdtype(param.asnumpy().dtype, np.floating):
                    param.set_data(Tensor(np.full(param.shape, np.nan, param.asnumpy().dtype)))
                    print(f"[LossGuard] test hook {INJECT_NAN_ENV}={self.inject_step}: filled {param.name} "
                          f"with NaN at step {self.data_step(cb)} on rank {rank}", flush=True)
                    break

    def step_end_once(self, run_context):
        cb = run_context.original_args()
        rank, world = rank_and_size()
        if self.rule.pipeline_stages > 1 and rank < self.rule.loss_rank(world):
            return  # an earlier pipeline stage holds no valid loss: the last stage's ranks judge it
        out = step_outputs(cb.net_outputs)
        out["loss_raw"], out["loss"] = out["loss"], self.rule.normalise(out["loss"])
        loss = out["loss"]
        mean = sum(self.losses) / len(self.losses) if self.losses else None
        if loss is not None and math.isfinite(loss):
            if len(self.losses) < self.window or loss <= self.spike_factor * mean:
                self.losses.append(loss)
                return
            ratio = loss / mean if mean > 0 else math.inf
            why = (f"loss {loss:.4f} is {ratio:.1f}x the mean {mean:.4f} of the last {self.window} steps "
                   f"(limit training.guard.spike_factor={self.spike_factor:g})")
            reason = "spike"
        else:
            why, reason = f"loss is {loss} (not finite)", "nonfinite"
        self._trip(cb, out, reason, why, mean)

    def _trip(self, cb, out: dict, reason: str, why: str, mean: float | None):
        rank, world = rank_and_size()
        step = self.data_step(cb)
        element = cb.get("train_dataset_element")
        ids = element[0].asnumpy() if element and isinstance(element[0], Tensor) else None
        batch = self.batch_size or (int(ids.shape[0]) if ids is not None else None)
        dp = self.data_parallel or world
        # rank % dp: with model/pipeline parallel several ranks share a data shard; with full_batch
        # (semi-auto parallel) the yaml passes data_parallel=1 and every rank reads the whole batch.
        rows, found, docs, lookup_error = None, None, None, None
        if ids is not None and ids.ndim == 2 and self.dataset_dir:
            try:
                from .batch_docs import documents, find_rows

                found = find_rows(self.dataset_dir, ids)
                docs = documents(self.dataset_dir, [hit for hits in found for hit in hits])
            except Exception as err:  # naming the documents must never hide the trip itself
                lookup_error = f"{type(err).__name__}: {err}"
        if self.shuffle_seed is not None:
            position = (f"a shuffled batch (training.shuffle, seed {self.shuffle_seed}): batch "
                        f"{(step - 1) % int(cb.batch_num) + 1} of epoch {int(cb.cur_epoch_num)}")
            if found is not None and all(found):
                rows = sorted({hit["global_row"] for hits in found for hit in hits})
                where = f"{position}, dataset rows {rows} (found by content)"
            else:
                where = f"{position} (its rows were not found by content: {lookup_error or 'no matching row'})"
        elif batch:
            rows = batch_rows(step, int(cb.batch_num), batch, dp, rank % dp, self.num_rows)
            where = f"dataset rows {rows}"
        else:
            where = "dataset rows unknown (no batch size)"
        message = (f"loss guard stopped training at step {step} on rank {rank}: {why}; the batch was {where}. "
                   "The weights of this step were not checkpointed: resume from latest_checkpoint.json after "
                   "lowering training.learning_rate or removing those rows")
        diag = {"reason": reason, "message": message, "step": step, "epoch": int(cb.cur_epoch_num),
                "rank": rank, "world_size": world, **out, "running_mean": mean, "window": self.window,
                "spike_factor": self.spike_factor, "batch_rows": rows, "batch_where": where,
                "batch_found": found, "documents": docs, "documents_error": lookup_error,
                "batch_head": ids[:4, :8].tolist() if ids is not None and ids.ndim == 2 else None,
                "time": time.time()}
        path = guard_diagnosis_path(self.output_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(diag, indent=2), encoding="utf-8")
        os.replace(tmp, path)
        raise LossGuardError(message)
