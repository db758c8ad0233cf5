"""The reliability suite (issue 16) and its table: run tests/reliability, then print what was measured.

    python bench/reliability.py                   # HYPOTHESIS_PROFILE=reliability: >= 10,000 fuzzed records
    python bench/reliability.py --profile ci      # the amount `make test` fuzzes
    python bench/reliability.py --table-only      # print the table of the last results file again

Runs `pytest -m reliability tests/reliability` with LLM_PIPELINE_RELIABILITY_RESULTS pointing at a JSON
file: tests/reliability/conftest.py writes there, per table row, what the tests counted (`tally.add(row,
key=n)`) plus `tests` / `failed_tests` (a failed test is a crash found, a leak found ...). Rows and keys:
  fuzz            records, configs, stage_runs                          (failed tests = crashes)
  secrets         secrets, scanned_bytes, scanned_objects, found, presigned_links
  kill_points     points, resumed, outputs_equal                        (filled by the kill-point harness)
  storage_faults  injected, survived, refused_cleanly                   (filled by the fault-injecting proxy)
  disk_full       runs, failed_clearly, resumed
  concurrent      runs, lost_or_half_merged
  hostile         inputs, stage_runs, input_bytes, written_bytes, worst_input_bytes, worst_written_bytes,
                  outside_writes   (written: quarantine/exclusion copies naming the file; failed tests = crashes)
  shared          cases, refused_clearly, private   (a second local account against the s3:// runs' local work
                  folders; failed tests = a folder used that another account made, or one it can read)
A row no test wrote yet reads "not measured". Exit status: pytest's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = Path(os.environ.get("LLM_PIPELINE_TEST_TMP", "/tmp/llm-pipeline-tests")) / "reliability.json"


def run_suite(profile: str, results: Path, extra: list[str]) -> int:
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    env = dict(os.environ, HYPOTHESIS_PROFILE=profile, LLM_PIPELINE_RELIABILITY_RESULTS=str(results),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "reliability", "tests/reliability", *extra]
    print("$ HYPOTHESIS_PROFILE=%s %s" % (profile, " ".join(cmd[1:])), flush=True)
    return subprocess.call(cmd, cwd=ROOT, env=env)


def _n(row: dict, key: str) -> int:
    return int(row.get(key, 0))


def table(data: dict) -> list[str]:
    lines = ["| property | measured | result |", "|---|---|---|"]

    def add(name: str, key: str, measured, result) -> None:
        row = data.get(key)
        if not row:
            lines.append(f"| {name} | not measured | - |")
        else:
            lines.append(f"| {name} | {measured(row)} | {result(row)} |")

    add("fuzzed input", "fuzz",
        lambda r: f"{_n(r, 'records'):,} records fuzzed ({_n(r, 'configs'):,} configs, "
                  f"{_n(r, 'stage_runs')} whole data-stage runs)",
        lambda r: f"{_n(r, 'failed_tests')} crashes" if not _n(r, "failed_tests")
        else f"{_n(r, 'failed_tests')} failing test(s): crashes found")
    add("secrets", "secrets",
        lambda r: f"{_n(r, 'secrets')} secrets; {_n(r, 'scanned_bytes'):,} bytes scanned "
                  f"({_n(r, 'scanned_objects')} S3 objects, Prefect DB + API records, work folders, logs)",
        lambda r: f"{_n(r, 'found')} found" + (f" (failing tests: {_n(r, 'failed_tests')})" if _n(r, "failed_tests")
                                             else "") + (f"; the access key id only in {_n(r, 'presigned_links')} "
                                                         "presigned links" if _n(r, "presigned_links") else ""))
    add("kill points", "kill_points", lambda r: f"{_n(r, 'points')} points killed",
        lambda r: f"{_n(r, 'resumed')} resumed, {_n(r, 'outputs_equal')} outputs equal")
    add("storage faults", "storage_faults", lambda r: f"{_n(r, 'injected')} faults injected",
        lambda r: f"{_n(r, 'survived')} survived, {_n(r, 'refused_cleanly')} refused cleanly")
    add("disk full", "disk_full", lambda r: f"{_n(r, 'runs')} runs",
        lambda r: f"{_n(r, 'failed_clearly')} failed clearly, {_n(r, 'resumed')} resumed")
    add("concurrent runs", "concurrent", lambda r: f"{_n(r, 'runs')} runs",
        lambda r: f"{_n(r, 'lost_or_half_merged')} lost or half-merged")
    add("hostile inputs", "hostile",
        lambda r: f"{_n(r, 'inputs')} inputs tried ({_n(r, 'input_bytes'):,} bytes, {_n(r, 'stage_runs')} "
                  "whole data-stage runs: newline gzip, one-line gzip, huge text, non-finite numbers, link loops)",
        lambda r: f"{_n(r, 'failed_tests')} crashes; bytes written per input byte: max "
                  f"{_n(r, 'worst_written_bytes') / max(_n(r, 'worst_input_bytes'), 1):,.0f} "
                  f"({_n(r, 'worst_input_bytes'):,} B -> {_n(r, 'worst_written_bytes'):,} B, capped per file and "
                  f"reason), overall {_n(r, 'written_bytes') / max(_n(r, 'input_bytes'), 1):.3f}; "
                  f"{_n(r, 'outside_writes')} written outside the root")
    add("shared machine", "shared",
        lambda r: f"{_n(r, 'cases')} cases by a second local account (a folder, a dangling link, a link, a file "
                  "made first at the work folder's name; a shared $LLM_PIPELINE_WORK_DIR; a fresh run's copy)",
        lambda r: f"{_n(r, 'refused_clearly')} refused clearly, {_n(r, 'private')} private (0700, unreadable to the "
                  f"other account); {_n(r, 'failed_tests')} failing test(s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="reliability", choices=["reliability", "ci"])
    ap.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="the JSON file the tests write")
    ap.add_argument("--table-only", action="store_true", help="print the table of an existing results file")
    args, extra = ap.parse_known_args(argv)
    code, started = 0, time.time()
    if not args.table_only:
        code = run_suite(args.profile, args.results, extra)
    data = json.loads(args.results.read_text()) if args.results.exists() else {}
    print()
    if not args.table_only:
        print(f"reliability suite ({args.profile} profile): {time.time() - started:.0f} s, pytest exit {code}")
    print("\n".join(table(data)))
    return code


if __name__ == "__main__":
    sys.exit(main())
