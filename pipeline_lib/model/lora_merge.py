"""Fold LoRA adapters into the base weights: W' = W + (alpha / rank) * B @ A, in numpy.

What mindformers 1.9 trains (measured by building LlamaForCausalLM + mindformers.pet.get_pet_model
with pet_type lora and listing its parameters): each target Linear becomes mindpet's `LoRADense`
with the base weight kept at `<module>.weight` [out, in] and two new parameters
`<module>.mindpet_delta_lora_a` [rank, in] and `<module>.mindpet_delta_lora_b` [out, rank], e.g.
`model.layers.0.attention.wq.mindpet_delta_lora_a`. Its forward is
`x W^T + scaling * (x A^T) B^T` with `scaling = lora_alpha / lora_rank` (python float division), so
the folded weight is `W + scaling * B @ A` (transposed for a weight stored [in, out]).

`merge_lora(base, adapter, alpha=, rank=)` returns the merged parameters (no LoRA names left) and a
report. `adapter` may be an adapter-only checkpoint (checkpoint_trainable) or a full SFT checkpoint:
only the lora_a/lora_b pairs are used, optimizer states (adam_m.*, ...) are ignored. Merging runs in
float64 and is cast back to the base weight's dtype.

Limits: LoRA on Linear weights only (no bias adapters, no DoRA); a square weight is assumed to be
stored [out, in] (mindformers Linear default transpose_b=True, true for every Llama projection).
Raises LoraMergeError naming the parameter or config field (sft.lora_rank, sft.target_modules) and
the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field


import numpy as np

from .. import killpoints

LORA_A = ".mindpet_delta_lora_a"
LORA_B = ".mindpet_delta_lora_b"
LORA_MARK = ".mindpet_delta_lora_"


class LoraMergeError(ValueError):
    """The adapter cannot be merged into this base (names, shapes or config disagree)."""


@dataclass
class MergeReport:
    scale: float
    rank: int
    modules: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    max_abs_delta: float = 0.0

    def to_json(self) -> dict:
        return {"scale": self.scale, "rank": self.rank, "merged_modules": len(self.modules),
                "modules": self.modules, "ignored_adapter_entries": len(self.ignored),
                "max_abs_delta": self.max_abs_delta}


def lora_scale(alpha: float, rank: int) -> float:
    """The factor mindpet's LoRADense applies: lora_alpha / lora_rank."""
    if rank < 1:
        raise LoraMergeError(f"sft.lora_rank={rank!r}: must be >= 1")
    return alpha / rank


def has_lora(params: dict) -> bool:
    return any(LORA_MARK in name for name in params)


def lora_pairs(params: dict, base_names: set[str] | None = None) -> dict[str, tuple[str, str]]:
    """module prefix -> (lora_a name, lora_b name). With `base_names`, prefixes without a base
    `<prefix>.weight` (optimizer states such as adam_m.<...>) are skipped."""
    pairs: dict[str, tuple[str, str]] = {}
    for name in params:
        if not name.endswith(LORA_A):
            continue
        prefix = name[: -len(LORA_A)]
        if base_names is not None and prefix + ".weight" not in base_names:
            continue
        b_name = prefix + LORA_B
        if b_name not in params:
            raise LoraMergeError(f"adapter has {name} but no {b_name}; the adapter checkpoint is incomplete, "
                                 "export it again from the SFT run")
        pairs[prefix] = (name, b_name)
    return pairs


def target_modules_of(pairs: dict[str, tuple[str, str]]) -> list[str]:
    """Child names that carry adapters, e.g. ['wk', 'wo', 'wq', 'wv']."""
    return sorted({prefix.rsplit(".", 1)[-1] for prefix in pairs})


def target_regex(modules: list[str]) -> str:
    """The regex mindformers' LoraAdapter matches against child cell names (as the training yaml)."""
    return "|".join(rf".*{m}$" for m in modules)


def lora_delta(a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """scale * B @ A in float64, shape [out, in]."""
    return scale * (b.astype(np.float64) @ a.astype(np.float64))


def merge_lora(base: dict[str, np.ndarray], adapter: dict[str, np.ndarray], *, alpha: float, rank: int,
               target_modules: list[str] | None = None, scale: float | None = None
               ) -> tuple[dict[str, np.ndarray], MergeReport]:
    """Base parameters with every adapter folded in, and no LoRA parameter left.

    `scale` overrides alpha / rank (only to show that the logits check catches a wrong scale);
    `target_modules` (sft.target_modules), when given, must match the modules found in the adapter.
    """
    scale = lora_scale(alpha, rank) if scale is None else float(scale)
    base_plain = {k: v for k, v in base.items() if LORA_MARK not in k}
    pairs = lora_pairs(adapter, set(base_plain))
    if not pairs:
        raise LoraMergeError("the adapter checkpoint holds no '<module>.mindpet_delta_lora_a/_b' pair that matches "
                             "a base '<module>.weight'; pass the SFT run's adapter checkpoint and its base")
    found = target_modules_of(pairs)
    if target_modules is not None and sorted(set(target_modules)) != found:
        raise LoraMergeError(f"sft.target_modules={sorted(target_modules)} but the adapter carries {found}; "
                             "set sft.target_modules to what the SFT run trained")
    report = MergeReport(scale=scale, rank=rank)
    report.ignored = sorted(k for k in adapter if LORA_MARK in k and k.rsplit(".", 1)[0] not in pairs)
    merged = dict(base_plain)
    for prefix, (a_name, b_name) in sorted(pairs.items()):
        w_name = prefix + ".weight"
        w, a, b = base_plain[w_name], adapter[a_name], adapter[b_name]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise LoraMergeError(f"{a_name} {a.shape} and {b_name} {b.shape} are not [rank, in] and [out, rank]")
        if a.shape[0] != rank:
            raise LoraMergeError(f"sft.lora_rank={rank} but {a_name} has rank {a.shape[0]}; set sft.lora_rank="
                                 f"{a.shape[0]} (the rank the adapter was trained with)")
        delta = lora_delta(a, b, scale)
        if w.shape == delta.shape:
            pass
        elif w.shape == delta.T.shape:
            delta = delta.T
        else:
            raise LoraMergeError(f"{w_name} has shape {w.shape}, the adapter update B @ A has {delta.shape}; "
                                 "the adapter was trained on another base model")
        merged[w_name] = (w.astype(np.float64) + delta).astype(w.dtype)
        report.modules.append(prefix)
        if len(report.modules) == 1:
            killpoints.reached("export.mid_merge")
        report.max_abs_delta = max(report.max_abs_delta, float(np.abs(delta).max()))
    return merged, report


def adapter_config(report: MergeReport, alpha: float) -> dict:
    """The pet_config that rebuilds the training graph (used for the base+adapter logits check)."""
    return {"lora_rank": report.rank, "lora_alpha": alpha,
            "target_modules": target_regex(sorted({m.rsplit(".", 1)[-1] for m in report.modules}))}
