"""training.checkpoint_format: what a run writes, how mindformers is told, and how its files are found and read.

Two formats (facts and source lines: docs/mindformers-facts.md "Checkpoint formats"):
- `ckpt` (default): mindformers 1.9's legacy CheckpointMonitor, `<output_dir>/checkpoint/rank_N/<prefix>_rank_N-
  <E>_<S>.ckpt`, weights + AdamW moments + counters in one file per rank.
- `safetensors`: Checkpoint 2.0 (`use_legacy_format: False`, the format mindformers 2.x makes the default):
  `<output_dir>/checkpoint/iteration_<8 digits>/<prefix>-model-<rank 7>-<ranks 7>.safetensors` (the network's
  parameters), `<prefix>-opt-...safetensors` (AdamW moments + global_step), `common.json` (step_num, epoch_num,
  global_step, loss_scale, global_batch_size, by rank 0), `metadata.json` (every rank's shards with global
  offsets; only when there are several ranks) and `checkpoint/latest_checkpointed_iteration.txt` (the tracker,
  written after every rank finished, also under async_save). Weights and optimizer state are apart by design,
  so the weights-only hand-off is the model files as they are.

Here:
- `checkpoint_files(folder)`: the one lookup of checkpoint files by extension (`.ckpt`, `.safetensors`), for any
  code that finds checkpoints by glob;
- `yaml_keys(cfg)`: the top-level and CheckpointMonitor keys of the generated mindformers yaml;
- `iterations(ckpt_dir)` / `latest_iteration(ckpt_dir)`: a Checkpoint 2.0 folder's saved steps (the tracker
  names the complete one; a folder without a tracker entry may be half written);
- `write_weights_folder(it, dest)`: the weights-only hand-off folder (model files only, hard links; mindformers
  1.9 loads Checkpoint 2.0 weights from a folder, never from a file);
- `read_weights(path)`: name -> array of a `.safetensors` file or a Checkpoint 2.0 folder, without MindSpore.

- `merge_sharded(folder, dst)`: one file from tensor/pipeline-parallel shards (metadata.json with offsets), by
  mindformers' own ReshardLoader in a MindSpore subprocess (`read_weights` refuses such a folder; callers merge).

Limits: the shards a real tensor/pipeline-parallel run writes cannot be produced on CPU (docs/mindformers-facts.md);
the merge is proved on shards described by mindformers' own metadata writer.
"""
from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMATS = ("ckpt", "safetensors")
SUFFIXES = (".ckpt", ".safetensors")
TRACKER = "latest_checkpointed_iteration.txt"
ITERATION_DIR = re.compile(r"^iteration_(\d{8})$")
# mindformers/checkpoint/utils.py get_checkpoint_name: f'{user_prefix}-{type}-{file_idx:07d}-{total_file_num:07d}'
SHARD_FILE = re.compile(r"^(?:(?P<prefix>.+)-)?(?P<kind>model|opt)-(?P<rank>\d{7})-(?P<ranks>\d{7})\.safetensors$")


HANDOFF_NAME = "weights-model-0000000-0000001.safetensors"
"""The one file of a weights folder made for mindformers (named as Checkpoint 2.0 names rank 0 of 1)."""


class CheckpointFormatError(ValueError):
    """A checkpoint path that is not what the format says."""


def checkpoint_files(folder: str | Path, pattern: str = "*") -> list[Path]:
    """Checkpoint files (`.ckpt`, `.safetensors`) directly in `folder` whose names match `pattern`, sorted by
    name. Temporary files of a write in progress (`*.tmp`, `*.tmp.ckpt`) are not checkpoints."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(pattern)
                  if p.is_file() and p.suffix in SUFFIXES and not p.name.endswith((".tmp.ckpt", ".tmp.safetensors")))


def is_safetensors(path: str | Path) -> bool:
    """A safetensors reference: a `.safetensors` file or a Checkpoint 2.0 folder (tracker or iteration_N)."""
    p = Path(path)
    if p.suffix == ".safetensors":
        return True
    return p.is_dir() and ((p / TRACKER).is_file() or bool(ITERATION_DIR.match(p.name))
                           or any(SHARD_FILE.match(f.name) for f in checkpoint_files(p, "*.safetensors")))


def yaml_keys(cfg) -> tuple[dict, dict]:
    """(top-level keys, CheckpointMonitor keys) of the run yaml for training.checkpoint_format / async_save.

    Checkpoint 2.0 is mindformers' `use_legacy_format: False`; mindformers maps the CheckpointMonitor's keys to
    its `checkpoint` section (trainer/utils.py convert_checkpoint_config). `save_optimizer` keeps the opt files
    (resume needs them); `integrated_save` does not apply there."""
    t = cfg.training
    if t.checkpoint_format == "safetensors":
        return ({"use_legacy_format": False, "load_ckpt_format": "safetensors"},
                {"checkpoint_format": "safetensors", "async_save": bool(t.async_save), "save_optimizer": True})
    return ({"load_ckpt_format": "ckpt"}, {"checkpoint_format": "ckpt", "async_save": False})


@dataclass(frozen=True)
class Iteration:
    """One saved step of a Checkpoint 2.0 folder."""
    folder: Path
    step: int
    model_files: list[Path] = field(default_factory=list)
    opt_files: list[Path] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        """Ranks that wrote this step (from the file names)."""
        m = SHARD_FILE.match(self.model_files[0].name) if self.model_files else None
        return int(m["ranks"]) if m else 0

    @property
    def complete(self) -> bool:
        """Every rank's model file and common.json are there (opt files only when the run saved them)."""
        return bool(self.model_files) and len(self.model_files) == self.ranks and (self.folder / "common.json").is_file()

    def common(self) -> dict:
        """common.json: step_num, epoch_num, global_step, loss_scale, global_batch_size."""
        return json.loads((self.folder / "common.json").read_text(encoding="utf-8"))

    @property
    def sharded(self) -> bool:
        """Model files with offsets (tensor/pipeline parallel): metadata.json lists a shard with a non-zero
        offset. Pure data parallel saves the whole model on every rank."""
        meta = self.folder / "metadata.json"
        if not meta.is_file():
            return False
        data = json.loads(meta.read_text(encoding="utf-8")).get("state_dict_metadata", {})
        return any(any(c.get("global_offset") and any(c["global_offset"]) for c in v.get("chunk", []))
                   for v in data.values())


def _iteration(folder: Path) -> Iteration | None:
    m = ITERATION_DIR.match(folder.name)
    if not m or not folder.is_dir():
        return None
    model, opt = [], []
    for f in checkpoint_files(folder, "*.safetensors"):
        s = SHARD_FILE.match(f.name)
        if s:
            (model if s["kind"] == "model" else opt).append(f)
    return Iteration(folder, int(m[1]), model, opt)


def iterations(ckpt_dir: str | Path) -> list[Iteration]:
    """The iteration_N folders of a Checkpoint 2.0 `checkpoint/` folder, oldest first."""
    found = [_iteration(p) for p in Path(ckpt_dir).glob("iteration_*")]
    return sorted((i for i in found if i is not None), key=lambda i: i.step)


def latest_iteration(ckpt_dir: str | Path) -> Iteration | None:
    """The step the tracker names (written after every rank finished, checkpoint.py iter_finalize_func), if its
    files are complete; None when there is no tracker (nothing finished yet)."""
    tracker = Path(ckpt_dir) / TRACKER
    if not tracker.is_file():
        return None
    step = int(tracker.read_text(encoding="utf-8").strip())
    it = _iteration(Path(ckpt_dir) / f"iteration_{step:08d}")
    return it if it is not None and it.complete else None


def resolve_folder(path: str | Path) -> Iteration:
    """The Iteration of a Checkpoint 2.0 reference: an iteration_N folder, a `checkpoint/` folder (its tracker's
    step) or a weights-only hand-off folder (model files directly in it)."""
    p = Path(path)
    it = _iteration(p) or latest_iteration(p)
    if it is None:
        files = [f for f in checkpoint_files(p, "*.safetensors") if (s := SHARD_FILE.match(f.name)) and s["kind"] == "model"]
        if not files and len(found := checkpoint_files(p, "*.safetensors")) == 1:
            files = found  # one weights file of any name: what mindformers loads from such a folder too
        if files:
            it = Iteration(p, -1, files, [])
    if it is None or not it.model_files:
        raise CheckpointFormatError(
            f"{str(p)!r} is not a Checkpoint 2.0 folder: no {TRACKER}, no iteration_N folder and no "
            "<prefix>-model-<rank>-<ranks>.safetensors file; pass the checkpoint/ folder a training.checkpoint_format="
            "safetensors run wrote, one of its iteration_N folders, or a .safetensors file")
    return it


def write_weights_folder(it: Iteration, dest: str | Path) -> Path:
    """`dest/` with the iteration's model files (hard links, copies across filesystems), no optimizer state:
    what a consumer hands mindformers as `load_checkpoint` (a folder: mindformers/checkpoint/checkpoint.py
    get_checkpoint_path refuses a file). A sharded step's metadata.json is rewritten to the model's
    parameters only: mindformers checks that every file metadata.json names exists (checkpoint/utils.py
    verify_ckpt_valid)."""
    import shutil

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for f in it.model_files:
        target = dest / f.name
        if target.exists():
            continue
        try:
            os.link(f, target)
        except OSError:
            shutil.copy2(f, target)
    meta = it.folder / "metadata.json"
    if meta.is_file():
        data = json.loads(meta.read_text(encoding="utf-8"))
        keep = {f.name for f in it.model_files}
        storage = {k: [s for s in v if s.get("file_name") in keep] for k, v in data.get("storage_data", {}).items()}
        data["storage_data"] = {k: v for k, v in storage.items() if v}
        if "state_dict_metadata" in data:  # storage keys are str((name, offset)) (checkpoint/utils.py)
            names = {ast.literal_eval(k)[0] for k in data["storage_data"]}
            data["state_dict_metadata"] = {k: v for k, v in data["state_dict_metadata"].items() if k in names}
        (dest / "metadata.json").write_text(json.dumps(data), encoding="utf-8")
    return dest


def read_weights(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(name -> array, name -> dtype name) of a `.safetensors` file or a Checkpoint 2.0 folder's model files
    (rank 0's: under data parallel every rank holds the whole model). bfloat16 comes back as float32."""
    from safetensors import safe_open

    p = Path(path)
    if p.is_file():
        files = [p]
    else:
        it = resolve_folder(p)
        if it.sharded:
            raise CheckpointFormatError(
                f"{it.folder} holds tensor/pipeline-parallel shards (metadata.json has offsets): merge them first "
                "(checkpoint_format.merge_sharded, what model.checkpoints.local_ckpt_file does: "
                "python -m pipeline_lib.model.checkpoint_format merge FOLDER OUT.safetensors)")
        files = it.model_files[:1]
    arrays, dtypes = {}, {}
    for f in files:
        # framework="np" cannot hold bfloat16: read it as float32 through the raw bytes
        with safe_open(str(f), framework="np") as fh:
            for name in fh.keys():
                try:
                    arr = fh.get_tensor(name)
                    dtypes[name] = str(arr.dtype)
                except (TypeError, ValueError):
                    arr, dtypes[name] = _bf16_tensor(f, name), "bfloat16"
                arrays[name] = arr
    return arrays, dtypes


def _bf16_tensor(file: Path, name: str) -> np.ndarray:
    """A bfloat16 tensor of a safetensors file as float32 (the format's header gives offsets; bf16 is the high
    half of a float32)."""
    with open(file, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
        info = header[name]
        start, end = info["data_offsets"]
        fh.seek(8 + n + start)
        raw = np.frombuffer(fh.read(end - start), dtype=np.uint16)
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


# --- the checkpoint manager's view of a Checkpoint 2.0 folder (train/checkpoints.py, train/runner.py) ---

def finished_model_files(ckpt_dir: str | Path) -> list[tuple[Path, int, int]]:
    """(model file, rank, step) of every step up to the tracker's: mindformers writes the tracker after every rank
    finished a step (also under async_save), so a later folder may be half written and is not listed yet."""
    tracker = Path(ckpt_dir) / TRACKER
    if not tracker.is_file():
        return []
    last = int(tracker.read_text(encoding="utf-8").strip() or 0)
    out = []
    for it in iterations(ckpt_dir):
        if it.step <= last and (it.folder / "common.json").is_file():
            out += [(f, int(SHARD_FILE.match(f.name)["rank"]), it.step) for f in it.model_files]
    return out


def _opt_file_of(model_file: Path) -> Path:
    m = SHARD_FILE.match(model_file.name)
    if not m:
        return model_file.with_name(model_file.name + ".no-opt")
    prefix = f"{m['prefix']}-" if m["prefix"] else ""
    return model_file.with_name(f"{prefix}opt-{m['rank']}-{m['ranks']}.safetensors")


def inspect(model_file: str | Path) -> dict | None:
    """The checkpoint manager's verdict fields of one rank's step in a Checkpoint 2.0 folder, read in place without
    MindSpore: tensors of the model file and its optimizer file, the non-finite float ones, and common.json's
    counters. None when a file does not parse (the caller then asks MindSpore)."""
    from safetensors import SafetensorError, safe_open

    model_file = Path(model_file)
    files = [model_file] + [f for f in (_opt_file_of(model_file),) if f.is_file()]
    count, bad = 0, []
    try:
        for f in files:
            with safe_open(str(f), framework="np") as fh:
                for name in fh.keys():
                    try:
                        arr = fh.get_tensor(name)
                    except (TypeError, ValueError):
                        arr = _bf16_tensor(f, name)
                    count += 1
                    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
                        bad.append(name)
        common = json.loads((model_file.parent / "common.json").read_text(encoding="utf-8"))
    except (SafetensorError, OSError, ValueError, KeyError):
        return None
    return {"params": count, "nonfinite": bad, "global_step": common.get("global_step"),
            "step_num": common.get("step_num"), "epoch_num": common.get("epoch_num")}


def remove_iteration_if_empty(folder: Path) -> bool:
    """Delete a Checkpoint 2.0 iteration folder once no rank's model file is left in it (the checkpoint manager
    prunes per rank file; the optimizer files, common.json and metadata.json belong to the step)."""
    import shutil

    if not ITERATION_DIR.match(folder.name) or not folder.is_dir():
        return False
    if any((m := SHARD_FILE.match(f.name)) and m["kind"] == "model" for f in checkpoint_files(folder, "*.safetensors")):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def resume_fields(model_file: str | Path) -> dict:
    """The yaml fields that resume exactly the verified step of `model_file` (.../checkpoint/iteration_N/<model
    file>): mindformers 1.9 resumes Checkpoint 2.0 from the folder's tracker (trainer/trainer.py:494-495 ->
    checkpoint/checkpoint.py:760 get_checkpoint_path) and takes `resume_training` as a bool only
    (trainer/utils.py:809-811), so the tracker is set to that step first."""
    model_file = Path(model_file)
    it, root = _iteration(model_file.parent), model_file.parent.parent
    if it is None:
        raise CheckpointFormatError(f"{model_file} is not inside a Checkpoint 2.0 iteration_N folder")
    tmp = root / f".{TRACKER}.tmp"
    tmp.write_text(str(it.step), encoding="utf-8")
    os.replace(tmp, root / TRACKER)
    return {"load_checkpoint": str(root), "resume_training": True}


# --- what a training stage hands mindformers as its starting weights ---

def mindformers_base(path: str | Path, fmt: str, cache: str | Path) -> Path:
    """The local path mindformers loads as `load_checkpoint` for weights at `path` under training.checkpoint_format
    `fmt`: Checkpoint 2.0 loads a FOLDER of safetensors (checkpoint/checkpoint.py:760 get_checkpoint_path refuses a
    file), the legacy loader a `.ckpt` file. A `.safetensors` file goes into `cache/base_safetensors/` (hard link);
    a file of the other format is converted once into `cache` (`python -m pipeline_lib.model.checkpoint_format
    convert`, a MindSpore subprocess; the orchestrator never imports MindSpore)."""
    path, cache = Path(path), Path(cache)
    if fmt == "safetensors":
        if path.is_dir():
            return path
        folder = cache / "base_safetensors"
        target = folder / HANDOFF_NAME
        if folder.exists():
            import shutil
            shutil.rmtree(folder)  # made again each time: a stale copy must never stand in for the base
        folder.mkdir(parents=True)
        if path.suffix == ".safetensors":
            try:
                os.link(path, target)
            except OSError:
                import shutil
                shutil.copyfile(path, target)
        else:
            _convert(path, target)
        return folder
    if path.suffix == ".ckpt":
        return path
    if path.suffix == ".safetensors" or path.is_dir():
        target = cache / f"{path.stem if path.is_file() else path.name}.converted.ckpt"
        _convert(path, target)
        return target
    return path


def _convert(src: Path, dst: Path) -> None:
    from ..runtime.launcher import launch_module

    done = launch_module("pipeline_lib.model.checkpoint_format", ["convert", str(src), str(dst)], cwd=None,
                         timeout_s=3600, env={"GLOG_v": "3"})
    if not done.ok:
        raise CheckpointFormatError(f"converting {src} to {dst.suffix} failed: " + done.describe("checkpoint_format"))


def _convert_main(src: str, dst: str) -> None:
    """Runs in a subprocess: the weights of `src` (.ckpt, .safetensors or a Checkpoint 2.0 folder) written as `dst`
    in the format its suffix names, dtypes kept."""
    import mindspore as ms

    p = Path(src)
    if p.is_dir():
        p = resolve_folder(p).model_files[0]
    params = ms.load_checkpoint(str(p), format="safetensors" if p.suffix == ".safetensors" else "ckpt")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".part-{dst.name}")  # same suffix: MindSpore appends its format's suffix otherwise
    ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()], str(tmp),
                       format="safetensors" if dst.suffix == ".safetensors" else "ckpt")
    os.replace(tmp, dst)


def merge_sharded(folder: str | Path, dst: str | Path) -> Path:
    """One `.safetensors` file with the whole model from a Checkpoint 2.0 step whose model files are shards
    (tensor/pipeline parallel: metadata.json with offsets), in a MindSpore subprocess: mindformers' own online
    reshard (`checkpoint/reshard.py` ReshardLoader) with every model parameter's whole tensor as the destination,
    no network needed. Optimizer state is not merged (a consumer needs the weights)."""
    from ..runtime.launcher import launch_module

    it = resolve_folder(folder)
    dst = Path(dst)
    done = launch_module("pipeline_lib.model.checkpoint_format", ["merge", str(it.folder), str(dst)], cwd=None,
                         timeout_s=3600, env={"GLOG_v": "3"})
    if not done.ok:
        raise CheckpointFormatError(f"merging the Checkpoint 2.0 shards of {it.folder} failed: "
                                    + done.describe("checkpoint_format merge"))
    return dst


def _merge_main(folder: str, dst: str) -> None:
    import mindspore as ms
    from mindformers.checkpoint.metadata import load_metadata
    from mindformers.checkpoint.reshard import ReshardLoader
    from mindformers.checkpoint.sharded_tensor import build_sharded_tensor

    src, files = load_metadata(os.path.join(folder, "metadata.json"))
    model_params = {ast.literal_eval(k)[0] for k, v in files.items()
                    if any((m := SHARD_FILE.match(s["file_name"])) and m["kind"] == "model" for s in v)}
    whole = {}
    for name in sorted(model_params):
        first = src[name][0]
        shape = tuple(first.global_shape)
        whole[name] = build_sharded_tensor(name, first.dtype, shape, shape, (1,) * len(shape), (0,) * len(shape))
    params = ReshardLoader(checkpoint_dir=folder, dst_sharded_tensor_metas=whole, src_sharded_tensor_metas=src,
                           param_file_mappings=files, reshard_worker_num=1, template=None).load()
    out = Path(dst)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".part-{out.name}")
    ms.save_checkpoint([{"name": k, "data": params[k]} for k in sorted(params)], str(tmp), format="safetensors")
    os.replace(tmp, out)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 4 or sys.argv[1] not in ("convert", "merge"):
        sys.exit("usage: python -m pipeline_lib.model.checkpoint_format convert SRC DST(.ckpt|.safetensors)\n"
                 "       python -m pipeline_lib.model.checkpoint_format merge ITERATION_DIR DST.safetensors")
    (_convert_main if sys.argv[1] == "convert" else _merge_main)(sys.argv[2], sys.argv[3])


def load_mindspore(path: str | Path) -> dict:
    """In a MindSpore process: name -> Parameter of a checkpoint in either format. A Checkpoint 2.0 model file comes
    with its rank's optimizer file (what one legacy .ckpt holds: weights, moments, global_step)."""
    import mindspore as ms

    p = Path(path)
    if p.is_dir():
        p = resolve_folder(p).model_files[0]
    if p.suffix != ".safetensors":
        return ms.load_checkpoint(str(p))
    params = ms.load_checkpoint(str(p), format="safetensors")
    opt = _opt_file_of(p)
    if opt.is_file():
        params.update(ms.load_checkpoint(str(opt), format="safetensors"))
    return params


def weights_only_copy(model_file: Path, folder: Path, log=print) -> Path:
    """The weights-only hand-off of a Checkpoint 2.0 step: `<folder>/<model file stem>-weights.safetensors`, a copy
    (never a link: mindformers' keep_checkpoint_max deletes its iteration folder later) of rank 0's model file, which
    holds the network's parameters and nothing else; of a tensor/pipeline-parallel step, the merge of its shards."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / f"{model_file.stem}-weights.safetensors"
    it = _iteration(model_file.parent)
    if it is not None and it.sharded:
        merge_sharded(it.folder, dst)
    else:
        tmp = folder / f".part-{dst.name}"
        shutil.copyfile(model_file, tmp)
        os.replace(tmp, dst)
    log(f"pretrain: weights-only checkpoint {dst.name}: {dst.stat().st_size:,} bytes (the step's model file; its "
        f"optimizer file {_opt_file_of(model_file).name} stays with the training checkpoint)")
    return dst


def rollback_copy(model_files: list[Path], dest_dir: Path, step_num: int, epoch_num: int) -> Path:
    """The loss guard's rollback for Checkpoint 2.0: a copy of the step's iteration folder under `dest_dir` whose
    common.json carries the data position `step_num` / `epoch_num` (mindformers resumes the data from common.json,
    base_trainer.py:1150-1158; the optimizer's global_step stays in the opt file). Returns rank 0's model file in
    the copy (resume_fields of it points mindformers at `dest_dir`). No MindSpore: the tensors are copied as bytes."""
    import shutil

    src = model_files[0].parent
    it = _iteration(src)
    if it is None:
        raise CheckpointFormatError(f"{model_files[0]} is not inside a Checkpoint 2.0 iteration_N folder")
    dest = Path(dest_dir) / src.name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.verified.json"))
    common = json.loads((dest / "common.json").read_text(encoding="utf-8"))
    common.update(step_num=int(step_num), epoch_num=int(epoch_num))
    (dest / "common.json").write_text(json.dumps(common, indent=4), encoding="utf-8")
    return dest / model_files[0].name
