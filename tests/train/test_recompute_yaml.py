"""The parallel / recompute knobs in the generated mindformers yaml, and what mindformers 1.9 does with them.

The recompute sections are handed to mindformers' own TransformerRecomputeConfig and a tiny LlamaForCausalLM is built
on CPU: its LayerSetting marks the primitives our patterns name (and would raise for a pattern it cannot apply).
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.train.mindformers_yaml import build_run_config, recompute_section, write_run_yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planner"))
from llama2_configs import LLAMA2_7B_4X64GB  # noqa: E402


def cfg7b(model=None, parallel=None):
    raw = copy.deepcopy(LLAMA2_7B_4X64GB)
    raw["model"].update(model or {})
    raw["parallel"].update(parallel or {})
    return config_from_dict(raw)


def tiny_llama(section: dict, *, flash: bool):
    from mindformers import LlamaConfig, LlamaForCausalLM
    from mindformers.modules.transformer import TransformerOpParallelConfig, TransformerRecomputeConfig

    pc = TransformerOpParallelConfig(recompute=TransformerRecomputeConfig(**section))
    conf = LlamaConfig(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=176, vocab_size=256,
                       seq_length=16, batch_size=1, use_flash_attention=flash, parallel_config=pc)
    return LlamaForCausalLM(conf).model.layers


def marked(prim) -> bool:
    return bool(prim.attrs.get("recompute"))


def test_ffn_recompute_on_the_listed_layers_only():
    section = recompute_section(cfg7b(model={"recompute": "ffn", "recompute_layers": [1, 0]},
                                      parallel={"pipeline_stage": 1, "model_parallel": 4, "micro_batch_num": 1}))
    assert section["recompute"] is False and all(v == [1, 0] for v in section["select_recompute"].values())
    first, second = tiny_llama({**section, "select_recompute": {k: [1] for k in section["select_recompute"]}},
                               flash=False)
    assert marked(first.feed_forward.w1.matmul) and marked(first.feed_forward.w3.matmul)
    assert not marked(second.feed_forward.w1.matmul)  # the list counts layers from the stage's first
    assert not marked(first.attention.wq.matmul)


def test_attention_recompute_marks_the_flash_attention_block():
    section = recompute_section(cfg7b(model={"recompute": "attention"}))
    layers = tiny_llama(section, flash=True)
    for layer in layers:
        assert marked(layer.attention.wq.matmul) and marked(layer.attention.wv.matmul)
        assert not marked(layer.feed_forward.w1.matmul)


def test_modes_map_to_mindformers_keys():
    assert recompute_section(cfg7b())["recompute"] is True
    assert recompute_section(cfg7b(model={"recompute_layers": [10, 16]}))["recompute"] == [10, 16]
    sel = recompute_section(cfg7b(model={"recompute": "selective"}))
    assert sel["select_recompute"] is True and sel["recompute"] is False  # mindformers' default patterns
    comm = recompute_section(cfg7b(model={"comm_recompute": True}, parallel={"use_seq_parallel": True}))
    assert comm["select_comm_recompute"] is True and comm["parallel_optimizer_comm_recompute"] is True
    assert recompute_section(cfg7b(model={"recompute_slice_activation": True}))["recompute_slice_activation"]


def test_parallel_knobs_reach_the_yaml_mindformers_loads(tmp_path):
    from mindformers.tools import MindFormerConfig

    cfg = cfg7b(parallel={"mode": "auto", "use_seq_parallel": True, "pp_interleave_num": 2,
                          "pipeline_offset": [[1, -1], [0, 0]]})
    run = build_run_config(cfg, stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path / "out"),
                           train_rows=100_000)
    mf = MindFormerConfig(str(write_run_yaml(cfg, tmp_path / "run.yaml", run, stage="pretrain")))
    assert mf.parallel.parallel_mode == 2 and mf.parallel.search_mode == "sharding_propagation"
    assert mf.parallel.pipeline_config.pipeline_interleave is True
    assert mf.parallel_config.use_seq_parallel is True
    mc = mf.model.model_config
    assert mc.pp_interleave_num == 2 and mc.offset == [[1, -1], [0, 0]]
    semi = build_run_config(cfg7b(), stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path),
                            train_rows=100_000)
    assert semi["parallel"]["parallel_mode"] == 1 and "pipeline_config" not in semi["parallel"]


def test_mindformers_layer_setting_accepts_our_offsets():
    """mindformers' own offset check (LayerSetting._check_inputs) agrees with the config rule's arithmetic."""
    import mindspore as ms
    from mindformers.modules.transformer import TransformerOpParallelConfig
    from mindformers.parallel_core.training_graph.transformer.utils import LayerSetting

    from pipeline_lib.planner.params import stage_layer_counts

    pc = TransformerOpParallelConfig(pipeline_stage=4)
    ms.set_auto_parallel_context(pipeline_stages=4)
    try:
        setting = LayerSetting(30, [1, 1, 0, 0], pc)
        assert setting.layer_list.tolist() == [stage_layer_counts(30, 4, [1, 1, 0, 0])]
        with pytest.raises(ValueError, match="remainder"):
            LayerSetting(30, [1, 0, 0, 0], pc)
    finally:
        ms.reset_auto_parallel_context()
