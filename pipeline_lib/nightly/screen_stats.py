"""The screen's statistics: a robust threshold from the lineage's own documents, the files to quarantine, the AUC.

Scores are nats per character (lower: more like the lineage). The threshold is median + k * spread of the
calibration scores (the lineage's accepted documents scored by the same scorer tonight), with spread the scaled
median absolute deviation (1.4826 * MAD: the standard deviation of a normal sample) and never below `min_spread`, so
a calibration set of near-identical scores does not make a threshold a hair above them. Median and MAD ignore up to
half of the calibration set, so a few odd documents in the lineage's history do not move it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Threshold:
    value: float
    median: float
    spread: float
    k: float
    n: int

    def to_json(self) -> dict:
        return {"threshold": round(self.value, 4), "median": round(self.median, 4), "spread": round(self.spread, 4),
                "k": self.k, "calibration_documents": self.n}


def robust_threshold(calibration, k: float, min_spread: float) -> Threshold:
    """median + k * max(1.4826 * MAD, min_spread) of the finite calibration scores; ValueError when none is."""
    s = np.asarray(calibration, dtype=np.float64)
    s = s[np.isfinite(s)]
    if s.size == 0:
        raise ValueError("no calibration score: the screen needs the lineage's accepted documents scored tonight")
    median = float(np.median(s))
    spread = max(MAD_TO_SIGMA * float(np.median(np.abs(s - median))), float(min_spread))
    return Threshold(median + k * spread, median, spread, float(k), int(s.size))


def outside(scores, threshold: Threshold) -> np.ndarray:
    """True where a score is above the threshold (a non-finite score, e.g. an empty text, is not judged)."""
    s = np.asarray(scores, dtype=np.float64)
    return np.isfinite(s) & (s > threshold.value)


def file_shares(files: list[str], excluded) -> dict[str, dict]:
    """Per file (the file of each document, in document order): documents screened, excluded, and their share."""
    excluded = np.asarray(excluded, dtype=bool)
    out: dict[str, dict] = {}
    for f, x in zip(files, excluded):
        entry = out.setdefault(f, {"screened": 0, "excluded": 0})
        entry["screened"] += 1
        entry["excluded"] += int(x)
    for entry in out.values():
        entry["share"] = entry["excluded"] / entry["screened"]
    return out


def quarantined_files(shares: dict[str, dict], quarantine_share: float) -> list[str]:
    """Files with more than `quarantine_share` of their screened documents excluded, sorted."""
    return sorted(f for f, e in shares.items() if e["screened"] and e["share"] > quarantine_share)


def auc(good, bad) -> float:
    """Probability that a bad document scores above a good one (ties count half): 1.0 separates fully, 0.5 not at
    all. Mann-Whitney U over the two samples."""
    g, b = np.asarray(good, dtype=np.float64), np.asarray(bad, dtype=np.float64)
    if not g.size or not b.size:
        raise ValueError("auc needs at least one good and one bad score")
    above = (b[:, None] > g[None, :]).sum() + 0.5 * (b[:, None] == g[None, :]).sum()
    return float(above / (g.size * b.size))
