"""Packed rows: documents' tokens, each followed by EOS, cut into rows of seq_length + 1 tokens.

The one layout the data stage writes for pretraining and the evaluate stage rebuilds for its reference sets
(the same rows a model was trained on, so perplexities compare). A row may start mid-document; the last partial
row is dropped (remainder drop) or filled with the pad id (remainder pad), whose targets are out of the loss.

With data.packing.document_mask each row also gets an `attention_mask` (`document_attention_mask`) that stops
attention at the EOS ending each document, in the form mindformers 1.9's Llama applies on its attention path
without flash attention (docs/mindformers-facts.md, "Packed documents").
"""
from __future__ import annotations

import numpy as np


def join_with_eos(token_lists: list, eos_id: int) -> np.ndarray:
    """Documents' tokens (lists of ints or int arrays) each followed by EOS, as one int32 array."""
    lengths = np.fromiter((len(t) + 1 for t in token_lists), dtype=np.int64, count=len(token_lists))
    out = np.full(int(lengths.sum()), eos_id, dtype=np.int32)
    if len(out) > len(token_lists):  # some document has a token
        tokens = np.ones(len(out), dtype=bool)
        tokens[np.cumsum(lengths) - 1] = False  # each document's EOS
        out[tokens] = np.concatenate([np.asarray(t, dtype=np.int32) for t in token_lists])
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


DOCUMENT_MASK_ALLOWED = 255
"""The mask value at positions a query may attend to; 0 elsewhere. mindformers 1.9's Llama casts an
`attention_mask` to uint8 (models/llama/llama.py:347) and, without flash attention, adds it to the attention
scores (models/llama/llama_transformer.py:722): a 0/1 mask would only nudge the scores by 1. Adding 255 to every
allowed score of a query row shifts them alike (softmax is unchanged by a shift) and leaves the others e^-255
behind, exactly zero weight in float32. uint8 holds no larger value."""


def mask_bytes_per_row(seq_length: int) -> int:
    """Bytes the attention_mask column adds to a row (seq_length x seq_length int32)."""
    return 4 * seq_length * seq_length


def document_attention_mask(rows: np.ndarray, eos_id: int) -> np.ndarray:
    """(rows, 1, S, S) int32 for packed rows of S + 1 tokens: mask[r, 0, i, j] = DOCUMENT_MASK_ALLOWED when input
    position i may attend to j (j <= i and both in the same document), else 0. S is what mindformers trains on:
    the row's first S tokens are the inputs (LlamaForCausalLM drops the last, models/llama/llama.py:652).
    A document ends with its EOS (included); the tokens before a row's first EOS are the rest of a document begun
    in the row before, and pad tokens after the last EOS form one more span (their targets are out of the loss)."""
    inputs = np.asarray(rows)[:, :-1]
    n, s = inputs.shape
    is_eos = inputs == eos_id
    doc = np.cumsum(is_eos, axis=1, dtype=np.int32) - is_eos  # an EOS belongs to the document it ends
    allowed = (doc[:, :, None] == doc[:, None, :]) & np.tri(s, dtype=bool)
    return (allowed.astype(np.int32) * DOCUMENT_MASK_ALLOWED).reshape(n, 1, s, s)
