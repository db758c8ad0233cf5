"""Cross-field rules of the parallel and recompute knobs (checks.problems runs them: they need the planner's layer
arithmetic and the rank table's groups, which config/ may not import).

What mindformers 1.9 would refuse or silently ignore, refused here with the field, the value and the fix:
- parallel.pipeline_offset: mindformers' LayerSetting._check_inputs (parallel_core/training_graph/transformer/
  utils.py) wants one entry per stage (a row per interleave chunk), offsets summing to num_layers % (pp x
  interleave), no stage below 0 layers (middle stages >= 1): then the stages' layers sum to model.num_layers.
- parallel.pp_interleave_num needs pipeline_stage > 1 and at least one layer per chunk.
- model.recompute_layers: one count per stage, each at most the stage's layers, and a recompute mode to apply.
- model.recompute_slice_activation: mindformers passes it only with recompute = True for every layer
  (LayerSetting.set_recompute: `layer.recompute(recompute_slice_activation=...)` in the bool branch).
- parallel.use_seq_parallel / model.comm_recompute: refused where they do nothing.
- parallel.node_devices / fast_group_size / rank_table_file: the topology (runtime/rank_table.py); the file itself
  is read by checks/ (config rules read no files).
"""
from __future__ import annotations

from ..config.errors import ConfigIssue
from ..config.schema import PipelineConfig


def _offset_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    from ..planner.params import default_offset, offset_rows, stage_layer_counts

    p, L = cfg.parallel, cfg.model.num_layers
    pp, v = p.pipeline_stage, p.pp_interleave_num if p.pipeline_stage > 1 else 1
    field, off = "parallel.pipeline_offset", p.pipeline_offset
    if pp == 1:
        if off != 0:
            return [ConfigIssue(field, off, "a layer offset without pipeline parallel (pipeline_stage=1) does "
                                "nothing", "remove parallel.pipeline_offset or set pipeline_stage > 1")]
        return []
    rows = offset_rows(off, pp, v)
    fix_offset = default_offset(L, pp, v)
    fix = f"set parallel.pipeline_offset={fix_offset!r} (the remainder to the first stages) or another list of " \
          f"that shape summing to {L % (pp * v)}"
    if len(rows) != v or any(len(r) != pp for r in rows):
        return [ConfigIssue(field, off, f"needs {pp} entries (one per pipeline stage)"
                            + (f" in each of {v} rows (one per interleave chunk)" if v > 1 else ""), fix)]
    counts = stage_layer_counts(L, pp, off, v)
    base = L // (pp * v)
    chunks = [base + x for r in rows for x in r]
    if sum(counts) != L or isinstance(off, int) and off and L % (pp * v) != off * pp * v:
        return [ConfigIssue(field, off, f"the stages would hold {counts} layers = {sum(counts)}, not "
                            f"model.num_layers={L} (each stage holds {L} // ({pp} x {v}) = {base} + its offset)", fix)]
    if chunks[0] < 0 or chunks[-1] < 0 or any(c < 1 for c in chunks[1:-1]):
        return [ConfigIssue(field, off, f"a stage would hold {min(chunks)} layers (per chunk: {chunks}); the first "
                            "and last need >= 0, the middle ones >= 1", fix)]
    return []


def _interleave_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    p, L = cfg.parallel, cfg.model.num_layers
    v = p.pp_interleave_num
    if v == 1:
        return []
    if p.pipeline_stage == 1:
        return [ConfigIssue("parallel.pp_interleave_num", v, "interleaving splits pipeline stages; with "
                            "pipeline_stage=1 there is none", "set pp_interleave_num=1 or pipeline_stage > 1")]
    if L < p.pipeline_stage * v:
        return [ConfigIssue("parallel.pp_interleave_num", v, f"{p.pipeline_stage} stages x {v} chunks need at least "
                            f"{p.pipeline_stage * v} layers, model.num_layers={L}",
                            f"set pp_interleave_num <= {max(1, L // p.pipeline_stage)}")]
    return []


def _recompute_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    from ..planner.params import layers_on_stage

    m, p = cfg.model, cfg.parallel
    issues = []
    if m.recompute_layers is not None:
        pp = p.pipeline_stage
        v = p.pp_interleave_num if pp > 1 else 1
        counts = [layers_on_stage(m.num_layers, pp, i, p.pipeline_offset, v) for i in range(pp)]
        if m.recompute == "none":
            issues.append(ConfigIssue("model.recompute_layers", m.recompute_layers, "lists layers to recompute but "
                                      "model.recompute=none", "set model.recompute (full, selective, attention or "
                                      "ffn) or remove recompute_layers"))
        elif len(m.recompute_layers) != pp:
            issues.append(ConfigIssue("model.recompute_layers", m.recompute_layers, f"needs one count per pipeline "
                                      f"stage ({pp})", f"give {pp} counts, e.g. {counts} for every layer"))
        elif any(n > c for n, c in zip(m.recompute_layers, counts)):
            issues.append(ConfigIssue("model.recompute_layers", m.recompute_layers, f"more layers than the stages "
                                      f"hold ({counts})", f"keep each count <= its stage's layers {counts}"))
    if m.recompute == "attention" and not m.use_flash_attention:
        issues.append(ConfigIssue("model.recompute", "attention", "attention recompute selects the flash-attention "
                                  "block's operators; mindformers 1.9 fails on the score path's (batch_matmul_q_k, "
                                  "softmax: \"'bool' object is not callable\")", "set model.use_flash_attention=true "
                                  "(Ascend), or use recompute=selective / ffn / full"))
    if m.recompute_slice_activation and (m.recompute != "full" or m.recompute_layers is not None):
        issues.append(ConfigIssue("model.recompute_slice_activation", True, "mindformers applies it only with full "
                                  "recompute of every layer (recompute=full, no recompute_layers)",
                                  "set model.recompute=full without recompute_layers, or turn it off"))
    if m.comm_recompute and not ((p.use_seq_parallel and p.model_parallel > 1)
                                 or (p.optimizer_shard and p.data_parallel > 1)):
        issues.append(ConfigIssue("model.comm_recompute", True, "there is no communication to recompute: it applies "
                                  "to sequence parallel's all-gathers and optimizer sharding's weight all-gathers",
                                  "turn it off, or use parallel.use_seq_parallel (model_parallel > 1) or "
                                  "optimizer_shard (data_parallel > 1)"))
    return issues


def _seq_parallel_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    p, s = cfg.parallel, cfg.model.seq_length
    if not p.use_seq_parallel:
        return []
    if p.model_parallel == 1:
        return [ConfigIssue("parallel.use_seq_parallel", True, "sequence parallel splits the sequence over the "
                            "tensor-parallel group; model_parallel=1 has none", "turn it off or set model_parallel > 1")]
    if s % p.model_parallel:
        return [ConfigIssue("parallel.use_seq_parallel", True, f"model.seq_length={s} does not split into "
                            f"model_parallel={p.model_parallel} equal parts",
                            "use a seq_length that is a multiple of model_parallel")]
    return []


def _topology_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    from ..runtime.rank_table import node_device_issues

    p = cfg.parallel
    issues = []
    if p.fast_group_size is not None:
        if p.fast_group_size > p.devices_per_node or p.devices_per_node % p.fast_group_size:
            issues.append(ConfigIssue("parallel.fast_group_size", p.fast_group_size, "must divide devices_per_node="
                                      f"{p.devices_per_node} (a node's devices split into fast groups)",
                                      "set 8 for Atlas 800T A2, 4 for Atlas 800 model 9000, or leave it empty"))
        elif p.model_parallel > p.fast_group_size or p.fast_group_size % p.model_parallel:
            issues.append(ConfigIssue("parallel.model_parallel", p.model_parallel, f"tensor-parallel groups would "
                                      f"cross the fast interconnect groups of {p.fast_group_size} devices "
                                      "(parallel.fast_group_size)", "use a model_parallel that divides "
                                      f"{p.fast_group_size}, and pipeline_stage / data_parallel across the groups"))
    if p.rank_table_file and p.node_devices is not None:
        issues.append(ConfigIssue("parallel.node_devices", p.node_devices, "with a rank table the devices are the "
                                  "table's (DEVICE_ID per process); ASCEND_RT_VISIBLE_DEVICES would renumber them",
                                  "remove parallel.node_devices and list the devices in the rank table"))
    return issues + node_device_issues(cfg)


RULES = (_offset_issues, _interleave_issues, _recompute_issues, _seq_parallel_issues, _topology_issues)


def parallel_issues(cfg: PipelineConfig) -> list[ConfigIssue]:
    return [i for rule in RULES for i in rule(cfg)]
