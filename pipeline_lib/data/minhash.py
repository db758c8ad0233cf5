"""MinHash signatures computed in numpy batches, bit-identical to datasketch's MinHash.

A document's shingles (the token n-grams of text.shingles) get 32-bit hashes from tokenhash.py,
computed for a whole batch at once; the signature is what
`datasketch.MinHash(num_perm, seed=SEED, hashfunc=int).update_batch(shingle hashes)` gives with
datasketch's default "affine32" scheme (MurmurHash3 finalizer, then h -> a*h + b mod 2^32 per
permutation, then the minimum). Here the permutations run on a whole batch of documents
(`np.minimum.reduceat`), in blocks that fit the CPU cache, instead of one `update` per shingle.
Empty documents get the all-max signature (datasketch's empty MinHash) and are never near
duplicates of anything.

`lsh_params(threshold, num_perm)` picks the bands x rows datasketch's optimiser picks, weighted
towards recall because every LSH candidate is verified with the estimated Jaccard afterwards.
Neither imports datasketch (its import pulls in scipy: ~1-2 s in every process); tests check
both against it.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .tokenhash import chain, fmix32, token_arrays

SEED = 1
SCHEME = "affine32"
SHINGLE_VERSION = 1  # bump when text.tokens/shingles change: old index signatures become incompatible
LSH_WEIGHTS = (0.1, 0.9)  # (false positive, false negative): candidates are verified, misses are not
EMPTY = np.uint32(0xFFFFFFFF)
_BLOCK = 4096  # shingles per permutation block: 128 x 4096 x 4 B = 2 MB


@lru_cache(maxsize=8)
def permutations(num_perm: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's (a, b) affine32 permutation parameters for this num_perm and seed (uint32): odd
    multipliers a = 2k + 1 and offsets b, drawn in that order from numpy's RandomState(seed).
    Not datasketch's own code path: importing datasketch costs ~1-2 s per process (scipy)."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


@lru_cache(maxsize=8)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) that datasketch's MinHashLSH picks for threshold with LSH_WEIGHTS: of all
    b x r <= num_perm (b, then r, ascending; the first of equals), the least weighted sum of the
    false-positive area (integral over [0, threshold] of P(candidate | s) = 1 - (1 - s^r)^b) and the
    false-negative area (integral of 1 - P over [threshold, 1]). P is a polynomial of degree
    b * r <= num_perm, so Gauss-Legendre with num_perm // 2 + 1 nodes integrates it exactly
    (datasketch integrates numerically with scipy, whose import costs ~1-2 s per process)."""
    nodes, weights = np.polynomial.legendre.leggauss(num_perm // 2 + 1)
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)], dtype=float)
    b, r = pairs[:, :1], pairs[:, 1:]

    def area(lo: float, hi: float, miss: bool) -> np.ndarray:
        s = (hi - lo) / 2 * nodes + (hi + lo) / 2
        p = 1 - (1 - s[None, :] ** r) ** b
        return ((1 - p) if miss else p) @ weights * (hi - lo) / 2
    error = area(0.0, threshold, False) * LSH_WEIGHTS[0] + area(threshold, 1.0, True) * LSH_WEIGHTS[1]
    best = pairs[int(np.argmin(error))]
    return int(best[0]), int(best[1])


def shingle_hashes(texts: list[str], n: int, arrays=None) -> tuple[np.ndarray, np.ndarray]:
    """uint32 hashes of the token n-gram shingles of each text (the n-grams of text.shingles),
    vectorized over the whole batch (tokenhash.py): returns (flat hashes in text order, count
    per text). A text with fewer than n tokens gives one shingle over all its tokens.
    arrays: token_arrays(texts) when the caller has them (the decontamination check shares them)."""
    toks, tok_doc, _ = arrays if arrays is not None else token_arrays(texts)
    per_doc = np.bincount(tok_doc, minlength=len(texts))
    h = chain(toks, n)
    full = h[tok_doc[:len(h)] == tok_doc[n - 1:]] if len(h) else toks[:0]
    counts = np.maximum(per_doc - n + 1, 0)
    short = np.flatnonzero((per_doc > 0) & (per_doc < n))
    if not len(short):
        return full, counts
    first = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
    offsets = np.concatenate([[0], np.cumsum(counts)])
    pieces, cut = [], 0
    for d in short:  # rare: a document shorter than n tokens is one shingle of all its tokens
        pieces += [full[cut:offsets[d]], chain(toks[first[d]:first[d] + per_doc[d]], int(per_doc[d]))]
        cut = offsets[d]
    pieces.append(full[cut:])
    counts[short] = 1
    return np.concatenate(pieces), counts


def signatures(flat: np.ndarray, counts: np.ndarray, num_perm: int, seed: int = SEED) -> np.ndarray:
    """(len(counts), num_perm) uint32 signatures from shingle hashes (`shingle_hashes` output):
    row d equals datasketch MinHash(num_perm, seed, hashfunc=int).update_batch(its hashes)."""
    a, b = permutations(num_perm, seed)
    counts = np.asarray(counts, dtype=np.int64)
    out = np.full((len(counts), num_perm), EMPTY, dtype=np.uint32)
    docs = np.flatnonzero(counts)
    if not len(docs):
        return out
    flat = fmix32(np.asarray(flat, dtype=np.uint32))
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
