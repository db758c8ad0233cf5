"""Published model-state formulas, kept as reference points for the planner's own arithmetic.

ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", section 5, figure 1): mixed-precision Adam keeps 2P (fp16 weights) + 2P (fp16
gradients) + K*P (K = 12: fp32 weights, momentum, variance) bytes; with N data-parallel ranks
  stage 0 (plain data parallel):    (2 + 2 + K) * P
  stage 1 (P_os, optimizer states): 2P + 2P + K*P/N
  stage 2 (P_os+g, + gradients):    2P + (2 + K)*P/N
  stage 3 (P_os+g+p, + weights):    (2 + 2 + K)*P/N
DeepSpeed's estimators (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, per GPU, bytes):
  estimate_zero2_model_states_mem_needs: offload 2P; else 2P + 18P/N
      (18 = 2 fp16 grads + 4 fp32 grads + 4 fp32 weights + 8 fp32 moments; older DeepSpeed
      releases wrote 4P + 16P/N for the same case)
  estimate_zero3_model_states_mem_needs: 4*L + 18P/N without offload; 4*L + 2P/N with the
      optimizer offloaded; 4*L with weights and optimizer offloaded (L = largest layer's params)
DeepSpeed prints these in GiB (2**30 bytes); the functions here return bytes.
The planner models MindSpore's optimizer_shard as ZeRO stage 1; the others are not layout knobs.
"""
from __future__ import annotations


def zero_paper_bytes(params: float, n: int, stage: int, k: int = 12) -> float:
    """Model-state bytes per device for ZeRO `stage` (0-3) over `n` data-parallel ranks."""
    if stage == 0:
        return (2 + 2 + k) * params
    if stage == 1:
        return 4 * params + k * params / n
    if stage == 2:
        return 2 * params + (2 + k) * params / n
    if stage == 3:
        return (2 + 2 + k) * params / n
    raise ValueError(f"ZeRO stage={stage}: expected 0, 1, 2 or 3")


def deepspeed_zero2_gpu_bytes(params: int, num_gpus: int, *, cpu_offload: bool = False) -> int:
    if cpu_offload:
        return int(2 * params)
    return int(2 * params + int(18 * params / num_gpus))


def deepspeed_zero3_gpu_bytes(params: int, largest_layer_params: int, num_gpus: int, *,
                              cpu_offload: bool = False, cpu_offload_params: bool = False) -> int:
    largest = 4 * largest_layer_params  # the gathered fp16 weights + grads of one layer
    if cpu_offload and cpu_offload_params:
        return int(largest)
    if cpu_offload:
        return int(largest + int(2 * params / num_gpus))
    return int(largest + int(18 * params / num_gpus))
