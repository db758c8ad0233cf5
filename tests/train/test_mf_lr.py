"""LineageWSDLR (train/mf_lr.py) as mindformers builds it from the yaml section, compiled in graph mode on CPU and
evaluated at every step in a subprocess, against the plain-Python schedule (train/lr_schedule.py Wsd.lr) and the known
answers worked by hand."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline_lib.runtime.env import subprocess_env
from pipeline_lib.train.lr_schedule import Wsd

_PROBE = r'''
import json, sys
import mindspore as ms
import mindspore.common.dtype as mstype
from mindspore import Tensor, nn
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
import pipeline_lib.train.mf_lr  # noqa: F401 (registers LineageWSDLR, as the entry module does)
from mindformers.core.lr import build_lr

class At(nn.Cell):
    def __init__(self, lr):
        super().__init__()
        self.lr = lr
    def construct(self, step):
        return self.lr(step)

out = []
for section, steps in json.loads(sys.argv[1]):
    lr = build_lr(section)
    cell = At(lr)
    # global_step as the optimizer holds it: an int32 Parameter of shape (1,)
    out.append({"type": type(lr).__name__,
                "lrs": [float(cell(Tensor([s], mstype.int32)).asnumpy().reshape(-1)[0]) for s in range(steps)]})
print("LRS " + json.dumps(out))
'''

CASES = [
    Wsd(1e-3, 1e-4, warmup_steps=4, total_steps=10, decay_steps=2),                      # hand-worked below
    Wsd(2e-3, 0.0, warmup_steps=0, total_steps=5, decay_steps=3, shape="cosine"),        # no warm-up: no 0/0
    Wsd(8e-3, 1e-3, warmup_steps=8, total_steps=6, decay_steps=2, lineage_steps=3),      # a lineage's 2nd run
    Wsd(3e-3, 1e-5, warmup_steps=5, total_steps=60, decay_steps=12, lineage_steps=48),   # the tiny nightly's 2nd
]


@pytest.fixture(scope="module")
def computed(tmp_path_factory):
    sections = [[w.yaml_section(), w.total_steps + 2] for w in CASES]  # 2 steps past the end stay at the floor
    probe = tmp_path_factory.mktemp("mf_lr") / "probe.py"  # graph mode parses the cell's source: a file, not -c
    probe.write_text(_PROBE)
    done = subprocess.run([sys.executable, str(probe), json.dumps(sections)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=300)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("LRS ")), None)
    assert line, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(line[4:])


def test_mindformers_builds_our_registered_class(computed):
    assert {c["type"] for c in computed} == {"LineageWSDLR"}


def test_the_graph_gives_the_hand_worked_values(computed):
    assert computed[0]["lrs"][:10] == pytest.approx([0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 5.5e-4, 1e-4],
                                                    rel=1e-6, abs=1e-10)
    assert computed[1]["lrs"][:5] == pytest.approx([2e-3, 2e-3, 1.5e-3, 0.5e-3, 0.0], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_graph_equals_the_python_schedule_at_every_step(computed, case):
    w = CASES[case]
    want = [w.lr(s) for s in range(w.total_steps)] + [w.min_lr] * 2
    assert computed[case]["lrs"] == pytest.approx(want, rel=1e-6, abs=1e-10)
