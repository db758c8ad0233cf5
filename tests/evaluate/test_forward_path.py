"""The forward decoding path on a real tiny mindformers Llama (CPU): batched, right-padded greedy
decoding equals a per-prompt reference greedy; perplexity equals a per-token loop."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_forward_path_greedy_and_perplexity_on_tiny_llama(tiny, tmp_path):
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(tiny.cfg.model_dump(mode="json")))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", "LOG_MF_PATH": str(tmp_path / "mf")}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("forward_path_check.py")), str(cfg_file),
                           str(tiny.base)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["decoded"] == out["reference"]
    assert all(len(t) >= 1 for t in out["decoded"])
    assert out["ppl_tokens"] == out["ref_tokens"] == 4 * 32 + 19  # padded targets are not scored
    assert out["ppl"] == pytest.approx(out["ref_ppl"], rel=1e-9)
