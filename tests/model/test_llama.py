"""The inference Llama (evaluate/export workers) is configured by the same keys as the training yaml."""
from __future__ import annotations

import pytest

from pipeline_lib.config import config_from_dict
from pipeline_lib.train.mindformers_yaml import build_run_config
from pipeline_lib.model.token_ids import configured_ids
from pipeline_lib.model.llama import llama_kwargs


@pytest.mark.parametrize("target", ["CPU", "Ascend"])
def test_worker_llama_config_is_the_training_model_config(target, tmp_path):
    cfg = config_from_dict({"run": {"device_target": target},
                            "model": {"n_kv_heads": 2, "rms_norm_eps": 1e-6, "compute_dtype": "float32"}})
    ids = configured_ids(cfg.tokenizer)
    run = build_run_config(cfg, stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path),
                           train_rows=4096, token_ids=ids)
    yaml_mc = dict(run["model"]["model_config"])
    assert yaml_mc.pop("type") == "LlamaConfig"
    worker = llama_kwargs(cfg, batch_size=yaml_mc["batch_size"], seq_length=cfg.model.seq_length, target=target,
                          token_ids=ids)
    assert worker == yaml_mc
    assert ("use_rope_slice" in worker) == (target == "CPU")  # the measured CPU overrides, on CPU only
