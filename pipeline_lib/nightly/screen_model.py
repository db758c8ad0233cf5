"""Tonight's documents scored by one model of the lineage, in its own process (nightly/screen_worker.py).

`model_nll_per_char(cfg, checkpoint, tokenizer, texts, batch_size, log)` returns each text's NLL in nats per
character under the model: the worker's summed token NLL over the text's characters. The orchestrating process never
imports MindSpore (runtime.worker.run_worker: own process tree, timeout = training.timeout_seconds).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from ..config.platform import device_target
from ..runtime.upstream import localize
from ..runtime.worker import run_worker


def model_nll_per_char(cfg, checkpoint: str, tokenizer: str, texts: list[str], batch_size: int,
                       log=None, hf: bool = False) -> tuple[np.ndarray, dict]:
    """(nats per character of each text, the worker's figures: windows, seconds, device); `hf`: checkpoint is a
    Hugging Face folder (model.hf_checkpoint)."""
    with tempfile.TemporaryDirectory(prefix="screen-work-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        cache, endpoint = work / "inputs", cfg.run.s3_endpoint_url
        texts_file = work / "texts.jsonl"
        texts_file.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
                              encoding="utf-8")
        request = {"config": cfg.model_dump(mode="json"), "checkpoint": localize(checkpoint, cache, endpoint),
                   "tokenizer": localize(tokenizer, cache, endpoint), "texts_file": str(texts_file),
                   "work_dir": str(work), "target": device_target(cfg), "batch_size": batch_size, "hf": hf}
        result = run_worker("pipeline_lib.nightly.screen_worker", request, work,
                            timeout_s=cfg.training.timeout_seconds, log=log)
    chars = np.maximum(np.asarray(result["chars"], dtype=np.float64), 1.0)
    scores = np.asarray(result["nll"], dtype=np.float64) / chars
    scores[np.asarray(result["chars"]) == 0] = np.nan
    return scores, {k: result[k] for k in ("windows", "seconds", "device")}
