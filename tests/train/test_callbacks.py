"""callbacks.py in a real MindSpore training (CPUTrainOneStepCell, graph mode) in a subprocess.

One process trains a tiny next-token model four times: a normal run, a run whose 7th batch is a different
token pattern (loss spike), a run with the NaN test hook at step 7, and a "resumed" run whose checkpoint
callback carries step_num=12 like mindformers' resume does. It also reads a MindRecord file through
MindDataset shards to check `metrics.batch_rows` against the real data order.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from pipeline_lib.runtime.env import subprocess_env
from pipeline_lib.train.metrics import batch_rows, guard_diagnosis_path, metrics_path, read_metrics

_TRAIN = r'''
import json, os, sys
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, Tensor
from mindspore.mindrecord import FileWriter
from mindspore.train import Model
from mindspore.train.callback import ModelCheckpoint, CheckpointConfig
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
from pipeline_lib.train.cpu_wrappers import CPUTrainOneStepCell
from pipeline_lib.train.callbacks import PipelineMetrics, LossGuard, LossGuardError, INJECT_NAN_ENV

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
V, S, B, ROWS = 32, 8, 2, 24
root = sys.argv[1]

class TinyLM(nn.Cell):
    def __init__(self):
        super().__init__()
        self.emb, self.out, self.ce = nn.Embedding(V, 16), nn.Dense(16, V), nn.CrossEntropyLoss()
    def construct(self, ids):
        logits = self.out(self.emb(ids[:, :-1]))
        return self.ce(logits.reshape((-1, V)), ids[:, 1:].reshape((-1,)))

ms.set_seed(0)
net = TinyLM()
opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=0.05)
wrapper = CPUTrainOneStepCell(net, opt, scale_sense=Tensor(1.0), use_clip_grad=True, max_grad_norm=1.0)
initial = [(p, p.asnumpy().copy()) for p in wrapper.get_parameters()]

class SlowRows:
    """A dataset source that takes `delay` seconds per row: the trainer waits for data."""
    def __init__(self, data, delay):
        self.data, self.delay = data, delay
    def __getitem__(self, i):
        import time
        time.sleep(self.delay)
        return (self.data[i],)
    def __len__(self):
        return len(self.data)

def run(name, spike_step=None, nan_step=None, resumed_from=None, row_delay=None):
    # one compiled graph for every scenario: put weights, moments and step counters back instead
    for p, value in initial:
        p.set_data(Tensor(value))
    os.environ.pop(INJECT_NAN_ENV, None)
    if nan_step:
        os.environ[INJECT_NAN_ENV] = str(nan_step)
    data = np.stack([np.arange(S + 1) % 8 + 4] * ROWS).astype(np.int32)
    if spike_step:
        data[(spike_step - 1) * B: spike_step * B] = np.random.default_rng(0).integers(12, V, (B, S + 1))
    data[:, 0] = np.arange(ROWS)  # row marker (token 0 is never a target)
    if row_delay:
        dataset = ds.GeneratorDataset(SlowRows(data, row_delay), ["input_ids"], shuffle=False,
                                      num_parallel_workers=1, python_multiprocessing=False)
    else:
        dataset = ds.NumpySlicesDataset({"input_ids": data}, shuffle=False)
    dataset = dataset.batch(B, drop_remainder=True)
    out = os.path.join(root, name)
    append = [{"step_num": resumed_from}] if resumed_from else None
    ckpt = ModelCheckpoint(prefix="tiny", directory=os.path.join(out, "checkpoint", "rank_0"),
                           config=CheckpointConfig(save_checkpoint_steps=1, keep_checkpoint_max=50,
                                                   append_info=append))
    # mindformers' order: its checkpoint callback first, ours after it
    cbs = [ckpt, PipelineMetrics(out, tokens_per_step=B * S),
           LossGuard(out, spike_factor=3.0, window=3, batch_size=B, data_parallel=1, num_rows=ROWS)]
    try:
        Model(wrapper).train(1, dataset, callbacks=cbs, dataset_sink_mode=False)
        return "finished"
    except LossGuardError as err:
        return "guard: " + str(err)

def shards(dp, batch):
    path = os.path.join(root, "rows.mindrecord")
    w = FileWriter(path, shard_num=1, overwrite=True)
    w.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "rows")
    w.write_raw_data([{"input_ids": np.array([i, 5, 6], np.int32)} for i in range(11)])
    w.commit()
    out = {}
    for rank in range(dp):
        d = ds.MindDataset(path, columns_list=["input_ids"], shuffle=False, num_shards=dp, shard_id=rank)
        out[rank] = [[int(r[0]) for r in b["input_ids"]]
                     for b in d.batch(batch, drop_remainder=True).create_dict_iterator(output_numpy=True)]
    return out

result = {"normal": run("normal"), "spike": run("spike", spike_step=7), "nan": run("nan", nan_step=7),
          "resumed": run("resumed", resumed_from=12), "slow_data": run("slow_data", row_delay=0.05),
          "shards": shards(3, 2),
          "registered": [MindFormerRegister.is_exist(MindFormerModuleType.CALLBACK, n)
                         for n in ("PipelineMetrics", "LossGuard")]}
print("RESULT " + json.dumps(result))
'''


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cb")
    script = root / "tiny_train.py"  # graph mode parses the network's source: it must be a file
    script.write_text(_TRAIN, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(root)], env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root, json.loads(lines[0][len("RESULT "):]), proc.stdout


def _ckpt_steps(run_dir) -> list[int]:
    return sorted(int(p.stem.rsplit("_", 1)[1]) for p in (run_dir / "checkpoint" / "rank_0").glob("*.ckpt"))


def test_callbacks_are_registered_with_mindformers(trained):
    assert trained[1]["registered"] == [True, True]


def test_metrics_hold_exact_values_for_every_step(trained):
    root, result, _ = trained
    assert result["normal"] == "finished"
    rows = read_metrics(metrics_path(root / "normal"))
    assert [r["step"] for r in rows] == list(range(1, 13))
    for r in rows:
        assert math.isfinite(r["loss"]) and r["overflow"] is False and r["loss_scale"] == 1.0
        assert r["lr"] == pytest.approx(0.05) and r["global_norm"] > 0
        assert r["step_time_ms"] > 0 and r["tokens_per_s"] == pytest.approx(16 / (r["step_time_ms"] / 1000), rel=1e-3)
        assert r["source"] == "callback" and r["rank"] == 0 and r["epoch"] == 1 and r["step_in_epoch"] == r["step"]
    assert rows[-1]["loss"] < rows[0]["loss"] / 3  # it learns the repeated pattern
    assert _ckpt_steps(root / "normal") == list(range(1, 13))


def test_data_wait_is_the_time_between_steps_and_compute_the_step_itself(trained):
    root, result, _ = trained
    assert result["slow_data"] == "finished"
    fast, slow = read_metrics(metrics_path(root / "normal")), read_metrics(metrics_path(root / "slow_data"))
    assert fast[0]["data_wait_ms"] is None and slow[0]["data_wait_ms"] is None  # nothing before an attempt's first step
    # 2 rows x 50 ms per batch from a source the pipeline can only read one row at a time: the wait is the data's,
    # while the step itself (the same tiny model) stays as fast as with in-memory data
    waits = sorted(r["data_wait_ms"] for r in slow[1:])
    assert waits[len(waits) // 2] > 60
    assert sorted(r["data_wait_ms"] for r in fast[1:])[len(fast) // 2] < 30
    assert sorted(r["step_time_ms"] for r in slow[1:])[len(slow) // 2] < waits[len(waits) // 2] / 2


@pytest.mark.parametrize("case,reason", [("spike", "spike"), ("nan", "nonfinite")])
def test_guard_stops_before_the_bad_step_is_checkpointed(trained, case, reason):
    root, result, stdout = trained
    assert result[case].startswith("guard: loss guard stopped training at step 7 on rank 0")
    diag = json.loads(guard_diagnosis_path(root / case, 0).read_text())
    assert diag["reason"] == reason and diag["step"] == 7 and diag["window"] == 3
    assert diag["batch_rows"] == [12, 13]
    assert [row[0] for row in diag["batch_head"]] == [12, 13]  # the row markers of the batch it really saw
    assert _ckpt_steps(root / case) == [1, 2, 3, 4, 5, 6]  # no checkpoint of the step-7 weights
    metrics = read_metrics(metrics_path(root / case))
    assert [m["step"] for m in metrics] == list(range(1, 8))  # the bad step is in the history too
    if reason == "spike":
        assert diag["loss"] > 3.0 * diag["running_mean"] and "limit training.guard.spike_factor=3" in diag["message"]
    else:
        assert math.isnan(diag["loss"]) and math.isnan(metrics[-1]["loss"]) and diag["overflow"] is True
        assert "LLM_PIPELINE_INJECT_NAN_STEP=7: filled emb.embedding_table with NaN at step 7" in stdout


def test_resumed_run_counts_steps_from_the_checkpoint_position(trained):
    root, result, _ = trained
    assert result["resumed"] == "finished"
    assert [r["step"] for r in read_metrics(metrics_path(root / "resumed"))] == list(range(13, 25))


def test_batch_rows_match_mindrecord_shards(trained):
    shards = trained[1]["shards"]  # 11 rows, 3 ranks, batch 2: rank r reads rows r, r+3, ... (padded)
    for rank, batches in shards.items():
        for i, rows in enumerate(batches):
            assert batch_rows(i + 1, len(batches), 2, data_parallel=3, rank=int(rank), num_rows=11) == rows
