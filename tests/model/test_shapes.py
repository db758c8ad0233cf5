"""The one Llama parameter table agrees with every view of it: the planner's counts, the HF import's
expected shapes (with the field behind each dimension) and the LoRA factor shapes."""
from __future__ import annotations

import math

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.model.shapes import llama_param_shapes, projection_dims
from pipeline_lib.planner.params import count_params
from pipeline_lib.model.hf import _expected, expected_mf_shapes


def _model(**over):
    base = {"vocab_size": 640, "hidden_size": 64, "num_layers": 3, "num_heads": 8, "intermediate_size": 176,
            "seq_length": 32}
    return config_from_dict({"model": {**base, **over}}).model


@pytest.mark.parametrize("over", [{}, {"n_kv_heads": 2}, {"tie_word_embeddings": True}])
def test_planner_count_is_the_sum_of_the_table(over):
    m = _model(**over)
    assert count_params(m).total == sum(math.prod(s) for s in llama_param_shapes(m).values())


def test_grouped_query_attention_shrinks_wk_wv_only():
    m = _model(n_kv_heads=2)
    shapes = llama_param_shapes(m)
    assert shapes["model.layers.2.attention.wk.weight"] == (16, 64) == shapes["model.layers.2.attention.wv.weight"]
    assert shapes["model.layers.0.attention.wq.weight"] == (64, 64) == shapes["model.layers.0.attention.wo.weight"]
    assert shapes["lm_head.weight"] == (640, 64) and len(shapes) == 1 + 3 * 9 + 2
    assert "lm_head.weight" not in llama_param_shapes(_model(tie_word_embeddings=True))
    assert projection_dims(m, "wk") == (64, 16) and projection_dims(m, "w2") == (176, 64)
    assert projection_dims(m, "q_proj") is None


def test_hf_import_checks_the_same_table_and_names_the_fields():
    m = _model(n_kv_heads=2)
    assert expected_mf_shapes(m) == llama_param_shapes(m)
    shape, fields = _expected(m)["model.layers.1.attention.wk.weight"]
    assert shape == (16, 64) and fields[0].startswith("model.n_kv_heads") and fields[1] == "model.hidden_size"
