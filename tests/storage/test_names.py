"""Names that become paths and identities (issue 45 items 5 and 10): a full match, any language for run.name."""
from __future__ import annotations

import pytest

from pipeline_lib.config import ConfigError, config_from_dict
from pipeline_lib.storage.names import BadName, check_name, check_text_name, name_key


@pytest.mark.parametrize("bad", ["run-1\n", "../x", "/abs", ".x", "", "a b", "电力", "x" * 129])
def test_check_name_refuses_what_is_not_a_whole_name(bad):
    with pytest.raises(BadName, match="--run-id"):
        check_name("--run-id", bad)


def test_check_text_name_takes_any_language_and_refuses_paths():
    assert check_text_name("run.name", "电力语料") == "电力语料"
    assert check_text_name("run.name", "tiny-cpu") == "tiny-cpu"
    for bad in ("电力\n", "../电力", "/x", ".x", "_x", "a/b"):
        with pytest.raises(BadName):
            check_text_name("run.name", bad)


def test_name_key_keeps_ascii_names_and_never_joins_two_others():
    assert name_key("tiny-cpu") == "tiny-cpu"  # an index made before stays where it was
    a, b = name_key("电力语料"), name_key("医疗语料")
    assert a != b and check_name("key", a) == a and check_name("key", b) == b
    assert name_key("电力语料-v2").startswith("v2-")  # the readable part is kept


@pytest.mark.parametrize("field,value", [("run.name", "../x"), ("run.name", "/tmp/x"), ("run.name", ".x"),
                                         ("run.name", "tiny\n"), ("model.name", "../m"), ("sft.model_name", "a/b"),
                                         ("data.dedup.lineage", "电力")])
def test_config_refuses_a_name_that_is_a_path_naming_field_and_fix(field, value):
    section, *rest = field.split(".")
    node = {rest[-1]: value}
    for part in reversed(rest[:-1]):
        node = {part: node}
    with pytest.raises(ConfigError) as err:
        config_from_dict({section: node})
    assert err.value.fields() == [field] and "not a name" in str(err.value) and "Fix: use e.g." in str(err.value)


def test_config_takes_a_chinese_run_name():
    assert config_from_dict({"run": {"name": "电力语料"}}).run.name == "电力语料"
