"""Re-records checkpoint2_mp2_metadata.json: mp2 shards as mindformers 1.9's Checkpoint 2.0 describes them (its own
metadata writer and a MindSpore Layout; a real tensor-parallel run cannot write them on CPU).
Run: PYTHONPATH=. .venv/bin/python tests/train/data/record_checkpoint2_mp2.py /tmp/mp2 && cp /tmp/mp2/metadata.json
tests/train/data/checkpoint2_mp2_metadata.json  (tests/train/test_checkpoint_format.py writes the same shards)."""
import sys
from pathlib import Path
import numpy as np
import mindspore as ms
from mindformers.checkpoint.metadata import save_metadata
from mindformers.checkpoint.sharded_tensor import build_sharded_tensor

d = Path(sys.argv[1]); d.mkdir(parents=True)
w = np.arange(24, dtype=np.float32).reshape(4, 6); b = np.arange(6, dtype=np.float32)
layout = ms.parallel.Layout((2,), ("mp",), [0, 1])
metas, maps = {}, []
for r in range(2):  # W split on its first axis over mp2, b replicated; each rank's adam_m of its own slice
    ms.save_checkpoint([{"name": "W", "data": ms.Tensor(w[2 * r:2 * r + 2])}, {"name": "b", "data": ms.Tensor(b)}],
                       str(d / f"p-model-{r:07d}-0000002"), format="safetensors")
    ms.save_checkpoint([{"name": "adam_m.W", "data": ms.Tensor(np.zeros((2, 6), np.float32))}],
                       str(d / f"p-opt-{r:07d}-0000002"), format="safetensors")
    metas[r] = {"W": build_sharded_tensor("W", ms.float32, (2, 6), (4, 6), (2, 1), (2 * r, 0), layout=layout("mp", "None")),
                "adam_m.W": build_sharded_tensor("adam_m.W", ms.float32, (2, 6), (4, 6), (2, 1), (2 * r, 0),
                                                 layout=layout("mp", "None")),
                "b": build_sharded_tensor("b", ms.float32, (6,), (6,), (1,), (0,), replica_id=r, layout=layout("None"))}
    maps += [(f"p-model-{r:07d}-0000002.safetensors", r, [r], ("W", (2 * r, 0))),
             (f"p-opt-{r:07d}-0000002.safetensors", r, [r], ("adam_m.W", (2 * r, 0)))]
maps.append(("p-model-0000000-0000002.safetensors", 0, [0, 1], ("b", (0,))))
save_metadata(metas, maps, str(d / "metadata.json"))
