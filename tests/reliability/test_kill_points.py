"""SIGKILL the whole run at each named kill point, rerun with the same run id, and check: every stage
completes, no stage whose manifest was complete is redone, no output a later stage reads is partial, and
the outputs equal an uninterrupted run (bytes for data; tensors within the resume-equivalence tolerance
for training, merge and export; perplexity for evaluate).

`make test` runs the cases marked for CI; the reliability profile (`python bench/reliability.py`,
i.e. HYPOTHESIS_PROFILE=reliability) runs every case and fills the table's kill-point row."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from kill_harness import ROOT, STAGES, Case, Pipeline, killed_by_sigkill, known, still_running

pytestmark = [pytest.mark.slow, pytest.mark.train]
FULL = os.environ.get("HYPOTHESIS_PROFILE") == "reliability"
RELIABILITY_ROW = "kill_points"

# The cases `make test` runs, each with the stages its runs go through: the data case stops after data (its
# bytes equal the reference's, and the pretrain case shows that training resumes on such data); the pretrain case
# stops after pretrain (its weights equal the reference's, so what reads them is the reference's input: the export
# case shows the last stages resuming); the reliability profile runs every case through every stage.
CI_CASES = {"data:data.mindrecord.mid_file": ("data",), "pretrain:checkpoint.before_latest": ("data", "pretrain"),
            "export:export.mid_mindir": STAGES}
CASES = [
    *(Case(f"{s}.before_manifest", s) for s in STAGES),
    Case("data.prep.between_shards", "data", nth=2),
    Case("data.dedup.between_partitions", "data"),
    Case("data.after_tokenizer", "data"),
    Case("data.mindrecord.mid_file", "data"),
    Case("data.mindrecord.between_files", "data"),
    Case("data.dedup_index.mid_commit", "data"),
    *(Case(p, s) for s in ("pretrain", "sft") for p in ("checkpoint.mid_write", "checkpoint.verify",
                                                        "checkpoint.before_latest")),
    Case("checkpoint.mid_write", "pretrain", nth=2),
    Case("checkpoint.before_latest", "sft", nth=2, then="train.resuming"),
    Case("sft.adapter.mid_save", "sft"),
    Case("evaluate.between_checkpoints", "evaluate"),
    Case("export.mid_merge", "export"),
    Case("export.mid_mindir", "export"),
]


@pytest.fixture(scope="session")
def prefect_home(tmp_path_factory):
    return tmp_path_factory.mktemp("kill-prefect")


@pytest.fixture(scope="session")
def golden(tmp_path_factory, prefect_home):
    p = Pipeline(tmp_path_factory.mktemp("golden"), prefect_home)
    a = p.run()
    assert a.returncode == 0, a.output[-4000:]
    return p


def _weights(path: Path) -> dict[str, np.ndarray]:
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()
            if not k.startswith(("adam_", "global_step", "step_num", "epoch_num", "learning_rate",
                                 "current_iterator", "loss_scale", "scale_sense", "accu_grads"))}


def _close(a: dict, b: dict, what: str) -> list[str]:
    if sorted(a) != sorted(b):
        return [f"{what}: parameter names differ"]
    return [f"{what}: {k} differs" for k in a if not np.allclose(a[k], b[k], rtol=1e-4, atol=1e-5)]


def differences(run: Pipeline, golden: Pipeline, stage: str) -> list[str]:
    """How `stage`'s outputs differ from the uninterrupted run's (empty when equal)."""
    m = {p: json.loads((x.run_dir / stage / "manifest.json").read_text()) for p, x in (("run", run), ("ref", golden))}
    if stage == "data":
        shas = {p: {o["path"]: o["sha256"] for o in mm["outputs"] if o["path"] != "stats.json"} for p, mm in m.items()}
        return [f"data/{k}" for k in sorted(set(shas["run"]) | set(shas["ref"]))
                if shas["run"].get(k) != shas["ref"].get(k)]
    if stage == "pretrain":
        return _close(_weights(Path(m["run"]["metrics"]["latest_checkpoint"])),
                      _weights(Path(m["ref"]["metrics"]["latest_checkpoint"])), "pretrain weights")
    if stage == "sft":
        return _close(_weights(run.run_dir / "sft/adapter/adapter.ckpt"),
                      _weights(golden.run_dir / "sft/adapter/adapter.ckpt"), "adapter")
    if stage == "evaluate":
        ppl = {p: {c["checkpoint"]: c["perplexity"] for c in mm["metrics"]["checkpoints"]}
               for p, mm in m.items()}
        return [f"perplexity {k}" for k in ppl["ref"] if ppl["run"].get(k) != pytest.approx(ppl["ref"][k], rel=1e-3)]
    if stage == "export":
        diffs = _close(_weights(run.run_dir / "export/merged.ckpt"), _weights(golden.run_dir / "export/merged.ckpt"),
                       "merged weights")
        checks = json.loads((run.run_dir / "export/checks.json").read_text())
        return diffs + ([] if checks.get("mindir_check", {}).get("ok", True) else ["MindIR logits check"])
    raise KeyError(stage)


TRAINING_STATE = ("adam_m.", "adam_v.", "accu_grads.", "global_step", "epoch_num", "step_num", "scale_sense",
                  "loss_scale", "global_batch_size")


def test_the_sft_base_is_the_weights_only_file(golden):
    """The weights handed from pretrain to SFT (issue 27), read off the reference run (the tiny chain as the CLI runs
    it: it was tests/train/test_weights_handoff.py, which trained a chain of its own for it): the SFT base, as the SFT
    manifest names it, is the pretrain manifest's weights_checkpoint, loads with MindSpore, holds model parameters
    only, and the SFT stage checked the disk for the layout before it started."""
    import mindspore as ms

    from pipeline_lib.storage import read_manifest, sha256_file

    pre, sft = (read_manifest(str(golden.run_dir / s)) for s in ("pretrain", "sft"))
    weights = pre.metrics["weights_checkpoint"]
    base = sft.metrics["base_checkpoint"]
    assert Path(base) == Path(weights["path"]) and sha256_file(base) == weights["sha256"]
    params = ms.load_checkpoint(base)
    assert params and all(n.startswith(("model.", "lm_head.")) for n in params)
    assert not any(n.startswith(TRAINING_STATE) for n in params)
    training = ms.load_checkpoint(pre.metrics["latest_checkpoint"])
    assert set(params) == {n for n in training if not n.startswith(TRAINING_STATE)}
    sft_log = "".join(p.read_text() for p in (golden.run_dir / "logs").glob("sft-*.log"))
    assert re.search(r"sft: \d+\.\d GB free for ", sft_log), sft_log[-3000:]  # the layout's disk check


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kill_then_rerun_resumes_and_matches(case, golden, prefect_home, tmp_path, tally):
    if case.name not in CI_CASES and not FULL:
        pytest.skip("the full kill-point table runs in the reliability profile (bench/reliability.py)")
    known(case)
    stages = STAGES if FULL else CI_CASES[case.name]
    run = Pipeline(tmp_path / "runs", prefect_home)
    run.seed_from(golden, case.stage)
    row = {"killed": False, "resumed": False, "outputs_equal": False}
    try:
        first = run.run(kill=f"{case.point}@{case.nth}", report=tmp_path / "killed-1", stages=stages)
        assert killed_by_sigkill(first) and set(first.killed_at) == {case.point}, \
            (first.returncode, first.killed_at, first.output[-3000:])
        row["killed"] = True
        assert not first.survivors, f"processes of the killed run are still alive: {first.survivors}"
        assert not still_running(str(run.root)), "processes of the killed run are still alive"
        assert run.partial_outputs() == [], "a finished stage lists outputs that are partial"
        done_before = run.manifests()
        if case.then:  # kill again while the rerun resumes
            again = run.run(kill=case.then, report=tmp_path / "killed-2", stages=stages)
            assert killed_by_sigkill(again) and set(again.killed_at) == {case.then}, again.output[-3000:]
            assert run.partial_outputs() == []
        rerun = run.run(stages=stages)
        assert rerun.returncode == 0, rerun.output[-4000:]
        after = run.manifests()
        assert set(after) == set(STAGES[:STAGES.index(stages[-1]) + 1]), f"not every stage completed: {sorted(after)}"
        redone = [s for s, raw in done_before.items() if after[s] != raw]
        assert not redone, f"stages whose manifest was complete were redone: {redone}"
        row["resumed"] = True
        diffs = [d for s in STAGES[STAGES.index(case.stage):] if s in after for d in differences(run, golden, s)]
        assert diffs == [], diffs
        row["outputs_equal"] = True
    finally:
        tally.add("kill_points", points=row["killed"], resumed=row["resumed"], outputs_equal=row["outputs_equal"])


def test_kill_before_the_nightly_state_commit_then_the_same_night_commits(prefect_home, tmp_path, tally):
    if not FULL:
        pytest.skip("the full kill-point table runs in the reliability profile (bench/reliability.py)")
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    shutil.copy(ROOT / "configs/data/tiny_corpus.jsonl", incoming / "day1.jsonl")
    night = Pipeline(tmp_path / "runs", prefect_home, run_id="nightly-2026-11-01")
    state_file = night.root / "_nightly" / "state.json"
    row = {"killed": False, "resumed": False, "outputs_equal": False}
    try:
        first = night.nightly("2026-11-01", str(incoming / "*.jsonl"), kill="nightly.before_state_commit",
                              report=tmp_path / "killed-1")
        assert killed_by_sigkill(first) and first.killed_at == ["nightly.before_state_commit"], first.output[-3000:]
        assert not first.survivors, f"processes of the killed run are still alive: {first.survivors}"
        row["killed"] = True
        assert not state_file.exists() or "nightly-2026-11-01" not in state_file.read_text()
        assert night.partial_outputs() == []
        done_before = night.manifests()
        assert {"data", "pretrain"} <= set(done_before)
        again = night.nightly("2026-11-01", str(incoming / "*.jsonl"))
        assert again.returncode == 0, again.output[-4000:]
        assert night.manifests() == done_before, "the night's finished stages were redone"
        row["resumed"] = True
        state = json.loads(state_file.read_text())
        assert state["latest"]["run_id"] == "nightly-2026-11-01"
        assert [p.rsplit("/", 1)[-1] for p in state["consumed"]] == ["day1.jsonl"]
        assert [h["run_id"] for h in state["history"]] == ["nightly-2026-11-01"]  # committed once
        row["outputs_equal"] = True
    finally:
        tally.add("kill_points", points=row["killed"], resumed=row["resumed"], outputs_equal=row["outputs_equal"])
