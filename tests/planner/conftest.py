"""Shapes and configs the planner tests share: published Llama-2 shapes, the 7B 4 x 64 GB layout."""
from __future__ import annotations

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.planner.params import ModelShape

from llama2_configs import LLAMA2_7B_4X64GB  # noqa: F401  (the planner tests' shared layout)

LLAMA2_7B = ModelShape(vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, kv_heads=32,
                       intermediate_size=11008, tie_word_embeddings=False)
LLAMA2_70B = ModelShape(vocab_size=32000, hidden_size=8192, num_layers=80, num_heads=64, kv_heads=8,
                        intermediate_size=28672, tie_word_embeddings=False)

@pytest.fixture
def llama7b():
    return LLAMA2_7B


@pytest.fixture
def llama70b():
    return LLAMA2_70B


@pytest.fixture
def cfg7b_raw():
    import copy

    return copy.deepcopy(LLAMA2_7B_4X64GB)


@pytest.fixture
def cfg7b(cfg7b_raw):
    return config_from_dict(cfg7b_raw)
