"""Fixtures of the pretraining-stage tests: the real data stage once per session, fresh runs that reuse it.

`pretrain_data` runs the data stage on configs/data/tiny_corpus.jsonl (workers=1,
~10 s) once per session. `new_run(pretrain_data, name, **overrides)` gives a (cfg, RunPaths) of a new run whose
data stage folder is a copy of that one (the manifest and its fingerprint included), so every pretrain run
reads the data exactly as the registry would, without rerunning the data stage (whose persistent dedup index
would otherwise drop every document as already seen).
"""
from __future__ import annotations

import json
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "configs" / "data" / "tiny_corpus.jsonl"

# 323 packed train rows of 65 tokens from the bundled corpus; 4 rows per step -> 80 steps per epoch.
TINY = {
    "run": {"name": "pretrain-test", "device_target": "CPU", "seed": 1234},
    "data": {"inputs": [str(CORPUS)], "docs_per_shard": 200, "rows_per_mindrecord_shard": 200, "num_workers": 1},
    "model": {"name": "tiny_llama", "seq_length": 64, "vocab_size": 2048, "hidden_size": 64, "num_layers": 2,
              "num_heads": 4, "n_kv_heads": 2, "intermediate_size": 176},
    "training": {"micro_batch_size": 4, "global_batch_size": 4, "steps": 16, "save_steps": 4,
                 "keep_checkpoint_max": 2, "warmup_steps": 2, "learning_rate": 3e-3, "preflight_steps": 0,
                 "timeout_seconds": 600},
}


def merge(base: dict, over: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PretrainData:
    root: Path
    data_dir: Path  # <root>/runs/data-run/data: the data stage's folder
    rows_train: int


def new_run(data: PretrainData, name: str, **overrides):
    """(cfg, paths) of a fresh run `name` under data.root/runs with the shared data stage copied in."""
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.storage import RunPaths

    output_root = data.root / "runs"
    raw = merge(TINY, {"run": {"output_root": str(output_root)}})
    cfg = config_from_dict(merge(raw, overrides))
    paths = RunPaths(str(output_root), name)
    dest = Path(paths.stage_uri("data"))
    if not dest.exists():
        shutil.copytree(data.data_dir, dest)
    return cfg, paths


@pytest.fixture(scope="session")
def pretrain_data(tmp_path_factory) -> PretrainData:
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths

    root = tmp_path_factory.mktemp("pretrain_data")
    cfg = config_from_dict(merge(TINY, {"run": {"output_root": str(root / "runs")}}))
    paths = RunPaths(str(root / "runs"), "data-run")
    manifest, _ = run_stage(cfg, paths, "data", workers=1)
    return PretrainData(root, Path(paths.stage_uri("data")), manifest.metrics["rows_train"])
