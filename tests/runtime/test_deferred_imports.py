"""runtime.deferred_imports: mindformers imports without Hugging Face datasets, nltk and jieba, and what it took from
them still works when called."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from pipeline_lib.runtime.deferred_imports import DEFERRED

pytestmark = pytest.mark.train  # imports mindformers in a fresh process (~5-8 s)

CHILD = textwrap.dedent("""
    import json, sys, time
    from pipeline_lib.runtime.deferred_imports import DEFERRED, deferring, loaded
    t = time.time()
    with deferring() as placed:
        import mindformers  # noqa: F401
        import mindformers.core.metric.metric as metric
        import mindformers.dataset.dataloader.hf_dataloader as hf
    seconds = time.time() - t
    after_import = {name: loaded(name) for name in DEFERRED}
    # what mindformers took by name from the deferred modules, called: the real functions answer
    from nltk.translate.bleu_score import sentence_bleu as real_bleu  # the window is closed: the real function
    same = [list("abcd")], list("abcd")
    bleu = metric.sentence_bleu(*same, smoothing_function=metric.SmoothingFunction().method3)
    words = list(metric.jieba.cut("我们在北京训练模型"))
    print(json.dumps({"placed": placed, "after_import": after_import, "seconds": seconds,
                      "bleu": bleu, "real_bleu": real_bleu(*same), "words": words,
                      "split_is_real": callable(hf.split_dataset_by_node),
                      "dataset_is_class": isinstance(hf.datasets.Dataset, type),
                      "after_use": {name: loaded(name) for name in DEFERRED}}))
""")


def test_mindformers_imports_none_of_them_and_calls_through_the_stand_ins(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)  # cwd: mindformers' default ./output log folder lands in tmp_path
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(got["placed"]) == set(DEFERRED)  # all installed here: a pinned dependency of mindformers
    assert not any(got["after_import"].values()), got["after_import"]
    assert got["bleu"] == pytest.approx(got["real_bleu"]) == pytest.approx(1.0)
    assert "北京" in got["words"]  # jieba's real segmentation, not a stand-in's
    assert got["split_is_real"] and got["dataset_is_class"]  # after the window: the real `datasets` objects
    assert got["after_use"]["nltk.translate.bleu_score"] and got["after_use"]["jieba"] and got["after_use"]["datasets"]


def test_a_name_not_installed_is_left_to_fail_as_before():
    from pipeline_lib.runtime.deferred_imports import deferring

    with deferring(("no_such_module_here",)) as placed:
        assert placed == []
        with pytest.raises(ModuleNotFoundError):
            import no_such_module_here  # noqa: F401


def test_a_module_already_imported_is_not_replaced():
    import json as before

    from pipeline_lib.runtime.deferred_imports import deferring

    with deferring(("json",)) as placed:
        assert placed == [] and sys.modules["json"] is before
