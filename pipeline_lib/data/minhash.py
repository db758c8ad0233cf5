"""MinHash signatures computed in numpy batches, bit-identical to datasketch's MinHash.

A document's shingles (see text.shingles) are hashed with xxh32; the signature is what
`datasketch.MinHash(num_perm, seed=SEED, hashfunc=<xxh32 of the shingle>)` gives after
`update_batch(shingles)` with datasketch's default "affine32" scheme (MurmurHash3 finalizer, then
h -> a*h + b mod 2^32 per permutation, then the minimum). Here the permutations run on a whole
batch of documents at once (`np.minimum.reduceat`), in blocks that fit the CPU cache, instead of
one `update` per shingle. Empty documents get the all-max signature (datasketch's empty MinHash)
and are never near duplicates of anything.

`lsh_params(threshold, num_perm)` picks bands x rows with datasketch's own optimiser, weighted
towards recall because every LSH candidate is verified with the estimated Jaccard afterwards.
"""
from __future__ import annotations

from functools import lru_cache

import re

import numpy as np

from .text import CJK

SEED = 1
SCHEME = "affine32"
SHINGLE_VERSION = 1  # bump when text.tokens/shingles change: old index signatures become incompatible
LSH_WEIGHTS = (0.1, 0.9)  # (false positive, false negative): candidates are verified, misses are not
EMPTY = np.uint32(0xFFFFFFFF)
_BLOCK = 4096  # shingles per permutation block: 128 x 4096 x 4 B = 2 MB


@lru_cache(maxsize=8)
def permutations(num_perm: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's (a, b) permutation parameters for this num_perm and seed (uint32)."""
    from datasketch import MinHash

    a, b = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
    return a.astype(np.uint32), b.astype(np.uint32)


@lru_cache(maxsize=8)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) that datasketch's MinHashLSH picks for threshold with LSH_WEIGHTS."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=LSH_WEIGHTS)
    return lsh.b, lsh.r


def _char_classes() -> np.ndarray:
    """Per code point: 0 not part of a token, 1 word character, 2 CJK character (see text.tokens)."""
    table = _CLASS_TABLE.get("t")
    if table is None:
        every = "".join(map(chr, range(0x110000)))
        table = np.zeros(0x110000, dtype=np.uint8)
        for m in re.finditer(r"[^\W_]+", every):
            table[m.start():m.end()] = 1
        for m in re.finditer(f"[{CJK}]+", every):
            table[m.start():m.end()] = 2
        _CLASS_TABLE["t"] = table
    return table


_CLASS_TABLE: dict = {}
_POS_W = (np.random.RandomState(20240601).randint(0, 1 << 31, 64, dtype=np.int64) * 2 + 1).astype(np.uint32)
_CHAIN = np.uint32(0x9E3779B1)


def shingle_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """uint32 hashes of the token n-gram shingles of each text (the n-grams of text.shingles),
    vectorized over the whole batch: returns (flat hashes in document order, count per text).

    A token hashes to fmix32(sum of code point x position weight); a shingle chains its n token
    hashes with fmix32. Texts with fewer than n tokens give one shingle over all their tokens.
    """
    table = _char_classes()
    lowered = [t.lower() for t in texts]
    lengths = np.fromiter((len(t) + 1 for t in lowered), dtype=np.int64, count=len(lowered))
    cp = np.frombuffer("\n".join(lowered).encode("utf-32-le") + b"\n\0\0\0", dtype=np.uint32)
    cls = table[cp]
    prev = np.concatenate([[0], cls[:-1]])
    start = (cls == 2) | ((cls == 1) & (prev != 1))
    in_tok = cls > 0
    idx = np.arange(len(cp))
    pos = idx - np.maximum.accumulate(np.where(start, idx, 0))
    with np.errstate(over="ignore"):
        val = cp[in_tok] * _POS_W[pos[in_tok] & 63]
        tok_starts = np.flatnonzero(start[in_tok])
        toks = _fmix32(np.add.reduceat(val, tok_starts, dtype=np.uint32) if len(tok_starts) else val[:0])
        tok_doc = np.repeat(np.arange(len(texts)), lengths)[idx[start]]
        per_doc = np.bincount(tok_doc, minlength=len(texts))
        m = len(toks) - n + 1
        if m > 0:
            h = toks[:m].copy()
            for j in range(1, n):
                h = _fmix32(h * _CHAIN + toks[j:j + m])
            full = h[tok_doc[:m] == tok_doc[n - 1:]]
        else:
            full = toks[:0]
        counts = np.maximum(per_doc - n + 1, 0)
        short = np.flatnonzero((per_doc > 0) & (per_doc < n))
        if not len(short):
            return full, counts
        first = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
        offsets = np.concatenate([[0], np.cumsum(counts)])
        pieces, cut = [], 0
        for d in short:  # rare: a document shorter than n tokens is one shingle of all its tokens
            t = toks[first[d]:first[d] + per_doc[d]]
            h = t[:1].copy()
            for j in range(1, len(t)):
                h = _fmix32(h * _CHAIN + t[j:j + 1])
            pieces += [full[cut:offsets[d]], h]
            cut = offsets[d]
        pieces.append(full[cut:])
        counts[short] = 1
    return np.concatenate(pieces), counts


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def signatures(flat: np.ndarray, counts: np.ndarray, num_perm: int, seed: int = SEED) -> np.ndarray:
    """(len(counts), num_perm) uint32 signatures from shingle hashes (`shingle_hashes` output):
    row d equals datasketch MinHash(num_perm, seed, hashfunc=int).update_batch(its hashes)."""
    a, b = permutations(num_perm, seed)
    counts = np.asarray(counts, dtype=np.int64)
    out = np.full((len(counts), num_perm), EMPTY, dtype=np.uint32)
    docs = np.flatnonzero(counts)
    if not len(docs):
        return out
    flat = _fmix32(np.asarray(flat, dtype=np.uint32))
    ends = np.cumsum(counts[docs])
    starts = ends - counts[docs]
    a, b = a[:, None], b[:, None]
    i = 0
    with np.errstate(over="ignore"):
        while i < len(docs):  # whole documents in blocks of about _BLOCK shingles, permutations x shingles
            j = max(int(np.searchsorted(ends, starts[i] + _BLOCK, side="right")), i + 1)
            lo, hi = starts[i], ends[j - 1]
            buf = a * flat[None, lo:hi]
            buf += b
            out[docs[i:j]] = np.minimum.reduceat(buf, starts[i:j] - lo, axis=1).T
            i = j
    return out


_MIX = np.uint64(0x9E3779B97F4A7C15)


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64 keys, one per LSH band: a 64-bit mix of the band's `rows` values."""
    sigs = np.asarray(sigs, dtype=np.uint32)
    keys = np.zeros((len(sigs), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(bands):
            h = np.full(len(sigs), np.uint64(i + 1) * _MIX, dtype=np.uint64)
            for v in sigs[:, i * rows:(i + 1) * rows].T.astype(np.uint64):
                h = (h ^ v) * np.uint64(0xFF51AFD7ED558CCD)
                h ^= h >> np.uint64(33)
            keys[:, i] = h
    return keys


def jaccard_estimate(sig: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Share of equal signature positions between `sig` and each row of `others`."""
    return (np.asarray(others) == sig).mean(axis=-1)


def is_empty(sigs: np.ndarray) -> np.ndarray:
    return (np.asarray(sigs) == EMPTY).all(axis=-1)
