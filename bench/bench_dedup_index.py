"""Peak memory and time of the dedup step against a growing dedup index (prints a table).

    python bench/bench_dedup_index.py [--base-docs 50000] [--new-docs 20000] [--scales 1,4,16]

For each scale s the prior index holds s x base-docs documents with synthetic MinHash signatures
(random, 128 permutations), committed the way runs commit them (commit_segment: row store +
partition merges), as min(s, 4) runs. The new side is fixed: new-docs documents, 5% exact copies
of prior documents, 5% near copies (8 of 128 signature values changed), the rest new. Each point
runs in a fresh subprocess (peak RSS = that process's VmHWM / ru_maxrss): the dedup step's lookups
(load_prior with the run's keys and band keys) plus the decisions (Deduplicator.process, shards of
5,000), once with the partitioned index and once with the whole index loaded into memory (the
earlier versions' way, load_prior_in_memory) for contrast. Ratios are against the 1x point of the
same mode in the same invocation. The decisions of both modes are checked equal.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

NUM_PERM = 128
SHARD = 5000


def cfg_at(root: Path):
    from pipeline_lib.config import config_from_dict

    return config_from_dict({"run": {"output_root": str(root)}})


def build_prior(root: Path, base: int, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """Commit scale x base synthetic documents as min(scale, 4) runs: the first run is the same
    `base` documents at every scale (the new side copies from it), the others share the rest.
    Returns a sample (keys, sigs) of the first run."""
    from pipeline_lib.data.dedup_index import commit_segment, index_uri, segment_meta, write_segment

    cfg = cfg_at(root)
    sample_keys, sample_sigs = [], []
    runs = min(scale, 4)
    for r in range(runs):
        rng = np.random.default_rng(11 if r == 0 else 1000 * scale + r)
        per = base if r == 0 else (scale - 1) * base // (runs - 1)
        keys = rng.integers(0, 2**63, per, dtype=np.uint64) * np.uint64(2)
        sigs = rng.integers(0, 2**32 - 1, (per, NUM_PERM), dtype=np.uint32)
        folder = root / "segs" / f"prior{r:02d}"
        names = write_segment(folder, segment_meta(cfg, f"prior{r:02d}", per, True),
                              [f"prior{r}.jsonl:{i}" for i in range(per)], keys, sigs)
        commit_segment(folder, names, index_uri(cfg), f"prior{r:02d}")
        shutil.rmtree(folder)
        if r == 0:
            pick = rng.choice(per, min(per, 4000), replace=False)
            sample_keys.append(keys[pick])
            sample_sigs.append(sigs[pick])
        del keys, sigs
    return np.concatenate(sample_keys), np.concatenate(sample_sigs)


def new_side(path: Path, n: int, sample_keys: np.ndarray, sample_sigs: np.ndarray) -> None:
    """The fixed new documents (same for every scale: copies come from the 1x prior's run)."""
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    sigs = rng.integers(0, 2**32 - 1, (n, NUM_PERM), dtype=np.uint32)
    k = n // 20
    pick = rng.choice(len(sample_keys), 2 * k, replace=False)
    keys[:k], sigs[:k] = sample_keys[pick[:k]], sample_sigs[pick[:k]]
    sigs[k:2 * k] = sample_sigs[pick[k:]]
    for row in range(k, 2 * k):
        sigs[row, rng.choice(NUM_PERM, 8, replace=False)] ^= 1
    np.savez(path, keys=keys, sigs=sigs)


def peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_point(root: Path, new: Path, mode: str) -> dict:
    """One measured dedup step (in this process)."""
    from pipeline_lib.data.dedup import Deduplicator, collision_flags
    from pipeline_lib.data.dedup_index import load_prior, load_prior_in_memory
    from pipeline_lib.data.minhash import band_keys, is_empty

    cfg = cfg_at(root)
    data = np.load(new)
    keys, sigs = data["keys"], data["sigs"]
    base = peak_rss_mb()
    t0 = time.perf_counter()
    dd = Deduplicator(cfg.data.dedup, None, "tonight")
    bk = band_keys(sigs, dd.bands, dd.rows)
    query, insert = collision_flags(bk, is_empty(sigs))
    if mode == "partitioned":
        dd.prior = load_prior(cfg, "tonight", dd.bands, dd.rows, keys=keys, band_keys_=bk)
    else:
        dd.prior = load_prior_in_memory(cfg, "tonight", dd.bands, dd.rows)
    t_lookup = time.perf_counter() - t0
    decisions, records = [], []
    for a in range(0, len(keys), SHARD):
        d, r = dd.process([f"new.jsonl:{i}" for i in range(a, min(a + SHARD, len(keys)))], keys[a:a + SHARD],
                          sigs[a:a + SHARD], query[a:a + SHARD], insert[a:a + SHARD])
        decisions.append(d)
        records += r
    decisions = np.concatenate(decisions)
    return {"mode": mode, "prior_docs": len(dd.prior), "seconds": time.perf_counter() - t0,
            "lookup_seconds": t_lookup, "peak_rss_mb": peak_rss_mb(), "rss_before_mb": base,
            "exact": int((decisions == 1).sum()), "near": int((decisions == 2).sum()),
            "records_digest": hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:16]}


def index_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "_dedup_index").rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-docs", type=int, default=50_000)
    ap.add_argument("--new-docs", type=int, default=20_000)
    ap.add_argument("--scales", default="1,4,16")
    ap.add_argument("--modes", default="partitioned,memory")
    ap.add_argument("--dir", default=os.environ.get("LLM_PIPELINE_BENCH_CACHE", "/tmp/llm-pipeline-bench") +
                    "/dedup-index")
    ap.add_argument("--point", nargs=3, metavar=("ROOT", "NEW", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.point:
        print(json.dumps(run_point(Path(args.point[0]), Path(args.point[1]), args.point[2])))
        return
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    new = work / "new.npz"
    rows = []
    for s in [int(x) for x in args.scales.split(",")]:
        root = work / f"x{s}"
        t0 = time.perf_counter()
        sample = build_prior(root, args.base_docs, s)
        build = time.perf_counter() - t0
        if not new.exists():
            new_side(new, args.new_docs, *sample)
        for mode in args.modes.split(","):
            out = subprocess.run([sys.executable, __file__, "--point", str(root), str(new), mode], check=True,
                                 capture_output=True, text=True, cwd=ROOT).stdout
            rows.append({"scale": s, "build_seconds": build, "index_mb": index_bytes(root) / 2**20,
                         **json.loads(out.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), file=sys.stderr)
        shutil.rmtree(root)
    print(f"\nnew documents: {args.new_docs}; prior: {args.base_docs} x scale; {os.cpu_count()} CPUs\n")
    print("| mode | prior docs | index on disk | peak RSS | vs 1x | dedup step | vs 1x | exact | near |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        first = next(x for x in rows if x["mode"] == r["mode"])
        print(f"| {r['mode']} | {r['prior_docs']:,} | {r['index_mb']:.0f} MB | {r['peak_rss_mb']:.0f} MB | "
              f"{r['peak_rss_mb'] / first['peak_rss_mb']:.2f} | {r['seconds']:.1f} s | "
              f"{r['seconds'] / first['seconds']:.2f} | {r['exact']} | {r['near']} |")
    for s in sorted({r["scale"] for r in rows}) if len(args.modes.split(",")) > 1 else ():
        same = {(r["exact"], r["near"], r["records_digest"]) for r in rows if r["scale"] == s}
        print(f"scale {s}: decisions of both modes {'equal' if len(same) == 1 else 'DIFFER'}")


if __name__ == "__main__":
    main()
