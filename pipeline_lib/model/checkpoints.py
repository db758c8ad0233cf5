"""Turn a checkpoint reference into the full parameters of a plain (LoRA-free) model. Worker side.

A reference is a single `.ckpt` file, or the `checkpoint/` folder of a parallel run (rank_<N>/
sub-folders; merged first with shard_merge, strategy found next to it or given; a single rank's file
of such a run is merged with the same step of the other ranks), optionally plus a LoRA adapter.
`resolve_params(ref, cfg, scratch)` returns the plain-model parameters (name -> numpy array), their
dtypes, and the merge inputs and report when LoRA was folded in:
- base only: the checkpoint's tensors;
- base + adapter (the SFT stage's adapter/adapter.ckpt, a checkpoint_trainable file or a full SFT
  checkpoint): LoRA merged with sft.lora_alpha / sft.lora_rank (lora_merge.merge_lora);
- a full SFT checkpoint alone (it holds base weights and lora_a/lora_b): merged with itself.

Limits: imports MindSpore (reads .ckpt); sharded folders must be local.
An adapter_config.json next to the adapter (written by the SFT stage) must agree with sft.lora_rank
and sft.lora_alpha. Raises FileNotFoundError / ShardMergeError / LoraMergeError naming the path or field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..config.schema import PipelineConfig
from .llama import read_checkpoint
from .lora_merge import LoraMergeError, MergeReport, has_lora, merge_lora
from .shard_merge import (RANK_RE, STEP_RE, find_strategy, is_sharded_dir, merge_sharded_checkpoint,
                          rank_dirs)


@dataclass
class CheckpointRef:
    ckpt: str
    adapter: str | None = None
    strategy: str | None = None
    adapter_strategy: str | None = None

    @classmethod
    def parse(cls, value) -> "CheckpointRef":
        """A path string, or {"ckpt"|"base": path, "adapter": path, "strategy": ..., "adapter_strategy": ...}."""
        if isinstance(value, CheckpointRef):
            return value
        if isinstance(value, (str, Path)):
            return cls(ckpt=str(value))
        if isinstance(value, dict):
            ckpt = value.get("ckpt") or value.get("base")
            if not ckpt:
                raise ValueError(f"checkpoint spec {value!r} needs 'ckpt' (or 'base'); e.g. "
                                 "{'base': 'pretrain.ckpt', 'adapter': 'lora.ckpt'}")
            return cls(ckpt=str(ckpt), adapter=value.get("adapter"), strategy=value.get("strategy"),
                       adapter_strategy=value.get("adapter_strategy"))
        raise ValueError(f"checkpoint spec {value!r}: pass a path or a dict with 'ckpt' and optional 'adapter'")

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v}


def local_ckpt_file(path: str, scratch: Path, name: str, strategy: str | None = None) -> Path:
    """A single local .ckpt for `path`: itself, or the merge of a sharded run folder.

    A file inside `rank_<N>/` of a run that has several ranks and a strategy (given, or found next to
    the folder) is one shard: the same step of every rank is merged instead."""
    p = Path(path)
    if p.is_file():
        run_dir = p.parent.parent
        if RANK_RE.match(p.parent.name) and len(rank_dirs(run_dir)) > 1 and (strategy or find_strategy(run_dir)):
            m = STEP_RE.search(p.name)
            return merge_sharded_checkpoint(run_dir, scratch / f"{name}.unsharded.ckpt", strategy=strategy,
                                            suffix=m.group(0) if m else p.name)
        return p
    if is_sharded_dir(p):
        return merge_sharded_checkpoint(p, scratch / f"{name}.unsharded.ckpt", strategy=strategy)
    raise FileNotFoundError(f"checkpoint {path!r} is neither a .ckpt file nor a folder with rank_<N>/ "
                            "sub-folders; pass the checkpoint the training stage wrote")


def check_adapter_config(adapter_path: str, cfg: PipelineConfig) -> None:
    """Refuse a config whose LoRA rank/alpha differ from what the adapter was trained with.

    The SFT stage writes adapter_config.json (lora_rank, lora_alpha, ...) next to adapter.ckpt; the
    logits check cannot catch a wrong alpha in the config (both sides of it would use it)."""
    meta_file = Path(adapter_path).with_name("adapter_config.json")
    if not Path(adapter_path).is_file() or not meta_file.is_file():
        return
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    for field in ("lora_rank", "lora_alpha"):
        have, want = meta.get(field), getattr(cfg.sft, field)
        if have is not None and float(have) != float(want):
            raise LoraMergeError(f"sft.{field}={want} but {meta_file} records {have} for this adapter; set "
                                 f"sft.{field}={have} (the value it was trained with)")


@dataclass
class Resolved:
    params: dict            # plain model parameters (LoRA folded in when there was an adapter)
    dtypes: dict            # name -> dtype name as stored
    report: MergeReport | None = None
    base: dict | None = None      # base parameters before the merge (only with an adapter)
    adapter: dict | None = None   # adapter tensors (only with an adapter)


def resolve_params(ref: CheckpointRef, cfg: PipelineConfig, scratch: Path, name: str = "ckpt",
                   lora_scale: float | None = None) -> Resolved:
    """The plain-model parameters of `ref` (see the module docstring), with the merge inputs kept.

    `lora_scale` overrides alpha / rank (diagnostics: proves the logits check catches a wrong scale)."""
    scratch.mkdir(parents=True, exist_ok=True)
    base, dtypes = read_checkpoint(local_ckpt_file(ref.ckpt, scratch, name, ref.strategy))
    adapter = None
    if ref.adapter:
        check_adapter_config(ref.adapter, cfg)
        adapter, _ = read_checkpoint(local_ckpt_file(ref.adapter, scratch, name + ".adapter", ref.adapter_strategy))
    elif has_lora(base):
        adapter = base
    if adapter is None:
        return Resolved(params=base, dtypes=dtypes)
    merged, report = merge_lora(base, adapter, alpha=cfg.sft.lora_alpha, rank=cfg.sft.lora_rank,
                                target_modules=list(cfg.sft.target_modules), scale=lora_scale)
    return Resolved(params=merged, dtypes=dtypes, report=report, base=base, adapter=adapter)
