"""The trainer on a tiny Llama on CPU: loss falls, checkpoints land, resume continues, LoRA finetunes.

Every training run is `python -m pipeline_lib.train.entry --yaml ...` in a subprocess (as the
launcher runs it). `pretrained` is session-scoped so other tests can reuse its checkpoint:
`pretrained.checkpoint` (a .ckpt file), `pretrained.yaml`, `pretrained.output_dir`.
Model: seq 64, hidden 64, 2 layers, 4 heads, vocab 2048, ffn 176. Data: rows of an arithmetic
token sequence over 61 ids (next = previous + 7 mod 61, ids 4..64; never the pad id 0), so the loss
falls within a dozen steps. The resume and the LoRA runs start together (two processes, 2 cores).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.train.mindformers_yaml import build_run_config, write_run_yaml

pytestmark = [pytest.mark.slow, pytest.mark.train]

ROOT = Path(__file__).resolve().parents[2]
SEQ = 64
ROWS = 128
CYCLE = 61  # tokens 4..64: next = previous + 7 (mod 61); never the pad id 0
TINY = {"run": {"device_target": "CPU"},
        "model": {"seq_length": SEQ, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 2048,
                  "intermediate_size": 176},
        # micro 2 x accumulation 2: the CPU wrapper splits each 4-row batch in the graph
        "training": {"micro_batch_size": 2, "gradient_accumulation_steps": 2, "global_batch_size": 4,
                     "steps": 12, "save_steps": 6, "keep_checkpoint_max": 3, "warmup_steps": 2,
                     "learning_rate": 5e-3},
        "sft": {"steps": 3, "micro_batch_size": 4, "lora_rank": 4, "warmup_steps": 2}}
LOSS_LINE = re.compile(r"step:\[\s*(\d+)/\s*\d+\], loss:\[([0-9.]+)/")


def token_rows(n: int, prompt_len: int | None = None) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(n):
        ids = ((rng.integers(0, CYCLE) + np.arange(SEQ + 1) * 7) % CYCLE + 4).astype(np.int32)
        row = {"input_ids": ids}
        if prompt_len is not None:
            labels = ids.copy()
            labels[:prompt_len] = -100
            row["labels"] = labels
        rows.append(row)
    return rows


def write_mindrecord(folder: Path, rows: list[dict]) -> Path:
    from mindspore.mindrecord import FileWriter

    folder.mkdir(parents=True)
    writer = FileWriter(str(folder / "rows.mindrecord"), shard_num=1, overwrite=True)
    writer.add_schema({k: {"type": "int32", "shape": [-1]} for k in rows[0]}, "tiny")
    writer.write_raw_data(rows)
    writer.commit()
    return folder


@dataclass
class Run:
    yaml: Path
    output_dir: Path
    stdout: str
    losses: dict[int, float] = field(default_factory=dict)
    timing: dict = field(default_factory=dict)

    @property
    def rank0(self) -> Path:
        return self.output_dir / "checkpoint" / "rank_0"

    @property
    def checkpoint(self) -> Path:
        meta = json.loads((self.rank0 / "meta.json").read_text())
        return self.rank0 / meta["last_ckpt_file"]


def start(tmp: Path, name: str, stage: str, data: Path, overrides: dict | None = None, **kw):
    """Write the run yaml and start the entry module in a subprocess (cwd = a scratch folder)."""
    sections = json.loads(json.dumps(TINY))
    for section, values in (overrides or {}).items():
        sections.setdefault(section, {}).update(values)
    cfg = config_from_dict(sections)
    run_dir = tmp / name
    out = kw.pop("output_dir", run_dir / "out")
    run = build_run_config(cfg, stage=stage, dataset_dir=str(data), output_dir=str(out), **kw)
    yaml_path = write_run_yaml(cfg, run_dir / f"{stage}.yaml", run, stage=stage)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               LOG_MF_PATH=str(run_dir / "log"), MS_OM_PATH=str(run_dir / "om"), GLOG_v="3")
    proc = subprocess.Popen([sys.executable, "-m", "pipeline_lib.train.entry", "--yaml", str(yaml_path)],
                            cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, Run(yaml_path, Path(out), "")


def finish(started, timeout: float = 300) -> Run:
    proc, run = started
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"trainer timed out after {timeout}s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    if proc.returncode:
        raise AssertionError(f"trainer failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    run.stdout = stdout
    run.losses = {int(s): float(v) for s, v in LOSS_LINE.findall(stdout)}
    for line in stdout.splitlines():
        if line.startswith("PIPELINE_TIMING "):
            run.timing.update(json.loads(line.split(" ", 1)[1]))
    return run


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny_data")
    return {"pretrain": write_mindrecord(base / "pretrain", token_rows(ROWS)),
            "sft": write_mindrecord(base / "sft", token_rows(ROWS // 2, prompt_len=20))}


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory, tiny_data) -> Run:
    """12 optimizer steps of pretraining; checkpoints every 6 steps."""
    return finish(start(tmp_path_factory.mktemp("pretrain"), "pretrain", "pretrain", tiny_data["pretrain"]))


@pytest.fixture(scope="session")
def followups(tmp_path_factory, pretrained, tiny_data) -> dict[str, Run]:
    """Run concurrently: a resume of the pretraining (budget 14: steps 13-14) in a copy of its
    output folder, and a 3-step LoRA finetune from its last checkpoint."""
    import shutil

    tmp = tmp_path_factory.mktemp("followups")
    out = tmp / "resume" / "out"
    shutil.copytree(pretrained.output_dir / "checkpoint", out / "checkpoint")
    resume = start(tmp, "resume", "pretrain", tiny_data["pretrain"],
                   {"training": {"steps": 14, "micro_batch_size": 4, "gradient_accumulation_steps": 1}},
                   output_dir=out, load_checkpoint=str(out / "checkpoint"), resume=True)
    sft = start(tmp, "sft", "sft", tiny_data["sft"], load_checkpoint=str(pretrained.checkpoint))
    return {"resume": finish(resume), "sft": finish(sft)}


def test_pretrain_loss_falls(pretrained):
    assert sorted(pretrained.losses) == list(range(1, 13))
    first, last = pretrained.losses[1], np.mean([pretrained.losses[s] for s in (10, 11, 12)])
    assert first > 7.3  # ~ln(2048) at random init
    assert last < first - 0.7, pretrained.losses


def test_checkpoints_land_per_rank_with_meta(pretrained):
    files = sorted(p.name for p in pretrained.rank0.glob("*.ckpt"))
    assert files == ["tiny_llama_rank_0-1_12.ckpt", "tiny_llama_rank_0-1_6.ckpt"]
    assert pretrained.checkpoint.name == "tiny_llama_rank_0-1_12.ckpt"


def test_resume_continues_the_step_count(followups):
    # micro 4 x accumulation 1 is the same 4 rows per step as micro 2 x accumulation 2
    run = followups["resume"]
    assert sorted(run.losses) == [13, 14]
    assert "dataset skip 12 steps" in run.stdout
    import mindspore as ms

    state = ms.load_checkpoint(str(run.checkpoint), choice_func=lambda n: n in ("global_step", "step_num"))
    assert int(state["global_step"].asnumpy().reshape(-1)[0]) == 14
    assert int(state["step_num"].asnumpy().reshape(-1)[0]) == 14
    # mindformers names the resumed run's files by steps since the resume, with a de-duplicated prefix
    assert run.checkpoint.name == "tiny_llama_rank_0_1-1_2.ckpt"


def test_lora_finetune_saves_adapter_apart_from_base(pretrained, followups):
    run = followups["sft"]
    assert sorted(run.losses) == [1, 2, 3]
    # starts from the pretrained weights (same token pattern), not from random init (~7.6)
    assert run.losses[1] < pretrained.losses[1] - 0.5
    import mindspore as ms

    adapter = next((run.output_dir / "checkpoint_trainable" / "rank_0").glob("*trainable_params-1_3.ckpt"))
    names = sorted(ms.load_checkpoint(str(adapter)))
    assert len(names) == 2 * 4 * 2  # (lora_a, lora_b) x wq wk wv wo x 2 layers
    assert "model.layers.0.attention.wq.mindpet_delta_lora_a" in names
    assert all(n.endswith(("mindpet_delta_lora_a", "mindpet_delta_lora_b")) for n in names)
    full = ms.load_checkpoint(str(run.checkpoint))
    base = ms.load_checkpoint(str(pretrained.checkpoint))
    np.testing.assert_array_equal(full["model.layers.1.attention.wq.weight"].asnumpy(),
                                  base["model.layers.1.attention.wq.weight"].asnumpy())  # frozen
    assert np.abs(full["model.layers.1.attention.wq.mindpet_delta_lora_b"].asnumpy()).max() > 0


def test_cpu_accumulation_equals_full_batch_step():
    """One SGD step (lr 1, so the update is -gradient) with accumulation 1 vs 2 from the same weights.

    In process and in PyNative (no compile); the previous execution mode is restored.
    """
    import mindspore as ms
    from mindspore import nn
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM

    from pipeline_lib.config.platform import CPU_MODEL_OVERRIDES
    from pipeline_lib.train.cpu_wrappers import CPUTrainOneStepCell

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    try:
        ms.set_seed(0)
        config = LlamaConfig(batch_size=4, seq_length=SEQ, hidden_size=64, num_layers=1, num_heads=4,
                             vocab_size=2048, intermediate_size=176, compute_dtype="float32",
                             param_init_type="float32", **CPU_MODEL_OVERRIDES)
        batch = ms.Tensor(np.stack([r["input_ids"] for r in token_rows(4)]), ms.int32)
        init, results = None, []
        for steps in (1, 2):
            net = LlamaForCausalLM(config)
            if init is None:
                init = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
            else:
                ms.load_param_into_net(net, {n: ms.Parameter(ms.Tensor(v), name=n) for n, v in init.items()})
            net.set_train(True)
            cell = CPUTrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=1.0),
                                       accumulation_steps=steps, use_clip_grad=False)
            loss = float(cell(batch)[0].asnumpy().reshape(-1)[0])
            results.append((loss, {p.name: p.asnumpy() - init[p.name] for p in net.get_parameters()}))
    finally:
        ms.set_context(mode=mode)
    (loss_1, d1), (loss_2, d2) = results
    assert abs(loss_1 - loss_2) < 1e-5
    assert max(float(np.abs(d).max()) for d in d1.values()) > 1e-3  # the step did move the weights
    rel = max(float(np.abs(d1[n] - d2[n]).max() / (np.abs(d1[n]).max() + 1e-30)) for n in d1)
    assert rel < 1e-3


def test_model_io_logits_and_greedy_decode(pretrained, tmp_path):
    from model_io import CausalLM

    model = CausalLM(pretrained.yaml, pretrained.checkpoint, workdir=tmp_path)
    row = token_rows(1)[0]["input_ids"]
    logits = model.logits(row[None, :SEQ])
    assert logits.shape == (1, SEQ, 2048) and logits.dtype == np.float32
    # right padding does not change earlier positions (causal attention)
    np.testing.assert_allclose(model.logits(row[None, :10])[0], logits[0, :10], atol=1e-5)
    logp = logits[0] - logits[0].max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -logp[np.arange(SEQ - 1), row[1:SEQ]].mean()
    assert nll < pretrained.losses[1] - 0.5  # the trained weights were loaded
    # batch 1 again: reuses the compiled graph (each new batch size compiles one)
    out = model.greedy_decode([list(row[:8])], 5)
    assert len(out[0]) == 5 and all(0 <= t < 2048 for t in out[0])
    with pytest.raises(ValueError, match="seq_length"):
        model.logits(np.ones((1, SEQ + 1), np.int32))
