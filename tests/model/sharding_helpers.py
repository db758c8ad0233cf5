"""Sharded-checkpoint helpers for the export tests: strategy files written with node_strategy_pb2.

Strategy semantics (MindSpore): a device matrix `dev_matrix` (e.g. [dp, mp]); a tensor map entry m
for tensor dim d means "split d over device-matrix dim len(dev_matrix) - 1 - m", -1 = not split. A
rank's coordinates are its row-major index in the device matrix (per pipeline stage).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from random_init import save_params


def write_strategy(path: Path, layouts: dict[str, list[int]], dev_matrix: list[int], stage: int = 0) -> Path:
    """One strategy file (what a rank of pipeline stage `stage` saves) for the given tensor maps."""
    from mindspore.train import node_strategy_pb2 as pb

    smap = pb.ParallelStrategyMap()
    smap.current_stage = 1
    item = smap.parallel_strategy_item.add()
    item.node_name = f"Default/MatMul-op{stage}"
    item.parallel_strategys.stage = stage
    item.parallel_strategys.parallel_strategy.add().dim.extend([1, dev_matrix[-1]])
    for name, tmap in layouts.items():
        layout_item = smap.parallel_layout_item.add()
        layout_item.param_name = name
        lay = layout_item.parallel_layouts
        lay.dev_matrix.add().dim.extend(dev_matrix)
        lay.tensor_map.add().dim.extend(tmap)
        lay.param_split_shape.add()
        lay.indices_offset.add()
        lay.field, lay.opt_weight_shard_step, lay.opt_weight_shard_size = 0, 0, 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(smap.SerializeToString())
    return path


def shard(arr: np.ndarray, tmap: list[int], dev_matrix: list[int], rank_in_stage: int) -> np.ndarray:
    """The slice of `arr` a rank holds under tensor map `tmap`."""
    coord = np.unravel_index(rank_in_stage, dev_matrix)
    index = []
    for d, m in enumerate(tmap):
        if m == -1:
            index.append(slice(None))
            continue
        dev_dim = len(dev_matrix) - 1 - m
        n, k = dev_matrix[dev_dim], coord[dev_dim]
        size = arr.shape[d] // n
        index.append(slice(k * size, (k + 1) * size))
    return np.ascontiguousarray(arr[tuple(index)])


def write_sharded(root: Path, params: dict[str, np.ndarray], layouts: dict[str, list[int]], dev_matrix: list[int],
                  stage_of: dict[str, int] | None = None, ckpt_name: str = "llama_rank-1_10.ckpt") -> tuple[Path, Path]:
    """Per-rank checkpoints under root/checkpoint/rank_N and strategy files under root/strategy/."""
    stage_of = stage_of or {k: 0 for k in params}
    per_stage = int(np.prod(dev_matrix))
    for stage in sorted(set(stage_of.values())):
        names = [k for k in params if stage_of[k] == stage]
        write_strategy(root / "strategy" / f"ckpt_strategy_rank_{stage * per_stage}.ckpt",
                       {k: layouts[k] for k in names}, dev_matrix, stage)
        for r in range(per_stage):
            save_params({k: shard(params[k], layouts[k], dev_matrix, r) for k in names},
                        root / "checkpoint" / f"rank_{stage * per_stage + r}" / ckpt_name)
    return root / "checkpoint", root / "strategy"


def llama_tp_layouts(names) -> dict[str, list[int]]:
    """Megatron-style 2-way tensor parallel of the Llama weights (dev_matrix [mp])."""
    out = {}
    for n in names:
        if any(k in n for k in ("wq.", "wk.", "wv.", "w1.", "w3.", "embedding", "lm_head")):
            out[n] = [0, -1]   # column parallel / vocab parallel: split dim 0
        elif any(k in n for k in ("wo.", "w2.")):
            out[n] = [-1, 0]   # row parallel: split dim 1
        else:
            out[n] = [-1]      # norms replicated
    return out
