"""Sizes as people read them."""
from __future__ import annotations


def size_text(n: float) -> str:
    """Bytes as people read them (decimal units, as disks are sold): 1.4 MB, 80.9 GB, 3.2 TB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
