"""Merge a tensor/pipeline-parallel checkpoint (one file per rank + strategy) into one .ckpt.

Layout read (what mindformers writes): `<ckpt_dir>/rank_<N>/<prefix>-<epoch>_<step>.ckpt` for every
rank, and the strategy either as one file or as a folder of per-rank files
(`<output>/strategy/ckpt_strategy_rank_<N>.ckpt`, one per pipeline stage being enough). Per-stage
strategy files are first combined with `mindspore.merge_pipeline_strategys`; then
`mindspore.transform_checkpoints(src, dst, prefix, src_strategy, None)` (None = unsharded target)
rebuilds every full tensor. All of this runs on CPU.

Picking the file per rank: mindformers keeps several checkpoints per rank and transform_checkpoints
would take the lexicographically last (`-100_1` sorts before `-20_1`), so `pick_rank_checkpoints`
chooses the highest step (or the step asked for) and stages exactly one file per rank, linked into a
scratch folder.

Limits: checkpoints saved with remove_redundancy are not supported by transform_checkpoints; the
merged file keeps every tensor of the source, optimizer states included, unless `--weights-only` (the handoff to
consumers, model.checkpoint_cache, asks for it: model.weights_only keeps the network's parameters). A folder with no strategy and several ranks is taken as data parallel (rank_0 is
used) only if every rank holds identical tensors.
Raises ShardMergeError naming the folder/file and the fix.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from pathlib import Path

STEP_RE = re.compile(r"-(\d+)_(\d+)\.ckpt$")
RANK_RE = re.compile(r"^rank_(\d+)$")


class ShardMergeError(ValueError):
    """Sharded checkpoint that cannot be merged as given."""


def _step_key(path: Path) -> tuple:
    m = STEP_RE.search(path.name)
    return (int(m.group(1)), int(m.group(2)), path.stat().st_mtime) if m else (-1, -1, path.stat().st_mtime)


def rank_dirs(ckpt_dir: str | Path) -> dict[int, Path]:
    out = {}
    for p in Path(ckpt_dir).iterdir() if Path(ckpt_dir).is_dir() else []:
        m = RANK_RE.match(p.name)
        if m and p.is_dir():
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


def is_sharded_dir(path: str | Path) -> bool:
    return Path(path).is_dir() and bool(rank_dirs(path))


def pick_rank_checkpoints(ckpt_dir: str | Path, step: int | None = None, suffix: str | None = None
                          ) -> dict[int, Path]:
    """rank -> the checkpoint file to use: the highest (epoch, step), or the one whose step is `step`,
    or whose name ends with `suffix` (e.g. "-3_20.ckpt")."""
    ranks = rank_dirs(ckpt_dir)
    if not ranks:
        raise ShardMergeError(f"{str(ckpt_dir)!r} has no rank_<N>/ folders; pass the checkpoint folder of a "
                              "parallel run (…/checkpoint) or a single .ckpt file")
    if list(ranks) != list(range(len(ranks))):
        raise ShardMergeError(f"{str(ckpt_dir)!r} has ranks {list(ranks)}: a rank folder is missing, "
                              "copy every rank's checkpoint before merging")
    picked = {}
    for rank, folder in ranks.items():
        files = sorted(folder.glob("*.ckpt"), key=_step_key)
        if step is not None:
            files = [f for f in files if _step_key(f)[1] == step]
        if suffix is not None:
            files = [f for f in files if f.name.endswith(suffix)]
        if not files:
            want = "" if step is None and suffix is None else f" for step {step}" if suffix is None else f" *{suffix}"
            raise ShardMergeError(f"{folder}: no .ckpt file{want}; pick a step every rank saved")
        picked[rank] = files[-1]
    return picked


def find_strategy(ckpt_dir: str | Path) -> Path | None:
    """The strategy next to a mindformers checkpoint folder: ../strategy/ or a *strategy*.ckpt file."""
    ckpt_dir = Path(ckpt_dir)
    for cand in (ckpt_dir / "strategy", ckpt_dir.parent / "strategy"):
        if cand.is_dir() and any(cand.glob("*.ckpt")):
            return cand
    files = sorted(glob.glob(str(ckpt_dir / "*strategy*.ckpt")) + glob.glob(str(ckpt_dir.parent / "*strategy*.ckpt")))
    return Path(files[0]) if files else None


def _strategy_file(strategy: Path, scratch: Path) -> str:
    import mindspore as ms

    if strategy.is_file():
        return str(strategy)
    files = sorted(strategy.glob("*.ckpt")) + sorted(strategy.glob("*.json"))
    if not files:
        raise ShardMergeError(f"strategy folder {str(strategy)!r} holds no strategy file (*.ckpt)")
    if len(files) == 1:
        return str(files[0])
    merged = scratch / "merged_strategy.ckpt"
    ms.merge_pipeline_strategys(str(strategy), str(merged))
    return str(merged)


def _identical_ranks(picked: dict[int, Path]) -> bool:
    """True when every rank holds the same tensors (data parallel). Same shapes are not enough: the
    shards of a 2-way split of a square weight have equal shapes."""
    import mindspore as ms
    import numpy as np

    first = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(picked[0])).items()}
    for path in list(picked.values())[1:]:
        other = ms.load_checkpoint(str(path))
        if set(other) != set(first) or any(not np.array_equal(first[k], other[k].asnumpy()) for k in first):
            return False
    return True


def merge_sharded_checkpoint(ckpt_dir: str | Path, out_file: str | Path, strategy: str | Path | None = None,
                             step: int | None = None, suffix: str | None = None) -> Path:
    """Write the unsharded checkpoint of a parallel run to `out_file`; returns its path.

    `strategy`: a strategy file or folder; default: found next to `ckpt_dir` (find_strategy).
    """
    import mindspore as ms

    picked = pick_rank_checkpoints(ckpt_dir, step, suffix)
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    strategy = Path(strategy) if strategy else find_strategy(ckpt_dir)
    if strategy is None:
        if len(picked) > 1 and not _identical_ranks(picked):
            raise ShardMergeError(f"{str(ckpt_dir)!r}: ranks hold different tensors (tensor/pipeline parallel) and no "
                                  "strategy file was found; pass the run's strategy folder (output/strategy)")
        shutil.copyfile(picked[0], out_file)
        return out_file
    if not strategy.exists():
        raise ShardMergeError(f"strategy {str(strategy)!r} not found; pass the run's output/strategy folder")
    with tempfile.TemporaryDirectory(prefix="shard-merge-", dir=out_file.parent) as tmp:
        scratch = Path(tmp)
        src = scratch / "src"
        for rank, f in picked.items():
            (src / f"rank_{rank}").mkdir(parents=True)
            os.symlink(f.resolve(), src / f"rank_{rank}" / f.name)
        strategy_file = _strategy_file(strategy, scratch)
        try:
            ms.transform_checkpoints(str(src), str(scratch / "dst"), "merged", strategy_file, None)
        except Exception as err:
            raise ShardMergeError(f"transform_checkpoints failed for {str(ckpt_dir)!r} with strategy "
                                  f"{str(strategy)!r}: {err}; check that the strategy belongs to this run") from err
        produced = sorted((scratch / "dst").rglob("*.ckpt"))
        if len(produced) != 1:
            raise ShardMergeError(f"transform_checkpoints produced {len(produced)} files, expected 1")
        os.replace(produced[0], out_file)
    return out_file


if __name__ == "__main__":  # run by model.checkpoint_cache: MindSpore stays out of the orchestrating process
    import argparse

    ap = argparse.ArgumentParser(description="merge a parallel run's rank checkpoints into one .ckpt")
    ap.add_argument("ckpt_dir")
    ap.add_argument("out_file")
    ap.add_argument("--strategy")
    ap.add_argument("--step", type=int)
    ap.add_argument("--weights-only", action="store_true",
                    help="keep the model's parameters only (model.weights_only): no optimizer or training state")
    a = ap.parse_args()
    merged = merge_sharded_checkpoint(a.ckpt_dir, a.out_file, a.strategy, a.step)
    if a.weights_only:
        from .weights_only import write_weights_only

        write_weights_only(merged, merged)
    print(merged)
