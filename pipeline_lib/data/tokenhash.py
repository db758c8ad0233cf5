"""Vectorized tokens and token n-grams of a batch of texts (numpy, no per-character Python).

The tokens are those of `text.tokens` (one per CJK character, one per run of other letters or
digits, lowercased), found with a per-code-point class table over the UTF-32 code points of the
whole batch. Each token gets a 32-bit hash (fmix32 of its code points times position weights);
an n-gram chains its tokens' hashes with fmix32. Used for MinHash shingles (minhash.py) and for
the repetition statistics of the top_ngram filter (`top_ngram_shares`); `window_hashes` gives 64-bit
window hashes for the decontamination lookups (decontaminate.py).

Limits: 32-bit n-gram hashes; two different n-grams of one document collide with probability
~k^2 / 2^33 for k n-grams (1e-5 at 300), which can only merge two counts.
"""
from __future__ import annotations

import re

import numpy as np

from .text import CJK

_CLASS_TABLE: dict = {}
_POS_W = (np.random.RandomState(20240601).randint(0, 1 << 31, 64, dtype=np.int64) * 2 + 1).astype(np.uint32)
_CHAIN = np.uint32(0x9E3779B1)


def code_point_table(*classes: tuple[str, int]) -> np.ndarray:
    """uint8 per code point (all 0x110000, lone surrogates too): the value of the last (regex character
    class, value) that matches it, else 0. Built by running the regex itself over every code point
    (~0.2 s a class), so a lookup agrees with `re` exactly, Unicode version included."""
    every = "".join(map(chr, range(0x110000)))
    table = np.zeros(0x110000, dtype=np.uint8)
    for pattern, value in classes:
        for m in re.finditer(f"{pattern}+", every):
            table[m.start():m.end()] = value
    return table


def code_points(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-32 code points of the texts' concatenation, start of each text in it plus the end)."""
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    cp = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return cp, np.concatenate([[0], np.cumsum(lengths)])


def counts_per_text(flags: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Per text, how many of its positions are set in `flags` (bounds: code_points' second value)."""
    total = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    return total[bounds[1:]] - total[bounds[:-1]]


def char_classes() -> np.ndarray:
    """Per code point: 0 not part of a token, 1 word character, 2 CJK character (built once, ~0.3 s)."""
    table = _CLASS_TABLE.get("t")
    if table is None:
        table = _CLASS_TABLE["t"] = code_point_table((r"[^\W_]", 1), (f"[{CJK}]", 2))
    return table


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer (wrapping uint32 arithmetic)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def token_arrays(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token hashes uint32, document index per token, characters per token), in text order."""
    table = char_classes()
    lowered = [t.lower() for t in texts]
    lengths = np.fromiter((len(t) + 1 for t in lowered), dtype=np.int64, count=len(lowered))
    cp = np.frombuffer("\n".join(lowered).encode("utf-32-le") + b"\n\0\0\0", dtype=np.uint32)
    cls = table[cp]
    prev = np.concatenate([[0], cls[:-1]])
    start = (cls == 2) | ((cls == 1) & (prev != 1))
    in_tok = cls > 0
    idx = np.arange(len(cp))
    pos = idx - np.maximum.accumulate(np.where(start, idx, 0))
    tok_starts = np.flatnonzero(start[in_tok])
    with np.errstate(over="ignore"):
        val = cp[in_tok] * _POS_W[pos[in_tok] & 63]
        toks = fmix32(np.add.reduceat(val, tok_starts, dtype=np.uint32) if len(tok_starts) else val[:0])
    tok_doc = np.repeat(np.arange(len(texts)), lengths)[idx[start]]
    tok_len = np.diff(np.append(tok_starts, int(in_tok.sum())))
    return toks, tok_doc, tok_len


# [(texts, token_arrays(texts))] of the last batch the top_ngram filter tokenized in this process: the same
# documents' dedup forms mostly have the same tokens (token_arrays_of_forms)
_FILTERED: list = []


def token_arrays_of_forms(texts: list[str], forms: list[str], same: list[bool]) -> tuple:
    """token_arrays(forms), where forms[i] has the tokens of texts[i] when same[i] (text.dedup_form_keeping_tokens):
    those documents' tokens are taken from the top_ngram filter's arrays of this batch, when it saw those very
    text objects, in the same order; the others are tokenized here."""
    seen, arrays = _FILTERED[0] if _FILTERED else ([], None)
    row = {id(t): i for i, t in enumerate(seen)}
    rows = np.fromiter((row.get(id(t), -1) if ok else -1 for t, ok in zip(texts, same)), np.int64, len(texts))
    reuse = rows >= 0
    if not reuse.any() or (np.diff(rows[reuse]) <= 0).any():
        return token_arrays(forms)
    toks, tok_doc, tok_len = arrays
    doc_of = np.full(len(seen), -1, np.int64)
    doc_of[rows[reuse]] = np.flatnonzero(reuse)  # filter-batch row -> document here
    doc = doc_of[tok_doc]
    keep = doc >= 0
    toks, doc, tok_len = toks[keep], doc[keep], tok_len[keep]
    redo = np.flatnonzero(~reuse)
    if not len(redo):
        return toks, doc, tok_len
    new_toks, new_doc, new_len = token_arrays([forms[i] for i in redo])
    new_doc = redo[new_doc]
    at = np.searchsorted(doc, new_doc)  # before the first token of a later document: document order kept
    return np.insert(toks, at, new_toks), np.insert(doc, at, new_doc), np.insert(tok_len, at, new_len)


def chain(toks: np.ndarray, n: int) -> np.ndarray:
    """Hash of every window of n consecutive tokens (len(toks) - n + 1 of them)."""
    m = len(toks) - n + 1
    if m <= 0:
        return toks[:0]
    h = toks[:m].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            h = fmix32(h * _CHAIN + toks[j:j + m])
    return h


_ROLL = np.uint64(0x100000001B3 * 2 + 1)  # odd: no two windows differing in one token share a hash


def window_hashes(toks: np.ndarray, n: int) -> np.ndarray:
    """64-bit hash of every window of n consecutive tokens (len(toks) - n + 1 of them): the polynomial
    sum(tok[i + j] * _ROLL^(n-1-j)) mod 2^64 of the 32-bit token hashes, for exact lookups (decontaminate.py),
    where 32 bits would collide: two passes a token, no mixing needed for equality."""
    m = len(toks) - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    wide = toks.astype(np.uint64)
    h = wide[:m].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            h *= _ROLL
            h += wide[j:j + m]
    return h


def top_ngram_shares(texts: list[str], n: int, cjk_n: int, min_tokens: int) -> np.ndarray:
    """Per text, the share of token characters covered by its most frequent token n-gram
    (the longest one on ties), 0 when no n-gram repeats or the text has < min_tokens tokens.
    A text is CJK when it has more tokens than half its characters; it then uses cjk_n."""
    toks, tok_doc, tok_len = arrays = token_arrays(texts)
    _FILTERED[:] = [(texts, arrays)]
    per_doc = np.bincount(tok_doc, minlength=len(texts))
    chars = np.bincount(tok_doc, weights=tok_len, minlength=len(texts))
    text_len = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    size = np.where(per_doc * 2 > text_len, cjk_n, n)
    share = np.zeros(len(texts))
    cum = np.concatenate([[0], np.cumsum(tok_len)])
    doc_mix = fmix32(np.arange(1, len(texts) + 1, dtype=np.uint32))  # per document: its windows' buckets differ
    for k in np.unique(size):
        m = max(len(toks) - k + 1, 0)
        counted = (size == k) & (per_doc >= min_tokens)
        ok = counted[tok_doc[:m]] & (tok_doc[:m] == tok_doc[k - 1:k - 1 + m])  # whole windows of counted texts
        doc = tok_doc[:m][ok]
        if not len(doc):
            continue
        hashes, width = chain(toks, k)[ok], (cum[k:k + m] - cum[:m])[ok]
        # An n-gram alone in its bucket of (doc, hash) occurs once: it can be neither a document's
        # most frequent n-gram (that needs a count >= 2 to count) nor a tie of it, so drop it before
        # sorting. Most windows of ordinary prose go here, in one bincount. (The hashes are mixed already.)
        buckets = 1 << max(int(len(doc) * 4 - 1).bit_length(), 4)
        bucket = (hashes ^ doc_mix[doc]) & np.uint32(buckets - 1)
        repeated = np.bincount(bucket, minlength=buckets)[bucket] > 1
        doc, hashes, width = doc[repeated], hashes[repeated], width[repeated]
        if not len(doc):
            continue
        docs, best, widest = _top_per_document(doc, hashes, width)
        share[docs] = np.where(best >= 2, best * widest, 0) / np.maximum(chars[docs], 1)
    return share


def _top_per_document(doc, hashes, width):
    """Per document (grouped, in order): (doc, count of its most frequent n-gram hash, the widest
    window among the n-grams with that count)."""
    key = (doc.astype(np.uint64) << np.uint64(32)) | hashes.astype(np.uint64)
    _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    count = counts[inverse]
    starts = np.flatnonzero(np.append(True, doc[1:] != doc[:-1]))  # windows come grouped by document
    best = np.maximum.reduceat(count, starts)
    widest = np.maximum.reduceat(np.where(count == np.repeat(best, np.diff(np.append(starts, len(doc)))),
                                          width, 0), starts)
    return doc[starts], best, widest
