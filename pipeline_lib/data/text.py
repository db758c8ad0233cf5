"""Text units shared by the filters and the deduplicator.

- `tokens(text)`: one token per CJK character (Han, kana) and one per run of other letters or
  digits (a Latin word, a number, a Hangul word), lowercased; punctuation and spaces are not tokens.
  Word splitters that split on spaces would see a whole Chinese clause as one word.
- `shingles(tokens, n)`: n-grams of those tokens joined by a space (so "ab c" != "a bc"); a
  document shorter than n tokens is one shingle; an empty one has none.
- `dedup_form(text)`: the text as the deduplicator compares it: NFKC (full-width and
  compatibility forms folded, "，" == ","). Only the dedup keys and MinHash shingles see it; the
  training text keeps its punctuation (filters.Width).
- `exact_key(text)`: 64-bit xxh3 of the casefolded dedup form with all whitespace runs collapsed:
  the exact-duplicate key. Limits: 64 bits collide with probability ~n^2/2^65 (3e-4 at 100M documents).
"""
from __future__ import annotations

import re
import unicodedata

import xxhash

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"
_TOKEN = re.compile(f"[{CJK}]|[^\\W_{CJK}]+")
_SPACES = re.compile(r"\s+")


def tokens(text: str) -> list[str]:
    """CJK characters and other words of `text`, lowercased (see the module docstring)."""
    return _TOKEN.findall(text.lower())


def shingles(toks: list[str], n: int) -> list[str]:
    """Token n-grams joined by a space; [] for no tokens, one shingle when len(toks) < n."""
    if len(toks) <= n:
        return [" ".join(toks)] if toks else []
    return [" ".join(toks[i:i + n]) for i in range(len(toks) - n + 1)]


# Code points of the blocks where text usually needs NFKC (Latin-1 signs, general punctuation and
# symbols, CJK symbols and compatibility, presentation forms, full- and half-width forms) -> their NFKC.
_NFKC_BLOCKS = ((0xA0, 0x100), (0x2000, 0x2C00), (0x3000, 0x3400), (0xF900, 0xFB50), (0xFE10, 0xFE70),
                (0xFF00, 0xFFF0))
_NFKC_OF = {chr(c): unicodedata.normalize("NFKC", chr(c)) for a, b in _NFKC_BLOCKS for c in range(a, b)
            if unicodedata.normalize("NFKC", chr(c)) != chr(c)}
_NEEDS_NFKC = re.compile("[" + "".join(re.escape(c) for c in _NFKC_OF) + "]")


def _keeps_tokens(char: str, folded: str) -> bool:
    """Folding `char` to `folded` cannot change tokens(): neither is, nor lowercases to, a token character,
    and `folded` is not empty (dropping a separator would join two tokens)."""
    return bool(folded) and not _TOKEN.search(char + folded + char.lower() + folded.lower())


# the folds that may change tokens(), and Σ: its lowercase depends on the characters after it (final sigma)
_RETOKENIZES = re.compile("[Σ" + "".join(re.escape(c) for c, f in _NFKC_OF.items() if not _keeps_tokens(c, f)) + "]")


def _fast_nfkc(text: str) -> tuple[str, bool]:
    """(text with each character of _NFKC_OF replaced by its NFKC, True when that is NFKC already)."""
    # the full-width comma is ~70% of the folds in Chinese prose: str.replace spares the sub its call per match
    out = _NEEDS_NFKC.sub(lambda m: _NFKC_OF[m.group()], text.replace("，", ","))
    return out, unicodedata.is_normalized("NFKC", out)


def nfkc(text: str) -> str:
    """unicodedata.normalize("NFKC", text), ~4x faster on Chinese prose. Replacing characters by
    their own NFKC keeps the string's NFKC (both have the same NFKD), so when the replaced string is
    already NFKC it is the answer; else (combining marks, e.g. a half-width voiced mark) normalize it."""
    out, done = _fast_nfkc(text)
    return out if done else unicodedata.normalize("NFKC", out)


def dedup_form(text: str) -> str:
    """NFKC of `text`: what exact keys and shingles are computed from (see the module docstring)."""
    return nfkc(text)


def dedup_form_keeping_tokens(text: str) -> tuple[str, bool]:
    """(dedup_form(text), True when tokens() of it are those of `text`: NFKC folded only punctuation and
    spaces, as in most Chinese prose once the width filter folded its full-width digits). Then a token
    array of the text serves the form too (tokenhash.token_arrays_of_forms)."""
    out, done = _fast_nfkc(text)
    if not done:
        return unicodedata.normalize("NFKC", out), False
    return out, _RETOKENIZES.search(text) is None


def key_of_form(form: str) -> int:
    """exact_key of a text whose dedup form (dedup_form) is `form`."""
    folded = form.casefold()
    if not single_spaced(folded):  # else the collapse is the identity: its regex pass is half this key's time
        folded = _SPACES.sub(" ", folded)
    return xxhash.xxh3_64_intdigest(folded.strip().encode("utf-8"))


def single_spaced(text: str) -> bool:
    """True when the text's only whitespace is single ASCII spaces, so collapsing runs of whitespace
    changes nothing: str.isprintable is False for every other character that re's \\s matches."""
    return text.isprintable() and "  " not in text


def exact_key(text: str) -> int:
    """64-bit key of the casefolded, whitespace-collapsed dedup form (exact-duplicate detection)."""
    return key_of_form(dedup_form(text))
