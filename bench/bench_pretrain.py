"""Benchmark: step time of the pretrain stage against a bare mindformers Trainer on the same generated yaml.

    python bench/bench_pretrain.py [--steps 60] [--save-steps 20] [--repeats 1] [--workdir DIR]

1. the data stage on the bundled tiny corpus (configs/data/tiny_corpus.jsonl, once, workers=1);
2. per repeat, in this order: the stage (through the registry's `run_stage`: launcher, PipelineMetrics + LossGuard
   callbacks, checkpoint verification/pruning on ticks, progress, plot, manifest), then the bare Trainer: the stage's own
   run.yaml without the PipelineMetrics/LossGuard entries, run as `python -m pipeline_lib.train.entry --yaml` in a
   plain subprocess (mindformers' MFLossMonitor, CheckpointMonitor and StopAtStep stay: they are mindformers');
3. step times of both come from the same source, mindformers' MFLossMonitor `per_step_time` log lines (whole ms),
   step 1 (graph compile) excluded. Printed: the overhead ratio stage/bare of the median and of the mean step time
   per back-to-back pair (goal <= 1.05; the mean includes any checkpoint verifier process competing for the CPU),
   the ratio of the fastest medians, and wall times.
Model: the tiny CPU default (seq 64, hidden 64, 2 layers, vocab 2048), 4 rows per step, fp32, graph mode.
On a shared 2-core machine other processes move the figures by several percent: use --repeats 3 for a median.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GLOG_v", "3")

TINY = {
    "run": {"name": "bench-pretrain", "device_target": "CPU", "seed": 1234},
    "data": {"inputs": [str(ROOT / "configs" / "data" / "tiny_corpus.jsonl")], "docs_per_shard": 200,
             "rows_per_mindrecord_shard": 200, "num_workers": 1},
    "model": {"seq_length": 64, "vocab_size": 2048, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
              "n_kv_heads": 2, "intermediate_size": 176},
    "training": {"micro_batch_size": 4, "global_batch_size": 4, "warmup_steps": 5, "keep_checkpoint_max": 2,
                 "preflight_steps": 0, "timeout_seconds": 1800},
}


def step_times(lines: list[str]) -> list[float]:
    from pipeline_lib.train.metrics import parse_loss_line

    records = {}
    for line in lines:
        if line.startswith("[worker_") and not line.startswith("[worker_0]"):
            continue
        rec = parse_loss_line(line)
        if rec is not None:
            records[rec["step"]] = rec["step_time_ms"]
    return [records[s] for s in sorted(records) if s > 1]


def run_stage(cfg, paths) -> dict:
    from pipeline_lib.stages import run_stage as run_registered_stage

    lines: list[str] = []
    t0 = time.time()
    manifest, _ = run_registered_stage(cfg, paths, "pretrain", log=lines.append, force=True)
    return {"wall_s": time.time() - t0, "steps": step_times(lines), "loss": manifest.metrics["final_loss"],
            "yaml": Path(paths.stage_uri("pretrain")) / "run.yaml"}


def run_bare(stage_yaml: Path, workdir: Path) -> dict:
    import yaml

    from pipeline_lib.runtime.env import subprocess_env

    out = workdir / "bare"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run = yaml.safe_load(stage_yaml.read_text(encoding="utf-8"))
    run["callbacks"] = [c for c in run["callbacks"] if c["type"] not in ("PipelineMetrics", "LossGuard")]
    run["output_dir"] = str(out)
    bare_yaml = out / "bare.yaml"
    bare_yaml.write_text(yaml.safe_dump(run, sort_keys=False), encoding="utf-8")
    env = subprocess_env(extra={"GLOG_v": "3", "LOG_MF_PATH": str(out / "log"), "MS_OM_PATH": str(out / "om")})
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "pipeline_lib.train.entry", "--yaml", str(bare_yaml)], cwd=out,
                          env=env, capture_output=True, text=True, timeout=1800)
    wall = time.time() - t0
    if proc.returncode:
        raise SystemExit(f"bare trainer failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    lines = (proc.stdout + proc.stderr).splitlines()
    return {"wall_s": wall, "steps": step_times(lines)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--save-steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workdir", default=None, help="default: a temp folder (removed)")
    args = ap.parse_args()

    from pipeline_lib.config import config_from_dict
    from pipeline_lib.stages import run_stage as run_registered
    from pipeline_lib.storage import RunPaths

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-pretrain-")).resolve()
    raw = json.loads(json.dumps(TINY))
    raw["run"]["output_root"] = str(workdir / "runs")
    raw["training"].update(steps=args.steps, save_steps=args.save_steps)
    cfg = config_from_dict(raw)
    t0 = time.time()
    run_registered(cfg, RunPaths(str(workdir / "runs"), "data"), "data", workers=1)
    print(f"data stage: {time.time() - t0:.1f} s")

    stage_runs, bare_runs = [], []
    for i in range(args.repeats):
        paths = RunPaths(str(workdir / "runs"), f"stage-{i}")
        shutil.copytree(workdir / "runs" / "data" / "data", paths.stage_uri("data"))
        stage_runs.append(run_stage(cfg, paths))
        bare_runs.append(run_bare(stage_runs[-1]["yaml"], workdir / f"bare-{i}"))
        s, b = stage_runs[-1], bare_runs[-1]
        print(f"repeat {i + 1}: stage median {statistics.median(s['steps']):.0f} ms (wall {s['wall_s']:.1f} s), "
              f"bare median {statistics.median(b['steps']):.0f} ms (wall {b['wall_s']:.1f} s)")

    # each repeat runs the two back to back, so a pair shares the machine's load: the ratio is taken per pair
    ratios_med = [statistics.median(s["steps"]) / statistics.median(b["steps"]) for s, b in zip(stage_runs, bare_runs)]
    ratios_mean = [statistics.fmean(s["steps"]) / statistics.fmean(b["steps"]) for s, b in zip(stage_runs, bare_runs)]
    s_min = min(statistics.median(r["steps"]) for r in stage_runs)
    b_min = min(statistics.median(r["steps"]) for r in bare_runs)
    s_wall = statistics.median(r["wall_s"] for r in stage_runs)
    b_wall = statistics.median(r["wall_s"] for r in bare_runs)
    print(f"\npretrain stage vs bare mindformers Trainer, {args.steps} steps, checkpoint every {args.save_steps}, "
          f"{args.repeats} repeat(s), step 1 (compile) excluded:")
    print(f"  overhead ratio of median step times, per pair: {[round(r, 3) for r in ratios_med]} -> median "
          f"{statistics.median(ratios_med):.3f}")
    print(f"  overhead ratio of mean step times, per pair:   {[round(r, 3) for r in ratios_mean]} -> median "
          f"{statistics.median(ratios_mean):.3f}")
    print(f"  fastest median step: stage {s_min:.1f} ms, bare {b_min:.1f} ms -> ratio {s_min / b_min:.3f}")
    print(f"  wall time (median): stage {s_wall:.1f} s (launch, verify, plot, manifest), bare process {b_wall:.1f} s")
    print(f"  final loss (stage): {stage_runs[-1]['loss']:.4f}")
    print(json.dumps({"overhead_ratio_median": round(statistics.median(ratios_med), 4),
                      "overhead_ratio_mean": round(statistics.median(ratios_mean), 4),
                      "fastest_ratio": round(s_min / b_min, 4), "stage_step_ms": s_min, "bare_step_ms": b_min,
                      "stage_wall_s": round(s_wall, 1), "bare_wall_s": round(b_wall, 1)}))
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
