"""The pipeline's markdown (what `llm-pipeline diff` writes for artifacts and --out) as plain text for a terminal:
tables as aligned columns, headings underlined, folded sections as headings, quotes indented, and none of the
markup a terminal shows raw (`<br>`, `**`, backslash escapes, `<details>`). It reads only the markdown this package
writes (evaluate/report.md_table, md_quote, run_diff): not a general markdown renderer."""
from __future__ import annotations

import re
import unicodedata

_ESCAPED = re.compile(r"\\([\\`*_\[\]<>|#~])")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_SUMMARY = re.compile(r"^<details><summary>(.*)</summary>\s*$")


def _plain(text: str) -> str:
    text = text.replace("**", "").replace("\u200b", "")
    text = re.sub(r"(?<!\\)`", "", text)
    text = re.sub(r"(?<![\w\\])_(\S(?:.*?\S)?)_(?!\w)", r"\1", text)  # _emphasis_, not snake_case names
    return _ESCAPED.sub(r"\1", text)


def _width(text: str) -> int:
    """Terminal columns: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _table(lines: list[str]) -> list[str]:
    rows = []
    for line in lines:
        cells = [c.strip() for c in _CELL_SPLIT.split(line.strip())[1:-1]]
        if all(set(c) <= set("-:") and c for c in cells):  # the |---|---| line
            continue
        rows.append([_plain(c.replace("<br>", " / ")) for c in cells])
    if not rows:
        return []
    widths = [max(_width(r[i]) if i < len(r) else 0 for r in rows) for i in range(max(map(len, rows)))]
    out = []
    for n, row in enumerate(rows):
        out.append("  ".join(c + " " * (widths[i] - _width(c)) for i, c in enumerate(row)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def terminal_text(markdown: str) -> str:
    out: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out += _table(lines[i:j])
            i = j
            continue
        folded = _SUMMARY.match(line)
        heading = re.match(r"^(#{1,6}) (.*)$", line)
        if folded or heading:
            title = _plain(folded.group(1) if folded else heading.group(2))
            level = 2 if folded else len(heading.group(1))
            out += [title, ("=" if level == 1 else "-") * _width(title)] if level <= 2 else [title]
        elif line.strip() == "</details>":
            pass
        elif line.startswith("> "):
            out += ["    " + _plain(part) for part in line[2:].split("<br>")]
        else:
            out.append(_plain(line.replace("<br>", " ")))
        i += 1
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
