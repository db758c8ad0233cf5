"""`llm-pipeline plan` and the hooks `validate` and the training preflight call.

    llm-pipeline plan --model configs/pipelines/llama2-7b-4x64gb.yaml \\
        --devices 4 --devices-per-node 4 --device-memory-gb 64 [--seq-length N] [--global-batch N] \\
        [--nights 30] [--night-tokens N] [--json] [key=value overrides]

--devices, --devices-per-node and --device-memory-gb default to the config's parallel section.
Exit codes: 0 a layout fits, 1 none fits (the report says why), 2 invalid config or arguments.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..config import ConfigError, load_config
from ..config.schema import PipelineConfig
from .advisor import PlanRequest, plan
from .cost import Hardware
from .memory import GB, estimate
from .report import plan_dict, render


def predicted_peak_gb(cfg: PipelineConfig) -> float:
    """Predicted per-device peak (GB, 1e9 bytes) of the layout the config sets."""
    return estimate(cfg).total / GB


def memory_warning(cfg: PipelineConfig) -> str | None:
    """A one-line warning when the predicted peak exceeds the usable memory (the card minus the headroom)."""
    p = cfg.parallel
    peak, usable = predicted_peak_gb(cfg), p.usable_memory_gb
    if peak <= usable:
        return None
    return (f"predicted peak {peak:.2f} GB per device exceeds the usable {usable:g} GB (parallel.device_memory_gb="
            f"{p.device_memory_gb:g} minus device_memory_headroom_gb={p.headroom_gb:g}); run `llm-pipeline plan` "
            "for a layout that fits")


def predicted_vs_measured(cfg: PipelineConfig, measured_gb: float) -> str:
    """The preflight's line: prediction, measurement and their ratio."""
    peak = predicted_peak_gb(cfg)
    ratio = measured_gb / peak if peak else float("nan")
    return f"memory per device: predicted {peak:.2f} GB, measured {measured_gb:.2f} GB (measured/predicted {ratio:.2f})"


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llm-pipeline plan",
        description="Memory per device and a ranked parallel layout, before any card is spent.")
    ap.add_argument("--model", required=True, metavar="CONFIG_YAML", help="pipeline config yaml")
    ap.add_argument("--seq-length", type=_positive(int), help="default: model.seq_length")
    ap.add_argument("--global-batch", type=_positive(int),
                    help="default: the config's (micro_batch_size x gradient_accumulation_steps x data_parallel)")
    ap.add_argument("--devices", type=_positive(int), help="default: parallel.devices")
    ap.add_argument("--devices-per-node", type=_positive(int), help="default: parallel.devices_per_node")
    ap.add_argument("--device-memory-gb", type=_positive(float), help="default: parallel.device_memory_gb")
    ap.add_argument("--headroom-gb", type=float, default=None,
                    help="memory per device left outside MindSpore's pool (default: parallel.device_memory_headroom_gb, "
                         "else 5 GB on >= 32 GB cards, else 8%%)")
    ap.add_argument("--reserve-gb", type=float, default=PlanRequest.reserve_gb,
                    help="framework reserve per device (default %(default)s)")
    ap.add_argument("--max-micro-batch", type=_positive(int), default=8, help="largest micro batch tried")
    ap.add_argument("--tflops", type=_positive(float), default=Hardware.tflops,
                    help="achieved TFLOP/s per device, for ranking (default %(default)s)")
    ap.add_argument("--intra-node-gbps", type=_positive(float), default=Hardware.intra_node_gbps,
                    help="all-reduce GB/s inside a node (default %(default)s)")
    ap.add_argument("--inter-node-gbps", type=_positive(float), default=Hardware.inter_node_gbps,
                    help="GB/s per device across nodes (default %(default)s)")
    ap.add_argument("--top", type=_positive(int), default=10, help="rows of the table")
    ap.add_argument("--nights", type=_positive(int), default=30,
                    help="nights of the nightly's disk figure, without and with nightly.retention "
                    "(default %(default)s)")
    ap.add_argument("--night-tokens", type=_positive(int), default=None,
                    help="new tokens a night packs (default: the tokens a night trains, training.steps x tokens "
                    "per step)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. model.use_flash_attention=false")
    return ap


def plan_main(argv: list[str]) -> int:
    ap = build_parser()
    args = ap.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.model, args.overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    p = cfg.parallel
    req = PlanRequest(devices=args.devices or p.devices,
                      devices_per_node=args.devices_per_node or p.devices_per_node,
                      device_memory_gb=args.device_memory_gb or p.device_memory_gb,
                      seq_length=args.seq_length, global_batch=args.global_batch, reserve_gb=args.reserve_gb,
                      max_micro_batch_size=args.max_micro_batch,
                      headroom_gb=args.headroom_gb if args.headroom_gb is not None else p.device_memory_headroom_gb,
                      hardware=Hardware(args.tflops, args.intra_node_gbps, args.inter_node_gbps))
    result = plan(cfg, req)
    from dataclasses import asdict

    from .disk import disk_lines, month_lines, month_of_nights

    from .oom import granularity_lines, oom_remedies, remedy_lines

    month = month_lines(cfg, args.nights, args.night_tokens)
    if args.json:
        print(json.dumps({**plan_dict(result, top=args.top), "disk": disk_lines(cfg) + month,
                          "oom_remedies": {ph: [asdict(r) for r in rs] for ph, rs in oom_remedies(cfg).items()},
                          "month_of_nights": asdict(month_of_nights(cfg, args.nights, args.night_tokens))}, indent=2))
    else:
        print(render(result, top=args.top))
        # the config's own layout: the training checkpoints of a node and the weights-only file consumers take; then
        # what a month of nightly runs leaves on the run store, without and with nightly.retention
        print("\n" + "\n".join(disk_lines(cfg) + month))
        # the config's own layout: what each recompute choice costs, and what to change if memory runs out
        print("\n" + "\n".join(granularity_lines(cfg) + [""] + remedy_lines(cfg)))
    return 0 if result.best else 1
