"""Disk the checkpoints of a training layout need on one node (the free-disk check of the train stages).

Each rank saves its own shard (`integrated_save: False`): the parameters of its pipeline stage split over
the tensor-parallel group (params.stage_params), as `model.param_init_type` (4 bytes float32, 2 bytes
half), plus the two AdamW moments mindformers keeps in float32 (8 bytes per parameter), divided by the
data-parallel degree when the optimizer is sharded. mindformers numbers ranks pipeline stage first:
rank r is on stage r // (data_parallel x model_parallel). A node needs the sum over its ranks, times the
copies on disk at the worst moment: `training.keep_checkpoint_max` kept plus the one being written
before the oldest is deleted.
Each verified checkpoint is split into a weights file and an optimizer-state file (train.checkpoint_split): the
same bytes kept, but while the newest is split its optimizer state is on disk twice (`splitting`).
LoRA SFT (`sft_checkpoint_disk`) runs the same layout and mindformers writes the same network, the frozen base
weights included, but AdamW keeps moments only for what it trains: the LoRA factors (rank x (in + out) per target
projection per layer, counted as if every rank held all of its stage's factors: an upper bound, they are small).
The split keeps only those factors and their moments (the frozen weights are the base's), so a kept SFT checkpoint
is megabytes; the whole file mindformers writes lives only until it is split (`splitting`). Not under tensor
parallel (`lora_only_checkpoints`): a rank's frozen weights are then slices, which neither the byte comparison with
the full base nor a resume (which loads a rank file after compile, unsliced) can take from the base; those SFT
checkpoints keep the frozen shards (weights + optimizer state in two files, as pretraining's).
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
    splitting: int = 0  # bytes on top while the newest checkpoint is split (train.checkpoint_split)

    @property
    def per_checkpoint(self) -> int:
        return sum(self.rank_bytes.values())

    @property
    def total(self) -> int:
        return self.per_checkpoint * self.copies + self.splitting

    def explain(self) -> str:
        ranks = len(self.rank_bytes)
        return (f"{self.copies} checkpoints (training.keep_checkpoint_max + the one being written) x "
                f"{self.per_checkpoint:,} bytes per checkpoint on this node ({ranks} rank shard(s))"
                + (f" + {self.splitting:,} bytes while the newest is split into weights and optimizer state"
                   if self.splitting else ""))


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


def rank_optimizer_bytes(cfg: PipelineConfig, rank: int) -> int:
    """Bytes of `rank`'s optimizer-state file: the AdamW moments of its weight shard (sharded over dp if asked)."""
    p = cfg.parallel
    return int(_rank_weights(cfg, rank) * MOMENT_BYTES / (p.data_parallel if p.optimizer_shard else 1))


def rank_checkpoint_bytes(cfg: PipelineConfig, rank: int) -> int:
    """Bytes of one checkpoint of `rank` as mindformers writes it: its weight shard plus its AdamW moments (after the
    split: the weights file + the optimizer-state file)."""
    return _rank_weights(cfg, rank) * _weight_bytes(cfg) + rank_optimizer_bytes(cfg, rank)


def _rank_lora(cfg: PipelineConfig, rank: int) -> int:
    s = cfg.sft
    per_layer = sum(s.lora_rank * sum(projection_dims(cfg.model, t) or (0, 0)) for t in s.target_modules)
    return per_layer * layers_on_stage(cfg.model.num_layers, cfg.parallel.pipeline_stage, _stage(cfg, rank))


def sft_rank_checkpoint_bytes(cfg: PipelineConfig, rank: int) -> int:
    """Bytes of one kept LoRA SFT checkpoint of `rank`: its stage's LoRA factors and their AdamW moments (the
    adapter file + its optimizer-state file), plus its frozen weight shard under tensor parallel (see the module
    docstring)."""
    lora = int(_rank_lora(cfg, rank) * (_weight_bytes(cfg) + MOMENT_BYTES))
    return lora if lora_only_checkpoints(cfg) else _rank_weights(cfg, rank) * _weight_bytes(cfg) + lora


def lora_only_checkpoints(cfg: PipelineConfig) -> bool:
    """Whether SFT checkpoints keep only the LoRA factors + their optimizer state (see the module docstring)."""
    return cfg.parallel.model_parallel == 1


def sft_rank_written_bytes(cfg: PipelineConfig, rank: int) -> int:
    """Bytes of the whole file mindformers writes for `rank` before it is split: the frozen weight shard too."""
    return _rank_weights(cfg, rank) * _weight_bytes(cfg) + int(_rank_lora(cfg, rank) * (_weight_bytes(cfg) + MOMENT_BYTES))


def checkpoint_disk(cfg: PipelineConfig, ranks: list[int], *, copies: int | None = None) -> CheckpointDisk:
    """What the checkpoints of `ranks` (the ranks on one node) need; copies default keep_checkpoint_max + 1, plus
    the newest one's optimizer state written beside it while it is split."""
    copies = cfg.training.keep_checkpoint_max + 1 if copies is None else copies
    return CheckpointDisk({r: rank_checkpoint_bytes(cfg, r) for r in ranks}, copies,
                          sum(rank_optimizer_bytes(cfg, r) for r in ranks))


def sft_checkpoint_disk(cfg: PipelineConfig, ranks: list[int], *, copies: int | None = None) -> CheckpointDisk:
    """What the LoRA SFT checkpoints of `ranks` need: keep_checkpoint_max + 1 adapter checkpoints, plus the newest
    whole file (frozen weights included) until it is split, with its optimizer state written beside it."""
    copies = cfg.training.keep_checkpoint_max + 1 if copies is None else copies
    kept = {r: sft_rank_checkpoint_bytes(cfg, r) for r in ranks}
    moments = sum(_rank_lora(cfg, r) * MOMENT_BYTES for r in ranks)
    return CheckpointDisk(kept, copies, sum(sft_rank_written_bytes(cfg, r) - kept[r] for r in ranks) + moments)


def weights_bytes(cfg: PipelineConfig) -> int:
    """One full file of the model's parameters as model.param_init_type, no optimizer state."""
    return count_params(cfg.model).total * _weight_bytes(cfg)


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"  # the tiny configs' files are megabytes


def disk_lines(cfg: PipelineConfig) -> list[str]:
    """The disk figures of node 0 (what `llm-pipeline validate` prints)."""
    ranks = node_ranks(cfg)
    pre, sft = checkpoint_disk(cfg, ranks), sft_checkpoint_disk(cfg, ranks)
    opt = sum(rank_optimizer_bytes(cfg, r) for r in ranks)
    return [f"disk, pretrain checkpoints on node 0: {pre.copies} x {_size(pre.per_checkpoint)} "
            f"({len(ranks)} rank shard(s), weights {_size(pre.per_checkpoint - opt)} + AdamW moments {_size(opt)} "
            f"in two files) + {_size(pre.splitting)} while the newest is split = {_size(pre.total)}",
            f"disk, weights only (model parameters, no optimizer state): {_size(weights_bytes(cfg))}",
            f"disk, SFT checkpoints on node 0: {sft.copies} x {_size(sft.per_checkpoint)} ("
            + ("LoRA factors + their moments; the frozen weights are the base's" if lora_only_checkpoints(cfg) else
               "frozen weight shards + LoRA factors and their moments: under tensor parallel the frozen shards stay")
            + f") + {_size(sft.splitting)} while the newest whole file is split = {_size(sft.total)}"]


def disk_fix(cfg: PipelineConfig, need: CheckpointDisk, *, where: str = "run.output_root") -> str:
    """The knobs that change `need` (or the disk it lands on), with what each kept checkpoint costs."""
    p, t = cfg.parallel, cfg.training
    fix = (f"lower training.keep_checkpoint_max (now {t.keep_checkpoint_max}; each kept checkpoint needs "
           f"{need.per_checkpoint / 1e9:.1f} GB on this node), or point {where} at a larger disk")
    if p.data_parallel > 1 and not p.optimizer_shard:
        fix += f", or set parallel.optimizer_shard=true (AdamW moments split over data_parallel={p.data_parallel})"
    return fix


# A month of nights (nightly.retention). Per-token and per-step bytes the layout does not give: estimates, measured on
# the tiny default's nights (configs/pipelines/tiny-cpu.yaml, 6 steps, 22k tokens).
MINDRECORD_BYTES_PER_TOKEN = 4      # input_ids int32 (the index files and row maps beside them are not counted)
CLEANED_BYTES_PER_TOKEN = 1.5       # data/cleaned/*.jsonl.gz: 32 kB of gzip'd jsonl for the tiny corpus's 22k tokens
SMALL_BYTES_PER_NIGHT = 320_000     # manifests, stats, evaluation outputs, the yaml, the loss curve (a tiny night)
LOG_BYTES_PER_STEP = 360            # a metrics.jsonl row
LOG_BYTES_PER_STEP_RANK = 1_000     # mindformers' log line per rank per step, and the stage log's


@dataclass(frozen=True)
class NightDisk:
    """What one trained night leaves in its run folder, in bytes (see month_of_nights)."""

    weights: int           # the weights-only checkpoints (two under the lineage schedule: decayed and stable-phase)
    checkpoint: int        # one training checkpoint: every rank's file, weights + AdamW moments
    kept: int              # training checkpoints left after the night (keep_checkpoint_max, or fewer saves)
    tokens: int | None     # new tokens a night packs (None: unknown)
    data: int | None       # its cleaned text + MindRecord
    heldout: int | None    # its held-out split's MindRecord (the lineage keeps its first night's: reference_heldout)
    small: int             # logs, metrics, manifests, evaluation

    @property
    def training(self) -> int:
        return self.checkpoint * self.kept

    @property
    def total(self) -> int:
        return self.weights + self.training + (self.data or 0) + self.small


def night_disk(cfg: PipelineConfig, night_tokens: int | None = None) -> NightDisk:
    """One trained night at the config's layout. night_tokens: the new tokens a night packs; default the tokens a
    night trains (training.steps x tokens per step: one pass over what arrived), unknown for an epochs-based run."""
    from ..config.schema import global_batch

    t, p = cfg.training, cfg.parallel
    world = p.data_parallel * p.model_parallel * p.pipeline_stage
    checkpoint = checkpoint_disk(cfg, list(range(world)), copies=1).per_checkpoint  # every node's shards
    kept = min(t.keep_checkpoint_max, -(-t.steps // t.save_steps)) if t.steps else t.keep_checkpoint_max
    tokens = night_tokens if night_tokens is not None else (
        t.steps * global_batch(cfg) * cfg.model.seq_length if t.steps else None)
    data = heldout = None
    if tokens is not None:
        per_token = MINDRECORD_BYTES_PER_TOKEN
        if cfg.data.packing.document_mask:  # an attention_mask row of seq_length^2 int32 beside each row
            per_token += 4 * cfg.model.seq_length ** 2 / (cfg.model.seq_length + 1)
        data = int(tokens * (per_token + CLEANED_BYTES_PER_TOKEN))
        heldout = int(tokens * cfg.data.heldout_fraction * per_token)
    small = SMALL_BYTES_PER_NIGHT + (t.steps or 0) * (LOG_BYTES_PER_STEP + LOG_BYTES_PER_STEP_RANK * world)
    # the lineage schedule (nightly.lr_schedule) keeps the stable-phase weights beside the decayed ones
    copies = 2 if cfg.nightly.lr_schedule == "lineage" else 1
    return NightDisk(copies * weights_bytes(cfg), checkpoint, kept, tokens, data, heldout, small)


@dataclass(frozen=True)
class MonthDisk:
    nights: int
    night: NightDisk
    without: int                 # every night keeps everything
    retained: int                # after each night's retention pass, once the horizon has passed
    weights_kept: int            # weights files retention keeps at most
    data_kept: int               # nights whose data retention keeps
    horizon: int                 # nights after which only `growth` is added a night
    growth: int                  # bytes a night still adds past the horizon (its small files; its data when replay
                                 # reads every promoted night)


def month_of_nights(cfg: PipelineConfig, nights: int = 30, night_tokens: int | None = None) -> MonthDisk:
    """The disk of `nights` trained nights at the config's layout, without and with nightly.retention. With it, at
    most keep_promoted promoted nights' weights plus one held candidate a day for held_days days (the worst case: a
    person never promotes them), the newest night's training checkpoints, the data replay reads (with replay off:
    only the lineage's fixed held-out split) and every night's small files."""
    import math

    night, r = night_disk(cfg, night_tokens), cfg.nightly.retention
    weights_kept = min(nights, r.keep_promoted + math.ceil(r.held_days))
    replay = cfg.data.replay.fraction > 0
    data_kept = min(nights, (r.replay_nights or nights) + (math.ceil(r.held_days) if replay else 0)) if replay else 0
    retained = (weights_kept * night.weights + min(nights, 1) * night.training + data_kept * (night.data or 0)
                + (0 if replay else (night.heldout or 0)) + nights * night.small)
    unbounded = replay and not r.replay_nights  # replay reads every promoted night: their data stays
    horizon = max(weights_kept, 1 if unbounded else data_kept, 1)
    growth = night.small + ((night.data or 0) if unbounded else 0)
    return MonthDisk(nights, night, nights * night.total, retained, weights_kept, data_kept, horizon, growth)


def month_lines(cfg: PipelineConfig, nights: int = 30, night_tokens: int | None = None) -> list[str]:
    """What `llm-pipeline plan` prints of a month of nights."""
    from ..storage.sizes import size_text

    m, r = month_of_nights(cfg, nights, night_tokens), cfg.nightly.retention
    n = m.night
    tokens = ("data unknown (an epochs-based run: give --night-tokens)" if n.tokens is None else
              f"data {size_text(n.data)} for {n.tokens:,} new tokens (cleaned text + MindRecord"
              + (")" if night_tokens is not None else ", one pass: training.steps x tokens per step)"))
    replay = ("data: only the lineage's fixed held-out split (replay off)" if cfg.data.replay.fraction <= 0 else
              f"data of the newest {r.replay_nights} promoted nights (replay)" if r.replay_nights else
              "data of every promoted night (replay reads them all: nightly.retention.replay_nights bounds it)")
    return [
        f"disk, a month of nights ({nights} trained nights at this layout; one night leaves weights "
        f"{size_text(n.weights)}, training checkpoints {n.kept} x {size_text(n.checkpoint)} = "
        f"{size_text(n.training)}, {tokens}, logs/metrics/evaluation {size_text(n.small)}):",
        f"  without retention: {nights} x {size_text(n.total)} = {size_text(m.without)}",
        f"  with nightly.retention: {size_text(m.retained)} = weights of at most {m.weights_kept} nights "
        f"(keep_promoted {r.keep_promoted} + held_days {r.held_days:g}) + the newest night's training checkpoints + "
        f"{replay} + every night's logs; it stops growing after {m.horizon} nights but for "
        f"{size_text(m.growth)} a night" + (" (data and logs)" if m.growth > n.small else " (logs)"),
        f"  while a night trains, add its own training checkpoints: up to {n.kept + 1} x {size_text(n.checkpoint)} = "
        f"{size_text((n.kept + 1) * n.checkpoint)} (keep_checkpoint_max kept + the one being written)",
    ]
