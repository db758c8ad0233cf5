"""A tiny random-init Llama world shared by the evaluate tests (built once per session).

seq_length 32, hidden 32, 2 layers, 4 heads (2 KV heads); a sentencepiece tokenizer trained on a
few hundred lines; checkpoints `base`, `pretrained` (other weights), a LoRA adapter with non-zero B
and a "full SFT" checkpoint (base + adapter tensors in one file); a 6-row held-out MindRecord.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipeline_lib.config.load import config_from_dict
from random_init import random_llama_params, random_lora_params, save_params, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def tiny_config(output_root: Path, prompt_files: list[str]):
    return config_from_dict({
        "run": {"output_root": str(output_root), "device_target": "CPU", "seed": 7},
        "model": {"seq_length": 32, "vocab_size": 640, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                  "n_kv_heads": 2, "intermediate_size": 64},
        "evaluate": {"batch_size": 2, "max_new_tokens": 5, "perplexity_max_rows": 6, "prompt_files": prompt_files},
        "sft": {"lora_rank": 4, "lora_alpha": 8.0, "target_modules": ["wq", "wk", "wv", "wo"]},
        "training": {"timeout_seconds": 300},
    })


def tokenizer_texts() -> list[str]:
    records = [json.loads(line) for f in sorted((ROOT / "configs" / "eval").glob("*.jsonl"))
               for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [r["prompt"] for r in records if "prompt" in r]  # the prompt sets (not the reference sets)
    texts += [" ".join(r.get("choices", []) + r.get("labels", [])) for r in records
              if {"choices", "labels"} & set(r)]  # the task sets' candidates (their questions: byte fallback)
    texts += [f"The quick brown fox jumps over the lazy dog number {i}." for i in range(150)]
    texts += [f"我们每天晚上都会用新数据继续训练模型，第{i}次检查点已经保存。"
              for i in range(150)]
    return texts


def write_heldout(folder: Path, seq_length: int, rows: int = 6, seed: int = 0) -> Path:
    from mindspore.mindrecord import FileWriter

    folder.mkdir(parents=True, exist_ok=True)
    writer = FileWriter(str(folder / "heldout.mindrecord"), shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "heldout")
    rng = np.random.default_rng(seed)
    data = []
    for i in range(rows):
        ids = rng.integers(4, 500, size=seq_length + 1).astype(np.int32)
        if i == rows - 1:
            ids[seq_length // 2:] = 0  # a padded last row: its pad targets are not scored
        data.append({"input_ids": ids})
    writer.write_raw_data(data)
    writer.commit()
    return folder


@dataclass
class Tiny:
    root: Path
    cfg: object
    tokenizer: Path
    base: Path
    pretrained: Path
    adapter: Path
    sft_full: Path
    heldout: Path
    prompts: Path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Tiny:
    root = tmp_path_factory.mktemp("tiny_eval")
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(p, ensure_ascii=False) for p in [
        {"id": "t-en", "prompt": "The quick brown fox", "keywords": ["dog", "fox"]},
        {"id": "t-zh", "prompt": "我们每天晚上", "keywords": ["模型"]},
        {"id": "t-long", "prompt": " ".join(["number"] * 60), "keywords": []},
    ]) + "\n", encoding="utf-8")
    cfg = tiny_config(root / "runs", [str(prompts)])
    tok = tiny_tokenizer(tokenizer_texts(), root / "tok", cfg.tokenizer)
    base = random_llama_params(cfg.model, seed=0)
    adapter = random_lora_params(base, list(cfg.sft.target_modules), cfg.sft.lora_rank, seed=3)
    return Tiny(root=root, cfg=cfg, tokenizer=tok, base=save_params(base, root / "base.ckpt"),
                pretrained=save_params(random_llama_params(cfg.model, seed=1), root / "pretrained.ckpt"),
                adapter=save_params(adapter, root / "adapter.ckpt"),
                sft_full=save_params({**base, **adapter}, root / "sft_full.ckpt"),
                heldout=write_heldout(root / "heldout", cfg.model.seq_length), prompts=prompts)


class BackgroundCheck:
    """forward_path_check.py running in its own process; `result()` waits and parses its JSON line."""

    def __init__(self, tiny: Tiny, workdir: Path):
        cfg_file = workdir / "cfg.json"
        cfg_file.write_text(json.dumps(tiny.cfg.model_dump(mode="json")))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", "LOG_MF_PATH": str(workdir / "mf")}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("forward_path_check.py")),
                                      str(cfg_file), str(tiny.base)], cwd=workdir, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def result(self, timeout: float = 600) -> dict:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, out[-3000:] + err[-3000:]
        return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def forward_path_run(tiny, tmp_path_factory):
    """Started by the first test that asks for it, so it overlaps with the evaluate-stage worker."""
    run = BackgroundCheck(tiny, tmp_path_factory.mktemp("forward_path"))
    yield run
    if run.proc.poll() is None:
        run.proc.kill()
        run.proc.wait()
