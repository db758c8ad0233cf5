"""Render a Plan: the ranked table, the memory terms, the config patch (yaml) and a JSON dict.

The config patch holds the `parallel:` section plus the fields of other sections that a layout
sets (model.recompute, training batch fields, model.seq_length when the plan overrode it), so it
can be pasted over a pipeline config as is.
"""
from __future__ import annotations

from dataclasses import replace

import yaml

from .advisor import Candidate, Layout, Plan
from .memory import GB, TERMS, MemoryBreakdown

TERM_FORMULAS = {
    "weights": "params_on_device x weight bytes (2 fp16/bf16, 4 fp32)",
    "gradients": "params_on_device x gradient bytes (2 fp16/bf16, 4 fp32)",
    "optimizer_states": "params_on_device x 12 (fp32 master + 2 moments; 8 in fp32) / dp if sharded",
    "activations": "Korthikanti per-layer bytes x layers on stage x micro batches in flight",
    "embedding_output": "sbh x in flight (first stage) + 4sbh + 4sbv/t (last stage)",
    "recompute_workspace": "one layer's recomputed activations during its backward",
    "comm_buffers": "DP gradient bucket + TP all-reduce 2sbh + PP send/recv 2 x 2sbh",
    "framework_reserve": "runtime, collective buffers, workspaces (assumed)",
}


def layout_text(c: Candidate) -> str:
    lay = c.layout
    return (f"dp{lay.data_parallel} x mp{lay.model_parallel} x pp{lay.pipeline_stage}, micro_batch_num "
            f"{lay.micro_batch_num}, micro batch {lay.micro_batch_size}, accumulation "
            f"{lay.gradient_accumulation_steps}, recompute {lay.recompute}, optimizer shard "
            f"{'off' if not lay.optimizer_shard else 'on' if lay.data_parallel > 1 else 'on (no effect at dp=1)'}")


def best_per_family(cands: list[Candidate]) -> list[tuple[int, Candidate]]:
    """(overall rank, candidate) of the best-ranked candidate of each (dp, mp, pp, sharding,
    recompute): variants that differ only in micro batch count or size would fill the table."""
    seen, out = set(), []
    for rank, c in enumerate(cands, 1):
        key = (c.layout.family, c.layout.recompute)
        if key not in seen:
            seen.add(key)
            out.append((rank, c))
    return out


def table_lines(cands: list[Candidate], top: int = 10) -> list[str]:
    head = (f"{'#':>2} {'dp':>3} {'mp':>3} {'pp':>3} {'m':>3} {'mbs':>4} {'ga':>3} {'recompute':<9} "
            f"{'shard':<5} {'peak GB':>8} {'mem%':>5} {'step x':>7}  why")
    lines = [head, "-" * len(head)]
    for i, c in best_per_family(cands)[:top]:
        lay = c.layout
        lines.append(f"{i:>2} {lay.data_parallel:>3} {lay.model_parallel:>3} {lay.pipeline_stage:>3} "
                     f"{lay.micro_batch_num:>3} {lay.micro_batch_size:>4} {lay.gradient_accumulation_steps:>3} "
                     f"{lay.recompute:<9} {'yes' if lay.optimizer_shard else 'no':<5} "
                     f"{c.memory.total / GB:>8.1f} {c.memory.total / c.capacity_bytes:>5.0%} "
                     f"{c.cost.relative:>7.2f}  {', '.join(c.cost.reasons())}")
    return lines


def breakdown_lines(mem: MemoryBreakdown, capacity_gb: float | None = None) -> list[str]:
    lines = [f"  {t:<20} {getattr(mem, t) / GB:>8.2f} GB   {TERM_FORMULAS[t]}" for t in TERMS]
    cap = f" of {capacity_gb:g} GB" if capacity_gb else ""
    lines.append(f"  {'total':<20} {mem.total / GB:>8.2f} GB{cap}   (pipeline stage {mem.stage}: "
                 f"{mem.layers_on_stage} layers, {mem.params_on_device:,} params, "
                 f"{mem.micro_batches_in_flight} micro batch(es) in flight)")
    return lines


def config_patch(plan: Plan, c: Candidate) -> dict:
    lay, cfg = c.layout, plan.config
    p = lay.apply(cfg).parallel
    parallel = {k: getattr(p, k) for k in ("devices", "data_parallel", "model_parallel", "pipeline_stage",
                                             "micro_batch_num", "optimizer_shard", "devices_per_node",
                                             "device_memory_gb")}
    for key in ("pipeline_offset", "pp_interleave_num"):  # only when the layout or the config moves them
        if getattr(p, key) != getattr(cfg.parallel, key) or getattr(p, key) not in (0, 1):
            parallel[key] = getattr(p, key)
    model = {"recompute": lay.recompute}
    if plan.request.seq_length:
        model["seq_length"] = cfg.model.seq_length
    training = {"micro_batch_size": lay.micro_batch_size,
                "gradient_accumulation_steps": lay.gradient_accumulation_steps,
                "global_batch_size": cfg.training.global_batch_size}
    return {"parallel": parallel, "model": model, "training": training}


def yaml_text(patch: dict) -> str:
    return yaml.safe_dump(patch, sort_keys=False, default_flow_style=False)


def pure_dp_note(plan: Plan) -> str:
    """Why pure data parallel (every device holds all model states) is or is not the answer."""
    n, parts = plan.request.devices, []
    for shard in ((False, True) if n > 1 else (False,)):
        name = Layout(n, 1, 1, 1, 1, 1, "none", shard).family_name()
        rej = next((r for r in plan.rejected if r.family == name), None)
        if rej is not None:
            parts.append(f"{name} does not fit: {rej.reason}")
            continue
        rank = next((i for i, c in enumerate(plan.ranked, 1) if c.layout.family == (n, 1, 1, shard)), None)
        if rank:
            c = plan.ranked[rank - 1]
            parts.append(f"{name} fits ({c.memory.total / GB:.1f} GB with recompute {c.layout.recompute}, "
                         f"micro batch {c.layout.micro_batch_size}) but ranks #{rank} of {len(plan.ranked)} at step "
                         f"x{c.cost.relative:.2f} ({', '.join(c.cost.reasons())})")
    return ". ".join(parts)


def _same_layout(lay: Layout) -> Layout:
    # Optimizer sharding over a data-parallel group of one changes nothing: compare without it.
    return replace(lay, optimizer_shard=False) if lay.data_parallel == 1 else lay


def render(plan: Plan, top: int = 10) -> str:
    cfg, req, pc = plan.config, plan.request, plan.params
    m, hw = cfg.model, req.hardware
    nodes = -(-req.devices // req.devices_per_node)
    out = [f"model {m.name}: {pc.total:,} parameters (embedding {pc.embedding:,}, attention {pc.attention:,}, "
           f"ffn {pc.ffn:,}, norms {pc.norms:,}, output head {pc.output_head:,})",
           f"request: {req.devices} devices ({req.devices_per_node} per node, {nodes} node(s)), "
           f"{req.device_memory_gb:g} GB each ({req.usable_gb:g} GB usable after headroom); seq {m.seq_length}, global batch {cfg.training.global_batch_size} "
           f"({cfg.training.global_batch_size * m.seq_length:,} tokens/step), precision {cfg.training.precision}, "
           f"flash attention {'on' if m.use_flash_attention else 'off'}", ""]
    for issue in plan.model_issues:
        out.append(f"WARNING (not a layout problem): {issue}")
    if plan.best is None:
        out.append(f"No layout fits {req.devices} x {req.usable_gb:g} GB usable.")
    else:
        out += [f"{len(plan.ranked)} layouts fit. Best of each family and recompute mode: those leaving 10% of "
                "memory free first, then by step time relative to perfect scaling (1.00 = compute only); # is the "
                "overall rank:"]
        out += table_lines(plan.ranked, top)
        best = plan.best
        out += ["", f"Recommended: {layout_text(best)}", *breakdown_lines(best.memory, req.usable_gb),
                "", "Paste into the pipeline config:", yaml_text(config_patch(plan, best)).rstrip()]
    out += ["", "Why not pure data parallel: " + pure_dp_note(plan)]
    if plan.rejected:
        out += ["", "Rejected layout families:"] + [f"  - {r.family}: {r.reason}" for r in plan.rejected]
    cur = plan.current
    verdict = ("breaks rules: " + "; ".join(cur.issues)) if cur.issues else (
        "fits" if cur.fits else f"does NOT fit ({cur.memory.total / GB:.1f} GB > {req.usable_gb:g} GB usable)")
    key = _same_layout(cur.layout)
    rank = next((i for i, c in enumerate(plan.ranked, 1) if _same_layout(c.layout) == key), None)
    out += ["", f"The config's own layout ({layout_text(cur)}): {cur.memory.total / GB:.1f} GB, {verdict}"
            + (f", rank #{rank} of {len(plan.ranked)}" if rank else "")
            + f", step x{cur.cost.relative:.2f} ({', '.join(cur.cost.reasons())})"]
    out += [f"Assumptions: {hw.tflops:g} TFLOP/s achieved per device, {hw.intra_node_gbps:g} GB/s inside a node, "
            f"{hw.inter_node_gbps:g} GB/s across nodes, framework reserve {req.reserve_gb:g} GB "
            "(formulas and sources: docs/planner.md)"]
    return "\n".join(out)


def candidate_dict(c: Candidate) -> dict:
    return {"layout": vars(c.layout).copy(), "family": c.layout.family_name(), "fits": c.fits,
            "issues": c.issues, "memory_gb": c.memory.gb(), "memory": c.memory.as_dict(), "cost": c.cost.as_dict()}


def plan_dict(plan: Plan, top: int = 10) -> dict:
    req = plan.request
    return {
        "params": plan.params.as_dict(),
        "request": {"devices": req.devices, "devices_per_node": req.devices_per_node,
                    "device_memory_gb": req.device_memory_gb, "usable_gb": req.usable_gb, "seq_length": plan.config.model.seq_length,
                    "global_batch": plan.config.training.global_batch_size, "reserve_gb": req.reserve_gb,
                    "hardware": vars(req.hardware).copy()},
        "recommended": candidate_dict(plan.best) if plan.best else None,
        "config_patch": config_patch(plan, plan.best) if plan.best else None,
        "ranked": [candidate_dict(c) for c in plan.ranked[:top]],
        "fitting_count": len(plan.ranked),
        "rejected": [{"family": r.family, "reason": r.reason} for r in plan.rejected],
        "pure_data_parallel": pure_dp_note(plan),
        "current": candidate_dict(plan.current),
        "model_issues": plan.model_issues,
    }
