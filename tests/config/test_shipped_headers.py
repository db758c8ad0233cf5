"""The numbers the shipped Ascend configs' header comments state are the ones the code computes."""
import re
from pathlib import Path

import pytest

from pipeline_lib.config import load_config
from pipeline_lib.config.validate import warnings
from pipeline_lib.planner import predicted_peak_gb
from pipeline_lib.planner.disk import checkpoint_disk, sft_checkpoint_disk, weights_bytes
from pipeline_lib.train.runner import local_ranks

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "pipelines"


@pytest.mark.parametrize("name", ["llama2-7b-4x64gb.yaml", "llama-1.5b-lite.yaml"])
def test_header_memory_and_disk_numbers_match_the_planner(name):
    text = (CONFIGS / name).read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    cfg = load_config(CONFIGS / name)
    peak, usable = re.search(r"predicts ([\d.]+) GB per card of ([\d.]+) GB usable", header).groups()
    assert float(peak) == round(predicted_peak_gb(cfg), 1) and float(usable) == cfg.parallel.usable_memory_gb
    disk = re.search(r"keep_checkpoint_max (\d+) \+ (?:the one|1) being written[^=]* = ([\d.]+) GB", header).groups()
    need = checkpoint_disk(cfg, local_ranks(cfg, 0))
    assert int(disk[0]) == cfg.training.keep_checkpoint_max and float(disk[1]) == round(need.total / 1e9, 1)
    weights = re.search(r"weights alone \(fp32, no optimizer state\) are ([\d.]+) GB", header)
    if weights:  # the 7B header also states the weights-only size and the SFT need
        sft = sft_checkpoint_disk(cfg, local_ranks(cfg, 0))
        assert float(weights.group(1)) == round(weights_bytes(cfg) / 1e9, 1)
        assert f"{sft.per_checkpoint / 1e9:.1f} GB per checkpoint on the node, x {sft.copies}, + " \
               f"{sft.splitting / 1e9:.1f} GB while the newest whole file is split = SFT disk " \
               f"{sft.total / 1e9:.1f} GB" in header.replace("\n# ", " ")
    assert f"precision: {cfg.training.precision}" in text and "bf16 = bfloat16 matmuls" in header
    assert warnings(cfg) == []  # nothing in it is a no-op (e.g. optimizer sharding at dp1)
