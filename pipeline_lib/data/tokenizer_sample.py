"""The tokenizer's training sample, drawn by the shard workers: the main process never reads the corpus.

Every line (tokenizer._lines: a paragraph, cut at MAX_PIECE_CHARS) of a shard's training candidates (the
documents the filters kept, held-out ones left out) gets a priority, a uniform number hashed from its
document's content key, its place in the document and SAMPLE_SEED (`priorities`): the sample does not
depend on how the corpus is cut into shards. The sample is the `tokenizer.sample_lines` lines with
the lowest priorities among the lines of the documents dedup kept (bottom-k priority sampling: a uniform
sample without replacement), cut to its `tokenizer.sample_chars` lowest-priority characters' worth (the
trainer's memory follows the characters, not the lines), trained on in input order.

- `write_shard_sample` (prep_shard, on the worker): the shard's `quota` lowest-priority lines
  (shards/<k>/SAMPLE_FILE) and each document's line count (LINES_FILE; -1 for a held-out document).
  quota = SAMPLE_MARGIN x sample_lines / shards: the merged sample needs about sample_lines / shards
  of each.
- `merged_sample` (build_tokenizer, main process, after dedup): the k lowest priorities among the kept
  documents' sampled lines. A shard whose quota fell short (its highest sampled priority below the k-th
  lowest: dedup removed more of it than the margin, or its lines are shorter than its neighbours') is
  read again, its lines recomputed with the same priorities: the sample is the exact bottom-k, whatever
  the quotas. Below sample_lines lines every line is trained on, in input order: the same lines, hence
  the same model, as when the main process read every kept document (tokenizer.sample_lines).
Memory in the main process: one shard's sampled lines at a time (their priorities and lengths are kept, the lines
trained on read again at the end), plus one shard's lines while one is read again; sentencepiece's trainer then
holds ~46 bytes per character of the sample (tokenizer.sample_chars).
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .packing import heldout_mask
from .tokenizer import MAX_PIECE_CHARS, SAMPLE_SEED

SAMPLE_FILE = "tokenizer_sample.parquet"
LINES_FILE = "tokenizer_lines.npy"
SAMPLE_MARGIN = 1.5  # duplicates removed after the worker sampled, and shards of unequal line counts


def doc_lines(text: str) -> list[str]:
    """The training lines of one document, as tokenizer._lines cuts them."""
    return [line[i:i + MAX_PIECE_CHARS] for line in text.split("\n")
            for i in range(0, len(line), MAX_PIECE_CHARS) if line[i:i + MAX_PIECE_CHARS].strip()]


def shard_lines(texts, keys, held: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(document of each line, its priority, the lines, lines per document (-1 held out)) of a shard's candidate
    documents: the same on the worker and when the main process reads the shard again. A line's priority
    depends on its document's content key and its place in the document only: not on the shard layout."""
    docs, lines, per_doc = [], [], np.full(len(held), -1, np.int32)
    nth = []
    for i, (text, h) in enumerate(zip(texts, held)):
        if h:
            continue
        got = doc_lines(text)
        per_doc[i] = len(got)
        docs += [i] * len(got)
        nth += range(len(got))
        lines += got
    docs = np.asarray(docs, np.int64)
    keys = np.asarray(keys, np.uint64)
    prio = priorities(keys[docs] if len(docs) else np.zeros(0, np.uint64), np.asarray(nth, np.uint64))
    return docs, prio, lines, per_doc


def priorities(keys: np.ndarray, nth: np.ndarray) -> np.ndarray:
    """Uniform numbers in [0, 1) from (document key, line number in it) and SAMPLE_SEED: splitmix64's finalizer."""
    with np.errstate(over="ignore"):
        z = keys ^ (nth * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(SAMPLE_SEED)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def shard_quota(sample_lines: int, n_shards: int) -> int:
    return min(sample_lines, math.ceil(SAMPLE_MARGIN * sample_lines / max(n_shards, 1)))


def write_shard_sample(ws, cfg, index: int, texts: list[str], keys: list[int]) -> None:
    """Write shard `index`'s share of the tokenizer sample (none when tokenizer.path gives the tokenizer)."""
    if cfg.tokenizer.path:
        return
    n_shards = len(ws.read_json("shards/plan.json")["shards"])
    held = heldout_mask(np.asarray(keys, np.uint64), cfg.data.heldout_fraction)
    docs, prio, lines, per_doc = shard_lines(texts, keys, held)
    quota = shard_quota(cfg.tokenizer.sample_lines, n_shards)
    pick = np.sort(np.argpartition(prio, quota)[:quota]) if len(prio) > quota else np.arange(len(prio))
    folder = f"shards/{index:05d}"
    pq.write_table(pa.table({"pos": pa.array(pick, pa.int64()), "doc": pa.array(docs[pick], pa.int64()),
                             "prio": pa.array(prio[pick], pa.float64()),
                             "text": pa.array([lines[i] for i in pick], pa.string())}),
                   # uncompressed: ~1.5 x sample_lines lines over all shards, read back by the main process while
                   # the pool waits on it (zstd's decoding was a third of merged_sample's time at 10x)
                   ws.local(f"{folder}/{SAMPLE_FILE}"), compression="none")
    np.save(ws.local(f"{folder}/{LINES_FILE}"), per_doc)
    ws.publish(f"{folder}/{SAMPLE_FILE}", f"{folder}/{LINES_FILE}")


class _Candidates:
    """The sampled lines of the kept documents, shard by shard: priorities, (shard, position in shard) and
    characters as numpy arrays; the texts are read again at the end for the lines trained on only (at 10x
    the benchmark corpus ~70,000 of ~450,000): memory for one shard's lines, not all of them, and Python
    strings for the lines trained on only (making them all was most of this step's time)."""

    def __init__(self):
        self.prio, self.order, self.chars, self.texts = [], [], [], []

    def add(self, prio: np.ndarray, order: np.ndarray, text: pa.Array | pa.ChunkedArray, again=None) -> None:
        """`again()`: the same `text` read anew (kept in memory when None)."""
        self.prio.append(prio)
        self.order.append(order)
        self.chars.append(pc.utf8_length(text).to_numpy(zero_copy_only=False).astype(np.int64))
        self.texts.append(again or (lambda: text))

    def _all(self, parts: list, empty: np.ndarray) -> np.ndarray:
        return np.concatenate(parts) if parts else empty

    def bound(self, k: int) -> float:
        """The k-th lowest priority; infinite while fewer than k lines are held (then every line belongs in)."""
        prio = self._all(self.prio, np.zeros(0))
        return float(np.partition(prio, k - 1)[k - 1]) if len(prio) >= k else math.inf

    def lowest_in_input_order(self, k: int, max_chars: int) -> list[str]:
        """The k lowest-priority lines in input order; past `max_chars` characters, only the lowest-priority
        of them whose characters add up to at most max_chars (priorities are uniform: still a uniform sample)."""
        prio = self._all(self.prio, np.zeros(0))
        order = self._all(self.order, np.zeros((0, 2), np.int64))
        chars = self._all(self.chars, np.zeros(0, np.int64))
        held = np.argpartition(prio, k - 1)[:k] if len(prio) > k else np.arange(len(prio))
        if chars[held].sum() > max_chars:
            by_prio = held[np.argsort(prio[held], kind="stable")]
            held = by_prio[:max(1, int(np.searchsorted(np.cumsum(chars[by_prio]), max_chars, side="right")))]
        held = held[np.lexsort((order[held, 1], order[held, 0]))]
        at = np.sort(held)  # taken part by part, in place order, then put in input order
        ends = np.cumsum([len(p) for p in self.prio], dtype=np.int64)
        cut = np.searchsorted(at, np.concatenate([[0], ends]))
        lines = [s for i, texts in enumerate(self.texts) if cut[i] < cut[i + 1]
                 for s in texts().take(pa.array(at[cut[i]:cut[i + 1]] - (ends[i] - len(self.prio[i])))).to_pylist()]
        return [lines[i] for i in np.searchsorted(at, held)]


def merged_sample(ws, cfg, n_shards: int, kept_of, texts_of) -> tuple[list[str], dict]:
    """(the training lines in input order, {"docs", "lines"}: the kept training documents and their lines).
    kept_of(k): the boolean keep mask of shard k's candidates; texts_of(k): (texts, keys) of its candidates,
    read only for a shard whose sample fell short (or that wrote none: a stage folder of an earlier version)."""
    k_lines = cfg.tokenizer.sample_lines
    found, seen, short = _Candidates(), {"docs": 0, "lines": 0}, []
    for k in range(n_shards):
        keep, folder = kept_of(k), f"shards/{k:05d}"
        if not (_has(ws, f"{folder}/{SAMPLE_FILE}") and _has(ws, f"{folder}/{LINES_FILE}")):
            short.append((k, keep, -math.inf))
            continue
        per_doc = np.load(ws.fetch(f"{folder}/{LINES_FILE}"))
        train = keep & (per_doc >= 0)
        seen["docs"] += int(train.sum())
        seen["lines"] += int(per_doc[train].sum())
        path = ws.fetch(f"{folder}/{SAMPLE_FILE}")
        table = pq.ParquetFile(path).read()
        pos, docs, prio = (table.column(c).to_numpy() for c in ("pos", "doc", "prio"))
        mine = keep[docs]
        if len(prio) < int(per_doc[per_doc >= 0].sum()):  # the worker kept its quota only
            short.append((k, keep, float(prio.max()) if len(prio) else -math.inf))
        found.add(prio[mine], _order(k, pos[mine]), table.column("text").filter(pa.array(mine)),
                  again=partial(_sampled_text, path, pa.array(mine)))
    for k, keep, highest in sorted(short, key=lambda s: s[2]):
        bound = found.bound(k_lines)
        if highest >= bound:  # every line of the shard below the bound is in its sample already
            continue
        texts, keys = texts_of(k)
        held = heldout_mask(np.asarray(keys, np.uint64), cfg.data.heldout_fraction)
        docs, prio, lines, per_doc = shard_lines(texts, keys, held)
        if highest == -math.inf and not _has(ws, f"shards/{k:05d}/{LINES_FILE}"):  # counted here, not above
            train = keep & (per_doc >= 0)
            seen["docs"] += int(train.sum())
            seen["lines"] += int(per_doc[train].sum())
        new = keep[docs] & (prio > highest) & (prio < bound)  # the lines the shard's sample did not hold
        found.add(prio[new], _order(k, np.flatnonzero(new)), pa.array([t for t, m in zip(lines, new) if m], pa.string()))
    return found.lowest_in_input_order(k_lines, cfg.tokenizer.sample_chars), seen


def _sampled_text(path, mine: pa.Array) -> pa.ChunkedArray:
    return pq.ParquetFile(path).read(columns=["text"]).column("text").filter(mine)


def _has(ws, rel: str) -> bool:
    """Whether the stage file exists where ws.fetch finds it: this machine's copy (shards/ stays local when one
    machine runs the stage on S3) or the stage folder."""
    return ws.local(rel).exists() or ws.exists(rel)


def _order(shard: int, pos: np.ndarray) -> np.ndarray:
    """(shard, position among the shard's lines) of each line: its input order (lines are listed document by
    document, in order)."""
    return np.stack([np.full(len(pos), shard, np.int64), np.asarray(pos, np.int64)], axis=1)
