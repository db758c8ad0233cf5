"""Paired statistics for the gate: two models scored on the same rows (perplexity) or the same items (tasks).

- `perplexity_ratio(cand_nll, prom_nll, tokens, confidence, samples, seed)`: the candidate/promoted perplexity ratio
  over rows (exp of the per-token NLL difference) and a percentile interval from a paired bootstrap: each
  resample draws rows with replacement and scores both models on the drawn rows, so what the rows share (their
  difficulty) cancels and only the models' difference varies. Seeded; resamples are drawn in blocks so 100,000
  rows x 2,000 samples stays within a few hundred MB.
- `accuracy_change(cand_correct, prom_correct, ...)`: the candidate's accuracy minus the promoted one's on the
  same items, with the same paired bootstrap's interval (shown beside the test that decides, below).
- `mcnemar_worse(losses, gains)`: one-sided mid-p McNemar test that the candidate is worse on a task, from the
  discordant items only (`losses`: the promoted model right and the candidate wrong; `gains`: the reverse). Under
  "no change" each discordant item is a fair coin; the mid-p value (half the probability of the observed count
  plus all of the more extreme ones) keeps the exact test's error rate close to alpha where the exact
  conditional test is far below it on a few discordant pairs (Fagerland, Lydersen & Laake, BMC Medical Research
  Methodology 13:91, 2013).
- `above_chance(correct, items, chance)`: one-sided mid-p binomial test that an accuracy is above chance.
Plain numpy; no Prefect, no MindSpore.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BLOCK = 4_000_000  # row draws per resample block (int64 indices: 32 MB)


@dataclass(frozen=True)
class Ratio:
    point: float      # candidate perplexity / promoted perplexity on all rows
    low: float        # the interval's bounds (ratios)
    high: float
    rows: int
    tokens: int


def _bootstrap(num: np.ndarray, den: np.ndarray, confidence: float, samples: int, seed: int) -> tuple[float, float]:
    """Percentile interval of sum(num[rows]) / sum(den[rows]) over resamples of the rows with replacement."""
    n = len(num)
    rng = np.random.default_rng(seed)
    out = np.empty(samples)
    step = max(1, BLOCK // n)
    for start in range(0, samples, step):
        k = min(step, samples - start)
        idx = rng.integers(0, n, size=(k, n))
        drawn = den[idx].sum(axis=1)
        # a resample of only empty rows (possible when most rows hold no token) scores no change
        out[start:start + k] = np.where(drawn > 0, num[idx].sum(axis=1) / np.maximum(drawn, 1), 0.0)
    tail = (1 - confidence) / 2
    low, high = np.quantile(out, [tail, 1 - tail])
    return float(low), float(high)


def _paired(a, b, weights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b, w = (np.asarray(x, np.float64) for x in (a, b, weights))
    if not (a.shape == b.shape == w.shape) or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired scores must be of the same non-empty rows for both models (got {a.shape}, "
                         f"{b.shape}, {w.shape})")
    if w.sum() <= 0:
        raise ValueError("the rows hold no scored token")
    return a, b, w


def perplexity_ratio(cand_nll, prom_nll, tokens, confidence: float = 0.95, samples: int = 2000,
                     seed: int = 0) -> Ratio:
    cand, prom, tok = _paired(cand_nll, prom_nll, tokens)
    diff = cand - prom
    low, high = _bootstrap(diff, tok, confidence, samples, seed)
    return Ratio(math.exp(diff.sum() / tok.sum()), math.exp(low), math.exp(high), len(diff), int(tok.sum()))


def accuracy_change(cand_correct, prom_correct, confidence: float = 0.95, samples: int = 2000,
                    seed: int = 0) -> tuple[float, float, float]:
    """(candidate - promoted accuracy, the interval's low, high) on the same items."""
    cand, prom, ones = _paired(cand_correct, prom_correct, np.ones(len(cand_correct)))
    diff = cand - prom
    low, high = _bootstrap(diff, ones, confidence, samples, seed)
    return float(diff.mean()), low, high


def _binom_pmf(k: np.ndarray, n: int, p: float) -> np.ndarray:
    if p <= 0 or p >= 1:
        return (k == (n if p >= 1 else 0)).astype(np.float64)
    logc = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in k])
    return np.exp(logc + k * math.log(p) + (n - k) * math.log1p(-p))


def upper_midp(k: int, n: int, p: float) -> float:
    """P(X > k) + P(X = k) / 2 for X ~ Binomial(n, p): the one-sided mid-p value of observing k or more."""
    if n <= 0:
        return 1.0
    above = np.arange(k + 1, n + 1)
    return float(min(1.0, _binom_pmf(above, n, p).sum() + 0.5 * _binom_pmf(np.array([k]), n, p)[0]))


def mcnemar_worse(losses: int, gains: int) -> float:
    """One-sided mid-p value of "the candidate is worse" (1.0 when no item changed)."""
    return upper_midp(losses, losses + gains, 0.5) if losses + gains else 1.0


def above_chance(correct: int, items: int, chance: float) -> float:
    """One-sided mid-p value of "this accuracy is above chance" (small: clearly above)."""
    return upper_midp(correct, items, chance)
