"""Commands that need no orchestrator: `validate`, `plan`, `dedup-index`, `diff`, `doctor` and `gc`.

`llm-pipeline` itself lives in flows/cli.py (it also runs flows); it delegates here so that
pipeline_lib stays free of Prefect.
Exit codes: 0 ok, 2 invalid config or arguments.
"""
from __future__ import annotations

import argparse
import sys

from .checks import problems
from .config import ConfigError, load_config
from .config.errors import MAX_ISSUES_SHOWN
from .config.validate import warnings
from .checks.lr_range import lr_range_warnings
from .config.platform import device_target
from .config.schema import PipelineConfig, global_batch


def token_arithmetic(cfg: PipelineConfig) -> dict:
    t, m = cfg.training, cfg.model
    tokens_per_step = global_batch(cfg) * m.seq_length
    out = {"tokens_per_step": tokens_per_step, "steps": t.steps,
           "total_tokens": tokens_per_step * t.steps if t.steps else None}
    return out


def _predicted_peak(cfg: PipelineConfig):
    try:
        from .planner import predicted_peak_gb
    except ImportError:  # planner not installed in this build
        return None
    return predicted_peak_gb(cfg)


def summary_lines(cfg: PipelineConfig) -> list[str]:
    t, p, m = cfg.training, cfg.parallel, cfg.model
    arith = token_arithmetic(cfg)
    lines = [
        f"pipeline {cfg.run.name}: device {device_target(cfg)}, output {cfg.run.output_root}",
        f"model {m.name}: seq {m.seq_length}, hidden {m.hidden_size}, layers {m.num_layers}, heads "
        f"{m.num_heads}/{m.kv_heads} kv, ffn {m.intermediate_size}, vocab {m.vocab_size}",
        f"layout: dp {p.data_parallel} x mp {p.model_parallel} x pp {p.pipeline_stage} = {p.devices} devices "
        f"on {p.num_nodes} node(s)",
        f"batch: global {global_batch(cfg)} = micro {t.micro_batch_size} x accumulation "
        f"{t.gradient_accumulation_steps} x dp {p.data_parallel}",
        f"tokens per step: {arith['tokens_per_step']:,} = {global_batch(cfg)} x seq {m.seq_length}",
    ]
    if arith["steps"]:
        lines.append(f"steps: {arith['steps']:,}; total tokens: {arith['total_tokens']:,}")
    else:
        lines.append(f"epochs: {t.epochs} (steps follow from the packed data)")
    peak = _predicted_peak(cfg)
    if peak is not None:
        lines.append(f"predicted peak memory per device: {peak:.2f} GB of {p.usable_memory_gb:g} GB usable "
                     f"({p.device_memory_gb:g} GB card - {p.headroom_gb:g} GB headroom)")
        from .planner import memory_warning

        warning = memory_warning(cfg)
        if warning:
            lines.append(f"WARNING: {warning}")
        from .planner.disk import disk_lines

        lines += disk_lines(cfg)
    lines += [f"WARNING: {w}" for w in warnings(cfg) + lr_range_warnings(cfg)]
    return lines


def explain_lines() -> list[str]:
    """Every config field with its default and description."""
    lines = []

    def walk(model_cls, prefix):
        for name, field in model_cls.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.")
                continue
            default = field.default_factory() if field.default_factory else field.default
            if isinstance(default, list) and default and hasattr(default[0], "model_dump"):
                default = [d.model_dump() for d in default]
            lines.append(f"{prefix}{name} = {default!r}\n    {field.description or ''}")

    walk(PipelineConfig, "")
    return lines


def dedup_index_main(argv: list[str]) -> int:
    """`dedup-index list|clear|migrate|repartition CONFIG [--lineage X] [--bits N] [key=value ...]`:
    a lineage's incremental dedup index."""
    from .data.dedup_index import (FORMAT, clear_index, index_uri, lineage, list_segments, migrate_index,
                                   repartition_index)

    ap = argparse.ArgumentParser(prog="llm-pipeline dedup-index",
                                 description="List, clear or migrate the dedup index of a lineage (data.dedup.lineage, "
                                 "default run.name): the documents later runs are deduplicated against. migrate "
                                 "converts an index written by an earlier version in place; repartition --bits N "
                                 "grows it to 2^N partition files per kind (run it between nights).")
    ap.add_argument("action", choices=["list", "clear", "migrate", "repartition"])
    ap.add_argument("--bits", type=int, help="repartition: the new prefix bits (partitions per kind = 2^bits)")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ap.add_argument("--lineage", help="the lineage (default: the config's data.dedup.lineage or run.name)")
    args = ap.parse_intermixed_args(argv)
    overrides = list(args.overrides) + ([f"data.dedup.lineage={args.lineage}"] if args.lineage else [])
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    endpoint = cfg.run.s3_endpoint_url
    segments = list_segments(cfg, endpoint)
    print(f"lineage {lineage(cfg)}: index {index_uri(cfg)}")
    if args.action == "list":
        from .data.dedup_listing import reread_by, summary_line

        again = reread_by(segments)
        for m in segments:
            files = ", ".join(f["uri"] for f in m.get("inputs", [])) or "(inputs not recorded)"
            old = "" if m.get("format") == FORMAT else "  [earlier format: run `dedup-index migrate`]"
            reread = f"  (reread by {again[m['run_id']]})" if m["run_id"] in again else ""
            print(f"  {m['run_id']:<32} {m['docs']:>9} docs  {files}{old}{reread}")
        print(summary_line(segments))
        return 0
    if args.action == "repartition":
        if args.bits is None:
            print("dedup-index repartition needs --bits N (the index's partitions per kind become 2^N). "
                  "Fix: add --bits, e.g. --bits 6", file=sys.stderr)
            return 2
        try:
            old = repartition_index(cfg, args.bits, endpoint)
        except ValueError as err:  # DataStageError: no index, or not a growth
            print(err, file=sys.stderr)
            return 2
        print(f"repartitioned: {2 ** old} -> {2 ** args.bits} partitions per kind")
        return 0
    if args.action == "migrate":
        done = migrate_index(cfg, endpoint)
        print(f"migrated {len(done)} run(s) to the current format {FORMAT} (partitioned, origins as JSON strings)"
              + (f": {', '.join(done)}" if done else " (nothing to do)"))
        return 0
    try:
        n = clear_index(cfg, endpoint)
    except ValueError as err:  # DataStageError: not an index folder, nothing deleted
        print(err, file=sys.stderr)
        return 2
    print(f"cleared: {n} run(s), {sum(m['docs'] for m in segments)} documents; the next run of this lineage "
          "is deduplicated against nothing earlier")
    return 0


def validate_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="llm-pipeline validate",
                                 description="Check a pipeline config before anything runs.")
    ap.add_argument("config", nargs="?")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. training.steps=100")
    ap.add_argument("--plan-only", action="store_true",
                    help="check the layout as a plan (skip the rules and input-file checks that only "
                    "apply to running here)")
    ap.add_argument("--explain", action="store_true", help="print every field, its default and meaning")
    ap.add_argument("--check-remote", action="store_true",
                    help="also list s3:// inputs on run.s3_endpoint_url (connects to it; without this flag validate "
                    "opens no network connection)")
    args = ap.parse_intermixed_args(argv)
    if args.explain:
        print("\n".join(explain_lines()))
        return 0
    if not args.config:
        ap.error("CONFIG is required")
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    issues, warnings = problems(cfg, for_run=not args.plan_only, check_remote=args.check_remote)
    if issues:
        print(f"{args.config}: {len(issues)} problem(s):", file=sys.stderr)
        for issue in issues[:MAX_ISSUES_SHOWN]:
            print(f"  - {issue}", file=sys.stderr)
        if len(issues) > MAX_ISSUES_SHOWN:
            print(f"  ... and {len(issues) - MAX_ISSUES_SHOWN} more", file=sys.stderr)
        print_warnings(warnings, file=sys.stderr)
        return 2
    print(f"{args.config}: OK")
    for line in summary_lines(cfg):
        print("  " + line)
    print_warnings(warnings)
    return 0


def print_warnings(warnings, file=None) -> None:
    for issue in warnings:
        print(f"WARNING: {issue}", file=file or sys.stdout)


def plan_main(argv: list[str]) -> int:
    from .planner.cli import plan_main as _plan

    return _plan(argv)


def diff_main(argv: list[str]) -> int:
    """`diff CONFIG --run-id A --run-id B [--out FILE] [--markdown] [key=value ...]`: what changed from run A to run
    B, plain tables on the terminal (markdown with --markdown and in --out)."""
    from .run_diff import RunNotFound, diff_runs
    from .storage.names import BadName, check_name

    ap = argparse.ArgumentParser(prog="llm-pipeline diff", description="What changed from run A to run B: documents "
                                 "per source file with the top reasons, the token mix, every perplexity and task "
                                 "score side by side with the change, the fixed prompts whose answers changed.")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides (e.g. run.output_root=...)")
    ap.add_argument("--run-id", action="append", default=[], help="give it twice: A (before), then B (after)")
    ap.add_argument("--out", help="also write the markdown to this file")
    ap.add_argument("--markdown", action="store_true", help="print markdown (as the nightly-changes artifact and "
                    "--out have it) instead of the terminal's plain tables")
    args = ap.parse_intermixed_args(argv)
    if len(args.run_id) != 2:
        print(f"--run-id given {len(args.run_id)} time(s): give it twice, --run-id A --run-id B", file=sys.stderr)
        return 2
    try:
        for run_id in args.run_id:
            check_name("--run-id", run_id)
        cfg = load_config(args.config, args.overrides)
        text = diff_runs(cfg, *args.run_id).markdown()
    except (ConfigError, BadName, RunNotFound) as err:  # RunUnreadable is a RunNotFound
        print(err, file=sys.stderr)
        return 2
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text, encoding="utf-8")
    if args.markdown:
        print(text)
    else:
        from .terminal_text import terminal_text

        print(terminal_text(text))
    return 0


def gc_main(argv: list[str]) -> int:
    """`gc CONFIG [--dry-run] [key=value ...]`: apply nightly.retention to the decided nights of run.output_root."""
    from .nightly.retention import gc, plan_lines

    ap = argparse.ArgumentParser(prog="llm-pipeline gc", description="Remove what nightly.retention does not keep "
                                 "from the run folders of decided nights (older weights, training checkpoints of all "
                                 "but the newest night, packed data replay does not read) and print what it frees. "
                                 "Logs, metrics, manifests, evaluation, tokenizers, latest and the lineage's fixed "
                                 "held-out split are always kept; a running or failed night is untouched.")
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. nightly.retention.keep_promoted=5")
    ap.add_argument("--dry-run", action="store_true", help="print what would be freed; remove nothing")
    ap.add_argument("-v", "--verbose", action="store_true", help="also say why each night keeps what it keeps")
    args = ap.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        applied = gc(cfg, dry_run=args.dry_run, log=lambda line: None)
    except (OSError, ValueError, RuntimeError) as err:  # an unreachable store, a state that cannot be written
        print(f"gc {cfg.run.output_root}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print("\n".join(plan_lines(applied, args.dry_run, args.verbose)))
    return 0


def doctor_main(argv: list[str]) -> int:
    from .doctor.cli import doctor_main as _doctor

    return _doctor(argv)


COMMANDS = {"validate": validate_main, "plan": plan_main, "dedup-index": dedup_index_main, "doctor": doctor_main,
            "gc": gc_main}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: llm-pipeline {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
