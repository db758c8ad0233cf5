"""The message text that identifies each failure category, as MindSpore, mindformers, CANN/HCCL, Linux and we print it.

Every pattern names where its text comes from: a source file of the project, a string in the MindSpore 2.9 binaries
of our stack (`strings lib/...so`, the text MindSpore actually prints), an error we reproduced on this stack (the
tests hold those logs under tests/doctor/logs/), or a public issue thread quoting a real log. Nothing here is
invented: a failure whose text is not below is `unknown`, which is an honest answer.

Order matters: `CATEGORIES` is the precedence when one log shows several. A root cause outranks its echoes: an
HCCL socket timeout on rank 1 is usually rank 0 dying of an OOM, a NaN guard trip after a disk filled is the disk.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Pattern:
    category: str
    regex: re.Pattern
    source: str


def _p(category: str, regex: str, source: str, flags: int = 0) -> Pattern:
    return Pattern(category, re.compile(regex, flags), source)


# Precedence, most specific root cause first. device_oom_* is decided as "device_oom" and split by phase later.
CATEGORIES = ("disk_full", "device_oom", "host_oom", "checkpoint_shape_mismatch", "dataset_schema",
              "config_name_clash", "missing_kernel", "nan_or_overflow", "killed", "collective_timeout", "hang")

PATTERNS: tuple[Pattern, ...] = (
    # ---- disk full
    _p("disk_full", r"No space left on device",
       "Linux ENOSPC strerror; MindSpore 2.9 train/serialization.py _write_parameter_bytes_data raises "
       "'OSError: [Errno 28] No space left on device' when save_checkpoint fills a filesystem (reproduced: "
       "tests/doctor/logs/disk_full_save_checkpoint.log)"),
    _p("disk_full", r"No free disk to be used while writing mindrecord files",
       "MindSpore 2.9 mindrecord/io/shard_writer.cc: the MindRecord writer refuses below 10 MB free (reproduced on "
       "a tmpfs: tests/reliability/test_disk_full.py)"),
    _p("disk_full", r"not enough free disk for checkpoints under",
       "ours: pipeline_lib/train/checkpoints.py check_disk (InsufficientDiskError)"),
    # ---- device memory (Ascend/GPU HBM)
    _p("device_oom", r"Out of Memory!!! Request memory size",
       "MindSpore 2.9 lib/plugin/ascend/libmindspore_ascend_res_manager.so: '#umsg#Framework Error Message:#umsg#"
       "Out of Memory!!! Request memory size: ...'"),
    _p("device_oom", r"Out of [Mm]emory!!! total\s*\[",
       "mindspore ccsrc ascend_memory_manager.cc 'Out of memory!!! total[...] (dynamic[...] memory pool[...]) "
       "malloc [...] failed!'; MindSpore FAQ 'Out of Memory!!! total[3212254720] (dynamic[0] memory "
       "poll[524288000]) malloc[32611480064] failed!'"),
    _p("device_oom", r"Device\(id:\s*\d+\) memory isn't enough and alloc failed",
       "MindSpore 2.9 lib/libmindspore_ms_backend.so, libmindspore_ge_backend.so (graph_scheduler "
       "SET_OPCONTEXT_MEMORY_ALLOC_FAIL_BY_STRATEGY): '#umsg#Memory not enough:#umsg#Device(id:N) memory isn't "
       "enough and alloc failed, kernel name: ..., alloc size: ...B.'"),
    _p("device_oom", r"Allocate memory failed, maybe device memory",
       "MindSpore 2.9 lib/libmindspore_ms_backend.so: 'Allocate memory failed, maybe device memory(device id:N) "
       "isn't enough. Allocate size: ...'"),
    _p("device_oom", r"Malloc device memory failed",
       "mindspore ccsrc ascend memory adapter: 'Malloc device memory failed, size[...], ret[...], Device N "
       "Available HBM size:... free size:... may be other processes occupying this card, check as: ps -ef|grep "
       "python'"),
    _p("device_oom", r"Memory_Allocation_Failure\(EL0004\)",
       "CANN runtime error code, quoted in hw-native-sys/PTOAS#341 and PKU-YuanGroup/Helios#62 "
       "('Memory_Allocation_Failure(EL0004): Failed to allocate memory.')"),
    _p("device_oom", r"is more than total mem size",
       "mindspore ccsrc mem_dynamic_allocator.cc AddMemBlockAndMemBufByEagerFree, quoted in candle-org/MindAct#1761 "
       "('TotalUsedMemStatistics : ... plus alloc size : ... is more than total mem size : ...')"),
    _p("device_oom", r"It is estimated that the task may collapse due to out of memory",
       "MindSpore 2.9 lib/libmindspore_frontend.so (graph compile memory estimate)"),
    # ---- host memory (RAM; on a CPU device target the device memory IS host memory)
    _p("host_oom", r"(?<![)\w] )Memory isn't enough and alloc failed, kernel name",
       "MindSpore 2.9 graph_scheduler SET_OPCONTEXT_MEMORY_ALLOC_FAIL_BY_STRATEGY, the CPU branch (no 'Device(id:') "
       "of the same message: CPU kernels allocate host RAM"),
    _p("host_oom", r"Malloc for kernel (?:input|output) failed, Memory isn't enough",
       "MindSpore 2.9 lib/libmindspore_pynative_utils.so"),
    _p("host_oom", r"(?:RuntimeError|Check exception before process exit): Allocate memory failed\s*$",
       "MindSpore 2.9 pyboost_utils.cc MallocForInput on CPU (reproduced under a host memory limit: "
       "tests/doctor/logs/host_oom_cpu_rlimit.log)"),
    _p("host_oom", r"Cannot allocate memory",
       "Linux ENOMEM strerror ('[Errno 12] Cannot allocate memory'), e.g. JingyunLiang/VRT#49"),
    _p("host_oom", r"\bMemoryError\b|std::bad_alloc", "Python MemoryError / C++ std::bad_alloc"),
    _p("host_oom", r"[Oo]ut of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:constraint=",
       "Linux kernel OOM killer (dmesg / the kernel log: mm/oom_kill.c 'Out of memory: Killed process', "
       "'Memory cgroup out of memory: Killed process', 'invoked oom-killer', 'oom-kill:constraint='), quoted in "
       "vetter/shoc#38 ('Out of memory: Kill process 2700 ...')"),
    _p("host_oom", r"\[launcher\] memory evidence of an OOM kill: ",
       "ours: pipeline_lib/runtime/launcher.py OOM_LINE: the cgroup's oom_kill count rose during the run, or the "
       "killed tree's last sampled RSS was near the memory limit (runtime/memory_evidence.py)"),
    # ---- killed by SIGKILL with no evidence of memory pressure (decided with the launcher's memory evidence:
    # classify.py turns it into host_oom when that evidence shows an OOM kill)
    _p("killed", r"Worker process \d+ exit with exception\. Error code: -9\b",
       "MindSpore 2.9 mindspore/parallel/cluster/process_entity/_api.py (msrun): a worker ended by SIGKILL"),
    _p("killed", r"trainer (?:was killed by signal 9\b|exited with code -9\b)",
       "ours: pipeline_lib/train/runner.py TrainerKilled / runtime/launcher.py LaunchResult.how: SIGKILL from "
       "outside the launcher (its own timeout says 'timed out')"),
    _p("killed", r"exited with code -9 after|exit(?:ed)? (?:with )?(?:code|status) 137\b",
       "exit status 137 = 128 + SIGKILL (shell convention), -9 = SIGKILL (Python subprocess)"),
    # ---- checkpoint does not fit the network
    _p("checkpoint_shape_mismatch", r"For 'load_param_into_net', .* should have the same shape as",
       "MindSpore 2.9 mindspore/train/serialization.py _update_param (reproduced: "
       "tests/doctor/logs/checkpoint_shape_mismatch.log)"),
    _p("checkpoint_shape_mismatch", r"Failed to combine the net and the parameters for param",
       "MindSpore 2.9 mindspore/train/serialization.py _update_param"),
    # ---- dataset columns vs what the trainer reads
    _p("dataset_schema", r"column name: \S+ can not found in schema",
       "MindSpore 2.9 _c_mindrecord (shard_reader.cc): 'Invalid data, column name: X can not found in schema. "
       "Please check the 'column_list'.' (reproduced: tests/doctor/logs/dataset_schema_columns.log)"),
    _p("dataset_schema", r"Invalid columns_list, (?:tfrecord file failed to find )?column name",
       "MindSpore 2.9 _c_dataengine: 'Invalid columns_list, column name: ...'"),
    # ---- a model/config name someone registered twice
    _p("config_name_clash", r"'[^']+' is already used by a Transformers (?:config|model)",
       "transformers models/auto/configuration_auto.py AutoConfig.register / auto_factory.py register"),
    _p("config_name_clash", r"'[^']+' is already used by a (?:Mindformers config|mindformers model)",
       "mindformers 1.9 models/auto/configuration_auto.py / auto_factory.py register"),
    # ---- an op with no kernel on this device target
    _p("missing_kernel", r"The kernel \w+ unregistered",
       "MindSpore 2.9 pyboost_utils.cc SelectKernel (reproduced: ArgMaxExt on CPU, "
       "tests/doctor/logs/missing_kernel_cpu.log)"),
    _p("missing_kernel", r"Unsupported op \[\w+\]", "MindSpore 2.9 lib/libmindspore_cpu.so 'Unsupported op ['"),
    _p("missing_kernel", r"Unsupported op type on acl", "MindSpore 2.9 lib/plugin/libmindspore_ops_ascend.so"),
    # ---- NaN / inf loss, loss-scale collapse
    _p("nan_or_overflow", r"There is (?:nan|inf) in \S+ with value",
       "mindformers 1.9 core/callback/callback.py (TrainingStateMonitor): 'There is nan in {indicator} with value "
       "..., terminate training.'"),
    _p("nan_or_overflow", r"step:\[\s*\d+/\s*\d+\], loss:\s*\[?\s*-?(?:nan|inf)\b",
       "mindformers 1.9 core/callback/callback.py MFLossMonitor step line ('loss: %5.6f' prints nan/inf)"),
    _p("nan_or_overflow", r"loss guard stopped training at step",
       "ours: pipeline_lib/train/callbacks.py LossGuard (NaN/inf loss or a spike)"),
    # ---- collectives that waited too long (HCCL)
    _p("collective_timeout", r"EI0006|Getting socket times out",
       "CANN HCCL error EI0006, quoted in hiyouga/LlamaFactory#5071 and vllm-project/vllm-ascend#486 ('EI0006: "
       "... Getting socket times out. Reason: Remote Rank did not send the data in time.')"),
    _p("collective_timeout", r"Communication_Error_Get_Socket", "CANN HCCL, vllm-project/afd-plugin#229"),
    _p("collective_timeout", r"wait socket establish timeout",
       "HCCL hccl_socket_manager.cc, quoted in vllm-project/vllm-ascend#1955"),
    # ---- a rank that stopped making progress
    _p("hang", r"^\[watchdog\] hang: ",
       "ours: the stage's hang watchdog (issue 29), the line it prints when a rank made no new step for "
       "training.hang_timeout_s"),
)

# Lines that say more about a category once it is decided, but do not decide it on their own (quoted as evidence).
CONTEXT = {
    # MindSpore 2.9 mindspore/train/serialization.py, logged after the OSError (also for a permission problem)
    "disk_full": re.compile(r"Failed to save the checkpoint file .*disk space is insufficient"),
    # mindformers 1.9 MFLossMonitor: the loss scale after an overflow step
    "nan_or_overflow": re.compile(r"overflow cond: True"),
    # ours: runtime/launcher.py NO_OOM_LINE, what the memory evidence showed (and that it showed no OOM kill)
    "killed": re.compile(r"\[launcher\] no memory evidence of an OOM kill: "),
}

# Lines that show training reached its steps: a device OOM after one of these happened in a step, not at compile.
STEP_LINE = re.compile(r"step:\[\s*\d+/\s*\d+\]")  # mindformers 1.9 MFLossMonitor / loss_callback.py
# Lines that show graph compilation was under way when memory ran out: MindSpore's compile-phase estimate, or a
# traceback through Cell.compile (mindspore/nn/cell.py, `_cell_graph_executor.compile(...)`).
COMPILE_HINT = re.compile(r"It is estimated that the task may collapse due to out of memory"
                          r"|mindspore/nn/cell\.py\", line \d+, in compile\b|_cell_graph_executor\.compile\(")
