"""Fuzzed SFT records (issue 16, "Fuzzed input"): instruction files with any bytes per line and records of
the three shapes holding any JSON value, through `iter_instruction_records` and `build_sft_rows` with
the chat_markers template on a real sentencepiece tokenizer (and the chat template's truncation).
Properties: nothing crashes; read = rejected + dropped + kept; every refused record is in the quarantine
file (written as the stage writes it, UTF-8) with its reason and line, and names the offending field."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from fuzz_inputs import JSON_VALUE, TEXT, examples, raw_line
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib.config.schema import TokenizerConfig
from pipeline_lib.data.tokenizer import train_tokenizer
from pipeline_lib.model.chat_template import ChatTemplate
from pipeline_lib.train.instructions import REASONS, iter_instruction_records, to_turns
from pipeline_lib.train.sft_data import build_sft_rows

RELIABILITY_ROW = "fuzz"
ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "configs" / "data" / "tiny_sft.jsonl"
WHOLE_RECORD = {"empty_line", "bad_utf8", "bad_json", "not_an_object", "unknown_shape"}
MARKERS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


@pytest.fixture(scope="module")
def tpl_tok(tmp_path_factory):
    texts = [t.content for r in iter_instruction_records([str(BUNDLED)]) if r.obj
             for t in (to_turns(r.obj)[0] or [])]
    tok = train_tokenizer(texts * 4, TokenizerConfig(vocab_size=600), tmp_path_factory.mktemp("tok"))
    return ChatTemplate.from_tokenizer(tok, TokenizerConfig().special_tokens), tok


CONTENT = st.one_of(TEXT, JSON_VALUE, st.sampled_from(MARKERS).map(lambda m: f"say {m} now"),
                    st.text("abc 设备 ", min_size=1, max_size=400))
MESSAGE = st.one_of(st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["system", "user", "assistant",
                                                                               " User ", "robot"]), JSON_VALUE),
                                           "content": CONTENT}),
                    JSON_VALUE)
RECORD = st.one_of(
    st.fixed_dictionaries({"prompt": CONTENT, "response": CONTENT}, optional={"system": CONTENT}),
    st.fixed_dictionaries({"instruction": CONTENT, "output": CONTENT}, optional={"input": CONTENT, "system": CONTENT}),
    st.fixed_dictionaries({"messages": st.one_of(st.lists(MESSAGE, max_size=6), JSON_VALUE)}),
    st.dictionaries(st.sampled_from(["prompt", "response", "instruction", "output", "messages", "x"]), JSON_VALUE,
                    max_size=3),
)
LINE = st.one_of(RECORD.flatmap(lambda r: st.booleans().map(
    lambda a: json.dumps(r, ensure_ascii=a).encode("utf-8", "surrogatepass"))), raw_line()).map(
    lambda b: b.replace(b"\n", b" "))


@settings(max_examples=examples(150, 1500))
@given(st.lists(LINE, min_size=1, max_size=25), st.sampled_from(["drop", "truncate_prompt", "truncate_end"]),
       st.booleans())
def test_sft_rows_account_for_every_fuzzed_record(tally, tpl_tok, lines, truncation, packing):
    tpl, tok = tpl_tok
    data = b"\n".join(lines) + b"\n"
    n = len(data.split(b"\n")) - 1
    tally.add(RELIABILITY_ROW, records=n)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "sft.jsonl"
        src.write_bytes(data)
        with open(Path(tmp) / "q.jsonl", "w", encoding="utf-8") as q, open(Path(tmp) / "x.jsonl", "w") as x:
            rows, stats = build_sft_rows(iter_instruction_records([str(src)]), tpl, tok, row_len=65,
                                         truncation=truncation, packing=packing, quarantine=q, excluded=x,
                                         threads=1, batch=8)
        quarantine = [json.loads(r) for r in (Path(tmp) / "q.jsonl").read_text("utf-8").split("\n") if r]
    t = stats["total"]
    assert stats["balanced"] and t["read"] == n
    assert len(quarantine) == t["rejected_total"]
    for r in quarantine:  # a refusal about a field names it; one about the whole line or record names none
        assert r["reason"] in REASONS and 1 <= r["line"] <= n
        assert (r["field"] is None) == (r["reason"] in WHOLE_RECORD), r
    assert rows.input_ids.shape[0] == t["rows"]
