"""Held out means held out: drop every training document that shares a long n-gram with an evaluation file.

The evaluation files are the evaluate stage's (`evaluate.reference_sets`, `evaluate.tasks`, `evaluate.prompt_files`)
plus `data.decontamination.files`, in that order. Every string value of every jsonl record of them (a reference
`text`, a task's `question` and `choices`, a prompt; not `id`) is an evaluation text.

Rule: a document is contaminated when some window of `data.decontamination.ngram` (default 13) consecutive tokens
of it equals a window of an evaluation text. Tokens are those of the dedup shingles (text.tokens: one per CJK
character, one per Latin word or number, lowercased; punctuation and spaces are not tokens), on the NFKC form of
both sides (text.dedup_form: full-width copies and other compatibility forms match their plain twins). So 13 means
13 CJK characters, or 13 words of English, or any mix. A document that shares only shorter spans with a long
evaluation text is kept.
Short evaluation items: a record's strings are also joined into one text (a task's question followed by its choices:
the benchmark page a scraper copies has them in that order), and an evaluation text of fewer than n tokens but at
least `data.decontamination.min_tokens` (default 8, the window PaLM's contamination study used) is matched whole: a
document holding its tokens in a row is contaminated. Matched whole are a record's joined strings and a record's only
string; never one choice of several alone (a domain phrase a good document may hold) nor a text under min_tokens (a
one-word answer): those occur in ordinary text.

Cost: the evaluation windows are hashed once per run (`build_eval_ngrams` in the plan step, written to the stage's
work folder); each shard worker loads them and checks its documents in the same pass that hashes their shingles
(the token hashes are shared, tokenhash.token_arrays): one 64-bit rolling hash per token, one lookup in a bitmap of
the evaluation hashes' top bits, and a binary search for the few windows the bitmap lets through.
Limits: a 64-bit window hash; a false match needs two different 13-token windows with equal hashes, ~m/2^64 per
window for m evaluation windows.
Bounds: evaluation files are read with the bounded reader (storage.bounded): a line over data.max_line_bytes, a
file over 256 MiB or a line nested too deep to parse is refused, naming the field, the file and the line.
Raises DataStageError naming the field, the file and the line for an evaluation file that cannot be read.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import DataStageError
from .text import dedup_form
from .tokenhash import token_arrays, window_hashes

SKIPPED_KEYS = frozenset({"id", "lang", "language"})  # identifiers and tags, not text a model could have been shown
REASON, FILTER = "contamination", "decontamination"


def eval_files(cfg) -> list[tuple[str, str]]:
    """(config field, path) of every evaluation file held out from training, without repeats."""
    e, out, seen = cfg.evaluate, [], set()
    groups = [("evaluate.reference_sets", e.reference_sets), ("evaluate.tasks", getattr(e, "tasks", None) or []),
              ("evaluate.prompt_files", e.prompt_files), ("data.decontamination.files", cfg.data.decontamination.files)]
    for field, entries in groups:
        for i, entry in enumerate(entries):
            path = _entry_path(entry)
            if path and path not in seen:
                seen.add(path)
                out.append((f"{field}[{i}]", path))
    return out


def _entry_path(entry) -> str | None:
    """A list entry naming an evaluation file: a path, or a section with a `path` (or `file`) field."""
    if isinstance(entry, str):
        return entry
    for name in ("path", "file"):
        value = entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)
        if isinstance(value, str):
            return value
    return None


def _strings(value, key: str | None = None) -> list[str]:
    """Every string value of a parsed record, in order, but those under SKIPPED_KEYS (walked without recursion)."""
    out, stack = [], [(value, key)]
    while stack:
        node, name = stack.pop()
        if isinstance(node, str):
            if name not in SKIPPED_KEYS:
                out.append(node)
        elif isinstance(node, list):
            stack.extend((v, name) for v in reversed(node))
        elif isinstance(node, dict):
            stack.extend((v, k) for k, v in reversed(list(node.items())))
    return out


def eval_texts(field: str, path: str, endpoint: str | None, max_line: int = 64 << 20) -> tuple[list[str], list[str]]:
    """(the evaluation texts of one jsonl file, the ones matched whole when short: a record's joined strings or its
    only string, never one choice of several; see the module docstring), read with the bounded reader (a line
    over `max_line`, data.max_line_bytes, or a file over storage.bounded.MAX_LIST_BYTES is refused: its texts are
    held in memory)."""
    from ..storage import LongLine
    from ..storage.bounded import MAX_LIST_BYTES, InputTooLarge, bounded_lines

    texts, whole = [], []
    try:
        lines = bounded_lines(path, endpoint, field=field, max_line=max_line, max_bytes=MAX_LIST_BYTES,
                              fix="hold out a smaller evaluation file, or remove it from the list")
        for n, raw in enumerate(lines, 1):
            if isinstance(raw, LongLine):
                raise DataStageError(field, path, f"line {n} is {raw.size:,} bytes, over data.max_line_bytes="
                                     f"{max_line:,}", "remove that line, or raise data.max_line_bytes")
            line = raw.decode("utf-8", "replace")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except RecursionError:  # 100k brackets: deeper than Python's parser goes
                raise DataStageError(field, path, f"line {n} is JSON nested deeper than can be read",
                                     "each line must be one JSON object of text fields") from None
            except ValueError:
                raise DataStageError(field, path, f"line {n} is not JSON", "each line must be one JSON object") from None
            strings = _strings(record)
            texts.extend(strings)
            if len(strings) > 1:
                texts.append(" ".join(strings))
            if strings:
                whole.append(texts[-1])
    except InputTooLarge as err:
        raise DataStageError(err.field, err.value, err.problem, err.fix) from None
    except (OSError, KeyError) as err:
        raise DataStageError(field, path, f"cannot read this evaluation file to hold it out of training ({err})",
                             "fix the path, or remove it from the list") from None
    return texts, whole


def ngram_hashes(texts: list[str], n: int, arrays=None) -> tuple[np.ndarray, np.ndarray]:
    """(64-bit hash of every n-token window that lies inside one text, the text index of each window), on the
    texts' dedup form; `arrays`: tokenhash.token_arrays of those forms when the caller has them."""
    toks, tok_doc, _ = arrays if arrays is not None else token_arrays([dedup_form(t) for t in texts])
    h = window_hashes(toks, n)
    if not len(h):
        return h, tok_doc[:0]
    inside = tok_doc[:len(h)] == tok_doc[n - 1:]
    return h[inside], tok_doc[:len(h)][inside]


def whole_text_hashes(texts: list[str], n: int, min_tokens: int) -> dict[int, np.ndarray]:
    """{k: hashes of the whole texts of k tokens} for the texts of min_tokens <= k < n tokens (dedup form)."""
    toks, tok_doc, _ = token_arrays([dedup_form(t) for t in texts])
    counts = np.bincount(tok_doc, minlength=len(texts))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    out: dict[int, np.ndarray] = {}
    for k in range(max(min_tokens, 1), n):
        which = np.flatnonzero(counts == k)
        if len(which):
            h = window_hashes(toks, k)
            out[k] = h[starts[which]]
    return out


class EvalNgrams:
    """The evaluation windows of a run: sorted hashes, the file of each (the first file holding it), the files;
    `short`: {k: EvalNgrams of the whole evaluation texts of k < n tokens}."""

    def __init__(self, n: int, hashes: np.ndarray, file_index: np.ndarray, files: list[str],
                 short: dict[int, "EvalNgrams"] | None = None):
        self.n, self.hashes, self.file_index, self.files = n, hashes, file_index, files
        self.short = short or {}
        # a table of the hashes' top bits, ~16 slots a hash (at most 32 MB): almost every window of a document is
        # ruled out by one lookup in it; only the rest is binary-searched (~7x faster than searching every window)
        self.bits = int(min(max(int(len(hashes) * 16).bit_length(), 16), 25))
        self.table = np.zeros(1 << self.bits, bool)
        self.table[hashes >> np.uint64(64 - self.bits)] = True

    def find(self, arrays, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
        """Per document (arrays = tokenhash.token_arrays of their dedup forms): the index into `files` of the
        evaluation file it overlaps (-1: none) and the token offset in the document of the first window found
        (a window of n tokens first; else a whole short evaluation text, the shortest last)."""
        found, offset = self._find(arrays, n_docs)
        for k in sorted(self.short, reverse=True):
            more, at = self.short[k]._find(arrays, n_docs)
            new = (found < 0) & (more >= 0)
            found[new], offset[new] = more[new], at[new]
        return found, offset

    def _find(self, arrays, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
        found, offset = np.full(n_docs, -1, np.int64), np.zeros(n_docs, np.int64)
        if not len(self.hashes):
            return found, offset
        toks, tok_doc, _ = arrays
        h = window_hashes(toks, self.n)
        if not len(h):
            return found, offset
        where = np.flatnonzero(self.table[h >> np.uint64(64 - self.bits)])
        pos = np.minimum(np.searchsorted(self.hashes, h[where]), len(self.hashes) - 1)
        hit = (self.hashes[pos] == h[where]) & (tok_doc[where] == tok_doc[where + self.n - 1])
        where, pos = where[hit], pos[hit]
        if len(where):
            docs = tok_doc[where]
            first = np.flatnonzero(np.append(True, docs[1:] != docs[:-1]))  # windows come in document order
            starts = np.concatenate([[0], np.cumsum(np.bincount(tok_doc, minlength=n_docs))[:-1]])
            found[docs[first]] = self.file_index[pos[first]]
            offset[docs[first]] = where[first] - starts[docs[first]]
        return found, offset

    def save(self, path: Path) -> None:
        short = {f"{name}_{k}": getattr(e, name) for k, e in self.short.items() for name in ("hashes", "file_index")}
        np.savez(path, n=self.n, hashes=self.hashes, file_index=self.file_index,
                 files=np.array(json.dumps(self.files)), short=np.array(sorted(self.short), np.int64), **short)

    @classmethod
    def load(cls, path: Path) -> "EvalNgrams":
        with np.load(path) as z:
            files = json.loads(str(z["files"]))
            short = {int(k): cls(int(k), z[f"hashes_{k}"], z[f"file_index_{k}"], files)
                     for k in (z["short"] if "short" in z.files else [])}
            return cls(int(z["n"]), z["hashes"], z["file_index"], files, short)


def build_eval_ngrams(cfg, endpoint: str | None) -> tuple[EvalNgrams, list[dict]]:
    """The run's evaluation windows (built once, in the plan step) and a summary per file {file, field, texts,
    ngrams} for stats.json."""
    dc = cfg.data.decontamination
    n, hashes, owners, summary = dc.ngram, [], [], []
    short: dict[int, tuple[list, list]] = {}
    files = eval_files(cfg) if dc.enabled else []
    for i, (field, path) in enumerate(files):
        texts, whole_texts = eval_texts(field, path, endpoint, cfg.data.max_line_bytes)
        h, _ = ngram_hashes(texts, n)
        h = np.unique(h)
        hashes.append(h)
        owners.append(np.full(len(h), i, np.int64))
        whole = whole_text_hashes(whole_texts, n, dc.min_tokens)
        for k, hk in whole.items():
            short.setdefault(k, ([], []))[0].append(np.unique(hk))
            short[k][1].append(np.full(len(np.unique(hk)), i, np.int64))
        summary.append({"file": path, "field": field, "texts": len(texts), "ngrams": int(len(h)),
                        "short_texts": int(sum(len(np.unique(hk)) for hk in whole.values()))})
    names = [p for _, p in files]
    parts = {k: EvalNgrams(k, *_first_owner(hs, os_), names) for k, (hs, os_) in short.items()}
    return EvalNgrams(n, *_first_owner(hashes, owners), names, parts), summary


def _first_owner(hashes: list[np.ndarray], owners: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct hashes of all files and the first file holding each."""
    if not hashes:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    flat, owner = np.concatenate(hashes), np.concatenate(owners)
    # stable sort: of equal hashes the first file's comes first, np.unique keeps it
    order = np.argsort(flat, kind="stable")
    flat, owner = flat[order], owner[order]
    keep = np.append(True, flat[1:] != flat[:-1])
    return flat[keep], owner[keep]


def overlap_text(form: str, offset: int, n: int) -> str:
    """The n tokens of `form` (a document's dedup form) from token `offset`, as text.tokens spells them."""
    from .text import tokens

    return " ".join(tokens(form)[offset:offset + n])
