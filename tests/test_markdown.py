"""File names inside the markdown the UI renders are shown as written (issue 45 item 11)."""
from pipeline_lib.evaluate.report import md_table
from pipeline_lib.markdown import md_code, md_text

HOSTILE = "<img src=x onerror=alert(1)>|a`b.jsonl"


def test_text_and_code_spans_carry_no_tag_and_split_no_cell():
    assert md_text(HOSTILE) == "\\<img src=x onerror=alert(1)\\>\\|a`b.jsonl"
    assert md_code(HOSTILE) == "`<img src=x onerror=alert(1)>\\|ab.jsonl`"  # < > are literal inside code
    assert md_text("a\nb") == "a b"


def test_a_table_built_from_file_names_escapes_them():
    table = md_table([{"file": HOSTILE, "kept": 3}])
    row = table.splitlines()[2]
    assert "<img" not in row.replace("\\<img", "") and row.count(" | ") == 1  # one cell split: two cells
