"""The data stage: raw jsonl/parquet -> cleaned, deduplicated documents, a tokenizer, packed
MindRecord shards, and a stats report that accounts for every input record.

    run_data_stage(run)   runs every step locally with a process pool (the registry calls it)

The same steps, for a Prefect flow that maps tasks over shards (each idempotent, skipping work
whose completion marker exists, each reading and writing only the stage folder):
    shards = plan_data_stage(cfg, paths)                      # -> list of shard specs
    prep_shard(cfg, paths, k)        for k in range(len(shards))
    dedup_partition(cfg, paths, p)   for p in range(dedup_partitions(ws))  (dedup_run.py)
    dedup_stage(cfg, paths)          (runs the partitions not done yet, then decides)
    build_tokenizer(cfg, paths)      (tokenizer_and_cleaned: with write_cleaned_shard and
                                      stage_index_segment meanwhile, in the pool)
    tokenize_shard(cfg, paths, k)    for k in range(len(shards))
    prepare_replay(cfg, paths)       (data.replay: the replay rows; plan_mindrecord runs it if not done)
    write_mindrecord_shard(cfg, paths, split, j)  for (split, j) in plan_mindrecord(cfg, paths)
        (or write_mindrecord_files(cfg, paths, group) for each group of mindrecord_groups(items, n, plan))
    output = finalize_data_stage(cfg, paths)              # -> StageOutput, recorded by the registry
Step functions default to shared=True (work files and markers in the stage folder, so mapped
tasks may run on other machines); run_data_stage passes shared=False (see workspace.py). A
script using the process pool must guard its entry point (if __name__ == "__main__").
The output does not depend on the number of workers. Finalizing checks conservation
(stats.json), publishes this run's segment of the persistent dedup index (its entries were merged
while the tokenizer trained, unseen by readers until then; with data.dedup.defer_publish, as the nightly
runs it, the segment is kept in segment/ instead and published when the night is promoted) and removes the work
files under shards/; the registry (pipeline_lib.stages.record_stage) then writes manifest.json.
Raises: DataStageError (config/data problems, naming the field), ConservationError (a bug).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import shutil
import sys
import threading
from collections import Counter
from functools import partial

from ..lifetime import exit_when_gone
from ..runtime.contract import StageOutput, StageRun
from ..storage import describe_files
from . import fork_server
from .dedup_index import index_uri, publish_segment
from .index_lease import drop_lease
from .encode import (build_tokenizer, file_rows, mindrecord_groups, mindrecord_name, plan_mindrecord, sidecar_name,
                     tokenize_shard, write_cleaned_shard, write_mindrecord_files)
from .errors import ConservationError
from .replay import REPLAY, prepare_replay, reads_earlier_runs
from .dedup_run import dedup_partition
from .prep import SEGMENT, dedup_partitions, dedup_stage, plan_data_stage, prep_shard, shard_dir, stage_index_segment
from .stats import attribute_rows, build_stats
from .workspace import Workspace, atomic_path


def _concat(ws: Workspace, counts: list[dict], name: str, cap: int) -> Counter:
    """Merge the shards' copies of `name` (quarantine.jsonl or excluded.jsonl) in input order, keeping the
    first `cap` per input file and reason (a shard caps only its own; the rest of a file's records are
    counted, not written). Shards whose copies all fit are copied byte for byte. Returns the records
    written per (file label, reason)."""
    out = ws.local(name)
    tmp = atomic_path(out)
    kept: Counter = Counter()
    with open(tmp, "wb") as dst:
        for k, c in enumerate(counts):
            label, wrote = c["label"], c.get("written", {}).get(name, {})
            with open(ws.fetch(f"{shard_dir(k)}/{name}"), "rb") as src:
                if all(kept[label, r] + n <= cap for r, n in wrote.items()):
                    shutil.copyfileobj(src, dst, 1 << 20)
                    kept.update({(label, r): n for r, n in wrote.items()})
                    continue
                for line in src:  # at most `cap` lines a reason: this shard's own cap
                    reason = json.loads(line)["reason"]
                    if kept[label, reason] < cap:
                        kept[label, reason] += 1
                        dst.write(line)
    os.replace(tmp, out)
    ws.publish(name)
    return kept


def _not_written(stats: dict, written: dict[str, Counter]) -> None:
    """Add to stats.json, per file and in total, the records counted but not written (beyond
    data.max_records_written_per_reason): `not_written` {rejected: {reason: n}, filtered: {...}},
    present only where some were left out (a normal run's stats.json is unchanged)."""
    total: dict[str, Counter] = {}
    for label, entry in stats["files"].items():
        gaps = {}
        for kind, name in (("rejected", "quarantine.jsonl"), ("filtered", "excluded.jsonl")):
            left = {r: n - written[name][label, r] for r, n in entry[kind].items() if n > written[name][label, r]}
            if left:
                gaps[kind] = dict(sorted(left.items()))
                total.setdefault(kind, Counter()).update(left)
        if gaps:
            entry["not_written"] = gaps
    if total:
        stats["total"]["not_written"] = {k: dict(sorted(v.items())) for k, v in total.items()}


def finalize_data_stage(cfg, paths, *, shared: bool = True) -> StageOutput:
    """Merge quarantine/exclusion files, write stats.json, publish the index segment; returns the outputs."""
    ws = Workspace(cfg, paths, shared)
    plan = ws.read_json("shards/plan.json")
    n = len(plan["shards"])
    prepared = [ws.read_json(f"{shard_dir(k)}/counts.json") for k in range(n)]
    written = {name: _concat(ws, prepared, name, cfg.data.max_records_written_per_reason)
               for name in ("quarantine.jsonl", "excluded.jsonl")}
    dedup, mr = ws.read_json("shards/dedup.json"), ws.read_json("shards/mindrecord.json")
    shards = []
    for k in range(n):
        s = {**prepared[k], **dedup["shards"][k], **ws.read_json(f"{shard_dir(k)}/tokens.json")}
        shards.append(s)
    labels = [s["label"] for s in shards]
    for split in ("train", "heldout"):  # replay rows (after new_rows) belong to no input file: stats["replay"]
        rows = attribute_rows(mr[split]["token_counts"], labels, mr[split]["row_len"],
                              mr[split].get("new_rows", mr[split]["rows"]))
        seen = set()
        for s in shards:  # a file's rows go to its first shard (rows are counted per file)
            s[f"rows_{split}"] = 0 if s["label"] in seen else rows.get(s["label"], 0)
            seen.add(s["label"])
    tokenizer = ws.read_json("tokenizer/tokenizer_config.json")
    row_len = cfg.model.seq_length + 1
    pad = {sp: mr[sp].get("new_rows", mr[sp]["rows"]) * row_len - sum(mr[sp]["token_counts"])
           for sp in ("train", "heldout")}
    replay = ws.read_json(f"{REPLAY}.json")
    replay["rows"] = mr["train"].get("replay_rows", 0)  # none when tonight gave no training row
    mix = {"new": sum(mr["train"]["token_counts"]),
           "replay": {p["replay"]: p["tokens"] for p in replay["pools"]} if replay["rows"] else {}}
    extra = {"run_id": paths.run_id, "row_tokens": row_len, "shards": n, "tokenizer": tokenizer,
             "pad_tokens": {k: max(v, 0) for k, v in pad.items()},
             "mindrecord_files": {sp: mr[sp]["files"] for sp in ("train", "heldout")},
             "decontamination": plan.get("decontamination"), "replay": replay, "token_mix": mix,
             "dedup": {k: dedup[k] for k in ("bands", "rows", "prior_docs", "prior_runs")} |
             {"threshold": cfg.data.dedup.threshold, "num_perm": cfg.data.dedup.num_perm}}
    stats = build_stats(shards, extra)
    for held_out in (stats["decontamination"] or {}).get("files", []):
        held_out["documents_excluded"] = stats["total"].get("contaminated_by", {}).get(held_out["file"], 0)
    _not_written(stats, written)
    ws.write_json("stats.json", stats)
    if not stats["balanced"]:
        raise ConservationError(f"read != rejected + filtered + duplicates + kept; see {ws.uri_of('stats.json')}")
    names = stage_index_segment(cfg, paths, shared=shared)  # staged while the tokenizer trained
    kept_segment = []
    if names:
        folder = ws.fetch(f"{SEGMENT}/{names[-1]}").parent
        for name in names[:-1]:
            ws.fetch(f"{SEGMENT}/{name}")
        if cfg.data.dedup.defer_publish:  # kept in the stage folder: the nightly publishes it on promotion
            kept_segment = [keep_segment(ws, folder, name) for name in names]
        else:
            publish_segment(folder, names, index_uri(cfg), paths.run_id, ws.endpoint)
    drop_lease(index_uri(cfg), paths.run_id, ws.endpoint)  # taken by the dedup step (index_lease)
    outputs = ["quarantine.jsonl", "excluded.jsonl", "duplicates.jsonl", "stats.json",
               "tokenizer/tokenizer.model", "tokenizer/tokenizer_config.json", *kept_segment]
    outputs += [f"cleaned/part-{k:05d}.jsonl.gz" for k in range(n)]
    for split in ("train", "heldout"):
        for j in range(mr[split]["files"]):
            rel = mindrecord_name(split, j)
            outputs += [rel, rel + ".db", sidecar_name(split, j)]
    described = describe_files([(ws.fetch(rel), rel) for rel in sorted(outputs)])
    t = stats["total"]
    metrics = {k: t[k] for k in ("read", "rejected_total", "filtered_total", "exact_duplicates", "near_duplicates",
                                 "kept", "tokens", "rows_train", "rows_heldout")}
    metrics["input_files"] = plan["files"]
    metrics["contaminated"] = t["filtered"].get("contamination", 0)
    metrics["rows_train"] += replay["rows"]  # every row of the train files: what pretraining counts
    metrics["replay_rows"], metrics["token_mix"] = replay["rows"], mix
    ws.remove("shards")
    ws.drop_local_copy()
    return StageOutput(described, metrics)


KEPT_SEGMENT = "segment"  # <run>/data/segment/: the run's unpublished dedup index segment (data.dedup.defer_publish)


def keep_segment(ws, folder, name: str) -> str:
    """Copy a staged segment file out of shards/ (removed when the stage ends) into KEPT_SEGMENT; its stage path."""
    rel = f"{KEPT_SEGMENT}/{name}"
    shutil.copyfile(folder / name, ws.local(rel))
    ws.publish(rel)
    return rel


class _Progress:
    """progress(step, done, total) callback, or tqdm bars when stderr is a terminal."""

    def __init__(self, callback=None):
        self.callback, self.bar, self.step = callback, None, None
        self.tty = callback is None and sys.stderr.isatty()

    def __call__(self, step: str, done: int, total: int) -> None:
        if self.callback is not None:
            self.callback(step, done, total)
        elif self.tty:
            from tqdm import tqdm

            if self.step != step:
                self.close()
                self.bar, self.step = tqdm(total=total, desc=f"data/{step}", leave=True), step
            self.bar.update(done - self.bar.n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _run_all(pool, fn, items: list[tuple], step: str, progress: _Progress, inline_one: bool = True) -> list:
    """fn(*item) for every item, in the pool when there is one (one item inline, unless not
    `inline_one`); results in item order."""
    progress(step, 0, len(items))
    if pool is None or (len(items) < 2 and inline_one):
        out = []
        for i, item in enumerate(items):
            out.append(fn(*item))
            progress(step, i + 1, len(items))
        return out
    futures = [pool.submit(fn, *item) for item in items]
    try:
        for i, _ in enumerate(cf.as_completed(futures)):
            progress(step, i + 1, len(items))
        return [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()


# What a MindRecord file costs one process (measured with MindSpore 2.x on this stage's rows): per row ~11 us
# (~7 of them in FileWriter.commit's index database, one SQLite row per record), per byte ~100 MB/s
_MINDRECORD_ROW_S, _MINDRECORD_BYTES_PER_S = 11e-6, 100e6
_MINDSPORE_IMPORT_S = 2.0  # a fresh worker's `import mindspore.mindrecord`: ~1.2 s of CPU on a quiet machine
_SPREAD_MIN_S = 1.0  # what spreading must save beyond the imports: the estimate's margin
# what the dedup step imports first in this process: datasketch (dedup.RunLSH; its scipy import is most of
# its ~0.5 s) and pandas (pyarrow imports it on first use, ~0.2 s; pyarrow.dataset is not needed, see
# prep.read_docs)
DEDUP_IMPORTS = ("datasketch", "pandas")


def mindrecord_work(pool, cfg, paths, items: list[tuple], workers: int, *, warm: bool = False) -> tuple:
    """(pool or None, groups of (split, j), the heaviest first). The pool when its groups finish sooner than
    one group by _SPREAD_MIN_S, counting a MindSpore import (_MINDSPORE_IMPORT_S) for each pool worker and,
    with `warm` (a warm writer: MindRecordLanes), none for the heaviest group, which the writer takes. The
    estimate: _MINDRECORD_ROW_S (short rows cost per row, long ones per byte). Else one group in one process
    (the warm writer, or this process with one worker): the import is paid once, in the only step that
    needs MindSpore."""
    plan = Workspace(cfg, paths, False).read_json("shards/mindrecord.json")

    def seconds(group):
        return sum(file_rows(plan, split, j) * (_MINDRECORD_ROW_S + plan[split]["row_len"] * 4 /
                                                _MINDRECORD_BYTES_PER_S) for split, j in group)
    if pool is not None and len(items) >= 2:
        groups = sorted(mindrecord_groups(items, workers, plan), key=seconds, reverse=True)
        pays = [0.0 if warm and i == 0 else _MINDSPORE_IMPORT_S for i in range(len(groups))]
        alone = seconds(items) + (0.0 if warm else _MINDSPORE_IMPORT_S)
        if alone - max(seconds(g) + t for g, t in zip(groups, pays)) >= _SPREAD_MIN_S:
            return pool, groups
    return None, mindrecord_groups(items, 1)


class MindRecordLanes:
    """The executor of a spread MindRecord step: the first group submitted (mindrecord_work's heaviest) goes
    to the warm writer, whose MindSpore is imported already, the others to the pool. Before, the writer sat
    idle while every pool worker imported MindSpore first."""

    def __init__(self, writer: cf.Executor, pool: cf.Executor):
        self.writer, self.pool = writer, pool

    def submit(self, fn, *args, **kwargs) -> cf.Future:
        on, self.writer = self.writer or self.pool, None
        return on.submit(fn, *args, **kwargs)


def _make_pool(workers: int) -> cf.ProcessPoolExecutor:
    """Workers forked from a fork server that imported this package once: cheap to start, and
    never forked from a process with threads (Prefect's, boto3's). Like spawn, it imports the
    caller's __main__ module: scripts must guard their entry point with if __name__ == "__main__".
    Each worker exits when this process does: a SIGKILLed stage would otherwise leave workers (and so the fork
    server and resource tracker) waiting on their task queue forever."""
    fork_server.start(["pipeline_lib.data._warm"])
    return cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("forkserver"), initializer=_init_worker,
                                  initargs=(os.getpid(),))


WORKER_NICE = 5


def _init_worker(parent: int) -> None:
    """A pool worker: it ends with `parent`, and yields the CPU to it (nice +WORKER_NICE): the
    single-threaded steps of the parent (dedup, tokenizer training) are the stage's critical path,
    while what the workers do meanwhile (cleaned parts, the index segment, MindSpore's import) is not."""
    exit_when_gone(parent)
    os.nice(WORKER_NICE)


_SHARED_POOLS: dict[object, cf.ProcessPoolExecutor] = {}
_SHARED_POOLS_LOCK = threading.Lock()
_WRITER = "mindrecord-writer"


def _shared_pool(key, make) -> cf.ProcessPoolExecutor:
    with _SHARED_POOLS_LOCK:
        pool = _SHARED_POOLS.get(key)
        if pool is None or pool._broken:  # a worker died (killed, OOM): a retry gets a new pool
            pool = _SHARED_POOLS[key] = make()
    return pool


def _in_shared_pool(key, make, fn, *args, **kwargs):
    """fn(*args, **kwargs) in the shared pool `key` (made by `make` the first time); a pool whose worker
    died is dropped (the task's retry gets a new one)."""
    pool = _shared_pool(key, make)
    try:
        return pool.submit(fn, *args, **kwargs).result()
    except cf.process.BrokenProcessPool:
        with _SHARED_POOLS_LOCK:
            if _SHARED_POOLS.get(key) is pool:
                del _SHARED_POOLS[key]
        raise


def _shards(workers: int) -> tuple:
    return ("shards", workers), partial(_make_pool, workers)


def shard_pool(workers: int) -> cf.ProcessPoolExecutor | None:
    """The process pool of `workers` that this process's data step tasks share (tasks/data_tasks.py); None for one."""
    return _shared_pool(*_shards(workers)) if workers > 1 else None


def _import_mindrecord() -> None:
    import mindspore.mindrecord  # noqa: F401


def _new_writer() -> cf.ProcessPoolExecutor:
    """One process that imports MindSpore (~1-3 s of CPU) as soon as it starts: made when the
    single-threaded steps (dedup, tokenizer training) begin, it uses the core they leave idle, and the
    MindRecord step then starts writing at once."""
    pool = _make_pool(1)
    pool.submit(_import_mindrecord)
    return pool


def warm_mindrecord_writer() -> None:
    """Start this process's shared MindRecord writer (_new_writer) now."""
    mindrecord_writer()


def mindrecord_writer() -> cf.ProcessPoolExecutor:
    """This process's shared MindRecord writer (warm_mindrecord_writer), made now if it is not there (or broke)."""
    return _shared_pool(_WRITER, _new_writer)


def in_mindrecord_writer(fn, *args, **kwargs):
    """fn(*args, **kwargs) in the shared MindRecord writer process (warm_mindrecord_writer)."""
    return _in_shared_pool(_WRITER, _new_writer, fn, *args, **kwargs)


def start_workers(pool: cf.ProcessPoolExecutor | None, n: int) -> None:
    """Have `pool` start its n workers now, from a background thread: the first start waits for the
    fork server to import this package (~0.5-0.7 s), which then overlaps with listing the inputs."""
    def start():
        try:
            for _ in range(n):
                pool.submit(int)
        except RuntimeError:  # shut down meanwhile (a failed plan)
            pass

    if pool is not None:
        threading.Thread(target=start, name="start-workers", daemon=True).start()


def preload(*modules: str) -> None:
    """Import `modules` in a background thread of this process, while it only waits on its pool (the
    shard steps): the single-threaded step that needs them (datasketch: the dedup step) starts without
    paying the import (~0.5 s) on the critical path."""
    import importlib

    threading.Thread(target=lambda: [importlib.import_module(m) for m in modules], name="preload",
                     daemon=True).start()


def tokenizer_and_cleaned(cfg, paths, pool, n_shards: int, *, shared: bool = True) -> dict:
    """build_tokenizer here while `pool` (if any) writes the cleaned parts and stages the dedup index
    segment, which need no tokenizer: sentencepiece's BPE training keeps about one core busy, the
    pool uses the other. Not in threads of this process: they would slow the training several
    times over (it takes the GIL back often; measured in bench/data.md)."""
    # the index segment first: it is one task over every shard (~40 s at 100x the benchmark corpus), and
    # submitted last it ran alone on one worker after the cleaned parts, the other worker idle
    side = [(stage_index_segment,)] + [(write_cleaned_shard, k) for k in range(n_shards)]
    futures = [pool.submit(fn, cfg, paths, *args, shared=shared) for fn, *args in side] if pool else []
    try:
        described = build_tokenizer(cfg, paths, shared=shared)
        for f in futures:
            f.result()
    finally:
        for f in futures:
            f.cancel()
    if pool is None:
        stage_index_segment(cfg, paths, shared=shared)
    return described


def run_data_stage(run: StageRun, *, workers: int | None = None) -> StageOutput:
    """Run every step of the data stage (see the module docstring).

    workers: processes for the shard steps (default data.num_workers; 1 runs everything inline).
    run.progress: optional callable(step, done, total); without it, tqdm bars show on a terminal."""
    cfg, paths, log = run.cfg, run.paths, run.log
    workers = workers or cfg.data.num_workers
    report = _Progress(run.progress)
    pool = _make_pool(workers) if workers > 1 else None
    start_workers(pool, workers)
    writer = None  # the MindRecord step's own process, warmed while dedup and the tokenizer run
    shared = False  # one machine runs every step: on S3 only the deliverables are uploaded
    try:
        shards = plan_data_stage(cfg, paths, shared=shared)
        log(f"data: {len(shards)} shards")
        each = [(cfg, paths, k) for k in range(len(shards))]
        if pool is not None:
            preload(*DEDUP_IMPORTS)
        counts = _run_all(pool, partial(prep_shard, shared=shared), each, "prep", report)
        log(f"data: read {sum(c['read'] for c in counts)} records")
        if pool is not None:
            writer = _new_writer()
        if cfg.data.dedup.exact or cfg.data.dedup.near:  # the partitions of the dedup step, in the pool
            parts = dedup_partitions(Workspace(cfg, paths, shared))
            _run_all(pool, partial(dedup_partition, shared=shared), [(cfg, paths, p) for p in range(parts)],
                     "dedup-partitions", report)
        summary = dedup_stage(cfg, paths, report, shared=shared)
        log("data: dedup " + json.dumps({k: sum(s[k] for s in summary["shards"])
                                         for k in ("exact_duplicates", "near_duplicates", "kept")}))
        report("tokenizer", 0, 1)
        log(f"data: tokenizer {tokenizer_and_cleaned(cfg, paths, pool, len(shards), shared=shared)['vocab_size']} pieces")
        report("tokenizer", 1, 1)
        _run_all(pool, partial(tokenize_shard, shared=shared), each, "tokenize", report)
        if writer is not None and reads_earlier_runs(cfg):  # with MindSpore: where it is imported already
            writer.submit(prepare_replay, cfg, paths, shared=shared).result()
        mr_pool, groups = mindrecord_work(pool, cfg, paths, plan_mindrecord(cfg, paths, shared=shared), workers,
                                          warm=writer is not None)
        lanes = MindRecordLanes(writer, mr_pool) if mr_pool is not None and writer is not None else mr_pool or writer
        _run_all(lanes, partial(write_mindrecord_files, shared=shared), [(cfg, paths, g) for g in groups],
                 "mindrecord", report, inline_one=False)
        report("finalize", 0, 1)
        output = finalize_data_stage(cfg, paths, shared=shared)
        report("finalize", 1, 1)
        log(f"data: done, {output.metrics['rows_train']} train rows")
        return output
    finally:
        report.close()
        for p in (pool, writer):
            if p is not None:
                p.shutdown(wait=True, cancel_futures=True)
