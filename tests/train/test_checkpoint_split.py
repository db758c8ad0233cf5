"""train.checkpoint_split on MindSpore-written checkpoints with the names (and order) mindformers 1.9 writes: what
`mindspore.load_checkpoint` reads from the weights file and from the optimizer file, the join that resumes, a LoRA
file that keeps only what it trains, and CheckpointManager's split, prune and resume record around them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline_lib.runtime.env import subprocess_env
from pipeline_lib.train.checkpoint_split import (CheckpointSplitError, hand_off_weights, join_checkpoint,
                                                 optimizer_file, resume_record, split_checkpoint)
from pipeline_lib.train.checkpoints import CheckpointManager
from pipeline_lib.train.adapter import is_lora_param

WEIGHTS = {"model.tok_embeddings.embedding_weight": (16, 8), "model.layers.0.attention.wq.weight": (8, 8),
           "model.layers.0.feed_forward.w1.weight": (400, 500),  # 800 KB: written as two records
           "model.norm_out.weight": (8,), "lm_head.weight": (16, 8)}
LORA = {"model.layers.0.attention.wq.mindpet_delta_lora_a": (2, 8),
        "model.layers.0.attention.wq.mindpet_delta_lora_b": (8, 2)}
COUNTERS = ("global_step", "epoch_num", "step_num", "loss_scale", "global_batch_size")

# one process writes every file (MindSpore's own save_checkpoint, in mindformers' order: the network's parameters,
# then scale_sense, global_step, the moments, then the appended counters)
_MAKE = """
import json, sys, numpy as np, mindspore as ms
spec = json.loads(sys.argv[1])
for path, (weights, trained, seed, step) in spec.items():
    rng = np.random.default_rng(seed)
    items = [(n, rng.standard_normal(s).astype(np.float32)) for n, s in weights]
    items += [("scale_sense", np.ones((), np.float32)), ("global_step", np.array([step], np.int32))]
    items += [(f"adam_{m}.{n}", rng.standard_normal(s).astype(np.float32)) for m in "mv" for n, s in trained]
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in items], path,
                       append_dict={"epoch_num": 1, "step_num": step, "loss_scale": 1.0, "global_batch_size": 2})
"""


def _make(spec: dict) -> None:
    subprocess.run([sys.executable, "-c", _MAKE, json.dumps(spec)], check=True, env=subprocess_env(),
                   capture_output=True)


_LOAD = """
import json, sys, hashlib, mindspore as ms
print(json.dumps({p: {k: hashlib.sha256(v.asnumpy().tobytes()).hexdigest() for k, v in ms.load_checkpoint(p).items()}
                  for p in sys.argv[1:]}))
"""


def _loaded(*paths) -> list[dict]:
    """What mindspore.load_checkpoint reads from each file: name -> sha256 of the tensor's bytes."""
    out = subprocess.run([sys.executable, "-c", _LOAD, *map(str, paths)], check=True, env=subprocess_env(),
                         capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return [got[str(p)] for p in paths]


def _scanned_names(path) -> dict:
    from pipeline_lib.model.ckpt_scan import scan

    return {k: (t.dtype, t.dims, t.nbytes) for k, t in scan(path).tensors.items()}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("split")
    w, lw = list(WEIGHTS.items()), list(WEIGHTS.items()) + list(LORA.items())
    _make({str(out / "pretrain_4.ckpt"): [w, w, 1, 4], str(out / "pretrain_8.ckpt"): [w, w, 2, 8],
           # SFT: the same frozen weights as the base (seed 3), LoRA trained; the base is a weights-only file
           str(out / "sft_4.ckpt"): [lw, list(LORA.items()), 3, 4], str(out / "base.ckpt"): [w, [], 3, 0],
           str(out / "other_base.ckpt"): [w, [], 9, 0]})
    return out


def _place(made: Path, run: Path, source: str, step: int, rank: int = 0) -> Path:
    dest = run / "checkpoint" / f"rank_{rank}" / f"tiny_llama_rank_{rank}-1_{step}.ckpt"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(made / source, dest)
    os.chmod(dest, 0o400)  # as MindSpore leaves it
    return dest


def test_weights_and_optimizer_state_land_in_two_files_mindspore_reads_and_the_join_is_the_original(tmp_path, made):
    path = _place(made, tmp_path, "pretrain_4.ckpt", 4)
    original, inode = path.read_bytes(), path.stat().st_ino
    split = split_checkpoint(path, optimizer_file(path))
    assert split.optimizer == tmp_path / "checkpoint_optimizer" / "rank_0" / path.name
    joined = join_checkpoint([path, split.optimizer], tmp_path / "joined.ckpt")
    whole, weights, state, back = _loaded(made / "pretrain_4.ckpt", path, split.optimizer, joined)
    assert set(weights) == set(WEIGHTS)  # no adam_m / adam_v / global_step / step_num in the weights file
    assert set(state) == set(whole) - set(WEIGHTS) and {"adam_m.lm_head.weight", "adam_v.lm_head.weight",
                                                         "scale_sense", *COUNTERS} <= set(state)
    assert all(weights[k] == whole[k] for k in weights) and all(state[k] == whole[k] for k in state)
    # the weights were not rewritten: the same file, cut after its weights
    assert path.stat().st_ino == inode and original.startswith(path.read_bytes()) and oct(path.stat().st_mode)[-3:] == "400"
    assert back == whole


def test_a_lora_checkpoint_keeps_what_it_trains_and_refuses_a_base_it_was_not_trained_on(tmp_path, made):
    path = _place(made, tmp_path, "sft_4.ckpt", 4)
    with pytest.raises(CheckpointSplitError, match=r"frozen weights missing from the base .* different from it"):
        split_checkpoint(path, optimizer_file(path), keep=is_lora_param, base=made / "other_base.ckpt")
    assert path.read_bytes() == (made / "sft_4.ckpt").read_bytes()  # refused: left whole
    split = split_checkpoint(path, optimizer_file(path), keep=is_lora_param, base=made / "base.ckpt")
    assert sorted(split.dropped) == sorted(WEIGHTS) and path.stat().st_size < 2_000  # the 1 MB frozen base is not in it
    joined = join_checkpoint([path, split.optimizer], tmp_path / "joined.ckpt", base=made / "base.ckpt")
    whole, lora, state, back = _loaded(made / "sft_4.ckpt", path, split.optimizer, joined)
    assert set(lora) == set(LORA) and {f"adam_m.{n}" for n in LORA} | {"global_step", "step_num"} <= set(state)
    assert back == whole  # what mindformers resumes: base + adapter + its optimizer state


def test_the_manager_splits_prunes_both_parts_and_resumes_from_a_joined_file(tmp_path, made):
    run, lines = tmp_path / "run", []
    p4 = _place(made, run, "pretrain_4.ckpt", 4)
    mgr = CheckpointManager(run, ranks=[0], keep=1, log=lines.append)
    mgr.sync()
    side = json.loads(Path(str(p4) + ".verified.json").read_text())
    assert side["step"] == 4 and side["global_step"] == 4 and side["size"] == p4.stat().st_size
    assert side["split"]["optimizer"]["size"] == optimizer_file(p4).stat().st_size
    latest = mgr.latest()
    record = resume_record(latest, run / "checkpoint_resume")
    assert record["path"] == str(run / "checkpoint_resume" / "rank_0" / p4.name)
    assert Path(record["path"]).read_bytes() == (made / "pretrain_4.ckpt").read_bytes()  # the records, in order
    handed = hand_off_weights(p4, run / "checkpoint" / "merged" / "w.ckpt")
    assert handed.stat().st_ino == p4.stat().st_ino  # the hand-off is the weights file, linked

    p8 = _place(made, run, "pretrain_8.ckpt", 8)
    mgr.sync()
    mgr.sync()  # keep=1 (once latest has moved to step 8): step 4's weights and optimizer state go together
    assert not p4.exists() and not optimizer_file(p4).exists() and optimizer_file(p8).exists()
    optimizer_file(p8).write_bytes(b"cut")
    with pytest.raises(CheckpointSplitError, match="optimizer state .* is missing or not the file that was written"):
        resume_record(mgr.latest(), run / "checkpoint_resume")


def test_a_lora_resume_and_merge_refuse_a_base_that_changed(tmp_path, made):
    from pipeline_lib.model.checkpoints import check_adapter_base
    from pipeline_lib.model.lora_merge import LoraMergeError
    from pipeline_lib.storage import sha256_file

    base = tmp_path / "base.ckpt"
    shutil.copyfile(made / "base.ckpt", base)
    info = {"path": str(base), "sha256": sha256_file(base), "size": base.stat().st_size}
    run = tmp_path / "run"
    path = _place(made, run, "sft_4.ckpt", 4)
    mgr = CheckpointManager(run, ranks=[0], keep=2, keep_weight=is_lora_param, base=info)
    mgr.sync()
    assert json.loads(Path(str(path) + ".verified.json").read_text())["split"]["frozen_in_base"] == len(WEIGHTS)
    assert hand_off_weights(path, tmp_path / "w.ckpt") is None  # an adapter is no model's weights
    joined = resume_record(mgr.latest(), run / "r")["path"]
    assert _scanned_names(joined) == _scanned_names(made / "sft_4.ckpt")

    adapter = tmp_path / "adapter" / "adapter.ckpt"
    adapter.parent.mkdir()
    adapter.write_bytes(b"")
    (adapter.parent / "adapter_config.json").write_text(json.dumps({"base_checkpoint": {
        "uri": str(base), "sha256": info["sha256"], "size": info["size"]}}))
    check_adapter_base(str(adapter), base)  # the base it names: accepted
    shutil.copyfile(made / "other_base.ckpt", base)  # same size, other weights
    with pytest.raises(CheckpointSplitError, match="is now another one: restore it or rerun SFT"):
        resume_record(mgr.latest(), run / "r")
    with pytest.raises(LoraMergeError, match="was trained on the base .* is another file"):
        check_adapter_base(str(adapter), base)
    base.unlink()
    with pytest.raises(CheckpointSplitError, match="needs its base .* which is missing"):
        resume_record(mgr.latest(), run / "r")
