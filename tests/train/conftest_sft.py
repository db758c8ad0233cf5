"""A tiny trained base for the SFT tests: tokenizer, a short pretraining run, fake upstream manifests.

`make_sft_base(root)` (called once per session by the `sft_base` fixture of the SFT test modules):
1. trains a 600-piece sentencepiece tokenizer (with the chat markers) on the bundled SFT texts;
2. packs those texts as pretraining documents into MindRecord rows (a MindSpore subprocess);
3. pretrains the tiny Llama for PRETRAIN_STEPS steps through the generated yaml and
   `python -m pipeline_lib.train.entry` (the launcher, its own process);
4. writes data and pretrain manifests into a run folder, so `run_sft_stage` finds the tokenizer and
   the base checkpoint (`metrics.latest_checkpoint`) the way it does in a real run.
Returns an `SFTBase` with the run paths and a `config(**overrides)` factory for the tiny config.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SFT_DATA = ROOT / "configs" / "data" / "tiny_sft.jsonl"
PRETRAIN_STEPS = 200

TINY = {
    "run": {"name": "sft-test", "device_target": "CPU", "seed": 7},
    "tokenizer": {"vocab_size": 600},
    "model": {"name": "sft_test_llama", "seq_length": 64, "vocab_size": 640, "hidden_size": 64, "num_layers": 2,
              "num_heads": 4, "n_kv_heads": 2, "intermediate_size": 176},
    "training": {"micro_batch_size": 4, "global_batch_size": 4, "steps": PRETRAIN_STEPS, "learning_rate": 1e-2,
                 "warmup_steps": 2, "save_steps": 1000, "keep_checkpoint_max": 2, "preflight_steps": 0,
                 "timeout_seconds": 300},
    "sft": {"inputs": [str(SFT_DATA)], "lora_rank": 8, "lora_alpha": 16, "steps": 30, "learning_rate": 1e-2,
            "warmup_steps": 2},
}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class SFTBase:
    root: Path
    tokenizer: Path
    checkpoint: Path
    output_root: Path
    run_id: str
    seconds: float

    def config(self, **overrides):
        from pipeline_lib.config.schema import PipelineConfig

        data = _merge(TINY, {"run": {"output_root": str(self.output_root)}})
        return PipelineConfig.model_validate(_merge(data, overrides))

    def paths(self, run_id: str | None = None):
        """RunPaths of `run_id` (default the shared run) with the data and pretrain manifests in place."""
        from pipeline_lib.storage import Manifest, RunPaths, read_manifest, write_manifest

        paths = RunPaths(str(self.output_root), run_id or self.run_id)
        if read_manifest(paths.stage_uri("pretrain")) is None:
            write_manifest(paths.stage_uri("data"), Manifest("data", paths.run_id, "test",
                                                             metrics={"tokenizer_model": str(self.tokenizer)}))
            write_manifest(paths.stage_uri("pretrain"), Manifest("pretrain", paths.run_id, "test",
                                                                 metrics={"latest_checkpoint": str(self.checkpoint)}))
        return paths


def _texts() -> list[str]:
    from pipeline_lib.train.instructions import iter_instruction_records, to_turns

    texts = []
    for rec in iter_instruction_records([str(SFT_DATA)]):
        turns, _ = to_turns(rec.obj) if rec.obj else (None, None)
        texts += [t.content for t in turns or []]
    return texts


def make_sft_base(root: Path) -> SFTBase:
    from pipeline_lib.train.mindformers_yaml import build_run_config, write_run_yaml
    from pipeline_lib.config.schema import PipelineConfig
    from pipeline_lib.model.packing import join_with_eos, rows_from_tokens
    from pipeline_lib.data.tokenizer import train_tokenizer
    from pipeline_lib.train.checkpoints import list_checkpoints
    from pipeline_lib.train.launch import build_command, launch

    t0 = time.time()
    cfg = PipelineConfig.model_validate(_merge(TINY, {"run": {"output_root": str(root / "runs")}}))
    texts = _texts()
    tok = train_tokenizer(texts * 4, cfg.tokenizer, root / "tokenizer")
    stream = join_with_eos(tok.encode_batch(texts * 3), tok.eos_id)
    rows = rows_from_tokens(stream, cfg.model.seq_length + 1, "drop", tok.pad_id)
    data_dir = root / "pretrain_data"
    data_dir.mkdir(parents=True)
    np.save(root / "rows.npy", rows)
    code = ("import numpy as np, sys; from pipeline_lib.data.packing import write_mindrecord; "
            "write_mindrecord(sys.argv[2], np.load(sys.argv[1]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    subprocess.run([sys.executable, "-c", code, str(root / "rows.npy"), str(data_dir / "pretrain.mindrecord")],
                   check=True, env=env, cwd=root, capture_output=True)
    out = root / "pretrain"
    run = build_run_config(cfg, stage="pretrain", dataset_dir=str(data_dir), output_dir=str(out), train_rows=len(rows))
    yaml_path = write_run_yaml(cfg, out / "pretrain.yaml", run, stage="pretrain")
    lines: list[str] = []
    launch(build_command(cfg.parallel, yaml_path), log=lines.append, cwd=out / "cwd", timeout_s=300)
    ckpt = list_checkpoints(out)[-1].path
    base = SFTBase(root, root / "tokenizer" / "tokenizer.model", ckpt, root / "runs", "sft-test-run",
                   round(time.time() - t0, 1))
    base.paths()
    return base
