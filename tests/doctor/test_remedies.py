"""Remedies carry numbers from our planner and config, and their overrides do what they say."""
from __future__ import annotations

import yaml

from pipeline_lib.config import config_from_dict, load_config
from pipeline_lib.config.load import apply_overrides
from pipeline_lib.doctor.classify import diagnose
from pipeline_lib.planner.memory import GB, estimate

from doctor_cases import LLAMA2_7B_DP4, log_text


def test_device_oom_names_the_predicted_peak_and_layouts_that_fit(oom_cfg):
    d = diagnose(log_text("device_oom_step_ascend.log"), oom_cfg)
    assert d.category == "device_oom_step"
    peak = estimate(oom_cfg).total / GB
    assert f"predicted peak {peak:.1f} GB" in d.remedies[0]["why"]
    assert f"{oom_cfg.parallel.usable_memory_gb:g} GB usable" in d.remedies[0]["why"]
    layouts = d.remedies[1:]
    assert len(layouts) >= 2
    for rem in layouts:
        fixed = config_from_dict(apply_overrides(LLAMA2_7B_DP4, rem["overrides"]))
        assert estimate(fixed).total <= fixed.parallel.usable_memory_gb * GB  # the override really fits
        assert f"{estimate(fixed).total / GB:.1f} GB" in rem["why"]


def test_compile_oom_says_so(oom_cfg):
    d = diagnose(log_text("device_oom_compile_ascend.log"), oom_cfg)
    assert d.category == "device_oom_compile" and "before the first step" in d.remedies[0]["why"]
    assert d.headline().startswith("doctor: device_oom_compile: device memory ran out while the graph was compiled")


def test_shape_mismatch_names_the_model_field_from_the_shapes():
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [])
    d = diagnose(log_text("checkpoint_shape_mismatch.log"), cfg)
    # net (3, 4) vs checkpoint (5, 4): the differing dimension 3 is no model.* value of this config
    assert all(r["overrides"] == [] for r in d.remedies) and "shape (3, 4)" in d.remedies[0]["why"]
    # the same MindSpore message for an embedding of the config's vocabulary against a 32000-row checkpoint
    line = next(ln for ln in log_text("checkpoint_shape_mismatch.log").splitlines() if "load_param_into_net" in ln
                and "shape (3, 4)" in ln)
    line = line.replace("shape (3, 4)", f"shape ({cfg.model.vocab_size}, {cfg.model.hidden_size})").replace(
        "shape (5, 4)", f"shape (32000, {cfg.model.hidden_size})")
    d = diagnose(line, cfg)
    assert d.category == "checkpoint_shape_mismatch"
    assert d.remedies[0]["overrides"] == ["model.vocab_size=32000"]


def test_nan_halves_the_learning_rate_of_the_stage():
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", ["training.learning_rate=0.004", "sft.learning_rate=0.002"])
    d = diagnose(log_text("nan_mindformers_monitor.log"), cfg, stage="pretrain")
    assert d.remedies[0]["overrides"] == ["training.learning_rate=0.002"]
    d = diagnose(log_text("nan_mindformers_monitor.log"), cfg, stage="sft")
    assert d.remedies[0]["overrides"] == ["sft.learning_rate=0.001"]


def test_disk_full_keeps_what_fits(tmp_path):
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [f"run.output_root={tmp_path}",
                                                          "training.keep_checkpoint_max=1000000"])
    d = diagnose(log_text("disk_full_save_checkpoint.log"), cfg)
    assert "GB free now on the filesystem of" in d.remedies[0]["why"]
    keep = [r for r in d.remedies if r["overrides"]]
    assert keep and keep[0]["overrides"][0].startswith("training.keep_checkpoint_max=")
    assert int(keep[0]["overrides"][0].split("=")[1]) < 1000000


def test_missing_kernel_names_the_op_and_the_device_target():
    cfg = load_config("configs/pipelines/tiny-cpu.yaml", [])
    d = diagnose(log_text("missing_kernel_cpu.log"), cfg)
    assert d.remedies[0]["why"].startswith("ArgMaxExt has no kernel on this device target (CPU)")


def test_config_clash_names_the_registered_name():
    d = diagnose(log_text("config_name_clash.log"))
    assert "'aimv2'" in d.remedies[0]["why"] and "Transformers" in d.remedies[0]["why"]


def test_config_yaml_round_trip_of_overrides(oom_cfg, tmp_path):
    """The overrides are the CLI's key=value form: `llm-pipeline run CONFIG <overrides>` accepts them."""
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(LLAMA2_7B_DP4))
    d = diagnose(log_text("device_oom_step_ascend.log"), oom_cfg)
    fixed = load_config(path, d.remedies[1]["overrides"])
    assert estimate(fixed).total < estimate(oom_cfg).total
