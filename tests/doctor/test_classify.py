"""The classifier on real failure text: each category from logs whose key lines are MindSpore/mindformers/HCCL/Linux
text as printed (tests/doctor/logs/README.md says where each comes from), `unknown` for anything else."""
from __future__ import annotations

import pytest

from pipeline_lib.doctor.classify import classify, diagnose, exception_text, stage_from_text
from pipeline_lib.doctor.patterns import PATTERNS

from doctor_cases import log_text

EXPECTED = {
    "checkpoint_shape_mismatch.log": "checkpoint_shape_mismatch",
    "collective_timeout_hccl.log": "collective_timeout",
    "collective_timeout_socket.log": "collective_timeout",
    "config_name_clash.log": "config_name_clash",
    "dataset_schema_columns.log": "dataset_schema",
    "device_oom_compile_ascend.log": "device_oom_compile",
    "device_oom_step_ascend.log": "device_oom_step",
    "disk_full_save_checkpoint.log": "disk_full",
    "host_oom_cpu_graph.log": "host_oom",
    "host_oom_cpu_rlimit.log": "host_oom",
    "missing_kernel_cpu.log": "missing_kernel",
    "msrun_worker_sigkill.log": "killed",  # SIGKILL alone is no OOM: the memory evidence decides (below)
    "nan_mindformers_monitor.log": "nan_or_overflow",
    "nan_overflow_skipped_tiny_cpu.log": "nan_or_overflow",
    "preflight_loss_rose_tiny_cpu.log": "preflight",
    "preflight_host_memory_tiny_cpu.log": "preflight",
    "preflight_sft_loss_rose_tiny_cpu.log": "preflight",
    "preflight_overflow_tiny_cpu.log": "preflight",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_category_from_its_log(name):
    text = log_text(name)
    category, evidence = classify(text)
    assert category == EXPECTED[name]
    assert evidence and all(line.strip() in text for line in evidence if not line.endswith(" ..."))


def test_evidence_quotes_the_lines_that_show_it():
    _, evidence = classify(log_text("device_oom_step_ascend.log"))
    assert evidence[0].startswith("2024-06-03") and "step:[    2/  500]" in evidence[0]  # the last good step
    assert any("Device(id:0) memory isn't enough and alloc failed" in line for line in evidence)
    _, evidence = classify(log_text("dataset_schema_columns.log"))
    assert evidence == ["[ERROR] Invalid data, column name: text can not found in schema. Please check the "
                        "'column_list'."]


def test_device_oom_before_any_step_is_compile_after_a_step_is_step():
    oom = "Device(id:3) memory isn't enough and alloc failed, kernel name: MatMul-op1, alloc size: 1024B."
    step = ("{ Epoch:[  1/  1], step:[    5/   10], loss: 3.100000, per_step_time: 10ms, overflow cond: False, "
            "loss_scale: 1.0, global_norm: [1.0]")
    assert classify(oom)[0] == "device_oom_compile"
    assert classify(step + "\n" + oom)[0] == "device_oom_step"
    assert classify(oom + "\n" + step)[0] == "device_oom_compile"  # a step after the OOM is another attempt's
    # MindSpore scopes the kernels of the backward graph under Gradients/: such a kernel ran in a step
    grad = oom.replace("MatMul-op1", "Gradients/Default/network-WithLossCell/gradMatMul/MatMul-op1")
    assert classify(grad)[0] == "device_oom_step"


@pytest.mark.parametrize("text", [
    "",
    log_text("healthy_pretrain.log"),  # overflow cond: True on one step is loss scaling at work, not a failure
    "pretrain: training 20 steps from random init\npretrain: 5.2 GB free for 4 checkpoints",
    "Traceback (most recent call last):\nKeyError: 'learning_rate'",
    "ValueError: the model is too small",
])
def test_text_without_known_failure_is_unknown(text):
    assert classify(text) == ("unknown", [])


def test_an_oom_in_a_step_kernel_is_a_step_without_a_step_line():
    # PyTorch's backward pass ran out of device memory on the first step: no step line, but the kernel is a step's
    category, evidence = classify(log_text("device_oom_torch_backward_cuda_error.log"))
    assert category == "device_oom_step" and any("loss.backward()" in line for line in evidence)
    # CANN: the allocation failed while a Conv2D executed
    assert classify(log_text("device_oom_el0004_execute_op.log"))[0] == "device_oom_step"
    # MindSpore's SOMAS memory plan was being laid out: before the first step
    category, evidence = classify(log_text("device_oom_ms_somas_first_sampling_step.log"))
    assert category == "device_oom_compile" and any("somas.cc" in line for line in evidence)


def test_a_loss_scale_searching_down_is_healthy_one_driven_below_one_is_not():
    assert classify(log_text("healthy_deepspeed_scale_warmup.log")) == ("unknown", [])  # 2**24 halving: the search
    assert classify(log_text("healthy_mindyolo_overflow_still_update.log")) == ("unknown", [])
    category, evidence = classify(log_text("nan_apex_loss_scale_collapse.log"))
    assert category == "nan_or_overflow" and evidence[0].endswith("reducing loss scale to 0.5")
    # MindSpore's 'overflow, still update, loss scale adjust to' alone is loss scaling at work; then loss: nan is not
    assert classify(log_text("nan_mindyolo_overflow_then_loss_nan.log"))[0] == "nan_or_overflow"


def test_a_bare_killed_is_killed_and_the_kernels_oom_lines_make_it_host_oom():
    assert classify(log_text("killed_bare_fastmaskrcnn.log"))[0] == "killed"
    assert classify(log_text("killed_bare_zh_locale.log"))[0] == "killed"
    assert classify(log_text("host_oom_dmesg_invoked_oom_killer.log"))[0] == "host_oom"  # 'Killed' + the kernel's
    assert classify("Killed process 7748 (python) was not the cause")[0] == "unknown"  # only the kernel's own line


def test_hang_and_stall_name_what_stopped():
    category, evidence = classify(log_text("hang_msrun_time_out_nodes.log"))
    assert category == "hang" and any("Time out nodes are ['3']" in line for line in evidence)
    category, evidence = classify(log_text("getnext_mindocr_e39999_task_fail.log"))
    assert category == "dataloader_stall" and any("GetNext-op18" in line for line in evidence)
    # HCCL blames the rank that went away: the cluster's exception location is quoted
    category, evidence = classify(log_text("hccl_ei0002_heartbeat_lost.log"))
    assert category == "collective_timeout" and any("Cluster Exception Location" in line for line in evidence)


def test_an_unknown_failure_quotes_its_error_lines_and_names_no_category():
    text = log_text("hang_eh9999_task_timeout_multinode.log").replace("task timeout", "something else")
    diag = diagnose(text)
    assert diag.category == "unknown" and diag.remedies == [] and diag.retry is None
    assert any("EH9999" in line for line in diag.evidence)
    assert diagnose(log_text("healthy_llama_adapter_first_iterations.log")).evidence == []


def test_root_cause_outranks_its_echo():
    # rank 1 times out in a collective because rank 0 ran out of device memory: the OOM is the answer
    both = log_text("collective_timeout_hccl.log") + "\n" + log_text("device_oom_compile_ascend.log")
    assert classify(both)[0] == "device_oom_compile"


def test_a_preflight_that_reports_a_crash_is_the_crash_and_the_trainer_it_stopped_is_its_echo():
    """A preflight's verdict ranks below what the trainer died of within its steps (the verdict quotes it) and above
    the kill that ends a trainer the watch stopped."""
    preflight = log_text("preflight_loss_rose_tiny_cpu.log")
    assert classify(preflight + "\n" + log_text("host_oom_cpu_rlimit.log"))[0] == "host_oom"
    assert classify(preflight + "\n" + log_text("msrun_worker_sigkill.log"))[0] == "preflight"
    category, evidence = classify(preflight)
    assert any(line.startswith("- loss rose over 5 steps") for line in evidence), evidence  # the problem line


def test_sigkill_without_evidence_is_killed_but_our_timeout_is_not():
    assert classify("", returncode=-9)[0] == "killed"
    assert classify("", returncode=137)[0] == "killed"
    assert classify("", returncode=-9, timed_out=True)[0] == "unknown"
    assert classify("", returncode=1)[0] == "unknown"


# cgroup v2 memory.events as the kernel writes it (Documentation/admin-guide/cgroup-v2.rst), before and after a kill
EVENTS_BEFORE = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"
EVENTS_AFTER = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"


def _evidence(tmp_path, after: str, rss: int = 1 << 30):
    from pipeline_lib.runtime.memory_evidence import MemoryEvidence, oom_kills

    events = tmp_path / "memory.events"
    events.write_text(EVENTS_BEFORE)
    before = oom_kills(events)
    events.write_text(after)
    return MemoryEvidence(str(events), before, oom_kills(events), rss, 64 << 30, str(tmp_path / "memory.max"))


def test_the_memory_evidence_decides_a_kill(tmp_path):
    msrun = log_text("msrun_worker_sigkill.log")
    category, evidence = classify(msrun, memory=_evidence(tmp_path, EVENTS_AFTER))
    assert category == "host_oom" and evidence[0].startswith("the cgroup's oom_kill count rose from 0 to 1")
    category, evidence = classify(msrun, memory=_evidence(tmp_path, EVENTS_BEFORE))
    assert category == "killed" and evidence[0].startswith("no memory pressure: the cgroup's oom_kill count stayed")
    # no counter rise, but the tree held 95% of the limit at its last sample before the kill
    category, evidence = classify("", returncode=-9, memory=_evidence(tmp_path, EVENTS_BEFORE, rss=61 << 30))
    assert category == "host_oom" and "last sampled RSS, 61.00 GB, was 95% of the 64.00 GB" in evidence[0]
    diag = diagnose(msrun, memory=_evidence(tmp_path, EVENTS_AFTER))
    assert diag.retry is False and "decided by: the cgroup's oom_kill count rose" in diag.headline()
    diag = diagnose(msrun, memory=_evidence(tmp_path, EVENTS_BEFORE))
    assert diag.retry is True and "no memory pressure" in diag.headline()


def test_the_kernel_oom_lines_are_evidence_without_the_counter():
    kernel = "[12345.678] Memory cgroup out of memory: Killed process 4242 (python) total-vm:1234kB"
    assert classify(log_text("msrun_worker_sigkill.log") + "\n" + kernel)[0] == "host_oom"


def test_every_pattern_names_its_source():
    assert all(len(p.source) > 20 for p in PATTERNS)


def test_stage_from_our_messages():
    assert stage_from_text("stage 'sft' failed (run r1): TrainingLaunchError: ...") == "sft"
    assert stage_from_text("pretrain: training 20 steps\nRuntimeError: x") == "pretrain"
    assert stage_from_text(log_text("device_oom_step_ascend.log")) is None


def test_exception_text_reads_the_launcher_tails_and_the_cause():
    class Result:
        tails = {"worker_0": ["OSError: [Errno 28] No space left on device"]}
        returncode, timed_out = 1, False

    class LaunchError(RuntimeError):
        def __init__(self, msg):
            super().__init__(msg)
            self.result = Result()

    try:
        try:
            raise ValueError("There is nan in loss with value nan, terminate training.")
        except ValueError as inner:
            raise LaunchError("trainer exited with code 1") from inner
    except LaunchError as exc:
        text = exception_text(exc)
    assert "No space left on device" in text and "There is nan in loss" in text
    assert classify(text)[0] == "disk_full"


def test_diagnose_without_config_still_names_the_knobs():
    d = diagnose(log_text("nan_mindformers_monitor.log"))
    assert d.category == "nan_or_overflow" and d.remedies and d.retry is False
    assert diagnose("nothing to see").remedies == []


def test_context_lines_join_the_evidence_but_do_not_decide():
    _, evidence = classify(log_text("disk_full_save_checkpoint.log"))
    assert any("Failed to save the checkpoint file" in line for line in evidence)
    assert classify("[CRITICAL] ME(1:2,MainProcess):2026 [mindspore/train/serialization.py:475] Failed to save the "
                    "checkpoint file /x.ckpt. Maybe don't have the permission to write files, or the disk space is "
                    "insufficient and so on.") == ("unknown", [])
    _, evidence = classify(log_text("nan_mindformers_monitor.log"))
    assert any("overflow cond: True" in line for line in evidence)
