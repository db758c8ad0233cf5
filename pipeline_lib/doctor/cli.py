"""`llm-pipeline doctor`: classify a failed run and say what to change.

    llm-pipeline doctor --log FILE [--log FILE2 ...] [CONFIG [key=value ...]] [--stage S] [--json]
    llm-pipeline doctor --run-id ID CONFIG [key=value ...] [--stage S] [--json]

--log reads any mindformers / msrun / MindSpore / HCCL log (ours or not); with CONFIG the remedies carry numbers
from our planner and config. --run-id finds the failed stage of the run (the first whose manifest does not match)
and reads its logs (logs.py); when its loss guard tripped, the source documents of the bad batches
(guard_diagnosis.json) are printed too, with the override that drops them from the next run's data.
--json prints {"category", "stage", "evidence", "remedies"} (+ "documents", "guard_diagnosis" with --run-id).
Exit codes: 0 a failure category was found, or --run-id names a run with nothing failed (it says so), 1 unknown (no
known failure text), 2 bad arguments or config.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .classify import diagnose


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llm-pipeline doctor",
                                 description="Why did the run fail, and what to change (category, the log lines "
                                 "that show it, remedies with config overrides).")
    ap.add_argument("config", nargs="?", help="pipeline config yaml (needed with --run-id; with --log it adds numbers)")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides the run used")
    ap.add_argument("--log", action="append", default=[], metavar="FILE", help="a log file (repeatable)")
    ap.add_argument("--run-id", help="a run of CONFIG: read the failed stage's logs from its folder")
    ap.add_argument("--stage", help="the stage (default: read from the log, or the run's failed stage)")
    ap.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    return ap


def render(diag) -> str:
    out = [f"category: {diag.category}" + (f" (stage {diag.stage})" if diag.stage else "")]
    if diag.category == "unknown":
        out.append("no known failure text found in the log (see docs/troubleshooting.md for what doctor knows)")
    if diag.evidence:
        out.append("error lines in the log (none is a failure doctor knows):" if diag.category == "unknown"
                   else "evidence:")
        out += [f"  > {line}" for line in diag.evidence]
    if diag.remedies:
        out.append("remedies:")
        for i, rem in enumerate(diag.remedies, 1):
            out.append(f"  {i}. {rem['why']}")
            if rem["overrides"]:
                out.append(f"     overrides: {' '.join(rem['overrides'])}")
    if diag.retry is not None:
        out.append("retry with the same config: " + ("may help (transient infrastructure)" if diag.retry
                                                      else "will not help; change the config first"))
    return "\n".join(out)


def guard_documents(folder: Path) -> tuple[Path | None, list[dict]]:
    """(the stage folder's guard_diagnosis.json, its documents), or (None, []) without one."""
    from ..train.session import GUARD_DIAGNOSIS_FILE

    path = folder / GUARD_DIAGNOSIS_FILE
    if not path.is_file():
        return None, []
    from ..storage.bounded import MAX_JSON_BYTES

    try:
        if path.stat().st_size > MAX_JSON_BYTES:  # not a diagnosis the guard wrote: not read
            return path, []
        docs = json.loads(path.read_text(encoding="utf-8")).get("documents") or []
        return path, [d for d in docs if isinstance(d, dict)] if isinstance(docs, list) else []
    except (ValueError, AttributeError, RecursionError):
        return path, []


def render_documents(path: Path, docs: list[dict]) -> str:
    out = [f"documents in the batches the loss guard stopped at ({path}):"]
    out += [f"  step {', '.join(map(str, d.get('steps') or []))}: id {json.dumps(d.get('id'))} origin {d.get('origin')}"
            for d in docs]
    out.append(f"  drop them from the next run's data: data.exclude_from=[{path}]")
    return "\n".join(out)


def doctor_main(argv: list[str]) -> int:
    ap = build_parser()
    args = ap.parse_intermixed_args(argv)
    if not args.log and not args.run_id:
        ap.error("give --log FILE or --run-id ID with CONFIG")
    if args.run_id and not args.config:
        ap.error("--run-id needs the run's CONFIG")
    cfg = None
    if args.config:
        from ..config import ConfigError, load_config

        try:
            cfg = load_config(args.config, args.overrides)
        except ConfigError as err:
            print(err, file=sys.stderr)
            return 2
    files = [Path(f) for f in args.log]
    stage = args.stage
    if args.run_id:
        from .logs import NothingFailed, run_logs

        try:
            stage, found = run_logs(cfg, args.run_id, args.stage)
        except NothingFailed as answer:  # a good run: exit 0, as a diagnosis found
            print(json.dumps({"category": None, "stage": None, "evidence": [], "remedies": [], "message": str(answer)})
                  if args.json else answer)
            return 0
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        files += found
        from ..storage import RunPaths
        from .logs import linked_outside

        run_folder = Path(RunPaths(cfg.run.output_root, args.run_id, cfg.run.s3_endpoint_url).run_uri)
        for link in linked_outside(Path(run_folder) / stage, run_folder) if (run_folder / stage).is_dir() else []:
            print(f"note: not read: {link} is a link to a file outside the run folder", file=sys.stderr)
        if not found:
            print(f"note: no log files in the {stage} folder of run {args.run_id}", file=sys.stderr)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"--log: no such file {', '.join(missing)}", file=sys.stderr)
        return 2
    from .logs import read_logs

    diag = diagnose(read_logs(files), cfg, stage=stage)
    guard_file, docs = None, []
    if args.run_id:
        from ..storage import RunPaths

        paths = RunPaths(cfg.run.output_root, args.run_id, cfg.run.s3_endpoint_url)
        guard_file, docs = guard_documents(Path(paths.stage_uri(stage)))
    if args.json:
        extra = {"documents": docs, "guard_diagnosis": str(guard_file)} if guard_file else {}
        print(json.dumps(diag.as_dict() | extra, indent=2, ensure_ascii=False))
    else:
        print(render(diag) + (("\n" + render_documents(guard_file, docs)) if docs else ""))
    return 1 if diag.category == "unknown" else 0
