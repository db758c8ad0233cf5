"""One test per validation rule: each breaks exactly one relation of a valid config."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.config import ConfigError, check, config_from_dict, validate
from pipeline_lib.config.identity import stage_hash
from pipeline_lib.config.schema import global_batch
from pipeline_lib.stages import SPECS


def issues(for_run=False, **sections):
    cfg = config_from_dict(sections)
    return {i.field: i for i in check(cfg, for_run=for_run)}


def ascend(**sections):
    sections.setdefault("run", {})["device_target"] = "Ascend"
    return sections


def test_valid_default_has_no_issues():
    assert issues() == {}


def test_global_batch_formula():
    found = issues(training={"micro_batch_size": 2, "gradient_accumulation_steps": 3, "global_batch_size": 7})
    issue = found["training.global_batch_size"]
    assert issue.value == 7
    assert "micro_batch_size x gradient_accumulation_steps x data_parallel" in issue.problem
    assert "global_batch_size=6" in issue.fix


def test_global_batch_is_derived_and_a_stated_one_only_checks_it():
    sections = {"training": {"micro_batch_size": 2, "gradient_accumulation_steps": 3},
                "sft": {"micro_batch_size": 3, "gradient_accumulation_steps": 2}}
    cfg = config_from_dict(sections)
    assert (global_batch(cfg), global_batch(cfg, "sft")) == (6, 6)
    assert cfg.training.global_batch_size is None and issues(**sections) == {}
    sections["training"]["global_batch_size"] = sections["sft"]["global_batch_size"] = 6
    assert issues(**sections) == {}
    stated = config_from_dict(sections)  # a check only: no stage reruns for stating it
    assert {s: stage_hash(stated, s) for s in SPECS} == {s: stage_hash(cfg, s) for s in SPECS}
    sft = issues(sft={"micro_batch_size": 2, "global_batch_size": 5})["sft.global_batch_size"]
    assert "2 x 1 x 1 = 2" in sft.problem and "remove sft.global_batch_size" in sft.fix


def test_global_batch_counts_data_parallel():
    ok = issues(**ascend(parallel={"devices": 2, "data_parallel": 2},
                         training={"micro_batch_size": 2, "global_batch_size": 4}))
    assert "training.global_batch_size" not in ok
    bad = issues(**ascend(parallel={"devices": 2, "data_parallel": 2},
                          training={"micro_batch_size": 2, "global_batch_size": 2}))
    assert "training.global_batch_size" in bad


def test_devices_equal_product_of_degrees():
    found = issues(parallel={"devices": 4, "data_parallel": 1, "model_parallel": 2})
    assert "parallel.devices" in found and "= 2 devices" in found["parallel.devices"].problem


def test_micro_batch_num_multiple_of_stages():
    found = issues(model={"num_layers": 4},
                   parallel={"devices": 2, "pipeline_stage": 2, "micro_batch_num": 3, "devices_per_node": 2},
                   training={"gradient_accumulation_steps": 3, "global_batch_size": 12})
    assert "parallel.micro_batch_num" in found
    assert "micro_batch_num to 4" in found["parallel.micro_batch_num"].fix


def test_accumulation_covers_pipeline_micro_batches():
    found = issues(model={"num_layers": 4},
                   parallel={"devices": 2, "pipeline_stage": 2, "micro_batch_num": 4},
                   training={"gradient_accumulation_steps": 2, "global_batch_size": 8})
    assert "training.gradient_accumulation_steps" in found


def test_layers_at_least_stages():
    found = issues(model={"num_layers": 2},
                   parallel={"devices": 4, "pipeline_stage": 4, "micro_batch_num": 4},
                   training={"gradient_accumulation_steps": 4, "global_batch_size": 16})
    assert "parallel.pipeline_stage" in found


def test_heads_divisible_by_model_parallel():
    found = issues(model={"num_heads": 6, "hidden_size": 96, "n_kv_heads": 6, "intermediate_size": 192},
                   parallel={"devices": 4, "model_parallel": 4, "devices_per_node": 4})
    assert "model.num_heads" in found


def test_kv_heads_divisible_by_model_parallel():
    found = issues(model={"num_heads": 4, "n_kv_heads": 1},
                   parallel={"devices": 2, "model_parallel": 2, "devices_per_node": 2})
    assert "model.n_kv_heads" in found and "model.num_heads" not in found


def test_hidden_divisible_by_heads():
    found = issues(model={"hidden_size": 66, "num_heads": 4})
    assert "model.hidden_size" in found


def test_tensor_parallel_stays_inside_node():
    found = issues(parallel={"devices": 8, "model_parallel": 8, "devices_per_node": 4},
                   model={"num_heads": 8, "hidden_size": 64})
    issue = found["parallel.model_parallel"]
    assert "across nodes" in issue.problem and "model_parallel <= 4" in issue.fix


def test_fp16_needs_loss_scale():
    found = issues(training={"precision": "fp16", "loss_scale": {"type": "none"}})
    assert "training.loss_scale.type" in found and "dynamic" in found["training.loss_scale.type"].fix
    assert issues(training={"precision": "fp16", "loss_scale": {"type": "dynamic"}}) == {}


def test_precision_is_one_knob_for_dtypes_and_loss_scale():
    fp16 = config_from_dict({"training": {"precision": "fp16"}})
    assert fp16.training.loss_scale.type == "dynamic" and fp16.model.compute_dtype == "float16"
    assert (fp16.model.param_init_type, fp16.model.softmax_compute_type) == ("float32", "float32")
    assert check(fp16) == []
    bf16 = config_from_dict({"training": {"precision": "bf16"}})
    assert bf16.training.loss_scale.type == "none" and bf16.model.compute_dtype == "bfloat16"
    # A derived dtype follows a later change of precision; an explicit one stays (and is checked).
    bf16.training = bf16.training.model_copy(update={"precision": "fp32"})
    assert bf16.model.compute_dtype == "float32"


def test_explicit_compute_dtype_must_match_precision():
    found = issues(model={"compute_dtype": "float16"})
    issue = found["model.compute_dtype"]
    assert "training.precision=fp32" in issue.problem and "training.precision=fp16" in issue.fix
    assert issues(model={"compute_dtype": "bfloat16"}, training={"precision": "bf16"}) == {}


def test_half_dtypes_are_not_mixed():
    found = issues(model={"softmax_compute_type": "float16"}, training={"precision": "bf16"})
    assert "model.softmax_compute_type" in found
    assert issues(model={"softmax_compute_type": "bfloat16"}, training={"precision": "bf16"}) == {}


def test_flash_attention_needs_half_precision_on_ascend():
    found = issues(**ascend(model={"use_flash_attention": True}))
    assert "model.use_flash_attention" in found and "float16/bfloat16" in found["model.use_flash_attention"].problem
    assert issues(**ascend(model={"use_flash_attention": True}, training={"precision": "bf16"})) == {}


def test_bf16_uses_constant_scale_one():
    assert "training.loss_scale.type" in issues(training={"precision": "bf16", "loss_scale": {"type": "dynamic"}})
    assert issues(training={"precision": "bf16", "loss_scale": {"type": "static", "init_value": 1}}) == {}
    assert issues(training={"precision": "bf16"}) == {}


def test_same_base_and_lora_model_name_is_allowed():
    # mindformers 1.9 registers neither name anywhere (see the comment in validate.py)
    assert issues(model={"name": "mine"}, sft={"model_name": "mine"}) == {}
    assert issues(model={"name": "llama"}) == {}  # a transformers/mindformers model type is just a label too


@pytest.mark.slow
def test_training_never_registers_a_config_with_transformers():
    """The "'aimv2' is already used by a Transformers config" clash needs an AutoConfig.register call: importing
    everything the trainer process imports must leave transformers' (and mindformers') config mappings as built."""
    code = ("from transformers.models.auto.configuration_auto import CONFIG_MAPPING as T\n"
            "import pipeline_lib.train.callbacks, pipeline_lib.train.cpu_wrappers, pipeline_lib.train.mf_callbacks\n"
            "import pipeline_lib.train.entry\n"
            "from mindformers.models.auto.configuration_auto import CONFIG_MAPPING as M\n"
            "print('EXTRA', len(T._extra_content), len(M._extra_content))\n")
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(root), "GLOG_v": "3"})
    assert "EXTRA 0 0" in res.stdout, res.stderr[-2000:]


def test_cpu_refuses_model_and_pipeline_parallel_for_runs_only():
    sections = dict(run={"device_target": "CPU"}, model={"num_layers": 2},
                    parallel={"devices": 4, "model_parallel": 2, "pipeline_stage": 2, "micro_batch_num": 2,
                              "devices_per_node": 4},
                    training={"gradient_accumulation_steps": 2, "global_batch_size": 8})
    run = issues(for_run=True, **sections)
    assert {"parallel.model_parallel", "parallel.pipeline_stage"} <= set(run)
    assert "Ascend" in run["parallel.model_parallel"].fix
    assert issues(for_run=False, **sections) == {}


def test_bf16_is_refused_for_cpu_runs_only():
    cpu = {"run": {"device_target": "CPU"}, "training": {"precision": "bf16"}}
    found = issues(for_run=True, **cpu)
    assert "training.precision" in found and "bfloat16" in found["training.precision"].problem
    assert issues(for_run=False, **cpu) == {}  # planning an Ascend bf16 layout here is fine
    assert issues(for_run=True, run={"device_target": "CPU"}, training={"precision": "fp16"}) == {}


def test_validate_raises_with_every_issue():
    cfg = config_from_dict({"training": {"global_batch_size": 5, "precision": "fp16", "loss_scale": {"type": "none"}}})
    with pytest.raises(ConfigError) as err:
        validate(cfg, for_run=False)
    assert {"training.global_batch_size", "training.loss_scale.type"} <= set(err.value.fields())


def test_sft_has_its_own_schedule_rules():
    found = issues(sft={"steps": 60, "warmup_steps": 60})
    assert "sft.warmup_steps" in found and "sft.steps=60" in found["sft.warmup_steps"].problem
    assert "sft.global_batch_size" in issues(sft={"global_batch_size": 5})
    assert issues(sft={"micro_batch_size": 2, "gradient_accumulation_steps": 3, "global_batch_size": 6}) == {}


def test_demo_sft_data_refused_outside_the_tiny_run():
    seven_b = ascend(model={"hidden_size": 4096, "num_heads": 32, "intermediate_size": 11008}, training={"precision": "bf16"})
    found = issues(**seven_b)
    assert "sft.inputs" in found and "sft.allow_demo_data=true" in found["sft.inputs"].fix
    assert issues(**seven_b, sft={"allow_demo_data": True}) == {}
    assert issues(**seven_b, sft={"inputs": ["s3://bucket/sft/*.jsonl"]}) == {}
    assert issues() == {}  # the tiny CPU run uses it


def test_warmup_longer_than_steps_refused_at_load():
    with pytest.raises(ConfigError, match="warmup_steps"):
        config_from_dict({"training": {"steps": 3, "warmup_steps": 10}})


def test_preflight_needs_three_steps_or_none():
    issue = issues(training={"preflight_steps": 2})["training.preflight_steps"]
    assert issue.value == 2 and "training.preflight_steps >= 3" in issue.fix and "or 0" in issue.fix
    assert issues(training={"preflight_steps": 0}) == {} and issues(training={"preflight_steps": 3}) == {}


def test_one_source_of_base_weights(tmp_path):
    found = issues(model={"base_checkpoint": "s3://b/base.ckpt", "hf_checkpoint": "s3://b/hf"})
    assert "keep one of model.base_checkpoint and model.hf_checkpoint" in found["model.hf_checkpoint"].fix


def test_dask_address_without_dask_executor_is_a_warning():
    from pipeline_lib.config.validate import warnings

    address = "tcp://10.0.0.5:8786"
    assert warnings(config_from_dict({"data": {"executor": "dask", "dask_address": address}})) == []
    (warning,) = warnings(config_from_dict({"data": {"executor": "local", "dask_address": address}}))
    assert "data.dask_address" in warning and "data.executor=local" in warning and "Fix: set data.executor=dask" in warning


def test_profile_window_inside_the_run_and_ordered():
    on = {"enabled": True}
    issue = issues(training={"steps": 20, "profile": {**on, "start_step": 6, "stop_step": 6}})
    assert list(issue) == ["training.profile.start_step"] and issue["training.profile.start_step"].value == 6
    assert "stop_step=6" in issue["training.profile.start_step"].problem
    past = issues(training={"steps": 8, "warmup_steps": 2, "profile": {**on, "start_step": 2, "stop_step": 9}})
    assert list(past) == ["training.profile.stop_step"] and "training.steps=8" in past["training.profile.stop_step"].problem
    assert "<= 8" in past["training.profile.stop_step"].fix
    assert issues(training={"steps": 8, "warmup_steps": 2, "profile": {**on, "start_step": 2, "stop_step": 8}}) == {}
    # off: the window is not checked (the default window 2..6 vs a 4-step run)
    assert issues(training={"steps": 4, "warmup_steps": 2, "profile": {"enabled": False}}) == {}


def test_upload_checkpoints_follows_a_remote_run_store_and_turning_it_off_warns():
    """A retry on another machine resumes only from uploaded checkpoints: on by default for s3://, off for a local
    store, and a remote run that turns it off gets a warning naming the field, the store and the fix."""
    from pipeline_lib.config import load_config
    from pipeline_lib.config.validate import warnings

    shipped = Path(__file__).resolve().parents[2] / "configs/pipelines/llama2-7b-4x64gb.yaml"
    cfg = load_config(str(shipped))
    assert cfg.run.output_root.startswith("s3://") and cfg.training.upload_checkpoints is True
    assert not any("upload_checkpoints" in w for w in warnings(cfg))
    assert config_from_dict({}).training.upload_checkpoints is False  # a local run store holds them already
    off = load_config(str(shipped), ["training.upload_checkpoints=false"])
    (warning,) = [w for w in warnings(off) if "upload_checkpoints" in w]
    assert "run.output_root=s3://" in warning and "restarts from step 0" in warning and "Fix:" in warning
    # the config a flow receives (dumped, loaded again) keeps the derived value
    assert config_from_dict(cfg.model_dump(mode="json")).training.upload_checkpoints is True


def _mask_issues(**sections):
    sections.setdefault("data", {})["packing"] = {"document_mask": True}
    return [i for i in check(config_from_dict(sections), for_run=False) if i.field == "data.packing.document_mask"]


def test_document_mask_runs_without_flash_attention_in_float32():
    assert _mask_issues(run={"device_target": "CPU"}) == []
    # on CPU flash attention is forced off (platform.CPU_MODEL_OVERRIDES): the mask works there
    assert _mask_issues(run={"device_target": "CPU"}, model={"use_flash_attention": True}) == []
    assert _mask_issues(**ascend()) == []  # mindformers' plain attention adds the mask on Ascend too


def test_document_mask_is_refused_with_flash_attention_or_16_bit_compute():
    flash, = _mask_issues(**ascend(model={"use_flash_attention": True, "compute_dtype": "float32"}))
    assert "flash_attention.py:92" in flash.problem and "llama.py:115" in flash.problem
    assert "document_mask=false" in flash.fix
    half, = _mask_issues(run={"device_target": "CPU"}, training={"precision": "fp16"})
    assert "float16" in half.problem and "llama_transformer.py:722" in half.problem
    assert "training.precision=fp32" in half.fix


def test_document_mask_on_the_shipped_7b_config_says_why_not():
    from pipeline_lib.config.load import load_config

    shipped = Path(__file__).resolve().parents[2] / "configs/pipelines/llama2-7b-4x64gb.yaml"
    assert _mask_issues() == [] and not load_config(shipped).data.packing.document_mask  # off by default
    found = [i for i in check(load_config(shipped, ["data.packing.document_mask=true"]), for_run=False)
             if i.field == "data.packing.document_mask"]
    assert len(found) == 2  # flash attention on Ascend, bfloat16 compute
    assert "FlashAttentionScore" in found[0].problem and "bfloat16" in found[1].problem


def test_document_mask_warns_of_its_size_beyond_seq_512():
    from pipeline_lib.config.validate import warnings

    def mask_warnings(seq):
        cfg = config_from_dict({"run": {"device_target": "CPU"}, "model": {"seq_length": seq},
                                "data": {"packing": {"document_mask": True}}})
        return [w for w in warnings(cfg) if w.startswith("data.packing.document_mask")]
    assert mask_warnings(512) == []
    warned, = mask_warnings(2048)
    assert "16 MiB attention_mask" in warned and "8.00391 KiB of tokens" in warned
