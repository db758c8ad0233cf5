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

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..config.schema import PipelineConfig
from .checkpoint_format import is_safetensors, merge_sharded, resolve_folder
from .llama import read_checkpoint
from .lora_merge import LoraMergeError, MergeReport, has_lora, merge_lora
from .shard_merge import (RANK_RE, STEP_RE, find_strategy, is_sharded_dir, merge_sharded_checkpoint,
                          rank_dirs)


@dataclass
class CheckpointRef:
    """One full checkpoint (`ckpt` a .ckpt file), or a sharded set: `shards` rank -> {path, size, sha256} plus the
    strategy files (`strategy_files`, each {path, size, sha256}) and the parallel `layout` (dp, mp, pp,
    optimizer_shard); `ckpt` is then the run's checkpoint/ folder. Built from a pretrain manifest by
    `from_manifest`; a consumer that needs one full model asks model.checkpoint_cache.full_checkpoint."""

    ckpt: str
    adapter: str | None = None
    strategy: str | None = None
    adapter_strategy: str | None = None
    shards: dict | None = None
    strategy_files: list = field(default_factory=list)
    layout: dict | None = None

    @property
    def sharded(self) -> bool:
        return bool(self.shards) and len(self.shards) > 1

    def shard_key(self) -> str:
        """sha256 over the rank files' and strategy files' sha256s: names one merge of exactly these bytes."""
        parts = [f"{r}:{i['sha256']}" for r, i in sorted(self.shards.items(), key=lambda kv: int(kv[0]))]
        parts += sorted(f"strategy:{f['sha256']}" for f in self.strategy_files)
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    @classmethod
    def from_manifest(cls, manifest) -> "CheckpointRef | None":
        """The pretrain stage's latest checkpoint as its manifest describes it (metrics.checkpoint_layout): a full
        checkpoint when one file holds the model (one rank, or pure data parallel without optimizer sharding:
        every rank a full copy), else the sharded set. None when the manifest names no checkpoint."""
        metrics = manifest.metrics or {}
        layout, latest = metrics.get("checkpoint_layout"), metrics.get("latest_checkpoint")
        if not layout:
            return cls(ckpt=str(latest)) if latest else None
        return cls.from_layout(layout)

    @classmethod
    def from_layout(cls, layout: dict) -> "CheckpointRef":
        """The reference a checkpoint_layout (train.stage.checkpoint_layout) describes: see from_manifest."""
        ranks = layout["ranks"]
        whole = layout["model_parallel"] == 1 and layout["pipeline_stage"] == 1 and not layout["optimizer_shard"]
        if len(ranks) == 1 or whole:
            return cls(ckpt=ranks[str(min(int(r) for r in ranks))]["path"])
        if len(ranks) != layout["world_size"]:
            raise ValueError(f"the pretrain manifest lists ranks {sorted(ranks, key=int)} of a world of "
                             f"{layout['world_size']} (dp {layout['data_parallel']} x mp {layout['model_parallel']} x "
                             f"pp {layout['pipeline_stage']}): every node's rank files are needed to merge; rerun "
                             "pretrain with training.upload_checkpoints on a shared s3:// run store")
        if not layout["strategy"]:
            raise ValueError("the pretrain manifest lists sharded rank files but no strategy file: the run's "
                             "output/strategy/ folder is missing; rerun pretrain (it publishes them now)")
        first = ranks[str(min(int(r) for r in ranks))]["path"]
        folder = first.rsplit("/", 2)[0]  # .../checkpoint/rank_0/<name>.ckpt -> .../checkpoint
        return cls(ckpt=folder, shards=dict(ranks), strategy_files=list(layout["strategy"]),
                   layout={k: layout[k] for k in ("data_parallel", "model_parallel", "pipeline_stage",
                                                  "optimizer_shard", "step")})

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
                       adapter_strategy=value.get("adapter_strategy"), shards=value.get("shards"),
                       strategy_files=list(value.get("strategy_files") or []), layout=value.get("layout"))
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
    if p.is_dir() and is_safetensors(p):  # a Checkpoint 2.0 folder: read_checkpoint reads its model files
        it = resolve_folder(p)
        return merge_sharded(it.folder, scratch / f"{name}.unsharded.safetensors") if it.sharded else p
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
    for key in ("lora_rank", "lora_alpha"):
        have, want = meta.get(key), getattr(cfg.sft, key)
        if have is not None and float(have) != float(want):
            raise LoraMergeError(f"sft.{key}={want} but {meta_file} records {have} for this adapter; set "
                                 f"sft.{key}={have} (the value it was trained with)")


def check_adapter_base(adapter_path: str, base_file: Path) -> None:
    """Refuse to fold an adapter into a base other than the one it was trained on: adapter_config.json records the
    base's size and sha256 (an adapter holds only what LoRA trained; its frozen weights are that file's)."""
    meta_file = Path(adapter_path).with_name("adapter_config.json")
    if not meta_file.is_file():
        return
    want = json.loads(meta_file.read_text(encoding="utf-8")).get("base_checkpoint") or {}
    if not want.get("sha256") or not Path(base_file).is_file():
        return
    size = Path(base_file).stat().st_size
    if size != want.get("size") or _sha256(Path(base_file)) != want["sha256"]:
        raise LoraMergeError(f"the adapter {adapter_path} was trained on the base {want.get('uri')} (sha256 "
                             f"{want['sha256'][:12]}, {want.get('size'):,} bytes); {base_file} ({size:,} bytes) is "
                             "another file: pass that base (the SFT stage's base_checkpoint) or rerun SFT on this one")


def _sha256(path: Path) -> str:
    from ..storage import sha256_file

    return sha256_file(path)


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
    base_file = local_ckpt_file(ref.ckpt, scratch, name, ref.strategy)
    base, dtypes = read_checkpoint(base_file)
    adapter = None
    if ref.adapter:
        check_adapter_config(ref.adapter, cfg)
        if base_file == Path(ref.ckpt):  # a merged shard set is a new file: its sha cannot be the recorded one
            check_adapter_base(ref.adapter, base_file)
        adapter, _ = read_checkpoint(local_ckpt_file(ref.adapter, scratch, name + ".adapter", ref.adapter_strategy))
    elif has_lora(base):
        adapter = base
    if adapter is None:
        return Resolved(params=base, dtypes=dtypes)
    merged, report = merge_lora(base, adapter, alpha=cfg.sft.lora_alpha, rank=cfg.sft.lora_rank,
                                target_modules=list(cfg.sft.target_modules), scale=lora_scale)
    return Resolved(params=merged, dtypes=dtypes, report=report, base=base, adapter=adapter)
