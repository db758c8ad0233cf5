"""Memory planner and parallel-layout advisor: do the arithmetic before the run.

- params:      parameter count by component (Llama: GQA attention, SwiGLU FFN, RMSNorm, tied/untied head)
- activations: Korthikanti et al. 2022 activation bytes per layer, 1F1B micro batches in flight
- memory:      MemoryBreakdown per device (one field per term) for a layout; `estimate(cfg)`
- zero:        the ZeRO paper's and DeepSpeed's published model-state formulas (reference points)
- cost:        relative step time of a layout (recompute, bubble, TP/DP communication)
- advisor:     enumerate layouts, drop those that do not fit or break the config rules, rank the rest
- oom:         out-of-memory remedies by phase (initialization, forward, backward) and the recompute choices
- readings:    Ascend readings (npu-smi info, MindSpore memory statistics) and MFU against a cited peak
- report:      table, config patch (yaml), JSON
- cli:         `llm-pipeline plan`, `predicted_peak_gb` for `validate` and the training preflight
Formulas, sources and assumptions: docs/planner.md. Pure Python, no MindSpore or Prefect import.
"""
from .advisor import Candidate, Layout, Plan, PlanRequest, Rejection, plan
from .cli import memory_warning, plan_main, predicted_peak_gb, predicted_vs_measured
from .cost import Cost, Hardware
from .memory import MemoryBreakdown, estimate, estimate_numbers, model_state_bytes
from .params import ModelShape, ParamCount, count_params

__all__ = ["Candidate", "Cost", "Hardware", "Layout", "MemoryBreakdown", "ModelShape", "ParamCount", "Plan",
           "PlanRequest", "Rejection", "count_params", "estimate", "estimate_numbers", "memory_warning",
           "model_state_bytes", "plan", "plan_main", "predicted_peak_gb", "predicted_vs_measured"]
