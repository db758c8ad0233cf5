"""Shipped prompt sets load; bad prompt files are refused with file:line; the side-by-side report."""
from __future__ import annotations

import json

import pytest

from pipeline_lib.config.schema import EvaluateConfig
from pipeline_lib.evaluate import report as rep
from pipeline_lib.evaluate.prompts import PromptSetError, keyword_hits, load_prompt_file, load_prompt_sets


def test_every_shipped_prompt_set_loads():
    files = EvaluateConfig().prompt_files
    prompts = load_prompt_sets(files)
    sets = {p.set for p in prompts}
    assert sets == {"domain_qa", "open_chat", "instruction_following"}
    for name in sets:
        langs = {p.meta.get("lang") for p in prompts if p.set == name}
        assert {"zh", "en"} <= langs, f"{name} needs zh and en prompts"
    assert len({p.id for p in prompts}) == len(prompts)


@pytest.mark.parametrize("line, match", [
    ("{not json", "not valid JSON"),
    ('{"prompt": "x"}', "'id'"),
    ('{"id": "a", "prompt": ""}', "'prompt'"),
    ('{"id": "a", "prompt": "x", "keywords": "k"}', "'keywords'"),
    ('["a"]', "JSON object"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, line, match):
    f = tmp_path / "set.jsonl"
    f.write_text('{"id": "ok", "prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(PromptSetError, match=match) as err:
        load_prompt_file(f)
    assert f"{f}:2" in str(err.value)


def test_duplicate_ids_and_missing_files(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"id": "x", "prompt": "p"}\n')
    b.write_text('{"id": "x", "prompt": "q"}\n')
    with pytest.raises(PromptSetError, match="unique"):
        load_prompt_sets([a, b])
    with pytest.raises(PromptSetError, match="evaluate.prompt_files"):
        load_prompt_sets([tmp_path / "missing.jsonl"])


def test_keyword_hits_fold_case_and_width():
    assert keyword_hits("The Model ran at ＮＩＧＨＴ", ["model", "night", "data"]) == ["model", "night"]
    assert keyword_hits("检查点可以恢复", ["检查点", "恢复", "删除"]) == ["检查点", "恢复"]


def _summary():
    prompts = [{"id": "p1", "set": "s", "prompt": "Say | hi", "keywords": ["hi", "mark"]},
               {"id": "p2", "set": "s", "prompt": "问", "keywords": []}]
    cks = [{"label": "base", "dir": "base", "ref": {"ckpt": "b.ckpt"}, "keyword_hits": 0, "keywords_total": 2,
            "perplexity": {"perplexity": 12.3456, "tokens": 40}},
           {"label": "sft", "dir": "sft", "ref": {"ckpt": "b.ckpt", "adapter": "a.ckpt"}, "keyword_hits": 2,
            "keywords_total": 2, "lora_merged": {"scale": 2.0}}]
    gens = {"base": {"p1": {"text": "nothing", "keyword_hits": [], "keywords": ["hi", "mark"], "num_tokens": 1,
                            "stop_reason": "eos"}},
            "sft": {"p1": {"text": "HI <b> mark", "keyword_hits": ["hi", "mark"], "keywords": ["hi", "mark"],
                           "num_tokens": 3, "stop_reason": "max_new_tokens"},
                    "p2": {"text": "答\n案", "keyword_hits": [], "keywords": [], "num_tokens": 2,
                           "stop_reason": "eos"}}}
    return {"prompts": prompts, "checkpoints": cks, "decoding": "greedy", "device": "CPU"}, gens


def test_comparison_and_summary_rows():
    summary, gens = _summary()
    rows = rep.comparison_rows(summary, gens)
    assert [r["prompt_id"] for r in rows] == ["p1", "p2"]
    assert list(rows[0])[-4:] == ["base", "base hits", "sft", "sft hits"]  # checkpoints in the given order
    assert rows[0]["sft"] == "HI <b> mark" and rows[0]["sft hits"] == "2/2" and rows[1]["base"] == ""
    srows = rep.summary_rows(summary)
    assert srows[0]["perplexity"] == 12.346 and srows[1]["perplexity"] is None
    assert srows[1]["source"] == "b.ckpt + a.ckpt" and srows[1]["lora_merged"] is True
    json.dumps(rows), json.dumps(srows)  # table artifact rows must be plain json


def test_markdown_and_html_are_escaped(tmp_path):
    summary, gens = _summary()
    md = rep.render_markdown(summary, gens, "T")
    assert "> Say \\| hi" in md and "> 答<br>案" in md and "> HI \\<b\\> mark" in md  # shown as written, not HTML
    long = rep.render_markdown({**summary, "prompts": [{**summary["prompts"][0], "prompt": "x" * 130}]}, gens, "T")
    assert "> " + "\u200b".join(["x" * 40] * 3 + ["x" * 10]) in long  # a long word can wrap
    page = rep.render_html(summary, gens, "T")
    assert "<mark>HI</mark> &lt;b&gt; <mark>mark</mark>" in page  # keywords highlighted, answer escaped
    assert "<b>" not in page.replace("<b>p1</b>", "").replace("<b>p2</b>", "")


def test_answers_are_stacked_per_prompt_not_one_column_per_checkpoint():
    summary, gens = _summary()
    more = dict(summary, checkpoints=[dict(ck, label=f"{ck['label']}{i}") for i in range(3) for ck in summary["checkpoints"]])
    more_gens = {f"{label}{i}": g for i in range(3) for label, g in gens.items()}
    widest = lambda md: max(line.count(" | ") for line in md.splitlines())  # noqa: E731
    md2, md6 = rep.render_markdown(summary, gens, "T"), rep.render_markdown(more, more_gens, "T")
    assert widest(md2) == widest(md6)  # a page as wide with 6 checkpoints as with 2
    p1 = md6.split("### p1", 1)[1].split("### p2", 1)[0]
    order = [p1.index(f"**{ck['label']}**") for ck in more["checkpoints"]]
    assert order == sorted(order)  # every checkpoint's answer under the prompt, in the given order
    assert md6.index("## Checkpoints") < md6.index("12.346") < md6.index("### p1")  # perplexity on top
    page = rep.render_html(more, more_gens, "T")
    assert page.count('class="prompt"') == 2 and page.count('class="answer"') == 12


def test_answers_of_byte_fallback_pieces_are_explained_once_and_counted_per_answer():
    """Issue 48 item 7: a tiny model's answer of stray byte pieces reads "\ufffd\ufffd"; the report says why."""
    summary, gens = _summary()
    assert "byte-fallback" not in rep.render_markdown(summary, gens, "T")  # no such answer: no note
    broken = b"\xe4\xb8 ok \xe5".decode("utf-8", errors="replace")  # two bytes of a character, then one
    gens["base"]["p1"] = {**gens["base"]["p1"], "text": broken}
    md = rep.render_markdown(summary, gens, "T")
    assert md.count("byte-fallback pieces") == 1 and "1 answer(s) contain" in md
    assert md.index("## Answers per prompt") < md.index("byte-fallback pieces") < md.index("### p1")
    assert '**base** (0/2 hits, 2 "\ufffd", 1 tokens, eos)' in md
