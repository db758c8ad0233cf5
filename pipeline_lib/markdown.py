"""Text from files (file names, run ids, config values) inside the markdown the UI renders: shown as written.

A file name is user data: `<img src=x onerror=...>.jsonl` is HTML to the Prefect UI's renderer and `a|b.jsonl`
splits a table row. `md_text` backslash-escapes `<`, `>` (no HTML tag) and `|` (no cell split), newlines as spaces (a table cell, a line
of text; other markdown is left to render: the texts it gets are ours around the user's names);
`md_code` makes an inline code span (backticks dropped: they would end it; `|` escaped: GFM splits table cells on
it even inside code, `<` and `>` are literal there).
"""
from __future__ import annotations

import re

_SPECIAL = re.compile(r"([<>|])")


def md_text(text) -> str:
    return _SPECIAL.sub(r"\\\1", str(text)).replace("\r", "").replace("\n", " ")


def md_code(text) -> str:
    return "`" + str(text).replace("`", "").replace("\r", "").replace("\n", " ").replace("|", "\\|") + "`"
