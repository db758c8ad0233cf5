"""The dedup lineage of run.name (issue 45 item 5): two Chinese names were both `____`, one index."""
from __future__ import annotations

from pipeline_lib.config import config_from_dict
from pipeline_lib.data.dedup_index import index_uri, lineage
from pipeline_lib.nightly.tonight import nightly_overrides


def _cfg(name: str, root):
    return config_from_dict({"run": {"name": name, "output_root": str(root)}})


def test_two_chinese_run_names_have_two_indexes(tmp_path):
    a, b = _cfg("电力语料", tmp_path), _cfg("医疗语料", tmp_path)
    assert lineage(a) != lineage(b) and index_uri(a) != index_uri(b)


def test_an_ascii_run_name_keeps_its_index_folder(tmp_path):
    assert index_uri(_cfg("tiny-cpu", tmp_path)) == f"{tmp_path}/_dedup_index/tiny-cpu"


def test_the_nightly_lineage_of_a_chinese_name_is_a_valid_config(tmp_path):
    cfg = _cfg("电力语料", tmp_path)
    changes = nightly_overrides(cfg, {}, {})
    again = config_from_dict({"run": {"name": "电力语料", "output_root": str(tmp_path)}, "data": changes["data"]})
    assert again.data.dedup.lineage == lineage(cfg) + "-nightly"
