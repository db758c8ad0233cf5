"""Failures produced for real on this stack and classified from what MindSpore printed: a training step under a host
memory limit it cannot fit, and a checkpoint saved onto a filesystem that fills up (a size-limited tmpfs)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from suite_rules import machine_skip

from pipeline_lib.doctor.classify import classify

# One step fits; then the address space is capped (RLIMIT_AS) 200 MB above what the process holds, and a batch of
# 100,000 x 1024 is trained: MindSpore cannot get the host memory the step needs.
TRAIN_UNDER_LIMIT = textwrap.dedent("""
    import resource, numpy as np, psutil
    import mindspore as ms
    from mindspore import nn, Tensor
    ms.set_context(mode=ms.GRAPH_MODE)
    body = nn.Dense(1024, 1024)
    step = nn.TrainOneStepCell(nn.WithLossCell(body, nn.MSELoss()), nn.Adam(body.trainable_params(), 1e-3))
    small = Tensor(np.ones((8, 1024), np.float32))
    print("step 1 loss", step(small, small), flush=True)
    big = Tensor(np.ones((100_000, 1024), np.float32))
    limit = psutil.Process().memory_info().vms + 200_000_000
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print("step 2 loss", step(big, big), flush=True)
""")

SAVE_CHECKPOINT = textwrap.dedent("""
    import sys
    import mindspore as ms
    from mindspore import nn
    ms.save_checkpoint(nn.Dense(512, 512), sys.argv[1])
""")


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GLOG_v": "2"})


@pytest.mark.slow  # a MindSpore process training under a memory cap: 5-11 s on the shared 2-core machine
def test_a_training_step_under_a_host_memory_limit_is_host_oom():
    proc = run_python(TRAIN_UNDER_LIMIT)
    assert proc.returncode != 0 and "step 1 loss" in proc.stdout
    category, evidence = classify(proc.stdout + proc.stderr, returncode=proc.returncode)
    assert category == "host_oom", proc.stderr[-2000:]
    assert evidence


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 256 KB tmpfs mounted for the test (needs root / CAP_SYS_ADMIN; skipped without)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        machine_skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_checkpoint_that_fills_the_filesystem_is_disk_full(tiny_filesystem):
    proc = run_python(SAVE_CHECKPOINT, str(tiny_filesystem / "model.ckpt"))  # 512 x 512 fp32 = 1 MB > 256 KB
    category, evidence = classify(proc.stdout + proc.stderr, returncode=proc.returncode)
    assert category == "disk_full", proc.stderr[-2000:]
    assert any("No space left on device" in line for line in evidence)
