"""Replay against forgetting: a share of tonight's training rows sampled from what the lineage trained on before.

`data.replay.fraction` f of the packed training rows are replay: R = round(f * N / (1 - f)) rows for N rows of
tonight's own documents, so replay holds f of the train split's tokens. The pool is
  - the packed training rows of earlier runs, `data.replay.runs` (the nightly sets it to its promoted nights; a
    held night's rows are never replayed): their MindRecord rows as written, already tokenized; only rows made of
    that run's own documents (a run's replay rows are not replayed again) and no padded row. Such a run must have
    been tokenized with this run's tokenizer (one tokenizer per lineage) and have this run's row length;
  - general corpora, `data.replay.sources` (jsonl or jsonl.gz, a `data.text_field` per line): tokenized once with
    the run's tokenizer, joined with EOS and cut into rows, cached under <output_root>/_replay_cache/<key>/ (key:
    the file's fingerprint, the tokenizer's sha256, the row length and the evaluation windows), written rows
    first, meta.json last. Their documents are not cleaned or deduplicated (a curated corpus), but decontaminated;
    a line longer than data.max_line_bytes is read past (storage.bounded), counted in meta.json `too_long_lines`.
Rows are drawn uniformly from the whole pool (so a source weighs by its rows) with numpy's generator seeded by
`data.replay.seed` (default run.seed), without replacement while the pool suffices, then every pool row again
(the repeats are counted). Replay rows from earlier runs are decoded and checked against the evaluation windows
(decontaminate.py), as new documents are: a row overlapping one is left out and counted.
Replay is deliberate repetition: it comes after dedup, never meets the dedup index and is never added to it.
The replay rows follow the new rows in the train split's MindRecord files (training shuffles rows each epoch);
their sidecar lines carry `replay` (the run or source) and `origin` (the row they copy). stats.json `replay` and
the manifest's `token_mix` give the mix: new tokens, replay tokens per source.
Raises DataStageError naming data.replay.runs[i] / sources[i], the value and the fix.
"""
from __future__ import annotations

import hashlib
import json
import os
import zlib

import numpy as np

from ..model.packing import count_rows, join_with_eos
from ..storage import LongLine, RunPaths, join, read_manifest, sha256_file, store_for
from ..storage.bounded import bounded_lines
from .errors import DataStageError
from .prep import eval_ngrams, shard_dir
from .workspace import Workspace, atomic_path

REPLAY = "shards/replay"
CACHE_VERSION = 2  # 2: lines over data.max_line_bytes are read past (1 trained on them)
_SOURCE_BATCH = 2000  # documents tokenized at a time while a source is cached


def reads_earlier_runs(cfg) -> bool:
    """Whether prepare_replay reads earlier runs' MindRecord files (and so imports MindSpore)."""
    return bool(cfg.data.replay.fraction and cfg.data.replay.runs)


def replay_rows_wanted(fraction: float, new_rows: int) -> int:
    """Replay rows that make `fraction` of all rows, next to `new_rows` rows of new documents."""
    return int(round(fraction * new_rows / (1 - fraction))) if fraction > 0 else 0


def sample_rows(pool: int, want: int, seed: int) -> tuple[np.ndarray, int]:
    """(sorted pool indices, how many are repeats): without replacement while the pool suffices, then the whole
    pool again as often as needed."""
    rng = np.random.default_rng(seed)
    whole, rest = divmod(want, pool)
    picks = np.concatenate([np.tile(np.arange(pool), whole), rng.choice(pool, rest, replace=False)])
    return np.sort(picks), max(want - pool, 0)


def _earlier_run(cfg, endpoint: str | None, i: int, run_id: str, row_len: int) -> tuple[str, dict, dict]:
    """(data stage URI, its outputs by path, its stats.json) of replay run i, refused when it did not finish or its
    rows are of another length."""
    field = f"data.replay.runs[{i}]"
    uri = RunPaths(cfg.run.output_root, run_id, endpoint).stage_uri("data")
    m = read_manifest(uri, endpoint)
    if m is None:
        raise DataStageError(field, run_id, f"no finished data stage at {uri}",
                             "name a run of this output root whose data stage succeeded, or remove it")
    stats = json.loads(store_for(uri, endpoint).get_bytes(join(uri, "stats.json")))
    if stats["row_tokens"] != row_len:
        raise DataStageError(field, run_id, f"its rows are {stats['row_tokens']} tokens, this run's {row_len} "
                             "(model.seq_length + 1)", "replay runs of the same model.seq_length, or remove it")
    return uri, {o["path"]: o for o in m.outputs}, stats


def _same_tokenizer(i: int, run_id: str, outputs: dict, sha: str) -> None:
    theirs = outputs.get("tokenizer/tokenizer.model", {}).get("sha256")
    if theirs != sha:
        raise DataStageError(f"data.replay.runs[{i}]", run_id, f"its rows were tokenized with tokenizer sha256 "
                             f"{theirs}, this run's is {sha}: its token ids mean other pieces",
                             "replay only runs of this tokenizer's lineage (set tokenizer.path to theirs), or remove it")


def check_replay(cfg, endpoint: str | None, tokenizer: str | None) -> None:
    """Refuse, before any record is read, replay runs that did not finish, have another row length or another
    tokenizer than `tokenizer` (the one this run loads; None: it trains one, which no earlier run can share)."""
    r = cfg.data.replay
    if not (r.fraction and r.runs):
        return
    if tokenizer is None:
        raise DataStageError("data.replay.runs", list(r.runs), "replaying earlier runs' token rows needs their "
                             "tokenizer, but this run trains a new one", "set tokenizer.path to theirs (the nightly "
                             "does), or replay only data.replay.sources")
    sha = hashlib.sha256(store_for(tokenizer, endpoint).get_bytes(tokenizer)).hexdigest()
    for i, run_id in enumerate(r.runs):
        _same_tokenizer(i, run_id, _earlier_run(cfg, endpoint, i, run_id, cfg.model.seq_length + 1)[1], sha)


class _RunPool:
    """The replayable rows of an earlier run's train split: rows [0, tokens_train // row_len) of its files."""

    def __init__(self, cfg, ws: Workspace, i: int, run_id: str, tokenizer_sha: str, row_len: int):
        self.label, self.run_id, self.ws = f"run:{run_id}", run_id, ws
        self.uri, outputs, stats = _earlier_run(cfg, ws.endpoint, i, run_id, row_len)
        _same_tokenizer(i, run_id, outputs, tokenizer_sha)
        self.files = sorted(p for p in outputs if p.startswith("mindrecord/train/") and p.endswith(".mindrecord"))
        self.rows = stats["total"]["tokens_train"] // row_len  # its own documents' whole rows come first

    def _file_rows(self, rel: str) -> int:
        """Rows of one of its MindRecord files, from its sidecar (the last line names the last row): a file no row is
        drawn from is never downloaded."""
        side = join(self.uri, rel[:-len(".mindrecord")] + ".docs.jsonl")
        lines = store_for(side, self.ws.endpoint).get_bytes(side).rstrip(b"\n").rsplit(b"\n", 1)
        return json.loads(lines[-1])["row_end"] + 1

    def _local(self, rel: str) -> str:
        store = store_for(self.uri, self.ws.endpoint)
        if not store.remote:
            return str(store.local_path(join(self.uri, rel)))
        dest = self.ws.local(f"{REPLAY}/runs/{self.run_id}/{rel}")
        for name in (rel, rel + ".db"):
            target = self.ws.local(f"{REPLAY}/runs/{self.run_id}/{name}")
            if not target.exists():
                store.get_file(join(self.uri, name), target)
        return str(dest)

    def read(self, picks: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Rows `picks` (sorted pool indices) and the origin of each."""
        import mindspore.dataset as ds

        rows, origins, first = [], [], 0
        for rel in self.files:
            if first >= self.rows or not len(picks):
                break
            size = self._file_rows(rel)
            mine = picks[(picks >= first) & (picks < first + size)] - first
            if len(mine):  # each row read once (the sampler takes at most the file's size of indices), then repeated
                once, again = np.unique(mine, return_inverse=True)
                data = ds.MindDataset([self._local(rel)], columns_list=["input_ids"],
                                      sampler=ds.SubsetSampler(once.tolist()))
                got = [r[0] for r in data.create_tuple_iterator(output_numpy=True, num_epochs=1)]
                rows += [got[k] for k in again]
                origins += [f"{self.run_id}/data/{rel}:{int(r)}" for r in mine]
            first += size
        return (np.stack(rows).astype(np.int32) if rows else np.zeros((0, 0), np.int32)), origins


def source_texts(uri: str, endpoint: str | None, field: str, text_field: str, max_line: int, counts: dict):
    """The texts of a replay source, read with the bounded reader: a line over `max_line` bytes is read past and
    counted (counts["too_long_lines"]), a line that is not JSON or has no text counted as skipped_lines."""
    try:
        for line in bounded_lines(uri, endpoint, field=field, max_line=max_line):
            if isinstance(line, LongLine):  # over data.max_line_bytes: read past, never held or trained on
                counts["too_long_lines"] = counts.get("too_long_lines", 0) + 1
                continue
            try:
                text = json.loads(line).get(text_field) if line.strip() else None
            except (ValueError, AttributeError, RecursionError):
                text = None
            if not isinstance(text, str) or not text.strip():
                counts["skipped_lines"] = counts.get("skipped_lines", 0) + bool(line.strip())  # not replayed
                continue
            yield text
    except (OSError, EOFError, zlib.error) as err:
        raise DataStageError(field, uri, f"cannot read this replay source ({err})",
                             "fix the file (jsonl or jsonl.gz)") from None


class _SourcePool:
    """A general corpus, tokenized once with the run's tokenizer into cached rows (see the module docstring)."""

    def __init__(self, cfg, ws: Workspace, i: int, uri: str, tokenizer_sha: str, row_len: int, evals):
        field = f"data.replay.sources[{i}]"
        self.label, self.source, self.ws = f"source:{uri}", uri, ws
        store = store_for(uri, ws.endpoint)
        if not (uri.endswith(".jsonl") or uri.endswith(".jsonl.gz")):
            raise DataStageError(field, uri, "a replay source is a jsonl or jsonl.gz file", "convert it, or remove it")
        try:
            fingerprint = store.fingerprint(uri)
        except (OSError, KeyError) as err:
            raise DataStageError(field, uri, f"cannot read this replay source ({err})", "fix the path") from None
        ident = {"v": CACHE_VERSION, "source": fingerprint, "tokenizer": tokenizer_sha, "row_len": row_len,
                 "text_field": cfg.data.text_field, "max_line": cfg.data.max_line_bytes,
                 "held_out": hashlib.sha256(evals.hashes.tobytes()).hexdigest() if evals is not None else None}
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
        self.cache = join(cfg.run.output_root, "_replay_cache", key)
        cache = store_for(self.cache, ws.endpoint)
        if not cache.exists(join(self.cache, "meta.json")):
            self._build(cfg, field, ident, row_len, evals)
        self.meta = json.loads(cache.get_bytes(join(self.cache, "meta.json")))
        self.rows = self.meta["rows"]

    def _build(self, cfg, field: str, ident: dict, row_len: int, evals) -> None:
        from ..model.tokenizer import Tokenizer
        from .text import dedup_form
        from .tokenhash import token_arrays

        tok = Tokenizer(self.ws.fetch("tokenizer/tokenizer.model"))
        local = self.ws.local(f"{REPLAY}/build/{self.cache.rsplit('/', 1)[-1]}/rows.bin")
        counts = {"documents": 0, "contaminated": 0, "skipped_lines": 0, "too_long_lines": 0, "tokens": 0}
        carry = np.zeros(0, np.int32)
        with open(local, "wb") as out:
            def flush(texts: list[str]) -> None:
                nonlocal carry
                if evals is not None and texts:
                    hit, _ = evals.find(token_arrays([dedup_form(t) for t in texts]), len(texts))
                    counts["contaminated"] += int((hit >= 0).sum())
                    texts = [t for t, h in zip(texts, hit) if h < 0]
                counts["documents"] += len(texts)
                stream = np.concatenate([carry, join_with_eos(tok.encode_batch(texts, threads=cfg.tokenizer.encode_threads),
                                                              tok.eos_id)])
                counts["tokens"] += len(stream) - len(carry)
                whole = len(stream) // row_len * row_len
                out.write(stream[:whole].astype(np.int32).tobytes())
                carry = stream[whole:]

            batch = []
            for text in source_texts(self.source, self.ws.endpoint, field, cfg.data.text_field,
                                     cfg.data.max_line_bytes, counts):
                batch.append(text)
                if len(batch) >= _SOURCE_BATCH:
                    flush(batch)
                    batch = []
            flush(batch)
        rows = os.path.getsize(local) // (4 * row_len)
        if rows == 0:
            raise DataStageError(field, self.source, f"it gives no row of {row_len} tokens ({counts['documents']} "
                                 f"documents with a {cfg.data.text_field!r} field)",
                                 "give a larger corpus, or check data.text_field")
        store = store_for(self.cache, self.ws.endpoint)
        store.put_file(local, join(self.cache, "rows.bin"))
        meta = {**ident, "source_uri": self.source, "rows": int(rows), **counts}
        store.put_bytes(join(self.cache, "meta.json"), json.dumps(meta, indent=1, sort_keys=True).encode())

    def read(self, picks: np.ndarray) -> tuple[np.ndarray, list[str]]:
        store = store_for(self.cache, self.ws.endpoint)
        path = store.local_path(join(self.cache, "rows.bin")) if not store.remote else None
        if path is None:
            path = self.ws.local(f"{REPLAY}/cache/{self.cache.rsplit('/', 1)[-1]}/rows.bin")
            if not path.exists():
                store.get_file(join(self.cache, "rows.bin"), path)
        rows = np.memmap(path, np.int32, "r").reshape(-1, self.meta["row_len"])
        return np.asarray(rows[picks]), [f"{self.source}#row{int(r)}" for r in picks]


def _contaminated_rows(ws: Workspace, rows: np.ndarray, evals) -> np.ndarray:
    """True for rows whose decoded text overlaps an evaluation window."""
    from ..model.tokenizer import Tokenizer
    from .text import dedup_form
    from .tokenhash import token_arrays

    if evals is None or not len(rows):
        return np.zeros(len(rows), bool)
    tok = Tokenizer(ws.fetch("tokenizer/tokenizer.model"))
    texts = [dedup_form(tok.decode(r.tolist())) for r in rows]
    return evals.find(token_arrays(texts), len(texts))[0] >= 0


def prepare_replay(cfg, paths, *, shared: bool = True) -> dict:
    """Sample this run's replay rows (shards/replay/rows.npy, their origins in rows.jsonl); returns the summary
    (shards/replay.json, stats.json's `replay`). Needs the tokenizer and the tokenized shards; MindSpore is
    imported only when earlier runs are replayed."""
    ws, r = Workspace(cfg, paths, shared), cfg.data.replay
    if ws.is_marked("replay"):
        return ws.read_json(f"{REPLAY}.json")
    row_len = cfg.model.seq_length + 1
    n_shards = len(ws.read_json("shards/plan.json")["shards"])
    new_tokens = sum(ws.read_json(f"{shard_dir(k)}/tokens.json")["tokens_train"] for k in range(n_shards))
    new_rows = count_rows(new_tokens, row_len, cfg.data.remainder)
    want = replay_rows_wanted(r.fraction, new_rows)
    seed = r.seed if r.seed is not None else cfg.run.seed
    summary = {"fraction": r.fraction, "seed": seed, "new_rows": new_rows, "new_tokens": new_tokens, "wanted_rows": want,
               "rows": 0, "tokens": 0, "repeated_rows": 0, "contaminated_rows": 0, "pools": []}
    rows = np.zeros((0, row_len), np.int32)
    origins: list[tuple[str, str]] = []
    if want:
        sha = sha256_file(ws.fetch("tokenizer/tokenizer.model"))
        evals = eval_ngrams(ws)
        pools = [_RunPool(cfg, ws, i, run_id, sha, row_len) for i, run_id in enumerate(r.runs)]
        pools += [_SourcePool(cfg, ws, i, uri, sha, row_len, evals) for i, uri in enumerate(r.sources)]
        total = sum(p.rows for p in pools)
        if total:
            picks, summary["repeated_rows"] = sample_rows(total, want, seed)
            parts, lo = [], 0
            for p in pools:
                mine = picks[(picks >= lo) & (picks < lo + p.rows)] - lo
                got, where = p.read(mine) if len(mine) else (np.zeros((0, row_len), np.int32), [])
                bad = _contaminated_rows(ws, got, evals) if isinstance(p, _RunPool) else np.zeros(len(got), bool)
                parts.append(got[~bad].reshape(-1, row_len))
                origins += [(p.label, o) for o, b in zip(where, bad) if not b]
                summary["contaminated_rows"] += int(bad.sum())
                summary["pools"].append({"replay": p.label, "pool_rows": p.rows, "rows": int((~bad).sum()),
                                         "tokens": int((~bad).sum()) * row_len})
                lo += p.rows
            rows = np.concatenate(parts)
        else:
            summary["note"] = "nothing to replay yet: no earlier run in data.replay.runs and no data.replay.sources"
    summary["rows"], summary["tokens"] = int(len(rows)), int(len(rows)) * row_len
    summary["share"] = round(len(rows) / (len(rows) + new_rows), 6) if new_rows else 0.0
    np.save(ws.local(f"{REPLAY}/rows.npy"), rows)
    side = ws.local(f"{REPLAY}/rows.jsonl")
    tmp = atomic_path(side)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"replay": label, "origin": o}, ensure_ascii=False) + "\n" for label, o in origins)
    os.replace(tmp, side)
    ws.publish(f"{REPLAY}/rows.npy", f"{REPLAY}/rows.jsonl")
    ws.write_json(f"{REPLAY}.json", summary)
    ws.mark("replay")
    return summary


def replay_sidecar_lines(ws: Workspace, lo: int, hi: int, first_in_file: int, row_len: int) -> list[str]:
    """Sidecar lines of replay rows [lo, hi) (indices into rows.npy) placed from row `first_in_file` of a file."""
    with open(ws.fetch(f"{REPLAY}/rows.jsonl"), encoding="utf-8") as fh:
        heads = [json.loads(x) for x in fh][lo:hi]
    out = []
    for k, head in enumerate(heads):
        r = first_in_file + k
        out.append(json.dumps({"id": None, "origin": head["origin"], "replay": head["replay"], "row_start": r,
                               "row_end": r, "token_start": r * row_len, "token_end": (r + 1) * row_len,
                               "whole": True}, ensure_ascii=False) + "\n")
    return out


def replay_rows(ws: Workspace, lo: int, hi: int) -> np.ndarray:
    return np.load(ws.fetch(f"{REPLAY}/rows.npy"), mmap_mode="r")[lo:hi]
