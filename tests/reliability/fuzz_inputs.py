"""Hypothesis strategies for the fuzz tests: raw jsonl lines as bytes (any JSON value, records with
wrong types, every Unicode category including lone surrogates, invalid UTF-8, huge lines, deep nesting)."""
from __future__ import annotations

import json

from hypothesis import strategies as st

# Every general category, surrogates (Cs) and private use (Co) included (the rare Zl, Zp, Me, Nl are also
# in SPECIAL): json.dumps escapes a lone surrogate as \udXXX (valid JSON, invalid Unicode), and
# "surrogatepass" bytes are invalid UTF-8.
ANY_CHAR = st.characters(codec=None, categories=None)
SPECIAL = st.sampled_from([
    "\u0301", "\u0327\u0308",            # combining marks
    "\u202e", "\u200f", "\u0627\u0644",  # RTL override, RTL mark, Arabic
    "\u200b", "\u200d", "\ufeff",        # zero-width space / joiner, BOM
    "\ue000", "\U000f0000",              # private use
    "\ud800", "\udfff",                  # lone surrogates
    "\x00", "\x1b[31m", "\r", "\u2028", "\u2029", "\u20dd", "\u2160", "\u3000", "ＧＩＳ１２３，", "设备运行正常。",
    " ", "\t", "",
])
TEXT = st.one_of(st.text(ANY_CHAR, max_size=60),
                 st.lists(st.one_of(SPECIAL, st.text(ANY_CHAR, max_size=8)), max_size=12).map("".join),
                 st.just("   \t "), st.just(""))
PLAIN_WORDS = st.lists(st.sampled_from(["power", "grid", "transformer", "变电站", "设备", "巡检", "the", "of"]),
                       min_size=0, max_size=40).map(" ".join)
JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), TEXT)
JSON_VALUE = st.recursive(JSON_SCALAR, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                                 st.dictionaries(TEXT, kids, max_size=4)),
                          max_leaves=12)
FIELD_VALUE = st.one_of(JSON_VALUE, TEXT, PLAIN_WORDS)


def _dump(obj, ascii_escapes: bool) -> bytes:
    """A JSON line; with ascii_escapes=False, surrogates become invalid UTF-8 bytes (surrogatepass)."""
    return json.dumps(obj, ensure_ascii=ascii_escapes, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def record_line(draw, text_field: str = "text", id_field: str = "id") -> bytes:
    """A JSON object shaped like a corpus record, with any value (or none) in text and id."""
    rec = {}
    rec[text_field] = draw(st.one_of(FIELD_VALUE, PLAIN_WORDS, TEXT))
    if draw(st.booleans()):
        rec[id_field] = draw(JSON_VALUE)
    for key in draw(st.lists(st.sampled_from(["lang", "url", "source", "date", "meta"]), max_size=3)):
        rec[key] = draw(JSON_VALUE)
    if draw(st.integers(0, 6)) == 0:
        rec.pop(text_field, None)
    return _dump(rec, draw(st.booleans()))


@st.composite
def deep_line(draw) -> bytes:
    depth = draw(st.one_of(st.integers(1, 50), st.integers(900, 1100), st.integers(10_000, 200_000)))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('{"text":[', "]}")]))
    return (opener * depth + "1" + closer * depth).encode()


@st.composite
def huge_line(draw) -> bytes:
    n = draw(st.integers(10_000, 2_000_000))
    unit = draw(st.sampled_from(["a", "电", "word ", "\u200b", "\\ud800"]))
    body = (unit * (n // len(unit) + 1))[:n]
    if draw(st.booleans()):
        return json.dumps({"text": body}, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return body.encode()  # not JSON at all


def raw_line() -> st.SearchStrategy[bytes]:
    """One line of a jsonl file (no newline inside)."""
    return st.one_of(
        record_line(),
        JSON_VALUE.flatmap(lambda v: st.booleans().map(lambda a: _dump(v, a))),
        st.binary(max_size=80),
        deep_line(),
        st.just(b""), st.just(b"   "), st.just(b"\r"),
    ).map(lambda b: b.replace(b"\n", b" "))


def raw_lines(max_size: int = 30, huge: bool = True) -> st.SearchStrategy[list[bytes]]:
    """Lines of one file; about one line in 40 is huge (10 kB - 2 MB) when `huge`."""
    line = st.integers(0, 39).flatmap(lambda k: huge_line() if huge and k == 0 else raw_line())
    return st.lists(line, min_size=1, max_size=max_size)


def examples(ci: int, full: int) -> int:
    """max_examples for a test: `ci` under the default profile, `full` under HYPOTHESIS_PROFILE=reliability."""
    import os

    return full if os.environ.get("HYPOTHESIS_PROFILE") == "reliability" else ci
