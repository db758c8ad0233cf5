"""Disk the checkpoints of a training layout need on one node (the free-disk check of the train stages).

Each rank saves its own shard (`integrated_save: False`): the parameters of its pipeline stage split over
the tensor-parallel group (params.stage_params), as `model.param_init_type` (4 bytes float32, 2 bytes
half), plus the two AdamW moments mindformers keeps in float32 (8 bytes per parameter), divided by the
data-parallel degree when the optimizer is sharded. mindformers numbers ranks pipeline stage first:
rank r is on stage r // (data_parallel x model_parallel). A node needs the sum over its ranks, times the
copies on disk at the worst moment: `training.keep_checkpoint_max` kept plus the one being written
before the oldest is deleted.
Limits: the strategy files and logs (megabytes) are not counted; LoRA SFT checkpoints are smaller.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config.schema import PipelineConfig
from .params import ModelShape, stage_params

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


def rank_checkpoint_bytes(cfg: PipelineConfig, rank: int) -> int:
    """Bytes of one checkpoint file of `rank`: its weight shard plus its AdamW moments."""
    p, m = cfg.parallel, cfg.model
    stage = min(rank // (p.data_parallel * p.model_parallel), p.pipeline_stage - 1)
    params = stage_params(ModelShape.from_config(m), pipeline_stage=p.pipeline_stage,
                          model_parallel=p.model_parallel, stage=stage)
    weight = 4 if m.param_init_type == "float32" else 2
    moments = MOMENT_BYTES / (p.data_parallel if p.optimizer_shard else 1)
    return int(params * (weight + moments))


def checkpoint_disk(cfg: PipelineConfig, ranks: list[int], *, copies: int | None = None) -> CheckpointDisk:
    """What the checkpoints of `ranks` (the ranks on one node) need; copies default keep_checkpoint_max + 1."""
    copies = cfg.training.keep_checkpoint_max + 1 if copies is None else copies
    return CheckpointDisk({r: rank_checkpoint_bytes(cfg, r) for r in ranks}, copies)


def disk_fix(cfg: PipelineConfig, need: CheckpointDisk, *, where: str = "run.output_root") -> str:
    """The knobs that change `need` (or the disk it lands on), with what each kept checkpoint costs."""
    p, t = cfg.parallel, cfg.training
    fix = (f"lower training.keep_checkpoint_max (now {t.keep_checkpoint_max}; each kept checkpoint needs "
           f"{need.per_checkpoint / 1e9:.1f} GB on this node), or point {where} at a larger disk")
    if p.data_parallel > 1 and not p.optimizer_shard:
        fix += f", or set parallel.optimizer_shard=true (AdamW moments split over data_parallel={p.data_parallel})"
    return fix
