"""Remedies carry numbers from our planner and config, and their overrides do what they say."""
from __future__ import annotations

from pathlib import Path

import yaml

from pipeline_lib.config import config_from_dict, load_config
from pipeline_lib.config.load import apply_overrides
from pipeline_lib.doctor.classify import diagnose
from pipeline_lib.planner.memory import GB, estimate

from doctor_cases import LLAMA2_7B_DP4, log_text

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "pipelines" / "tiny-cpu.yaml")


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
    cfg = load_config(TINY, [])
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
    cfg = load_config(TINY, ["training.learning_rate=0.004", "sft.learning_rate=0.002"])
    d = diagnose(log_text("nan_mindformers_monitor.log"), cfg, stage="pretrain")
    assert d.remedies[0]["overrides"] == ["training.learning_rate=0.002"]
    d = diagnose(log_text("nan_mindformers_monitor.log"), cfg, stage="sft")
    assert d.remedies[0]["overrides"] == ["sft.learning_rate=0.001"]


def test_disk_full_keeps_what_fits(tmp_path):
    cfg = load_config(TINY, [f"run.output_root={tmp_path}",
                                                          "training.keep_checkpoint_max=1000000"])
    d = diagnose(log_text("disk_full_save_checkpoint.log"), cfg)
    assert "GB free now on the filesystem of" in d.remedies[0]["why"]
    keep = [r for r in d.remedies if r["overrides"]]
    assert keep and keep[0]["overrides"][0].startswith("training.keep_checkpoint_max=")
    assert int(keep[0]["overrides"][0].split("=")[1]) < 1000000


def test_missing_kernel_names_the_op_and_the_device_target():
    cfg = load_config(TINY, [])
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


def test_preflight_remedies_follow_the_problem_with_the_stages_own_keys_and_the_runs_numbers():
    """Recorded verdicts of the tiny default (tests/doctor/logs/README.md): a loss that rose gets a tenth of the
    learning rate the run used, an SFT one the sft.* keys, a memory limit the figure the measured peak needs."""
    cfg = load_config(TINY, ["training.learning_rate=5"])
    rose = diagnose(log_text("preflight_loss_rose_tiny_cpu.log"), cfg)
    assert rose.category == "preflight" and rose.stage == "pretrain" and rose.retry is False
    assert rose.remedies[0]["overrides"] == ["training.learning_rate=0.5", f"training.warmup_steps={2 * cfg.training.warmup_steps}"]
    sft = diagnose(log_text("preflight_sft_loss_rose_tiny_cpu.log"), load_config(TINY,
                                                                               ["sft.learning_rate=20"]))
    assert sft.stage == "sft" and sft.remedies[0]["overrides"][0] == "sft.learning_rate=2"
    skipped = diagnose(log_text("preflight_overflow_tiny_cpu.log"), load_config(TINY, ["training.learning_rate=100000"]))
    assert skipped.category == "preflight" and "gradients overflowed at loss scale 1" in skipped.remedies[0]["why"]
    assert skipped.remedies[0]["overrides"][0] == "training.learning_rate=10000"
    mem = diagnose(log_text("preflight_host_memory_tiny_cpu.log"),
                   load_config(TINY, ["parallel.device_memory_gb=0.3"]))
    overrides = [o for r in mem.remedies for o in r["overrides"]]
    assert "parallel.device_memory_gb=1" in overrides  # 0.76 GB measured under 0.3: 0.3 x 0.76 / 0.3 x 1.25, rounded up
    fixed = config_from_dict(apply_overrides(yaml.safe_load(open(TINY, encoding="utf-8")), overrides[:1]))
    assert fixed.training.micro_batch_size < cfg.training.micro_batch_size


def test_preflight_remedies_without_a_config_name_the_knobs():
    d = diagnose(log_text("preflight_loss_rose_tiny_cpu.log"))
    assert "lower training.learning_rate" in d.remedies[0]["why"] and d.remedies[0]["overrides"] == []


def test_a_bare_killed_in_a_users_log_says_host_memory_is_likely_and_how_to_confirm_it():
    """Users' logs (ArjunaCluster/ArjunaUsers#52: epoch lines then 'Killed'; dreamerv3#203 in a zh_CN locale) keep
    only the shell's 'Killed' of an OOM kill: the kernel's line is in dmesg. Our launcher's kill (msrun's 'Error code:
    -9' with its memory evidence) is not guessed at."""
    for name in ("killed_bare_after_epoch_lines.log", "killed_bare_zh_locale.log"):
        d = diagnose(log_text(name), load_config(TINY, []))
        assert d.category == "killed"
        first = d.remedies[0]["why"]
        assert "most often the Linux OOM killer" in first and "dmesg -T" in first and "memory.events" in first
        assert any("training.dataset_workers=1" in r["overrides"] for r in d.remedies)  # the host-memory remedy
        assert "lost node" in d.remedies[-1]["why"]
    d = diagnose(log_text("msrun_worker_sigkill.log"))
    assert "OOM killer" not in d.remedies[0]["why"] and "without an OOM kill" in d.remedies[0]["why"]
