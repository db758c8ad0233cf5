"""Packed rows: documents' tokens, each followed by EOS, cut into rows of seq_length + 1 tokens.

The one layout the data stage writes for pretraining and the evaluate stage rebuilds for its reference sets
(the same rows a model was trained on, so perplexities compare). A row may start mid-document; the last partial
row is dropped (remainder drop) or filled with the pad id (remainder pad), whose targets are out of the loss.
"""
from __future__ import annotations

import numpy as np


def join_with_eos(token_lists: list[list[int]], eos_id: int) -> np.ndarray:
    """Documents' tokens each followed by EOS, as one int32 array."""
    lengths = np.fromiter((len(t) + 1 for t in token_lists), dtype=np.int64, count=len(token_lists))
    out = np.full(int(lengths.sum()), eos_id, dtype=np.int32)
    pos = 0
    for toks, n in zip(token_lists, lengths):
        out[pos:pos + n - 1] = toks
        pos += n
    return out


def count_rows(total_tokens: int, row_len: int, remainder: str) -> int:
    full, rest = divmod(total_tokens, row_len)
    return full + (1 if rest and remainder == "pad" else 0)


def rows_from_tokens(tokens: np.ndarray, row_len: int, remainder: str, pad_id: int) -> np.ndarray:
    """(rows, row_len) int32: whole rows, then a padded last row when remainder is pad."""
    n = count_rows(len(tokens), row_len, remainder)
    out = np.full(n * row_len, pad_id, dtype=np.int32)
    take = min(len(tokens), n * row_len)
    out[:take] = tokens[:take]
    return out.reshape(n, row_len)
