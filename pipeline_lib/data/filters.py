"""Cleaning filters: small classes configured by `data.filters` (an ordered list of name + params).

A filter is called with a `Doc` and returns True (keep) or (False, reason). Normalizers rewrite
`doc.text` and always keep. The first filter that drops a document decides its reason; the
stage writes dropped documents to excluded.jsonl and counts them by reason in stats.json.
Reasons are unique across filters, so a reason also names the filter. `apply_filters_batch`
runs each filter over a whole batch (filter after filter: the same verdicts as one document at a
time), which lets a filter vectorize its `batch` method (top_ngram does, with numpy).

Limits: the repetition and ratio rules follow the Gopher paper's web-text heuristics; they are
tuned for documents of a paragraph or more, so `top_ngram` ignores documents shorter than
`min_tokens` tokens. For CJK text one character is about half a word, so n-grams of CJK
characters are 2n long unless `cjk_n` is given.
Raises: DataStageError from `build_filters` for an unknown filter name, parameter or value.
"""
from __future__ import annotations

import functools
import inspect
import re
import unicodedata

import numpy as np

from .errors import DataStageError
from .text import nfkc, single_spaced
from .tokenhash import code_point_table, code_points, counts_per_text, top_ngram_shares

FILTERS: dict[str, type] = {}


def register(name: str):
    def deco(cls):
        cls.name, FILTERS[name] = name, cls
        return cls
    return deco


class Doc:
    """One document in flight: its id and (mutable) text."""

    __slots__ = ("id", "text")

    def __init__(self, id: str, text: str):
        self.id, self.text = id, text


class Filter:
    name = "filter"

    def __call__(self, doc: Doc) -> bool | tuple[bool, str]:
        raise NotImplementedError

    def batch(self, docs: list[Doc]) -> list:  # override to vectorize
        return [self(d) for d in docs]


@register("nfkc")
class NFKC(Filter):
    """Unicode NFKC on the training text: folds every compatibility form, CJK punctuation
    included, e.g. "ＡＢＣ１２３，（注）：是！？ﬁ" -> "ABC123,(注):是!?fi". A Chinese model trained on
    that writes ASCII punctuation in Chinese prose, so it is not in the default list (`width` is);
    use it only when that is what you want."""

    def __call__(self, doc):
        doc.text = nfkc(doc.text)
        return True


# Full-width Latin letters and digits (U+FF10-FF19, U+FF21-FF3A, U+FF41-FF5A) -> ASCII.
_FULLWIDTH_ALNUM = {c: c - 0xFEE0 for r in ((0xFF10, 0xFF19), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A))
                    for c in range(r[0], r[1] + 1)}
_FULLWIDTH_ALNUM_RUN = re.compile("[\uff10-\uff19\uff21-\uff3a\uff41-\uff5a]+")


def _fold_run(m: re.Match) -> str:
    return m.group().translate(_FULLWIDTH_ALNUM)


@register("width")
class Width(Filter):
    """NFC (composed characters), then full-width Latin letters and digits folded to ASCII;
    everything else, CJK punctuation included, is kept as written:
    "ＧＩＳ设备编号１２３，（注）：正常！" -> "GIS设备编号123，（注）：正常！".
    The text the model learns to write keeps its punctuation; the dedup keys fold much more
    (text.dedup_form, NFKC + casefold). The ideographic space is left to normalize_whitespace."""

    def __call__(self, doc):
        t = doc.text
        if not unicodedata.is_normalized("NFC", t):
            t = unicodedata.normalize("NFC", t)
        # only the runs: str.translate with a dict looks every character of the text up (a fifth of the
        # filters' time on Chinese prose with full-width digits)
        doc.text = _FULLWIDTH_ALNUM_RUN.sub(_fold_run, t)
        return True


_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u202a-\u202e"
                      "\u2060-\u206f\ufeff\ufff9-\ufffb\ue000-\uf8ff\U000f0000-\U0010ffff]")


@register("strip_control")
class StripControl(Filter):
    """Drop control, zero-width, bidi, BOM and private-use characters; CR/CRLF become LF."""

    def __init__(self, drop_replacement_char: bool = True):
        self.replacement = drop_replacement_char

    def __call__(self, doc):
        t = doc.text.replace("\r\n", "\n").replace("\r", "\n")
        t = _CONTROL.sub("", t)
        doc.text = t.replace("\ufffd", "") if self.replacement else t
        return True


_HSPACE, _LINE_EDGE = re.compile(r"[^\S\n]+"), re.compile(r" ?\n ?")


@register("normalize_whitespace")
class NormalizeWhitespace(Filter):
    """Any run of spaces/tabs (incl. NBSP, ideographic space) -> one space; lines stripped;
    at most `max_blank_lines` empty lines in a row; the document stripped."""

    def __init__(self, max_blank_lines: int = 1):
        if max_blank_lines < 0:
            raise ValueError("max_blank_lines must be >= 0")
        self.blank = re.compile("\n{%d,}" % (max_blank_lines + 2))
        self.repl = "\n" * (max_blank_lines + 1)

    def __call__(self, doc):
        t = doc.text
        if single_spaced(t) and t[:1] != " " and t[-1:] != " ":  # already normalized (typical Chinese prose)
            return True
        t = _LINE_EDGE.sub("\n", _HSPACE.sub(" ", t))
        doc.text = self.blank.sub(self.repl, t).strip()
        return True


@register("length")
class Length(Filter):
    """Keep documents of min_chars..max_chars characters (after the normalizers before it)."""

    def __init__(self, min_chars: int = 20, max_chars: int = 100_000):
        if not 0 <= min_chars <= max_chars:
            raise ValueError("need 0 <= min_chars <= max_chars")
        self.min, self.max = min_chars, max_chars

    def __call__(self, doc):
        n = len(doc.text)
        if n < self.min:
            return False, "too_short"
        return (False, "too_long") if n > self.max else True


@register("duplicate_lines")
class DuplicateLines(Filter):
    """Gopher: drop when the share of repeated lines (or of characters in them) is too high."""

    def __init__(self, max_dup_line_frac: float = 0.3, max_dup_char_frac: float = 0.2):
        self.max_lines, self.max_chars = max_dup_line_frac, max_dup_char_frac

    def __call__(self, doc):
        lines = [ln for ln in doc.text.split("\n") if ln.strip()]
        if len(lines) < 2:
            return True
        seen, dup_lines, dup_chars = set(), 0, 0
        for ln in lines:
            if ln in seen:
                dup_lines, dup_chars = dup_lines + 1, dup_chars + len(ln)
            seen.add(ln)
        if dup_lines / len(lines) > self.max_lines:
            return False, "dup_lines"
        total = sum(len(ln) for ln in lines)
        return (False, "dup_line_chars") if dup_chars / total > self.max_chars else True


@register("top_ngram")
class TopNgram(Filter):
    """Gopher: drop when the most frequent token n-gram (the longest on ties) covers more than
    max_frac of the token characters. Tokens as in text.tokens; vectorized over a batch."""

    def __init__(self, n: int = 2, max_frac: float = 0.2, cjk_n: int | None = None, min_tokens: int = 50):
        if n < 1 or not 0 < max_frac <= 1:
            raise ValueError("need n >= 1 and 0 < max_frac <= 1")
        self.n, self.max_frac, self.cjk_n, self.min_tokens = n, max_frac, cjk_n or 2 * n, min_tokens
        self.reason = f"top_{n}gram"

    def __call__(self, doc):
        return self.batch([doc])[0]

    def batch(self, docs):
        shares = top_ngram_shares([d.text for d in docs], self.n, self.cjk_n, self.min_tokens)
        return [(False, self.reason) if s > self.max_frac else True for s in shares]


_SPACE, _LETTER = 1, 2  # char_ratio's classes: what re's \s matches; letters, CJK included (re's [^\W\d_])


@functools.cache
def char_flags() -> np.ndarray:
    """Per code point: _SPACE, _LETTER or 0 (built once, ~0.4 s; the pool's fork server builds it)."""
    return code_point_table((r"[^\W\d_]", _LETTER), (r"\s", _SPACE))


@register("char_ratio")
class CharRatio(Filter):
    """Drop when letters (CJK characters included) are less than min_text_frac of the
    non-space characters: tables of numbers, symbol art, encoded blobs."""

    def __init__(self, min_text_frac: float = 0.5):
        self.min = min_text_frac

    def __call__(self, doc):
        return self.batch([doc])[0]

    def batch(self, docs):  # counted over the whole batch with a per-code-point table (char_flags)
        cp, bounds = code_points([d.text for d in docs])
        flags = char_flags()[cp]
        spaces, letters = counts_per_text(flags == _SPACE, bounds), counts_per_text(flags == _LETTER, bounds)
        visible = np.diff(bounds) - spaces
        return [(False, "low_text_ratio") if v == 0 or lt / v < self.min else True
                for v, lt in zip(visible.tolist(), letters.tolist())]


_URL = re.compile(r"(?:https?://|www\.)\S+", re.I)
_SEP = "\x00"  # between the texts of a batch that UrlHeavy searches at once
BOILERPLATE = ("all rights reserved", "cookie policy", "privacy policy", "terms of use", "click here",
               "enable javascript", "subscribe to our newsletter", "版权所有", "免责声明", "点击这里", "点击查看",
               "上一篇", "下一篇", "返回顶部", "扫一扫", "关注我们", "登录注册", "联系我们")


@register("url_heavy")
class UrlHeavy(Filter):
    """Drop URL-heavy documents (share of characters inside URLs) and boilerplate-heavy ones
    (share of short lines, < 100 characters, that contain a navigation/footer phrase)."""

    def __init__(self, max_url_frac: float = 0.3, max_boilerplate_line_frac: float = 0.5,
                 phrases: list[str] | None = None):
        self.max_url, self.max_bp = max_url_frac, max_boilerplate_line_frac
        self.phrases = tuple(p.lower() for p in (phrases if phrases is not None else BOILERPLATE))

    def __call__(self, doc):
        low = doc.text.lower()
        return self._verdict(doc.text, low, any(p in low for p in self.phrases))

    def batch(self, docs):
        lows = [d.text.lower() for d in docs]
        return [self._verdict(d.text, low, named) for d, low, named in zip(docs, lows, self._naming(lows))]

    def _naming(self, lows: list[str]) -> list[bool]:
        """Per lowered text, whether a phrase may occur in it: each phrase searched once over the batch joined by
        NUL (the per-document test of every phrase was a fifth of the filters' time). A phrase holding NUL may
        match across two texts: that only sends them to _verdict's exact per-line test."""
        if not lows:
            return []
        joined = _SEP.join(lows)
        ends = np.cumsum([len(low) + 1 for low in lows])  # each text's end, its separator included
        named = np.zeros(len(lows), bool)
        for p in self.phrases:
            at = joined.find(p)
            while at >= 0:
                k = int(np.searchsorted(ends, at, "right"))
                named[k] = True
                at = joined.find(p, int(ends[k]))  # on from the next text
        return named.tolist()

    def _verdict(self, t: str, low: str, named: bool):
        if t and ("://" in t or "www." in low) and sum(len(m) for m in _URL.findall(t)) / len(t) > self.max_url:
            return False, "url_heavy"
        if not named:
            return True
        lines = [ln for ln in low.split("\n") if ln.strip()]
        if lines:
            bp = sum(1 for ln in lines if len(ln) < 100 and any(p in ln for p in self.phrases))
            if bp / len(lines) > self.max_bp:
                return False, "boilerplate"
        return True


def build_filters(specs) -> list[Filter]:
    """Instantiate `data.filters` (FilterSpec objects or dicts with name/params), in order."""
    out = []
    for i, spec in enumerate(specs):
        name, params = (spec["name"], spec.get("params") or {}) if isinstance(spec, dict) else (spec.name, spec.params)
        cls = FILTERS.get(name)
        if cls is None:
            raise DataStageError(f"data.filters[{i}].name", name, "unknown filter",
                                 f"use one of {', '.join(sorted(FILTERS))}")
        accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise DataStageError(f"data.filters[{i}].params", params, f"{name} has no parameter(s) {unknown}",
                                 f"use only {accepted or 'no parameters'}")
        try:
            out.append(cls(**params))
        except (TypeError, ValueError) as err:
            raise DataStageError(f"data.filters[{i}].params", params, f"{name}: {err}",
                                 "see the filter's docstring in pipeline_lib/data/filters.py") from None
    return out


def apply_filters_batch(docs: list[Doc], filters: list[Filter]) -> list[tuple[str, str] | None]:
    """apply_filters for many documents, one filter at a time over the survivors."""
    verdicts: list[tuple[str, str] | None] = [None] * len(docs)
    alive = list(range(len(docs)))
    for f in filters:
        nxt = []
        for i, v in zip(alive, f.batch([docs[i] for i in alive])):
            if v is True:
                nxt.append(i)
            else:
                verdicts[i] = (f.name, v[1])
        alive = nxt
    return verdicts


def apply_filters(doc: Doc, filters: list[Filter]) -> tuple[str, str] | None:
    """Run the filters in order; None if kept, else (filter name, reason) of the first drop."""
    return apply_filters_batch([doc], filters)[0]
