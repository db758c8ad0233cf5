"""A training checkpoint as two files: the weights, and the optimizer state beside them; a LoRA one as the adapter alone.

mindformers 1.9's CheckpointMonitor (legacy `.ckpt` format) writes one file per rank and save: the network's
parameters, the AdamW moments, the step counters and the loss scale (model.weights_only names them). Its
`save_trainable_params` only adds a copy of the trainable parameters (`checkpoint_trainable/`) next to that whole
file, and its `save_optimizer` applies only to `use_legacy_format: False` (mindformers/core/callback/callback.py,
CheckpointMonitor.__init__ and save_checkpoint_network; docs/mindformers-facts.md). So the split is a post-save
step of ours, run by CheckpointManager.sync on each newly verified file, record by record (model.ckpt_scan: no
MindSpore import, no tensor in memory):
- `split_checkpoint(path, optimizer_dst, keep=..., base=...)`: `path` becomes the model's weights that `keep`
  accepts (all of them for pretraining: the file is cut after its weights, which mindformers writes first, so the
  weights are never rewritten; the LoRA factors for SFT, rewritten under a temp name and renamed); `optimizer_dst`
  gets every other record: `adam_m.*`, `adam_v.*`, `global_step`, `step_num`, `epoch_num`, `loss_scale`, `scale_sense`, ...
  Weights `keep` rejects (SFT's frozen base) are dropped only after they are found byte for byte in `base`: a file
  that would need a frozen weight the base does not hold is refused, not shrunk.
- `optimizer_file(path)`: where the optimizer part of `<out>/checkpoint/rank_N/<name>` lives:
  `<out>/checkpoint_optimizer/rank_N/<name>` (outside checkpoint/, so mindformers' own keep_checkpoint_max rotation,
  which counts the files of checkpoint/rank_N, never sees it).
- `join_checkpoint(parts, dst, base=None)`: one file mindformers can resume from: the records of `parts` (weights +
  optimizer state) plus, from `base`, every model weight the parts lack (a LoRA file's frozen base).
- `hand_off_weights(path, dst)`: the weights-only hand-off of a split file is that file: `dst` is a hard link to it
  (a byte copy across filesystems), nothing rewritten; None when `path` was not split.
- `resume_record(latest, dest_dir)`: a latest_checkpoint.json record whose rank paths are joined files under
  `dest_dir/rank_N/` (mindformers 1.9 resumes a single file per rank); ranks whose file is whole stay as they are.

The two files are plain MindSpore checkpoints: `mindspore.load_checkpoint` reads each (tests/train/test_checkpoints.py).
Used for `.ckpt`; a safetensors writer calls the same three functions with its own reader and writer when it exists.
Raises CheckpointSplitError (a frozen weight missing from or different in the base, a file with no model weight).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..model.ckpt_scan import Scan, copy_records, scan
from ..model.weights_only import is_model_weight

OPTIMIZER_DIR = "checkpoint_optimizer"
RESUME_DIR = "checkpoint_resume"


class CheckpointSplitError(ValueError):
    """A checkpoint cannot be split or joined as asked (the message names the file, the tensor and the fix)."""


class Unreadable(CheckpointSplitError):
    """A file the in-place reader does not understand (encrypted, map tensors): it stays whole."""


def is_optimizer_state(name: str) -> bool:
    """Everything of a training checkpoint that is not a model weight: moments, counters, loss scale."""
    return not is_model_weight(name)


def optimizer_file(path: str | Path) -> Path:
    """`<out>/checkpoint/rank_N/<name>` -> `<out>/checkpoint_optimizer/rank_N/<name>`."""
    path = Path(path)
    return path.parent.parent.parent / OPTIMIZER_DIR / path.parent.name / path.name


@dataclass(frozen=True)
class Split:
    weights: Path
    optimizer: Path
    weight_names: int      # tensors kept in the weights file
    optimizer_names: int   # tensors moved to the optimizer file
    dropped: list[str]     # frozen weights left to the base (found there byte for byte)


def _write(dst: Path, sources: list[tuple[Path, list[str], Scan]]) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".tmp-{dst.name}.{os.getpid()}")
    with open(tmp, "wb") as out:
        for src, tags, found in sources:
            if tags:
                copy_records(src, out, tags, found)
    os.replace(tmp, dst)


def _record_bytes(path: Path, found: Scan, name: str) -> bytes:
    with open(path, "rb") as f:
        chunks = []
        for start, stop in found.tensors[name].records:
            f.seek(start)
            chunks.append(f.read(stop - start))
    return b"".join(chunks)


def _scanned(path: Path, what: str) -> Scan:
    found = scan(path)
    if found is None:
        raise Unreadable(f"{path}: {what} is not a MindSpore .ckpt file this reader understands (encrypted, "
                                   "map tensors or damaged); keep the file whole")
    return found


def split_checkpoint(path: str | Path, optimizer_dst: str | Path, *, keep: Callable[[str], bool] = is_model_weight,
                     base: str | Path | None = None, base_scan: Scan | None = None) -> Split:
    """Rewrite `path` to the model weights `keep` accepts and write the rest of the training state to
    `optimizer_dst`; weights `keep` rejects must equal `base`'s (see the module docstring)."""
    path, optimizer_dst = Path(path), Path(optimizer_dst)
    found = _scanned(path, "the checkpoint")
    weights = [k for k in found.tensors if is_model_weight(k) and keep(k)]
    frozen = [k for k in found.tensors if is_model_weight(k) and not keep(k)]
    state = [k for k in found.tensors if is_optimizer_state(k)]
    if not weights:
        raise CheckpointSplitError(f"{path}: none of its {len(found.tensors)} tensors is a weight to keep; is it a "
                                   "mindformers Llama checkpoint of this run?")
    if frozen:
        if base is None:
            raise CheckpointSplitError(f"{path}: {len(frozen)} frozen weights (e.g. {frozen[0]}) and no base "
                                       "checkpoint to leave them to")
        base = Path(base)
        bs = base_scan or _scanned(base, "the base checkpoint")
        missing = [k for k in frozen if k not in bs.tensors]
        changed = [k for k in frozen if k not in missing and _record_bytes(path, found, k) != _record_bytes(base, bs, k)]
        if missing or changed:
            raise CheckpointSplitError(
                f"{path}: {len(missing)} frozen weights missing from the base {base} (e.g. {missing[:2]}) and "
                f"{len(changed)} different from it (e.g. {changed[:2]}): the base was not loaded or not frozen; "
                "check the pet_config of the generated yaml and model.base_checkpoint")
    _write(optimizer_dst, [(path, state, found)])  # first: until `path` changes below, it still holds everything
    ends = [r for k in weights for r in found.tensors[k].records]
    starts = [r for k in state for r in found.tensors[k].records]
    if not frozen and (not starts or max(e for _, e in ends) <= min(b for b, _ in starts)):
        # mindformers writes the network's weights before the optimizer's records (measured on this stack): the
        # weights file is the file's head, cut off in place; the weights are never rewritten
        mode = path.stat().st_mode
        path.chmod(0o600)  # MindSpore leaves checkpoints read-only
        os.truncate(path, max(e for _, e in ends))
        path.chmod(mode & 0o777)
    else:
        _write(path, [(path, weights, found)])
    return Split(path, optimizer_dst, len(weights), len(state), frozen)


def join_checkpoint(parts: Iterable[str | Path], dst: str | Path, *, base: str | Path | None = None,
                    base_names: Iterable[str] | None = None) -> Path:
    """`dst`: every tensor of `parts` plus the model weights of `base` the parts lack (only `base_names` when given:
    the frozen weights a split left to the base, e.g. one pipeline stage's); a name in two parts is refused."""
    dst, sources, names = Path(dst), [], set()
    for part in map(Path, parts):
        found = _scanned(part, "a checkpoint part")
        twice = names & set(found.tensors)
        if twice:
            raise CheckpointSplitError(f"{part}: tensors {sorted(twice)[:3]} are also in another part")
        names |= set(found.tensors)
        sources.append((part, list(found.tensors), found))
    if base is not None:
        bs = _scanned(Path(base), "the base checkpoint")
        wanted = set(base_names) if base_names is not None else None
        missing = sorted(wanted - set(bs.tensors)) if wanted is not None else []
        if missing:
            raise CheckpointSplitError(f"the base {base} lacks {len(missing)} frozen weights the checkpoint left to it, "
                                       f"e.g. {missing[:2]}: restore the base it was trained on")
        sources.append((Path(base), [k for k in bs.tensors if is_model_weight(k) and k not in names
                                     and (wanted is None or k in wanted)], bs))
    _write(dst, sources)
    return dst


def resume_record(latest: dict, dest_dir: str | Path) -> dict:
    """`latest` (a latest_checkpoint.json record) with every split rank file replaced by a joined one under
    `dest_dir/rank_N/` (the split parts are named by each file's `.verified.json`). Raises CheckpointSplitError when
    a part (or the base a LoRA file names) is missing or is not the file that was verified."""
    ranks = {}
    for rank, info in latest["ranks"].items():
        path = Path(info["path"])
        split = split_record(path)
        if not split:
            ranks[rank] = info
            continue
        opt, base = optimizer_file(path), split.get("base")
        if not opt.exists() or opt.stat().st_size != split["optimizer"]["size"]:
            raise CheckpointSplitError(f"{path}: its optimizer state {opt} is missing or not the file that was "
                                       f"written ({split['optimizer']['size']:,} bytes); resume from an earlier "
                                       "checkpoint or start the stage afresh")
        if base is not None:
            check_base(base, what=str(path))
        dst = Path(dest_dir) / f"rank_{rank}" / path.name
        join_checkpoint([path, opt], dst, base=base["path"] if base else None, base_names=split.get("frozen_names"))
        ranks[rank] = {**info, "path": str(dst)}
    first = ranks[min(ranks, key=int)]
    return {**latest, "ranks": ranks, "path": first["path"]}


def check_base(base: dict, *, what: str) -> Path:
    """The base checkpoint `base` ({path, sha256, size}) as it was when `what` was written; else
    CheckpointSplitError naming both and the fix."""
    from ..storage import sha256_file

    path = Path(base["path"])
    if not path.is_file():
        raise CheckpointSplitError(f"{what} holds only what LoRA trains and needs its base {path}, which is missing: "
                                   "restore that file (sha256 " + str(base["sha256"])[:12] + ") or rerun SFT")
    if path.stat().st_size != base["size"] or sha256_file(path) != base["sha256"]:
        raise CheckpointSplitError(f"{what} was trained on the base {path} with sha256 {str(base['sha256'])[:12]} "
                                   f"({base['size']:,} bytes); that file is now another one: restore it or rerun SFT")
    return path


def split_record(path: str | Path) -> dict | None:
    """What CheckpointManager recorded of `path`'s split in its `.verified.json` (None: a whole file, or unverified)."""
    sidecar = Path(str(path) + ".verified.json")
    return json.loads(sidecar.read_text(encoding="utf-8")).get("split") if sidecar.exists() else None


def hand_off_weights(path: str | Path, dst: str | Path) -> Path | None:
    """`dst` = the split weights file `path` (a hard link; a copy where links cannot go); None when not split."""
    import shutil

    if not split_record(path) or (split_record(path) or {}).get("base"):  # a LoRA file is no model's weights
        return None
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".tmp-{dst.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(path, tmp)
    os.replace(tmp, dst)
    return dst
