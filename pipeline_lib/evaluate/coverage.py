"""How much of a text a tokenizer covers with pieces of its own: `byte_fallback_share(sp, texts)`.

A character with no piece in the vocabulary is written as its UTF-8 bytes (byte fallback: three tokens for a CJK
character) or as <unk>. A reference set most of whose characters fall back that way is text the tokenizer was not
built for: a model of that lineage learns little there, its perplexity sits near the uniform one (the vocabulary
size), and the nightly gate reports the set as uninformative. `validate` says so before the first night
(checks/inputs.py). Whitespace is not counted (the tokenizer writes it its own way). Plain sentencepiece.
"""
from __future__ import annotations

from typing import Iterable


def byte_fallback_share(sp, texts: Iterable[str]) -> tuple[float, int]:
    """(share of the non-space characters with no piece of their own, characters counted)."""
    covered: dict[str, bool] = {}
    unk = sp.unk_id()
    missing = total = 0
    for text in texts:
        for ch in text:
            if ch.isspace():
                continue
            if ch not in covered:
                covered[ch] = sp.piece_to_id(ch) != unk
            total += 1
            missing += not covered[ch]
    return (missing / total if total else 0.0), total
