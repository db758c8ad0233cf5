"""Measured against predicted: a training run's step time and memory next to the planner's numbers.

`planner_check(cfg, step_time_ms=..., peak_rss_bytes=..., ranks=...)` returns both numbers, their ratio and an
alert per figure that strays by more than training.planner_alert_factor (either way).
- Step time: the planner's cost model (cost.step_cost: ideal step = training FLOPs / (devices x achieved TFLOP/s),
  times its overheads) with the achieved TFLOP/s of config.platform.achieved_tflops (training.planner_tflops, else
  150 on Ascend, else the CPU figure calibrated on the tiny run). Measured: the median `step_time_ms` of
  metrics.jsonl (a step's begin to its loss being ready; the data wait is not in the planner's model).
- Memory: the planner's per-device peak (memory.estimate: model states, activations, framework reserve). Measured,
  on CPU only: the peak RSS of the trainer's process tree (the launcher samples it) divided by the ranks on this
  node, i.e. host memory per trainer process, which on CPU is where the "device" memory lives (it includes the
  Python/MindSpore runtime, which the planner's 2 GB framework reserve stands for). On Ascend host RSS says nothing
  about device memory: the device reading is compared instead (MindSpore's memory_stats max_reserved_memory that the
  trainer records in metrics.jsonl, or an `npu-smi info` HBM reading; planner/readings.py).
- MFU: model training FLOPs per step / (step time x devices x peak), predicted and measured, against a peak with its
  source (planner.readings.PEAK_TFLOPS or training.peak_tflops); none when the peak is unknown.
Pure Python (no MindSpore); never raises for a missing figure (the comparison is advice).
"""
from __future__ import annotations

from ..config.platform import achieved_tflops, device_target
from ..config.schema import PipelineConfig, global_batch
from .cost import Hardware, cost_options, step_cost
from .memory import GB, estimate
from .params import ModelShape


def predicted_step_ms(cfg: PipelineConfig) -> tuple[float, float, str]:
    """(predicted step ms of the config's layout, achieved TFLOP/s used, where that figure comes from)."""
    tflops, source = achieved_tflops(cfg)
    p, t, m = cfg.parallel, cfg.training, cfg.model
    mem = estimate(cfg)
    cost = step_cost(ModelShape.from_config(m), seq_length=m.seq_length, global_batch=global_batch(cfg),
                     micro_batch_size=t.micro_batch_size, data_parallel=p.data_parallel,
                     model_parallel=p.model_parallel, pipeline_stage=p.pipeline_stage,
                     micro_batch_num=p.micro_batch_num, recompute=m.recompute, flash_attention=m.use_flash_attention,
                     gradient_bytes=mem.gradients, devices_per_node=p.devices_per_node,
                     hw=Hardware(tflops=tflops), weight_bytes=mem.weights, **cost_options(cfg))
    return cost.step_s * 1000, tflops, source


def _compare(name: str, predicted: float | None, measured: float | None, factor: float, unit: str,
             fix: str) -> dict:
    ratio = measured / predicted if predicted and measured else None
    off = ratio is not None and (ratio > factor or ratio < 1 / factor)
    row = {"figure": name, "predicted": predicted, "measured": measured, "unit": unit,
           "ratio": None if ratio is None else round(ratio, 3), "alert": off, "warning": None}
    if off:
        row["warning"] = (f"{name}: measured {measured:,.3g} {unit} is {ratio:.2f}x the planner's prediction "
                          f"{predicted:,.3g} {unit} (more than training.planner_alert_factor={factor:g} off). {fix}")
    return row


def planner_check(cfg: PipelineConfig, *, step_time_ms: float | None, peak_rss_bytes: int | None,
                  ranks: int = 1, device_peak_bytes: int | None = None, device_source: str | None = None,
                  device_name: str | None = None) -> dict:
    """Predicted vs measured step time and memory (see the module docstring). On Ascend `device_peak_bytes` is the
    measured device memory (planner.readings: MindSpore's max_reserved_memory, or npu-smi's HBM use), named by
    `device_source`; `device_name` (npu-smi's, e.g. 910B4-1) picks the peak FLOP/s of the MFU row."""
    factor = cfg.training.planner_alert_factor
    try:
        step_ms, tflops, source = predicted_step_ms(cfg)
        peak_gb = estimate(cfg).total / GB
    except Exception as err:  # the planner is advice: an unsupported layout must not fail the stage
        return {"factor": factor, "rows": [], "warnings": [], "error": f"planner prediction unavailable: {err}"}
    rows = [_compare("step time", step_ms, step_time_ms, factor, "ms",
                     f"The prediction assumes {tflops:g} TFLOP/s per device ({source}): if that figure is wrong for "
                     "this hardware set training.planner_tflops; if not, look at the profile summary "
                     "(training.profile.enabled=true) for data wait or communication.")]
    on_cpu = device_target(cfg) == "CPU"
    measured_gb = peak_rss_bytes / GB / max(1, ranks) if on_cpu and peak_rss_bytes else None
    mem = _compare("memory per device", peak_gb, measured_gb, factor, "GB",
                   "Measured is the trainer process's peak RSS (CPU); check model.* / training.micro_batch_size "
                   "against `llm-pipeline plan` (docs/planner.md).")
    if not on_cpu and device_peak_bytes:
        mem = _compare("memory per device", peak_gb, device_peak_bytes / GB, factor, "GB",
                       f"Measured is {device_source or 'the device reading'}; check model.* / training.micro_batch_size "
                       "against `llm-pipeline plan` (docs/planner.md).")
        mem["measured_by"] = device_source
    elif not on_cpu:
        mem["measured_by"] = ("not measured (no device reading: MindSpore's memory statistics or npu-smi; host RSS is "
                              "not device memory)")
    _overheads_dominate(mem, estimate(cfg).framework_reserve / GB)
    rows.append(mem)
    out = {"factor": factor, "tflops": tflops, "tflops_source": source, "rows": rows,
           "warnings": [r["warning"] for r in rows if r["warning"]], "notes": [r["note"] for r in rows if r.get("note")]}
    out["mfu"] = _mfu(cfg, step_ms, step_time_ms, device_name)
    return out


def _mfu(cfg: PipelineConfig, predicted_ms: float, measured_ms: float | None, device_name: str | None) -> dict:
    """MFU against a cited peak (planner.readings): predicted (the planner's step) and measured (the median step)."""
    from .cost import train_flops_per_token
    from .readings import mfu, peak_tflops

    on_cpu = device_target(cfg) == "CPU"
    peak, source = peak_tflops(device_name, cfg.training.peak_tflops)
    if peak is None or on_cpu and cfg.training.peak_tflops is None:
        return {"peak_tflops": None, "source": source if not on_cpu else "CPU: no peak table (set "
                "training.peak_tflops to compute one)", "predicted": None, "measured": None}
    m = cfg.model
    tokens = global_batch(cfg) * m.seq_length
    flops = train_flops_per_token(ModelShape.from_config(m), m.seq_length)
    devices = cfg.parallel.devices
    return {"peak_tflops": peak, "source": source,
            "predicted": round(mfu(flops, tokens, predicted_ms / 1000, devices, peak), 4),
            "measured": round(mfu(flops, tokens, measured_ms / 1000, devices, peak), 4) if measured_ms else None}


def _overheads_dominate(row: dict, reserve_gb: float) -> None:
    """A measured peak far BELOW a prediction that is mostly the planner's fixed framework reserve is not a fault: a
    tiny model's memory is the runtime's, which the reserve only stands in for (the bundled default: 0.76-0.89 GB
    measured against 2.01 GB, 2.0 of it the reserve). Such a row is a note, not a warning; above the prediction, or
    with a prediction mostly of model states and activations, the alert stands."""
    if not row["alert"] or row["ratio"] > 1 or reserve_gb <= row["predicted"] / 2:
        return
    row["alert"], row["warning"] = False, None
    row["note"] = (f"{row['figure']}: measured {row['measured']:,.3g} GB, {row['ratio']:.2f}x the planner's "
                   f"{row['predicted']:,.3g} GB, of which {reserve_gb:,.3g} GB is its fixed framework reserve: a model "
                   "this small is dominated by runtime overheads the planner does not model (its figure is for "
                   "models whose weights, optimizer states and activations dominate); not a warning")


def planner_markdown(check: dict) -> str:
    """Both numbers per figure, for the stage report and the Prefect artifact."""
    if check.get("error"):
        return f"**Measured vs planner**: {check['error']}"
    lines = [f"**Measured vs planner** (alert beyond x{check['factor']:g} either way; step-time prediction at "
             f"{check['tflops']:g} TFLOP/s per device, {check['tflops_source']})", "",
             "| figure | predicted | measured | measured/predicted | |", "|---|---|---|---|---|"]
    for r in check["rows"]:
        def num(v, unit=r["unit"]):
            return "-" if v is None else f"{v:,.3g} {unit}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        flag = "**off**" if r["alert"] else ("overheads dominate" if r.get("note") else
                                             "" if r["ratio"] is not None else r.get("measured_by", "not measured"))
        lines.append(f"| {r['figure']} | {num(r['predicted'])} | {num(r['measured'])} | {ratio} | {flag} |")
    mfu = check.get("mfu") or {}
    if mfu.get("peak_tflops"):
        def pct(v):
            return "-" if v is None else f"{v:.1%}"
        lines.append(f"| MFU (peak {mfu['peak_tflops']:g} TFLOP/s: {mfu['source']}) | {pct(mfu['predicted'])} | "
                     f"{pct(mfu['measured'])} | | |")
    return "\n".join(lines)
