"""The chat template with only model/ parts: a loaded tokenizer without the markers is refused by a
ChatTemplateError of the model's own (a ValueError naming tokenizer.special_tokens, not a data-stage
error), and a tokenizer with them lays out a prompt as marker + content ids."""
from __future__ import annotations

import pytest

from pipeline_lib.config.schema import TokenizerConfig
from pipeline_lib.model.chat_template import ChatTemplate, ChatTemplateError, Turn, template_for
from random_init import tiny_tokenizer
from pipeline_lib.model.tokenizer import Tokenizer

TEXTS = ["The transformer oil temperature stays below 85 C.", "Check the breaker every year.", "断路器每年检查。"] * 20


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    cfg = TokenizerConfig()
    path = tiny_tokenizer(TEXTS, tmp_path_factory.mktemp("tok"), cfg, vocab_size=300)
    return Tokenizer(path, pad_id=cfg.pad_id if cfg.pad_id is not None else 0, special_tokens=list(cfg.special_tokens))


def test_chat_template_refuses_a_tokenizer_without_markers(tok):
    with pytest.raises(ChatTemplateError, match="tokenizer.special_tokens"):
        ChatTemplate.from_tokenizer(tok, ["<|system|>", "<|user|>"])
    with pytest.raises(ChatTemplateError, match="no piece") as err:
        ChatTemplate.from_tokenizer(tok, ["<|sys|>", "<|user|>", "<|assistant|>", "<|end|>"])
    assert isinstance(err.value, ValueError) and err.value.field == "tokenizer.special_tokens"
    assert "Fix: train the tokenizer with these special tokens" in str(err.value)


def test_a_prompt_is_bos_markers_and_content_ending_with_the_assistant_marker(tok):
    tpl = template_for("chat_markers", tok, TokenizerConfig().special_tokens)
    ids = tpl.prompt_ids(tok, [Turn("system", "Be brief."), Turn("user", "Check the breaker?")])
    m = tpl.marker_ids
    assert ids == [tok.bos_id, m["system"], *tok.encode("Be brief."), m["end"],
                   m["user"], *tok.encode("Check the breaker?"), m["end"], m["assistant"]]
