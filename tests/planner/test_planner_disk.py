"""planner.disk: checkpoint bytes per node from the layout, in concrete numbers for the 7B 4 x 64 GB layout."""
from pipeline_lib.config import config_from_dict
from pipeline_lib.planner.disk import checkpoint_disk, disk_fix

# Llama-2 7B on mp2 x pp2: 16 layers per stage, matmuls and the vocab-parallel embedding/head split over 2.
LAYER_MATMULS = 4 * 4096 ** 2 + 3 * 4096 * 11008          # wq wk wv wo + w1 w2 w3
STAGE0 = 16 * LAYER_MATMULS // 2 + 32000 * 4096 // 2 + 16 * 2 * 4096            # + embedding, 2 norms/layer
STAGE1 = 16 * LAYER_MATMULS // 2 + 32000 * 4096 // 2 + 16 * 2 * 4096 + 4096     # + output head, final norm


def test_7b_layout_needs_its_shards_times_kept_checkpoints(cfg7b_raw):
    cfg = config_from_dict(cfg7b_raw)  # keep_checkpoint_max 3 (default), param_init_type float32
    need = checkpoint_disk(cfg, [0, 1, 2, 3])
    # float32 weights (4 B) + AdamW moments (8 B, float32); ranks 0-1 hold stage 0, ranks 2-3 stage 1
    assert need.rank_bytes == {0: STAGE0 * 12, 1: STAGE0 * 12, 2: STAGE1 * 12, 3: STAGE1 * 12}
    assert need.rank_bytes[0] == 20_216_020_992
    assert need.per_checkpoint == 80_864_182_272      # the whole model once per node (~6.74e9 params x 12 B)
    # 3 kept + 1 being written: 323.5 GB, not 646.9; + the newest one's moments (8 of its 12 bytes a parameter), on
    # disk twice while it is split into weights and optimizer files
    assert need.copies == 4 and need.splitting == 80_864_182_272 * 8 // 12
    assert need.total == 323_456_729_088 + 53_909_454_848
    fewer = checkpoint_disk(config_from_dict({**cfg7b_raw, "training": {**cfg7b_raw["training"],
                                                                          "keep_checkpoint_max": 1}}), [0, 1, 2, 3])
    assert fewer.total == 2 * 80_864_182_272 + 53_909_454_848
    fix = disk_fix(cfg, need)
    assert "training.keep_checkpoint_max (now 3; each kept checkpoint needs 80.9 GB on this node)" in fix


def test_sharded_moments_and_half_weights_shrink_a_rank_file():
    base = {"parallel": {"devices": 2, "data_parallel": 2, "devices_per_node": 2},
            "training": {"global_batch_size": 8}}
    plain = checkpoint_disk(config_from_dict(base), [0, 1])
    shard = checkpoint_disk(config_from_dict({**base, "parallel": {**base["parallel"], "optimizer_shard": True}}),
                            [0, 1])
    half = checkpoint_disk(config_from_dict({**base, "model": {"param_init_type": "bfloat16"},
                                             "training": {**base["training"], "precision": "bf16"}}), [0, 1])
    params = plain.rank_bytes[0] // 12
    assert shard.rank_bytes[0] == params * (4 + 8 // 2) and half.rank_bytes[0] == params * (2 + 8)
    assert "parallel.optimizer_shard=true" in disk_fix(config_from_dict(base), plain)


def test_7b_sft_disk_is_the_frozen_weights_and_lora_times_kept_copies(cfg7b_raw):
    """LoRA SFT without tensor parallel keeps only the LoRA part (factors + moments) per checkpoint: the frozen
    weights are on disk once, in the whole file mindformers writes until it is split. At the shipped mp2 x pp2 layout
    the frozen shards stay (a rank's slices cannot be taken from the full base): 4 x 27.4 GB, as before the split;
    before the planner: `base file x 1.2 x 2 copies x 4 ranks` of the 81 GB training checkpoint, ~776 GB."""
    from pipeline_lib.planner.disk import sft_checkpoint_disk, weights_bytes

    cfg = config_from_dict(cfg7b_raw)
    weights = weights_bytes(cfg)
    assert weights == 6_738_415_616 * 4  # Llama-2 7B's published count, fp32: 27.0 GB
    # the LoRA part: r 8 x (in + out) for wq wk wv wo (4 x 2 x 4096) x 16 layers per stage, weight + 2 moments
    lora_rank_bytes = 8 * 4 * (2 * 4096) * 16 * 12
    lora_moments = 4 * 8 * 4 * (2 * 4096) * 16 * 8
    sharded = sft_checkpoint_disk(cfg, [0, 1, 2, 3])  # mp2 x pp2: frozen shards kept, split in two files
    assert sharded.copies == 4 and sharded.rank_bytes[0] == STAGE0 * 4 + lora_rank_bytes
    assert sharded.splitting == lora_moments and weights * 4 < sharded.total < weights * 4 * 1.1
    raw = {**cfg7b_raw, "parallel": {**cfg7b_raw["parallel"], "model_parallel": 1, "data_parallel": 2}}
    lora_only = sft_checkpoint_disk(config_from_dict(raw), [0, 1, 2, 3])  # dp2 x pp2: LoRA + moments only
    assert lora_only.rank_bytes == {r: lora_rank_bytes for r in range(4)}
    # while the newest is split: its frozen weights (2 x the model at dp2) + its LoRA moments written beside it
    assert lora_only.splitting == 2 * weights + lora_moments
    assert 2 * weights < lora_only.total < 2 * weights * 1.1


def test_validate_prints_both_checkpoint_sizes_and_the_sft_need():
    """The shipped 7B config, as `llm-pipeline validate` prints it."""
    from pathlib import Path

    from pipeline_lib.cli import summary_lines
    from pipeline_lib.config import load_config

    shipped = Path(__file__).resolve().parents[2] / "configs/pipelines/llama2-7b-4x64gb.yaml"
    lines = summary_lines(load_config(str(shipped)))
    assert "disk, pretrain checkpoints on node 0: 4 x 80.9 GB (4 rank shard(s), weights 27.0 GB + AdamW moments " \
           "53.9 GB in two files) + 53.9 GB while the newest is split = 377.4 GB" in lines
    assert "disk, weights only (model parameters, no optimizer state): 27.0 GB" in lines
    assert any(line.startswith("disk, SFT checkpoints on node 0: 4 x 27.4 GB") and line.endswith("= 109.7 GB")
               for line in lines)
