"""Parameter counts against published Llama-2 shapes."""
from __future__ import annotations

from pipeline_lib.config import config_from_dict
from pipeline_lib.planner.params import (ModelShape, count_params, largest_module_params, layers_on_stage,
                                         stage_params)


def test_llama2_7b_total_and_components(llama7b):
    pc = count_params(llama7b)
    assert pc.total == 6_738_415_616
    assert pc.embedding == pc.output_head == 131_072_000
    assert pc.attention == 32 * 4 * 4096 * 4096 == 2_147_483_648
    assert pc.ffn == 32 * 3 * 4096 * 11008 == 4_328_521_728
    assert pc.norms == 32 * 2 * 4096 + 4096 == 266_240
    assert pc.per_layer == 202_383_360


def test_llama2_70b_grouped_query_attention(llama70b):
    pc = count_params(llama70b)
    assert pc.total == 68_976_648_192
    # 8 KV heads of 128: wk and wv are 8192 x 1024, not 8192 x 8192
    assert pc.attention == 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024)


def test_tied_embeddings_drop_the_head(llama7b):
    tied = ModelShape(**{**llama7b.__dict__, "tie_word_embeddings": True})
    assert count_params(tied).total == 6_738_415_616 - 131_072_000
    assert count_params(tied).output_head == 0


def test_from_model_config_matches_shape(cfg7b):
    assert count_params(cfg7b.model).total == 6_738_415_616
    tiny = config_from_dict({}).model  # defaults: the tiny CPU model with n_kv_heads None
    assert count_params(tiny).attention == tiny.num_layers * 4 * tiny.hidden_size ** 2


def test_stage_params_split_layers_embedding_and_head(llama7b):
    total = count_params(llama7b).total
    assert stage_params(llama7b, pipeline_stage=1, model_parallel=1, stage=0) == total
    assert sum(stage_params(llama7b, pipeline_stage=2, model_parallel=1, stage=i) for i in range(2)) == total
    # tensor parallel 2 splits matmuls and the embedding; norms stay whole on every device
    first = stage_params(llama7b, pipeline_stage=2, model_parallel=2, stage=0)
    assert first == (16 * (4 * 4096 ** 2 + 3 * 4096 * 11008) + 32000 * 4096) // 2 + 16 * 2 * 4096
    last = stage_params(llama7b, pipeline_stage=2, model_parallel=2, stage=1)
    assert last == first + 4096


def test_layers_on_stage_puts_the_remainder_first():
    assert [layers_on_stage(30, 4, i) for i in range(4)] == [8, 8, 7, 7]
    assert sum(layers_on_stage(80, 3, i) for i in range(3)) == 80


def test_largest_module_is_the_embedding_for_llama2_7b(llama7b):
    assert largest_module_params(llama7b) == 131_072_000
