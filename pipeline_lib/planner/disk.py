"""Disk the checkpoints of a training layout need on one node (the free-disk check of the train stages).

Each rank saves its own shard (`integrated_save: False`): the parameters of its pipeline stage split over
the tensor-parallel group (params.stage_params), as `model.param_init_type` (4 bytes float32, 2 bytes
half), plus the two AdamW moments mindformers keeps in float32 (8 bytes per parameter), divided by the
data-parallel degree when the optimizer is sharded. mindformers numbers ranks pipeline stage first:
rank r is on stage r // (data_parallel x model_parallel). A node needs the sum over its ranks, times the
copies on disk at the worst moment: `training.keep_checkpoint_max` kept plus the one being written
before the oldest is deleted.
LoRA SFT (`sft_checkpoint_disk`) runs the same layout and saves the same network, the frozen base weights included,
but AdamW keeps moments only for what it trains: the LoRA factors (rank x (in + out) per target projection per
layer, counted as if every rank held all of its stage's factors: an upper bound, they are small).
`weights_bytes`: one full file of the model's parameters only (no optimizer state), what a consumer of the trained
weights needs. `disk_lines` are the figures `llm-pipeline validate` prints.
Limits: the strategy files and logs (megabytes) are not counted.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config.schema import PipelineConfig
from ..model.shapes import projection_dims
from .params import ModelShape, count_params, layers_on_stage, stage_params

MOMENT_BYTES = 8  # adam_m + adam_v, float32 whatever the parameter dtype (mindformers AdamW.clone_state)


@dataclass(frozen=True)
class CheckpointDisk:
    """One checkpoint's bytes per rank of a node, and how many checkpoints sit on disk at once."""

    rank_bytes: dict[int, int]
    copies: int

    @property
    def per_checkpoint(self) -> int:
        return sum(self.rank_bytes.values())

    @property
    def total(self) -> int:
        return self.per_checkpoint * self.copies

    def explain(self) -> str:
        ranks = len(self.rank_bytes)
        return (f"{self.copies} checkpoints (training.keep_checkpoint_max + the one being written) x "
                f"{self.per_checkpoint:,} bytes per checkpoint on this node ({ranks} rank shard(s))")


def node_ranks(cfg: PipelineConfig, node: int = 0) -> list[int]:
    """Global ranks that node `node` runs (parallel.devices_per_node per node)."""
    p = cfg.parallel
    world = p.data_parallel * p.model_parallel * p.pipeline_stage
    start = node * p.devices_per_node
    return list(range(start, min(world, start + p.devices_per_node)))


def _weight_bytes(cfg: PipelineConfig) -> int:
    return 4 if cfg.model.param_init_type == "float32" else 2


def _stage(cfg: PipelineConfig, rank: int) -> int:
    p = cfg.parallel
    return min(rank // (p.data_parallel * p.model_parallel), p.pipeline_stage - 1)


def _rank_weights(cfg: PipelineConfig, rank: int) -> int:
    """Parameters of `rank`'s shard: its pipeline stage's, split over the tensor-parallel group."""
    p = cfg.parallel
    return stage_params(ModelShape.from_config(cfg.model), pipeline_stage=p.pipeline_stage,
                        model_parallel=p.model_parallel, stage=_stage(cfg, rank))


def rank_checkpoint_bytes(cfg: PipelineConfig, rank: int) -> int:
    """Bytes of one checkpoint file of `rank`: its weight shard plus its AdamW moments."""
    p = cfg.parallel
    moments = MOMENT_BYTES / (p.data_parallel if p.optimizer_shard else 1)
    return int(_rank_weights(cfg, rank) * (_weight_bytes(cfg) + moments))


def sft_rank_checkpoint_bytes(cfg: PipelineConfig, rank: int) -> int:
    """Bytes of one LoRA SFT checkpoint file of `rank`: its frozen weight shard, its stage's LoRA factors and their
    AdamW moments (see the module docstring)."""
    s, weight = cfg.sft, _weight_bytes(cfg)
    per_layer = sum(s.lora_rank * sum(projection_dims(cfg.model, t) or (0, 0)) for t in s.target_modules)
    lora = per_layer * layers_on_stage(cfg.model.num_layers, cfg.parallel.pipeline_stage, _stage(cfg, rank))
    return int(_rank_weights(cfg, rank) * weight + lora * (weight + MOMENT_BYTES))


def checkpoint_disk(cfg: PipelineConfig, ranks: list[int], *, copies: int | None = None) -> CheckpointDisk:
    """What the checkpoints of `ranks` (the ranks on one node) need; copies default keep_checkpoint_max + 1."""
    copies = cfg.training.keep_checkpoint_max + 1 if copies is None else copies
    return CheckpointDisk({r: rank_checkpoint_bytes(cfg, r) for r in ranks}, copies)


def sft_checkpoint_disk(cfg: PipelineConfig, ranks: list[int], *, copies: int | None = None) -> CheckpointDisk:
    """What the LoRA SFT checkpoints of `ranks` need (the same keep_checkpoint_max + 1 copies as pretrain)."""
    copies = cfg.training.keep_checkpoint_max + 1 if copies is None else copies
    return CheckpointDisk({r: sft_rank_checkpoint_bytes(cfg, r) for r in ranks}, copies)


def weights_bytes(cfg: PipelineConfig) -> int:
    """One full file of the model's parameters as model.param_init_type, no optimizer state."""
    return count_params(cfg.model).total * _weight_bytes(cfg)


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"  # the tiny configs' files are megabytes


def disk_lines(cfg: PipelineConfig) -> list[str]:
    """The disk figures of node 0 (what `llm-pipeline validate` prints)."""
    ranks = node_ranks(cfg)
    pre, sft = checkpoint_disk(cfg, ranks), sft_checkpoint_disk(cfg, ranks)
    return [f"disk, pretrain checkpoints on node 0: {pre.copies} x {_size(pre.per_checkpoint)} "
            f"({len(ranks)} rank shard(s), weights + AdamW moments) = {_size(pre.total)}",
            f"disk, weights only (model parameters, no optimizer state): {_size(weights_bytes(cfg))}",
            f"disk, SFT checkpoints on node 0: {sft.copies} x {_size(sft.per_checkpoint)} (frozen weights + "
            f"LoRA factors and their moments) = {_size(sft.total)}"]


def disk_fix(cfg: PipelineConfig, need: CheckpointDisk, *, where: str = "run.output_root") -> str:
    """The knobs that change `need` (or the disk it lands on), with what each kept checkpoint costs."""
    p, t = cfg.parallel, cfg.training
    fix = (f"lower training.keep_checkpoint_max (now {t.keep_checkpoint_max}; each kept checkpoint needs "
           f"{need.per_checkpoint / 1e9:.1f} GB on this node), or point {where} at a larger disk")
    if p.data_parallel > 1 and not p.optimizer_shard:
        fix += f", or set parallel.optimizer_shard=true (AdamW moments split over data_parallel={p.data_parallel})"
    return fix
