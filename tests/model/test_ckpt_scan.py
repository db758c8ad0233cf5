"""model/ckpt_scan.py against files MindSpore itself wrote, and against what MindSpore's own load reads back:
every dtype the trainers save, a tensor big enough to be sliced, a scalar, a string, the crc trailer; files it must
leave to MindSpore (encrypted, truncated, not a checkpoint); and checkpoints.verify_checkpoints starting no
MindSpore process for good files while a bad one still gets MindSpore's verdict."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.model.ckpt_scan import scan
from pipeline_lib.runtime.env import subprocess_env
from pipeline_lib.train import checkpoints

_MAKE = r"""
import json, sys, numpy as np, mindspore as ms
out = sys.argv[1]
rng = np.random.default_rng(0)
def tensors(poison=None):
    t = {"w32": rng.standard_normal((64, 32)).astype(np.float32),
         "big": rng.standard_normal((300, 1000)).astype(np.float32),  # 1.2 MB: written as three 512 KiB slices
         "w16": rng.standard_normal((8, 8)).astype(np.float16),
         "bf": rng.standard_normal((16, 4)).astype(np.float32),
         "mask": np.array([True, False, True]),
         "ids": np.arange(7, dtype=np.int32) + 3,
         "scalar": np.array(2.5, dtype=np.float32)}
    if poison:
        t[poison][(0,) * t[poison].ndim] = np.inf if poison == "bf" else np.nan
    out = [{"name": n, "data": ms.Tensor(a, dtype=ms.bfloat16) if n == "bf" else ms.Tensor(a)} for n, a in t.items()]
    return out
counters = {"global_step": 41, "step_num": 43, "epoch_num": 2}
ms.save_checkpoint(tensors(), f"{out}/plain.ckpt", append_dict=counters)
ms.save_checkpoint(tensors(), f"{out}/crc.ckpt", append_dict=counters, crc_check=True)
ms.save_checkpoint(tensors(), f"{out}/info.ckpt", append_dict={**counters, "note": "a string value"})
ms.save_checkpoint(tensors("w16"), f"{out}/nan16.ckpt", append_dict=counters)
ms.save_checkpoint(tensors("bf"), f"{out}/infbf16.ckpt", append_dict=counters)
ms.save_checkpoint(tensors("big"), f"{out}/nanbig.ckpt", append_dict=counters)
ms.save_checkpoint(tensors(), f"{out}/enc.ckpt", append_dict=counters, enc_key=b"0123456789abcdef")
seen = {}
for name in ("plain", "crc", "info", "nan16", "infbf16", "nanbig"):
    loaded = ms.load_checkpoint(f"{out}/{name}.ckpt")
    view = {}
    for k, v in loaded.items():
        if isinstance(v, str):
            view[k] = {"str": v}
            continue
        a = v.float().asnumpy() if k == "bf" else v.asnumpy()
        view[k] = {"shape": list(a.shape), "finite": bool(np.isfinite(a).all()) if a.dtype.kind == "f" else True,
                   "first": int(a.reshape(-1)[0]) if a.dtype.kind in "iu" else None}
    seen[name] = view
print("SEEN " + json.dumps(seen))
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ckpt-scan")
    done = subprocess.run([sys.executable, "-c", _MAKE, str(out)], env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("SEEN "))[5:])
    data = (out / "plain.ckpt").read_bytes()
    (out / "truncated.ckpt").write_bytes(data[: len(data) // 2])  # a write cut short by a full disk
    (out / "cut_in_a_tag.ckpt").write_bytes(data[:-3])
    (out / "noise.ckpt").write_bytes(bytes(range(256)) * 40)
    return out, seen


@pytest.mark.parametrize("name", ["plain", "crc", "info", "nan16", "infbf16", "nanbig"])
def test_scan_reads_what_mindspore_loads(written, name):
    out, seen = written
    found = scan(out / f"{name}.ckpt")
    assert found is not None
    theirs = seen[name]
    assert sorted(found.tensors) == sorted(theirs)
    for tag, t in found.tensors.items():
        if "str" in theirs[tag]:
            assert t.dtype == "str"
            continue
        shape = theirs[tag]["shape"]
        assert t.dims == tuple(shape) or (shape == [] and t.dims in ((), (0,))), tag
        assert t.finite == theirs[tag]["finite"], tag
        if theirs[tag]["first"] is not None:
            assert t.first == theirs[tag]["first"], tag
    assert (found.counter("global_step"), found.counter("step_num"), found.counter("epoch_num")) == (41, 43, 2)
    assert found.nonfinite == [tag for tag, v in theirs.items() if not v.get("finite", True)]


@pytest.mark.parametrize("name", ["enc", "truncated", "cut_in_a_tag", "noise", "missing"])
def test_what_it_does_not_understand_is_left_to_mindspore(written, name):
    out, _ = written
    assert scan(out / f"{name}.ckpt") is None


def test_verify_reads_good_files_in_place_and_asks_mindspore_about_the_rest(written, monkeypatch):
    out, _ = written
    launched: list[list[str]] = []
    real = checkpoints.launch_module

    def recording(module, args=(), **options):
        launched.append(list(args))
        return real(module, args, **options)

    monkeypatch.setattr(checkpoints, "launch_module", recording)
    good = [str(out / "plain.ckpt"), str(out / "crc.ckpt")]
    results = checkpoints.verify_checkpoints(good)
    assert [r.ok for r in results] == [True, True] and launched == []
    assert all(r.sha256 and r.size and r.global_step == 41 and r.step_num == 43 for r in results)
    assert results[0].params == 10  # seven tensors and the three counters, as MindSpore's load counts them

    bad = [str(out / "nanbig.ckpt"), str(out / "enc.ckpt"), str(out / "truncated.ckpt")]
    results = checkpoints.verify_checkpoints([good[0], *bad])
    assert launched == [["verify", *bad]]  # one MindSpore process, for the three it did not pass
    assert [r.ok for r in results] == [True, False, False, False]
    assert "non-finite values in 1 tensor(s)" in results[1].error and results[1].nonfinite == ["big"]
    assert all(r.error for r in results[1:])
