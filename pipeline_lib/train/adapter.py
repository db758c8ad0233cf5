"""LoRA adapter files: cut the adapter out of a finished SFT checkpoint, check it, describe it.

Layout written into `<sft stage>/adapter/`:
    adapter.ckpt         only the LoRA factors, MindSpore checkpoint, mindformers' names, e.g.
                         model.layers.0.attention.wq.mindpet_delta_lora_a  [rank, in]
                         model.layers.0.attention.wq.mindpet_delta_lora_b  [out, rank]
    adapter_config.json  pet_type, rank, alpha, dropout, scaling (alpha / rank), target_modules and
                         their regex, the base checkpoint (path, sha256, size), model dims, every
                         parameter's shape, the trainable count and the SFT checkpoint it came from.
mindpet's LoRADense computes `x W^T + (alpha / rank) * (x A^T) B^T`, so one target with a weight of
[out, in] trains rank x (in + out) numbers; `expected_lora_shapes` gives them from the ModelConfig.

What the extraction checks (`extract_adapter`, in a MindSpore subprocess; the caller never imports it):
the LoRA names and shapes are exactly the expected ones; the optimizer holds moments for the LoRA
factors and nothing else (LoRA alone was trained); every weight the SFT checkpoint shares with the
base is bitwise equal to the base (the base was loaded, not randomly initialised, and stayed frozen);
all factors are finite. The base checkpoint file itself is only read.

Limits: Llama projections only (wq wk wv wo w1 w2 w3); one rank's checkpoint (data parallel ranks
hold the same adapter). Raises AdapterError naming the config field (sft.target_modules,
sft.lora_rank, model.*) and the fix; AdapterError also when the subprocess fails or times out.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .mindformers_yaml import lora_target_regex
from ..config.validate import lora_model_name
from ..model.lora_merge import LORA_MARK
from ..model.shapes import PROJECTIONS as MODULE_PATHS
from ..model.shapes import projection_dims
from ..runtime.launcher import launch_module
OPTIMIZER_PREFIXES = ("adam_m.", "adam_v.", "moment1.", "moment2.", "accu_grads.", "accumulated_grads.")
ADAPTER_FILE = "adapter.ckpt"
CONFIG_FILE = "adapter_config.json"
_MARK = "ADAPTER_RESULT "


class AdapterError(ValueError):
    """The adapter does not match the config, or training touched what it must not."""


def target_dims(model, target: str) -> tuple[int, int]:
    """(in, out) features of a Llama projection for a ModelConfig `model`."""
    dims = projection_dims(model, target)
    if dims is None:
        raise AdapterError(f"sft.target_modules contains {target!r}: not a Llama projection; use {sorted(MODULE_PATHS)}")
    return dims


def expected_lora_shapes(model, target_modules: list[str], rank: int) -> dict[str, tuple[int, int]]:
    """name -> shape of every LoRA factor: A [rank, in] and B [out, rank] per target per layer."""
    shapes = {}
    for layer in range(model.num_layers):
        for target in target_modules:
            d_in, d_out = target_dims(model, target)
            prefix = f"model.layers.{layer}.{MODULE_PATHS[target]}{LORA_MARK}"
            shapes[prefix + "a"] = (rank, d_in)
            shapes[prefix + "b"] = (d_out, rank)
    return shapes


def trainable_count(model, target_modules: list[str], rank: int) -> int:
    """rank x (in + out) summed over targets and layers: what LoRA trains."""
    return sum(a * b for a, b in expected_lora_shapes(model, target_modules, rank).values())


def is_lora_param(name: str) -> bool:
    """A LoRA factor of the network (not an optimizer moment of one)."""
    return LORA_MARK in name and not name.startswith(OPTIMIZER_PREFIXES)


def adapter_config(cfg, *, base: dict, result: dict, source: str) -> dict:
    """The adapter_config.json content (see the module docstring)."""
    s, m = cfg.sft, cfg.model
    return {"format": "mindformers-lora-v1", "pet_type": "lora", "lora_rank": s.lora_rank,
            "lora_alpha": s.lora_alpha, "lora_dropout": s.lora_dropout, "scaling": s.lora_alpha / s.lora_rank,
            "target_modules": list(s.target_modules), "target_regex": lora_target_regex(list(s.target_modules)),
            "model_name": lora_model_name(cfg), "base_model_name": m.name,
            "model": {k: getattr(m, k) for k in ("hidden_size", "num_layers", "num_heads", "n_kv_heads",
                                                  "intermediate_size", "vocab_size", "seq_length")},
            "base_checkpoint": base, "source_checkpoint": source,
            "parameters": result["lora"], "trainable_params": result["lora_numel"],
            "checks": {k: result[k] for k in ("optimizer_params", "base_params_compared", "base_params_changed")}}


def write_adapter_config(out_dir: str | Path, config: dict) -> Path:
    path = Path(out_dir) / CONFIG_FILE
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)
    return path


def extract_adapter(sft_ckpt: str | Path, base_ckpt: str | Path, out_dir: str | Path,
                    expected: dict[str, tuple[int, int]], timeout_s: float = 600, *, optimizer: str | None = None,
                    frozen_in_base: int | None = None) -> dict:
    """Write out_dir/adapter.ckpt from `sft_ckpt` after the checks above; returns their result dict. A split SFT
    checkpoint (train.checkpoint_split) passes its `optimizer` file and `frozen_in_base`, the frozen weights its
    split already found equal to the base byte for byte (the file itself holds none of them)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    request = {"sft": str(sft_ckpt), "base": str(base_ckpt), "out": str(Path(out_dir) / ADAPTER_FILE),
               "expected": {k: list(v) for k, v in expected.items()}, "optimizer": optimizer,
               "frozen_in_base": frozen_in_base}
    lines: list[str] = []
    done = launch_module("pipeline_lib.train.adapter", [json.dumps(request)], cwd=out_dir, timeout_s=timeout_s,
                         on_line=lambda line: lines.append(line) if line.startswith(_MARK) else None)
    if done.timed_out:
        raise AdapterError(f"adapter extraction from {sft_ckpt} timed out after {timeout_s:g}s")
    if not lines:
        raise AdapterError(f"adapter extraction from {sft_ckpt} failed: " + done.describe("adapter extraction"))
    result = json.loads(lines[-1][len(_MARK):])
    if result.get("error"):
        raise AdapterError(result["error"])
    return result


def _check(params: dict, base: dict, expected: dict, frozen_in_base: int | None = None) -> tuple[dict, list[str], list[str]]:
    import numpy as np

    lora = {n: p.asnumpy() for n, p in params.items() if is_lora_param(n)}
    got = {n: list(a.shape) for n, a in lora.items()}
    if got != expected:
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        wrong = sorted(n for n in set(got) & set(expected) if got[n] != expected[n])
        raise AdapterError(f"the SFT checkpoint's LoRA factors differ from the config: missing {missing[:4]}, "
                           f"unexpected {extra[:4]}, wrong shape {[(n, got[n]) for n in wrong[:4]]}; check "
                           "sft.target_modules / sft.lora_rank / model.* against the run that trained it")
    bad = [n for n, a in lora.items() if not np.isfinite(a).all()]
    if bad:
        raise AdapterError(f"non-finite values in LoRA factors {bad[:4]}: lower sft.learning_rate and rerun")
    optimized = sorted(n[len("adam_m."):] for n in params if n.startswith("adam_m."))
    if set(optimized) != set(lora):
        raise AdapterError(f"the optimizer also trained non-LoRA parameters {sorted(set(optimized) - set(lora))[:4]}"
                           " (the base was not frozen); check the pet_config in the generated sft yaml")
    # weights have dotted names (model.*, lm_head.weight); step counters and loss scale do not
    shared = [n for n in base if n in params and "." in n and not n.startswith(OPTIMIZER_PREFIXES)]
    changed = [n for n in shared if not np.array_equal(base[n].asnumpy(), params[n].asnumpy())]
    if not shared and not frozen_in_base:
        raise AdapterError("the SFT checkpoint shares no weight name with the base checkpoint: it was trained on "
                           "another model; check model.* and the base checkpoint")
    if changed:
        raise AdapterError(f"{len(changed)} of {len(shared)} base weights differ from the base checkpoint after SFT, "
                           f"e.g. {changed[:4]}: the base was not loaded (random init) or not frozen; pass the "
                           "base as load_checkpoint with run_mode finetune")
    return lora, optimized, shared


def _main(request: dict) -> dict:
    import mindspore as ms

    from ..model.checkpoint_format import load_mindspore  # .ckpt or Checkpoint 2.0 (training.checkpoint_format)

    params = load_mindspore(request["sft"])
    if request.get("optimizer"):
        params.update(load_mindspore(request["optimizer"]))
    base = load_mindspore(request["base"])
    lora, optimized, shared = _check(params, base, request["expected"], request.get("frozen_in_base"))
    from ..killpoints import arm_checkpoint_writes

    arm_checkpoint_writes("sft.adapter.mid_save")  # the reliability suite's point; a no-op otherwise
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in sorted(lora.items())], request["out"])
    return {"lora": {n: list(a.shape) for n, a in sorted(lora.items())}, "lora_numel": int(sum(a.size for a in lora.values())),
            "optimizer_params": len(optimized),
            "base_params_compared": len(shared) or int(request.get("frozen_in_base") or 0), "base_params_changed": 0,
            "sft_params": len(params), "error": None}


if __name__ == "__main__":
    try:
        out = _main(json.loads(sys.argv[1]))
    except AdapterError as err:
        out = {"error": str(err)}
    print(_MARK + json.dumps(out), flush=True)
