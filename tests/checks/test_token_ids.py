"""The tokenizer's special ids against the config, one test per rule (checks/token_ids.py)."""
from pipeline_lib.checks.token_ids import token_id_issues
from pipeline_lib.config import config_from_dict


def issues(**sections):
    return {i.field: i for i in token_id_issues(config_from_dict(sections))}


def test_vocab_covers_tokenizer():
    found = issues(model={"vocab_size": 1000}, tokenizer={"vocab_size": 2000})
    assert "model.vocab_size" in found and ">= 2000" in found["model.vocab_size"].fix


def test_pad_is_not_a_real_token():
    found = issues(tokenizer={"pad_id": 3, "eos_id": 3})
    assert "tokenizer.pad_id" in found and "eos_id" in found["tokenizer.pad_id"].problem


def test_pad_defaults_to_our_layout_and_may_only_repeat_unk_for_a_loaded_tokenizer():
    assert "tokenizer.pad_id" in issues(tokenizer={"eos_id": 0})  # trained: default pad 0 collides with eos
    assert "tokenizer.pad_id" in issues(tokenizer={"pad_id": 1})  # trained: pad = unk is refused (we set pad)


def test_a_llama2_layout_tokenizer_passes_with_its_own_ids(llama2_tokenizer):
    """Llama-2: unk 0, bos 1, eos 2, no pad piece. Before the contract no pad id passed validate and the data
    stage together; now the ids come from the model (pad = unk = 0) and only a contradicting value fails."""
    base = dict(tokenizer={"path": str(llama2_tokenizer)}, model={"vocab_size": 1024}, sft={"template": "llama2"})
    assert issues(**base) == {}
    assert issues(**{**base, "tokenizer": {"path": str(llama2_tokenizer), "pad_id": 0, "unk_id": 0,
                                           "bos_id": 1, "eos_id": 2}}) == {}
    found = issues(**{**base, "tokenizer": {"path": str(llama2_tokenizer), "bos_id": 2}})
    assert set(found) == {"tokenizer.bos_id"}
    assert found["tokenizer.bos_id"].value == 2 and "has bos_id=1" in found["tokenizer.bos_id"].problem
    assert "remove tokenizer.bos_id" in found["tokenizer.bos_id"].fix
    found = issues(**{**base, "tokenizer": {"path": str(llama2_tokenizer), "pad_id": 2}})
    assert "tokenizer.pad_id" in found and "eos_id" in found["tokenizer.pad_id"].problem
    found = issues(**{**base, "model": {"vocab_size": 512}})
    assert "model.vocab_size" in found and ">= 1000" in found["model.vocab_size"].fix


def test_chat_markers_template_needs_the_marker_pieces_in_a_loaded_tokenizer(llama2_tokenizer):
    found = issues(tokenizer={"path": str(llama2_tokenizer)}, model={"vocab_size": 1024})
    issue = found["sft.template"]
    assert issue.value == "chat_markers" and "<|user|>" in issue.problem
    assert "sft.template=llama2" in issue.fix
    assert "sft.template" not in issues(tokenizer={"path": str(llama2_tokenizer)}, model={"vocab_size": 1024},
                                        sft={"template": "llama2"})


def test_trained_tokenizer_needs_four_distinct_special_ids():
    assert "tokenizer.pad_id/unk_id/bos_id/eos_id" in issues(tokenizer={"bos_id": 3, "eos_id": 3})
