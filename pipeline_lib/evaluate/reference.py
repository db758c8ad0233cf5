"""Reference sets: text held out from all training, scored the same way for every checkpoint.

The domain held-out split moves with the data (each night has its own); a reference set does not: general text
(e.g. configs/eval/general_zh.jsonl) whose perplexity rising says the model is forgetting what it knew, whatever
tonight's data was. `evaluate.reference_sets` lists jsonl files with a `text` field; `load_reference_set(path)`
reads one (refusing a file without usable text, naming the field and the line); `reference_rows(texts, codec,
seq_length, max_rows)` encodes the texts with the run's tokenizer and packs them exactly as pretraining rows are
packed (model.packing: tokens + EOS, rows of seq_length + 1, the last one padded), the first `max_rows` rows.
Every checkpoint of one evaluate run is scored on the same rows (perplexity.perplexity).
`evaluate.reference_heldout` adds the packed held-out rows of earlier runs of the lineage (read as they are:
already tokenized by the same tokenizer, model.tokenizer_lineage checks), named `heldout_name(folder)`.
Raises ValueError naming evaluate.reference_sets, the file and the line.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..model.packing import join_with_eos, rows_from_tokens


def set_name(path: str) -> str:
    """The name a reference set is reported under: its file name without the extension."""
    return Path(path).name.split(".")[0]


def heldout_name(folder: str) -> str:
    """heldout@<run id> for <output_root>/<run id>/data/mindrecord/heldout, else heldout@<folder name>."""
    parts = folder.rstrip("/").split("/")
    run = parts[-4] if len(parts) >= 4 and parts[-3:] == ["data", "mindrecord", "heldout"] else parts[-1]
    return f"heldout@{run}"


def load_reference_set(path: str) -> list[str]:
    texts = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line).get("text")
            except (ValueError, AttributeError):
                raise ValueError(f"evaluate.reference_sets: {path} line {n} is not a JSON object; each line must be "
                                 '{"text": "..."}') from None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"evaluate.reference_sets: {path} line {n} has no text field; each line must be "
                                 '{"text": "..."}')
            texts.append(text)
    if not texts:
        raise ValueError(f"evaluate.reference_sets: {path} holds no text; give a jsonl file with a text field per line")
    return texts


def reference_rows(texts: list[str], codec, seq_length: int, max_rows: int) -> np.ndarray:
    tokens = join_with_eos(codec.tok.encode_batch(texts), codec.eos_id)
    return rows_from_tokens(tokens, seq_length + 1, "pad", codec.pad_id)[:max_rows]
