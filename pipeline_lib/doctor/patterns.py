"""The message text that identifies each failure category, as MindSpore, mindformers, CANN/HCCL, Linux, the tools our
users run beside them (PyTorch/torch_npu, DeepSpeed, transformers) and we print it.

Every pattern names where its text comes from: a source file of the project, a string in the MindSpore 2.9 binaries
of our stack (`strings lib/...so`, the text MindSpore actually prints), an error we reproduced on this stack, or a
public issue thread / vendor page quoting a real log (tests/doctor/logs/corpus.yaml holds those excerpts with their
sources; pipeline_lib/doctor/scoring.py scores the patterns on them). A pattern matches the failure's mechanism in the
wordings it is printed with (old and new MindSpore, CANN error-code-first and message-first), not one sample line.
Nothing here is invented: a failure whose text is not below is `unknown`, which is an honest answer.

Order matters: `CATEGORIES` is the precedence when one log shows several. A root cause outranks its echoes: an
HCCL socket timeout on rank 1 is usually rank 0 dying of an OOM, a NaN guard trip after a disk filled is the disk, a
stalled input pipeline on one rank shows as a collective timeout on the others, and a rank that stopped is the last
resort: it is what everything else looks like from outside.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable


# the shell's own report of a child ended by SIGKILL, alone on its line (bash job control: '[1]+  Killed  python
# train.py', 'line 3: 4242 Killed  python ...'; '已杀死' in a zh_CN locale): all a user's log keeps of an OOM kill
BARE_KILLED = (r"^\s*(?:\[\d+\][+-]?\s+|.*line \d+:\s+\d+\s+)?(?:\*\*)?(?:Killed|已杀死)(?:\*\*)?"
               r"(?:\s{2,}\S.*)?\s*$")


@dataclass(frozen=True)
class Pattern:
    category: str
    regex: re.Pattern
    source: str
    accept: Callable[[re.Match], bool] | None = None  # a further check of the match (a number's value)

    def matches(self, line: str) -> bool:
        found = self.regex.search(line)
        return found is not None and (self.accept is None or self.accept(found))


def _p(category: str, regex: str, source: str, flags: int = 0, accept=None) -> Pattern:
    return Pattern(category, re.compile(regex, flags), source, accept)


def _scale_collapsed(found: re.Match) -> bool:
    """A dynamic loss scale driven below 1: overflow on (nearly) every step, the run is not training any more.
    Scales that halve from 2**32 towards a few thousand are the scaler searching, which healthy fp16 runs do."""
    value = next((v for v in found.groupdict().values() if v is not None), "")
    try:
        return float(value.rstrip(".,")) < 1.0
    except ValueError:
        return False


# Precedence, most specific root cause first. device_oom_* is decided as "device_oom" and split by phase later.
# A failed preflight ranks below the root causes it may report (a crash within its steps, a NaN) and above the kill
# that ends its trainer: the stopped trainer is its echo.
CATEGORIES = ("disk_full", "device_oom", "host_oom", "checkpoint_shape_mismatch", "dataset_schema",
              "config_name_clash", "missing_kernel", "nan_or_overflow", "dataloader_stall", "preflight", "killed",
              "collective_timeout", "hang")

PATTERNS: tuple[Pattern, ...] = (
    # ---- disk full
    _p("disk_full", r"No space left on device|\bENOSPC\b|kind: StorageFull",
       "Linux ENOSPC strerror ('OSError: [Errno 28] No space left on device'); MindSpore 2.9 serialization.py "
       "save_checkpoint (reproduced: tests/doctor/logs/disk_full_save_checkpoint.log); Rust std::io StorageFull in "
       "safetensors (hiyouga/LlamaFactory#5155); pyarrow cache writes (modelscope/ms-swift#3551)"),
    _p("disk_full", r"Disk quota exceeded|\[Errno 122\]",
       "Linux EDQUOT strerror ('[Errno 122] Disk quota exceeded'), a checkpoint save in open-mmlab/mmdetection#12069"),
    _p("disk_full", r"No usable temporary directory found in|Not enough disk space\. Needed:",
       "CPython tempfile.py _get_default_tempdir (every candidate directory unwritable, typically full) and Hugging "
       "Face datasets builder.py ('Not enough disk space. Needed: ...')"),
    _p("disk_full", r"PytorchStreamWriter failed writing file \S+: file write failed",
       "PyTorch caffe2/serialize/inline_container.cc: torch.save on a full filesystem (pytorch/pytorch#175248), "
       "quoted in hiyouga/LlamaFactory#1223, SWivid/F5-TTS#458"),
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
    # MindSpore prints the device variant in lower case after 'Device(id:N) ' and the CPU variant capitalised
    # (graph_scheduler SET_OPCONTEXT_MEMORY_ALLOC_FAIL_BY_STRATEGY); a quote that drops the prefix keeps the case
    _p("device_oom", r"Device\(id:\s*\d+\) memory isn't enough and alloc failed|(?<![A-Za-z])memory isn't enough and "
                     r"alloc failed, kernel name",
       "MindSpore 2.9 lib/libmindspore_ms_backend.so, libmindspore_ge_backend.so: '#umsg#Memory not enough:#umsg#"
       "Device(id:N) memory isn't enough and alloc failed, kernel name: ..., alloc size: ...B.'; a hiascend.com "
       "blog title quoting it without the prefix ('memory isn't enough and alloc failed, kernel name: "
       "kernel_graph_@ HostDSActor')"),
    _p("device_oom", r"Allocate memory failed, maybe device memory",
       "MindSpore 2.9 lib/libmindspore_ms_backend.so: 'Allocate memory failed, maybe device memory(device id:N) "
       "isn't enough. Allocate size: ...'"),
    _p("device_oom", r"Malloc device memory failed",
       "mindspore ccsrc ascend memory adapter: 'Malloc device memory failed, size[...], ret[...], Device N "
       "Available HBM size:... free size:... may be other processes occupying this card, check as: ps -ef|grep "
       "python'"),
    _p("device_oom", r"Out of memory error on GPU \d+\. Cannot allocate",
       "PaddlePaddle memory/allocation/cuda_allocator.cc ('ResourceExhaustedError: Out of memory error on GPU 0. "
       "Cannot allocate 172.000000MB memory on GPU 0', PaddlePaddle/PaddleNLP#7312)"),
    _p("device_oom", r"Memory_Allocation_Failure\(EL0004\)|\bEL0004\b",
       "CANN runtime error code EL0004, quoted in hw-native-sys/PTOAS#341 and PKU-YuanGroup/Helios#62 "
       "('Memory_Allocation_Failure(EL0004): Failed to allocate memory requested by GE module.')"),
    _p("device_oom", r"is more than total mem size",
       "mindspore ccsrc mem_dynamic_allocator.cc AddMemBlockAndMemBufByEagerFree, quoted in candle-org/MindAct#1761 "
       "and mindspore-lab/mindone#820 ('... plus alloc size : ... is more than total mem size : ...')"),
    _p("device_oom", r"It is estimated that the task may collapse due to out of memory",
       "MindSpore 2.9 lib/libmindspore_frontend.so (graph compile memory estimate)"),
    _p("device_oom", r"(?:CUDA|NPU|HIP|XPU) out of memory|CUDA error: out of memory|OutOfMemoryError: (?:CUDA|NPU)"
                     r"|OOM when allocating tensor|RESOURCE_EXHAUSTED: Out of memory",
       "PyTorch c10/cuda CUDACachingAllocator ('CUDA out of memory. Tried to allocate ...', torch.cuda."
       "OutOfMemoryError) and torch_npu ('NPU out of memory. Tried to allocate ...'): pytorch/pytorch#18313, "
       "facebookresearch/detectron2#1563, hiyouga/LlamaFactory#5491; ROCm 'HIP out of memory'; TensorFlow "
       "'ResourceExhaustedError: OOM when allocating tensor'; XLA/JAX 'RESOURCE_EXHAUSTED: Out of memory'"),
    # ---- host memory (RAM; on a CPU device target the device memory IS host memory)
    _p("device_oom", r"ACL_ERROR_RT_MEMORY_ALLOCATION|(?:runtime result|error code is|ret(?:code)?[:=] ?) ?207001\b",
       "CANN acl_base.h ACL_ERROR_RT_MEMORY_ALLOCATION = 207001 (device memory allocation failed), as the runtime and "
       "torch_npu print it ('runtime result = 207001', 'error code is 207001')"),
    _p("host_oom", r"(?<![)\w] )Memory isn't enough and alloc failed, kernel name",
       "MindSpore 2.9 graph_scheduler SET_OPCONTEXT_MEMORY_ALLOC_FAIL_BY_STRATEGY, the CPU branch (no 'Device(id:') "
       "of the same message: CPU kernels allocate host RAM"),
    _p("host_oom", r"Malloc for kernel (?:input|output) failed, Memory isn't enough",
       "MindSpore 2.9 lib/libmindspore_pynative_utils.so"),
    _p("host_oom", r"(?:RuntimeError|Check exception before process exit): Allocate memory failed\s*$",
       "MindSpore 2.9 pyboost_utils.cc MallocForInput on CPU (reproduced under a host memory limit: "
       "tests/doctor/logs/host_oom_cpu_rlimit.log)"),
    _p("host_oom", r"Cannot allocate memory",
       "Linux ENOMEM strerror ('[Errno 12] Cannot allocate memory', e.g. os.fork of DataLoader workers): "
       "microsoft/Graphormer#7, chenxi116/DeepLabv3.pytorch#5, JingyunLiang/VRT#49"),
    _p("host_oom", r"\bMemoryError\b|std::bad_alloc", "Python MemoryError / C++ std::bad_alloc"),
    _p("host_oom", r"DefaultCPUAllocator: can't allocate memory|insufficient shared memory \(shm\)",
       "PyTorch c10/core/impl/alloc_cpu.cpp ('DefaultCPUAllocator: can't allocate memory: you tried to allocate N "
       "bytes') and torch/utils/data/_utils/signal_handling ('Unexpected bus error encountered in worker. This might "
       "be caused by insufficient shared memory (shm)': /dev/shm is RAM)"),
    _p("host_oom", r"\bMD\(\d+.*(?:[Oo]ut of memory|Memory malloc failed)",
       "MindSpore MindData (the host-side dataset engine, log module MD): 'cudaHostAlloc failed, ret[2], out of "
       "memory' / 'Out of memory. Memory malloc failed.' (mindspore-ai/mindspore#172)"),
    _p("host_oom", r"[Oo]ut of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:constraint=",
       "Linux kernel OOM killer (dmesg / the kernel log: mm/oom_kill.c 'Out of memory: Killed process', "
       "'Memory cgroup out of memory: Killed process', 'invoked oom-killer', 'oom-kill:constraint='), quoted in "
       "vetter/shoc#38, equinor/ert#7797, 0jc1/py-autovod#7"),
    _p("host_oom", r"kernel: Killed process \d+ \(.+\) total-vm:",
       "Linux kernel OOM killer, older kernels' syslog line without the 'Out of memory:' prefix "
       "('kernel: Killed process 7748 (python) total-vm:...', systemd/systemd#6966)"),
    _p("host_oom", r"\bOOMKilled\b|killed by the OOM killer|oom-kill event\(s\)|cgroup out-of-memory handler",
       "the schedulers' OOM reports: Kubernetes container status reason 'OOMKilled', systemd 'A process of this "
       "unit has been killed by the OOM killer.', Slurm slurmstepd 'Detected N oom-kill event(s) in StepId=... Some "
       "of your processes may have been killed by the cgroup out-of-memory handler.'"),
    _p("host_oom", r"\[launcher\] memory evidence of an OOM kill: ",
       "ours: pipeline_lib/runtime/launcher.py OOM_LINE: the cgroup's oom_kill count rose during the run, or the "
       "killed tree's last sampled RSS was near the memory limit (runtime/memory_evidence.py)"),
    # ---- checkpoint does not fit the network
    _p("checkpoint_shape_mismatch", r"For 'load_param_into_net', .* should have the same shape as",
       "MindSpore 2.9 mindspore/train/serialization.py _update_param (reproduced: "
       "tests/doctor/logs/checkpoint_shape_mismatch.log)"),
    _p("checkpoint_shape_mismatch", r"Failed to combine the net and the parameters for param",
       "MindSpore 2.9 mindspore/train/serialization.py _update_param; mindspore-lab/mindyolo#271"),
    _p("checkpoint_shape_mismatch", r"size mismatch for \S+: copying a param with shape .* from checkpoint, the "
                                    r"shape in current model is",
       "PyTorch nn.Module.load_state_dict (torch/nn/modules/module.py), quoted in frotms/PaddleOCR2Pytorch#19, "
       "programmablebio/moppit#1"),
    _p("checkpoint_shape_mismatch", r"The size \(\d+\) in the file does not match the size \(\d+\) of the parameter",
       "PaddlePaddle Parameter.cpp load (PaddlePaddle/Paddle#6552)"),
    # ---- dataset columns / shapes vs what the trainer reads
    _p("checkpoint_shape_mismatch", r"Error\(s\) in loading state_dict for \w+",
       "PyTorch nn.Module.load_state_dict (torch/nn/modules/module.py): the checkpoint's keys or shapes do not fit "
       "the network ('Missing key(s) in state_dict', 'size mismatch for ...')"),
    _p("dataset_schema", r"column name: \S+ can not found in schema",
       "MindSpore 2.9 _c_mindrecord (shard_reader.cc): 'Invalid data, column name: X can not found in schema. "
       "Please check the 'column_list'.' (reproduced: tests/doctor/logs/dataset_schema_columns.log)"),
    _p("dataset_schema", r"Invalid columns_list, (?:tfrecord file failed to find )?column name",
       "MindSpore 2.9 _c_dataengine: 'Invalid columns_list, column name: ...'"),
    _p("dataset_schema", r"input column name: \S+ doesn't exist in the dataset columns",
       "MindSpore dataset map/project: 'Invalid parameter, input column name: X doesn't exist in the dataset "
       "columns.' (candle-org/MindAct#659)"),
    _p("dataset_schema", r"Inconsistent batch shapes, batch operation expects? same shape",
       "MindSpore minddata batch_op.cc: 'Inconsistent batch shapes, batch operation expects same shape for each "
       "data row, but got inconsistent shape in column N ...' (MindSpore 1.6: '... expect same shape ...'; "
       "hiascend forum thread-0254121940499220038, blog.csdn.net/beauthy/article/details/140692205)"),
    _p("dataset_schema", r"not in the dataset\.\s*Current columns in the dataset",
       "Hugging Face datasets arrow_dataset.py ('Column X not in the dataset. Current columns in the dataset: "
       "[...]'): alibaba/Pai-Megatron-Patch#611, hiyouga/LlamaFactory#977"),
    # ---- a model/config name someone registered twice
    _p("dataset_schema", r"stack expects each tensor to be equal size, but got|Cannot batch tensors with different "
                         r"shapes in component",
       "a batch of mixed shapes in the tools beside MindSpore: PyTorch default_collate torch.stack ('stack expects "
       "each tensor to be equal size, but got [3, 390, 771] at entry 0 and [3, 371, 880] at entry 1', "
       "guoweiyu/Context-Enhanced-Stereo-Transformer#3) and tf.data ('Cannot batch tensors with different shapes "
       "in component 0', isikdogan/deep_learning_tutorials#2)"),
    _p("config_name_clash", r"'.+' is already used by a Transformers (?:config|model)",
       "transformers models/auto/configuration_auto.py AutoConfig.register / auto_factory.py register "
       "(zai-org/GLM-V#84, microsoft/unilm#866, pzs19/TokenSelect#3)"),
    _p("config_name_clash", r"'.+' is already used by a (?:Mindformers config|mindformers model)",
       "mindformers 1.9 models/auto/configuration_auto.py / auto_factory.py register"),
    # ---- an op with no kernel on this device target
    _p("missing_kernel", r"The kernel \w+ unregistered",
       "MindSpore 2.9 pyboost_utils.cc SelectKernel (reproduced: ArgMaxExt on CPU, "
       "tests/doctor/logs/missing_kernel_cpu.log)"),
    _p("missing_kernel", r"Unsupported op \[\w+\]",
       "MindSpore 2.9 lib/libmindspore_cpu.so 'Unsupported op [' ('Unsupported op [Select] on CPU', "
       "candle-org/MindAct#1652)"),
    _p("missing_kernel", r"Unsupported op type on acl", "MindSpore 2.9 lib/plugin/libmindspore_ops_ascend.so"),
    _p("missing_kernel", r"Op \w+ does not has any binary",
       "CANN opp (aclnn kernel init): the chip's kernel binaries for the op are absent, e.g. the Ascend-cann-kernels "
       "package for this chip is not installed ('Op Cast does not has any binary.', hiyouga/LlamaFactory#3796)"),
    _p("missing_kernel", r"Not registered \w+ kernel: op\[\w+\]",
       "MindSpore 1.x cpu_kernel_factory.cc ('Not registered CPU kernel: op[CheckValid]!', "
       "mindspore-ai/community#4)"),
    _p("missing_kernel", r"does not have kernel for \{.*place\[",
       "PaddlePaddle operator.cc ('Operator (matmul) does not have kernel for {...place[Place(cpu)]...}', "
       "PaddlePaddle/Paddle#66398)"),
    _p("missing_kernel", r"Cannot find the kernel matching Current OperatorConf",
       "OneFlow user_op kernel registry (Oneflow-Inc/oneflow#9152)"),
    _p("missing_kernel", r"No registered '\w+' OpKernel for \w+ devices",
       "TensorFlow op_kernel.cc ('No registered '_Arg' OpKernel for CPU devices compatible with node', "
       "tensorflow/tensorflow#9443)"),
    _p("missing_kernel", r"Could not run '[^']+' with arguments from the '\w+' backend",
       "PyTorch dispatcher (c10/core/impl): an operator with no kernel for that backend"),
    # ---- NaN / inf loss, loss-scale collapse
    _p("missing_kernel", r"\"\w+\" not implemented for '\w+'|no kernel image is available for execution on the device",
       "PyTorch's dispatch stub for a dtype without a kernel on the device ('\"addmm_impl_cpu_\" not implemented for "
       "'Half'') and the CUDA runtime's cudaErrorNoKernelImageForDevice (a build without this GPU's architecture)"),
    _p("missing_kernel", r"Operator\[\w+\].* is not support\. This error means the current input type is not supported",
       "MindSpore kernel_select_cpu.cc / GPU kernel select: 'Operator[AddN] input(kNumberTypeBool,...) output(...) "
       "is not support. This error means the current input type is not supported' (MindSpore FAQ)"),
    _p("missing_kernel", r"(?:cpu_session|gpu_session)\.cc:\d+\] BuildKernel\] Operator\[\w+\] is not support\b",
       "MindSpore 0.x device/cpu/cpu_session.cc BuildKernel ('[ERROR] ME(...) [mindspore/ccsrc/device/cpu/"
       "cpu_session.cc:115] BuildKernel] Operator[SoftmaxCrossEntropyWithLogits] is not support.', "
       "mindspore-ai/mindarmour#2)"),
    _p("nan_or_overflow", r"There is (?:nan|inf) in \S+ with value",
       "mindformers 1.9 core/callback/callback.py (TrainingStateMonitor): 'There is nan in {indicator} with value "
       "..., terminate training.'"),
    _p("nan_or_overflow", r"\bloss is (?:nan|inf)\b",
       "'Loss is nan, stopping training' (MAE/DeiT-style engine_finetune.py, OpenGVLab/LLaMA-Adapter#144)",
       re.IGNORECASE),
    _p("nan_or_overflow", r"Function '\w+' returned nan values in its \d+th output",
       "PyTorch autograd anomaly mode (torch/csrc/autograd/engine.cpp): a backward function produced NaN"),
    _p("nan_or_overflow", r"step:\[\s*\d+/\s*\d+\], loss:\s*\[?\s*-?(?:nan|inf)\b",
       "mindformers 1.9 core/callback/callback.py MFLossMonitor step line ('loss: %5.6f' prints nan/inf)"),
    # a loss printed as nan/inf in any training log's format: 'loss: nan', 'lm loss NAN', 'Training Loss: nan',
    # 'train loss nan', 'train_epoch_loss=nan', 'eval_epoch_loss=tensor(nan'
    # ('best_loss: inf' is a tracker's starting value, not a loss)
    _p("nan_or_overflow", r"\b(?!best|min|lowest)\w*loss\b['\"]?\s*[:=]?\s*(?:tensor\()?\[?\s*[-+]?(?:nan|inf)\b",
       "the loss printed as nan/inf: MindSpore mindyolo ('loss: nan, lbox: nan', mindspore-lab/mindyolo#440), "
       "Megatron-style 'lm loss NAN' (THUDM/Chinese-Transformer-XL#7), 'Training Loss: nan' "
       "(nebuly-ai/optimate#314), 'train loss nan' (datawhalechina/tiny-universe#31), llama-recipes "
       "'train_epoch_loss=nan' (meta-llama/llama-cookbook#300), the transformers Trainer's \"{'loss': nan\"",
       re.IGNORECASE),
    _p("nan_or_overflow", r"reducing loss scale to (?P<scale>\S+)|Attempted loss scale: \S+, reducing to "
                          r"(?P<scale2>\S+)|loss scale adjust to (?P<scale3>\S+)",
       "a dynamic loss scale driven below 1 (every step overflows): apex 'Gradient overflow. Skipping step, loss "
       "scaler 0 reducing loss scale to 0.5' (NVIDIA/apex#834, Junjue-Wang/FactSeg#6), DeepSpeed 'OVERFLOW! ... "
       "Attempted loss scale: 0, reducing to 0' (ymcui/Chinese-LLaMA-Alpaca-2#97), MindSpore mindyolo 'overflow, "
       "still update, loss scale adjust to ...'", accept=_scale_collapsed),
    _p("nan_or_overflow", r"Current loss scale already at minimum",
       "DeepSpeed fp16 loss_scaler.py: 'Current loss scale already at minimum - cannot decrease scale anymore. "
       "Exiting run.' (Tencent/TencentPretrain#57)"),
    _p("nan_or_overflow", r"loss guard stopped training at step",
       "ours: pipeline_lib/train/callbacks.py LossGuard (NaN/inf loss or a spike)"),
    # ---- the input pipeline did not deliver a batch in time
    _p("nan_or_overflow", r"\d+ of \d+ steps overflowed \(gradients not finite",
       "ours: train/session.py, a run that ended short of its optimizer steps because its updates were skipped as "
       "overflowed; reproduced on the tiny default at training.learning_rate=100000 (mindformers' step lines "
       "'overflow cond: True, loss_scale: 1.0, global_norm: [nan]': tests/doctor/logs/nan_overflow_skipped_tiny_cpu.log)"),
    _p("dataloader_stall", r"GetNext error may be caused by slow data processing",
       "MindSpore ascend_kernel_runtime.cc DumpTaskExceptionInfo (mindspore-lab/mindocr#586, #615)"),
    _p("dataloader_stall", r"For 'GetNext', get data timeout",
       "MindSpore GPU dataset_iterator_kernel.cc ReadDevice (mindspore-lab/mindaudio#163)"),
    _p("dataloader_stall", r"Dump node \(\S*GetNext-op\d+\) task error|fault op_name=\S*[Gg]et[Nn]ext",
       "MindSpore/CANN task exception on the GetNext op (mindspore-lab/mindocr#615; CANN E30008 'fault "
       "op_name=aicpu_getnext_IteratorGetNext', hiascend TensorFlow migration FAQ tfmigr1_000142)"),
    _p("dataloader_stall", r"which might (?:result|cause) `GetNext` timeout problem",
       "MindSpore 2.9 _c_dataengine.cpython-311-x86_64-linux-gnu.so: '... seconds to fetch a batch of data from "
       "dataset pipeline, which might result `GetNext` timeout problem.' (and '... unable to fetch first Batch')"),
    _p("dataloader_stall", r"wait data sync to output dev timeout, current size of dataset queue is",
       "MindSpore 2.9 lib/plugin/ascend/libmindspore_ascend_res_manager.so (ascend_data_queue.cc)"),
    _p("dataloader_stall", r"\bGetNext\b.{0,200}?\btime ?out\b|\btime ?out\b.{0,200}?\bGetNext\b",
       "the GetNext op (dataset sink mode: the device pulls batches from the data queue) reported with a timeout in "
       "the same line, in MindSpore's and CANN's wordings (mindspore-lab/mindaudio#163, CANN E30008 'For the "
       "GetNext operator, its preprocessing duration may be too long')", re.IGNORECASE),
    _p("dataloader_stall", r"Worker timed out after \d+ seconds|DataLoader timed out after \d+ seconds",
       "MXNet gluon dataloader.py ('Worker timed out after 120 seconds. This might be caused by - Slow "
       "transform', apache/mxnet#18224) and PyTorch torch/utils/data/dataloader.py ('DataLoader timed out after "
       "N seconds')"),
    # ---- our preflight's bad verdict over the first training.preflight_steps steps
    _p("preflight", r"\b(?:pretrain |sft )?preflight failed:",
       "ours: pipeline_lib/train/preflight.py, the verdict's message ('pretrain preflight failed:' / 'sft preflight "
       "failed:' in the stage's error, '[preflight] preflight failed: ...: stopping the trainer' when the watch "
       "stops it, preflight.json's message); reproduced on the tiny default: "
       "tests/doctor/logs/preflight_*_tiny_cpu.log"),
    # ---- killed by SIGKILL with no evidence of memory pressure (decided with the launcher's memory evidence:
    # classify.py turns it into host_oom when that evidence shows an OOM kill)
    _p("killed", r"Worker process \d+ exit with exception\. Error code: -9\b",
       "MindSpore 2.9 mindspore/parallel/cluster/process_entity/_api.py (msrun): a worker ended by SIGKILL"),
    _p("killed", r"trainer (?:was killed by signal 9\b|exited with code -9\b)",
       "ours: pipeline_lib/train/runner.py TrainerKilled / runtime/launcher.py LaunchResult.how: SIGKILL from "
       "outside the launcher (its own timeout says 'timed out')"),
    _p("killed", r"exited with code -9 after|exit(?:ed)? (?:with )?(?:code|status) 137\b|"
                 r"exits with return code = -9\b|Signal 9 \(SIGKILL\) received|Exit Code:\s+137\b",
       "exit status 137 = 128 + SIGKILL (shell convention), -9 = SIGKILL (Python subprocess; DeepSpeed launcher "
       "'exits with return code = -9', alisson-anjos/diffusion-pipe-ui#2; torchrun 'Signal 9 (SIGKILL) "
       "received by PID')"),
    # the shell's report of a child that died of SIGKILL: 'Killed' alone on its line (bash job control:
    # '[1]+  Killed  python train.py', 'line 3: 4242 Killed  python ...'), '已杀死' in a zh_CN locale
    _p("killed", r"exitcode\s*:\s*-9\b",
       "torch.distributed.elastic error summary of a rank ended by SIGKILL ('exitcode  : -9 (pid: N)')"),
    _p("killed", BARE_KILLED,
       "bash jobs.c / the shell's strsignal(SIGKILL) 'Killed' (zh_CN: '已杀死'), quoted bare in "
       "CharlesShang/FastMaskRCNN#172, xk-huang/yet-another-vectornet#37, danijar/dreamerv3#203"),
    _p("killed", r"killed by signal: (?:Killed|9\b|SIGKILL)",
       "PaddlePaddle data_loader.cc ('DataLoader process (pid N) exited is killed by signal: Killed.', "
       "PaddlePaddle/PaddleNLP#3867)"),
    # ---- collectives that waited too long or lost their peer (HCCL, NCCL, c10d)
    _p("collective_timeout", r"EI0006|Getting socket times out|Get_Socket_Timeout|Communication_Error_Get_Socket",
       "CANN HCCL error EI0006, in its message-first and code-first wordings: hiyouga/LlamaFactory#5071, "
       "vllm-project/vllm-ascend#486, #5461, #9447, vllm-project/afd-plugin#229"),
    _p("collective_timeout", r"wait socket establish timeout",
       "HCCL hccl_socket_manager.cc, quoted in vllm-project/vllm-ascend#1955 and the HCCL user guide (EI0006)"),
    _p("collective_timeout", r"\bEI0002\b|The wait execution of the Notify register times out",
       "CANN HCCL error EI0002 'The wait execution of the Notify register times out. Reason: The Notify register "
       "has not received the Notify record from remote rank [...]' (hiascend atlaserrorcode_15_0242; "
       "Ascend/pytorch docs/zh/troubleshooting/HCCL_timeout.md)"),
    _p("collective_timeout", r"ExceptionType:\[Heartbeat Lost Occurred\]|status\[LOST\] by rank",
       "HCCL heartbeat.cc / task_exception_handler.cc: a peer rank's process exited or its network dropped "
       "(HCCL user guide hcclug_000055: 'Cluster Exception Location[IP/ID]... ExceptionType:[Heartbeat Lost "
       "Occurred]')"),
    _p("collective_timeout", r"\bEI0013\b|Execution Error ROCE CQE|error cqe status",
       "CANN HCCL EI0013 'An error CQE occurred during operator execution' (RoCE retransmissions exhausted, the "
       "peer gone; HCCL user guide hcclug_000061)"),
    _p("collective_timeout", r"hccl fftsplus task timeout|stuck notify num",
       "CANN runtime device_error_proc.cc ProcessStarsHcclFftsPlusTimeoutErrorInfo (InternLM/lmdeploy#3354)"),
    _p("collective_timeout", r"Watchdog caught collective operation timeout|Some NCCL operations have failed or timed"
                             r" out|Timeout at NCCL work",
       "PyTorch ProcessGroupNCCL.cpp watchdog (hiyouga/LlamaFactory#7396, OFA-Sys/OFA#271, modelscope/FunASR#2006)"),
    _p("collective_timeout", r"\[c10d\] The client socket has timed out after \d+ms while trying to connect",
       "PyTorch c10d socket.cpp: the rendezvous store's peer never answered (verl-project/verl#849, on Ascend)"),
    # ---- a rank that stopped making progress
    _p("collective_timeout", r"ncclRemoteError|remote process exiting prematurely|Timed out after \d+ seconds waiting "
                             r"for clients|gloo/transport/tcp/pair\.cc.*(?:Connection closed by peer|Timed out)",
       "PyTorch/NCCL 'ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
       "prematurely.', c10d TCPStore 'Timed out after N seconds waiting for clients. 1/2 clients joined.', Gloo "
       "tcp/pair.cc 'Connection closed by peer'"),
    _p("collective_timeout", r"Message receive timeout, Suggest configuring timeout time through "
                             r"MS_RECEIVE_MSG_TIMEOUT",
       "MindSpore 2.9 lib/libmindspore_cluster.so: a cluster message (rendezvous, collective metadata) never "
       "arrived"),
    _p("hang", r"Stream synchronize timeout|reason=\[(?:stream sync|task) timeout\]",
       "CANN runtime EE1002 'Stream synchronize timeout' / EH9999 'rtDeviceSynchronize execute failed, "
       "reason=[task timeout]': device work that never finished (Ascend/pytorch#48, #43)"),
    _p("hang", r"ExceptionType:\[Stuck Occurred\]",
       "HCCL task_exception_handler.cc: an operator's enter/exit counts stopped moving for a third of "
       "HCCL_EXEC_TIMEOUT (HCCL user guide hcclug_000055, 'Stuck Occurred')"),
    _p("hang", r"Time out nodes are \[|is timed out\. It may exit with exception|is the first one timed out",
       "MindSpore 2.9 msrun (parallel/cluster/process_entity/_api.py 'Time out nodes are [...]', "
       "candle-org/MindAct#1983) and lib/libmindspore_cluster.so (the scheduler's heartbeat: 'The node: N is "
       "timed out. It may exit with exception, please check this node's log.')"),
    _p("hang", r"^(?:\[rank\d+\]:\s*)?Timeout \(\d+:\d\d:\d\d\)!$",
       "CPython Modules/faulthandler.c dump_traceback_later: 'Timeout (0:05:00)!' and every thread's stack "
       "(vulnerability-lookup/vulnerability-lookup#591, Tribler/tribler#7696)"),
    _p("hang", r"ProcessGroup\w+'s watchdog got stuck for \d+ seconds without making progress",
       "PyTorch ProcessGroupNCCL.cpp heartbeat monitor, and torch_npu's ProcessGroupHCCL: the collective watchdog "
       "itself stopped moving"),
    _p("hang", r"^\[watchdog\] hang: ",
       "ours: the stage's hang watchdog (issue 29), the line it prints when a rank made no new step for "
       "training.hang_timeout_s"),
)


# Lines that say more about a category once it is decided, but do not decide it on their own (quoted as evidence).
CONTEXT = {
    # MindSpore 2.9 mindspore/train/serialization.py, logged after the OSError (also for a permission problem)
    "disk_full": re.compile(r"Failed to save the checkpoint file .*disk space is insufficient"),
    # mindformers 1.9 MFLossMonitor: the loss scale after an overflow step; torch/apex's inf-norm warning
    "nan_or_overflow": re.compile(r"overflow cond: True|NaN or Inf found in input tensor"),
    # ours: runtime/launcher.py NO_OOM_LINE, what the memory evidence showed (and that it showed no OOM kill)
    "killed": re.compile(r"\[launcher\] no memory evidence of an OOM kill: "),
    # ours: each problem of a bad preflight verdict, one "- " line with its numbers and fix (train/preflight.py)
    "preflight": re.compile(r"^\s*- (?:loss rose|loss did not fall|loss is not finite|gradients not finite in|"
                            r"peak host memory|only \d+ of \d+ preflight steps|no step metrics|"
                            r"\d+ step\(s\) are too few|the trainer failed within)"),
    # HCCL names the rank it blames (the cluster's exception location) and the timeout in force
    "collective_timeout": re.compile(r"Cluster Exception Location|HCCL_EXEC_TIMEOUT|HCCL_CONNECT_TIMEOUT"),
}

# Lines that show training reached its steps: a device OOM after one of these happened in a step, not at compile.
STEP_LINE = re.compile(r"step:\[\s*\d+/\s*\d+\]")  # mindformers 1.9 MFLossMonitor / loss_callback.py
# Lines that show the OOM was met while a step's kernels ran: a backward pass (PyTorch autograd frames; MindSpore names
# the gradient kernels under Gradients/ or Bprop/), an op being executed (CANN '[Exec][Op]Execute op failed'), or a
# data-source actor feeding a running graph (MindSpore's HostDSActor / DeviceDSActor). A forward kernel named alone
# is no evidence either way: the phase stays "before the first step", as graph mode lays out memory before it.
STEP_HINT = re.compile(r"\.backward\(|run_backward|in backward$|autograd/__init__\.py|kernel name: \S*(?:Gradients|Bprop)/"
                       r"|\[Exec\]\[Op\]Execute op failed|Execute op failed\. op type"
                       r"|kernel_graph_@ (?:Host|Device)DSActor")
# Lines that show graph compilation (or the load before the first step) was under way when memory ran out:
# MindSpore's compile-phase estimate, its SOMAS memory plan, a traceback through Cell.compile, weights being loaded.
COMPILE_HINT = re.compile(r"It is estimated that the task may collapse due to out of memory"
                          r"|mindspore/nn/cell\.py\", line \d+, in compile\b|_cell_graph_executor\.compile\("
                          r"|somas\.cc|_load_pretrained_model|Loading checkpoint shards|load_checkpoint\(")
# What an unknown failure's evidence quotes: the lines that report an error, so the user sees what doctor saw.
ERROR_LINE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?\w+(?:\.\w+)*(?:Error|Exception|Exit)\b:|\[ERROR\]|\bERROR\b"
                        r"|\b(?:E[A-Z]\d{4}|E\d{5})\b|error code|\bFatal\b|Traceback \(most recent call last\)")
