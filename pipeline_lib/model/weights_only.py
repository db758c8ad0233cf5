"""The model's parameters only: what a consumer of trained weights (SFT, evaluate, export, the next night) loads.

A training checkpoint of mindformers 1.9's LlamaForCausalLM holds the network's parameters (`model.*`, `lm_head.*`)
and what training needs to continue: both AdamW moments (`adam_m.<param>`, `adam_v.<param>`, float32), the step and
data position (`global_step`, `epoch_num`, `step_num`), loss scaling (`scale_sense`, `loss_scale`),
`global_batch_size`, and under gradient accumulation the accumulators (`accu_grads.*`) (names read from a
checkpoint our pretrain stage wrote on this stack). At 7B fp32 that is 81 GB where the weights are 27 GB.
`is_model_weight(name)`: a parameter of the network, by its top-level attribute (the network's own parameters all
live under `model.` and `lm_head.`; every optimizer or training-state name starts otherwise, e.g. `adam_m.model.`),
so nothing of the optimizer can slip through under a name we did not list.
`copy_weights(src, dst)` copies those tensors' records byte for byte (model.ckpt_scan reads where they are; no
MindSpore import, no tensor in memory): the file MindSpore's own rewrite writes, byte for byte
(tests/model/test_weights_only.py); it returns None for a file ckpt_scan leaves to MindSpore.
`write_weights_only(src, dst)` rewrites a checkpoint keeping those (in a MindSpore process; `python -m
pipeline_lib.model.weights_only SRC DST` runs it). Both raise ValueError when `src` holds no model parameter.
"""
from __future__ import annotations

import os
from pathlib import Path

WEIGHT_PREFIXES = ("model.", "lm_head.")


def is_model_weight(name: str) -> bool:
    return name.startswith(WEIGHT_PREFIXES)


def _no_weights(src, names) -> ValueError:
    return ValueError(f"{src}: no model parameter (names under {', '.join(WEIGHT_PREFIXES)}) in "
                      f"{len(names)} tensors; is it a mindformers Llama checkpoint?")


def copy_weights(src: str | Path, dst: str | Path) -> Path | None:
    """`dst`: `src`'s model parameters, copied record by record; None when ckpt_scan does not read `src`."""
    from .ckpt_scan import copy_records, scan

    found = scan(src)
    if found is None:
        return None
    kept = [k for k in found.tensors if is_model_weight(k)]
    if not kept:
        raise _no_weights(src, found.tensors)
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp.ckpt")
    with open(tmp, "wb") as out:
        copy_records(src, out, kept, found)
    os.replace(tmp, dst)
    return dst


def write_weights_only(src: str | Path, dst: str | Path) -> Path:
    """`dst`: `src`'s model parameters, same names, dtypes and bytes; written to a temp name, then renamed."""
    import mindspore as ms

    params = ms.load_checkpoint(str(src))
    kept = [{"name": k, "data": v} for k, v in params.items() if is_model_weight(k)]
    if not kept:
        raise _no_weights(src, params)
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp.ckpt")
    ms.save_checkpoint(kept, str(tmp))
    os.replace(tmp, dst)
    return dst


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python -m pipeline_lib.model.weights_only SRC.ckpt DST.ckpt")
    print(write_weights_only(sys.argv[1], sys.argv[2]))
