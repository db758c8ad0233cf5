"""Where reliability tests leave their rows for bench/reliability.py's table: one JSON line per row in
$LLM_PIPELINE_RELIABILITY_RESULTS (nothing is written when it is unset)."""
from __future__ import annotations

import json
import os

RESULTS = "LLM_PIPELINE_RELIABILITY_RESULTS"


def record(kind: str, row: dict) -> None:
    path = os.environ.get(RESULTS)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, **row}) + "\n")
