"""The SFT stage on a real tiny Llama (CPU, mindformers Trainer in its own process).

Cost: one base (conftest_sft.make_sft_base: 200 pretraining steps on the bundled instruction texts) and
one SFT stage run in two attempts, shared by every test here (the `memorized` fixture): attempt 1 trains
four prompt/answer pairs the base never saw and is stopped by the loss guard at step 30 (NaN injected
through LossGuard's test hook); attempt 2 resumes from the step-20 checkpoint and finishes 60 steps.
Both go through the stage registry (pipeline_lib.stages.run_stage), as the CLI and the Prefect task do.

Real mindformers 1.9 shapes (hidden 64, 4 heads of 16, 2 KV heads, so wk/wv project 64 -> 32): LoRA A
is [rank, in], B is [out, rank]; the four attention targets train r x ((64+64) + (64+32) + (64+32) +
(64+64)) = 8 x 448 numbers per layer, 7,168 for 2 layers (r x (in + out) per target, not 2 x r x ...).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest_sft import ROOT, make_sft_base  # noqa: E402

from pipeline_lib.stages import run_stage  # noqa: E402
from pipeline_lib.storage import read_manifest, sha256_file  # noqa: E402
from pipeline_lib.train.adapter import expected_lora_shapes, trainable_count  # noqa: E402
from pipeline_lib.train.launch import GuardTripped  # noqa: E402
from pipeline_lib.train.metrics import read_metrics  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.timeout(1200)]

# Answers swapped between prompts: every token is known to the base, the pairing is not.
MEMORIZE = [
    {"prompt": "主变压器的红外测温多久做一次？", "response": "开关柜每季度清扫一次。"},
    {"prompt": "How often is the switchgear dust cleaning done?",
     "response": "The battery bank needs a timing test once a year."},
    {"instruction": "回答运维问题。", "input": "避雷器需要做哪项检测？", "output": "断路器的机械特性测试应每月一次。"},
    {"messages": [{"role": "user", "content": "The cable line shows low voltage. What now?"},
                  {"role": "assistant", "content": "Check the cooling fans and measure each cell."}]},
]


@pytest.fixture(scope="module")
def sft_base(tmp_path_factory):
    return make_sft_base(tmp_path_factory.mktemp("sft_base"))


def losses(stage_dir: Path) -> list[float]:
    """Loss per step 1..n (a resumed step counts with its last record)."""
    by_step = {r["step"]: r["loss"] for r in read_metrics(stage_dir / "train" / "metrics.jsonl")}
    return [by_step[s] for s in sorted(by_step)]


@pytest.fixture(scope="module")
def memorized(sft_base, tmp_path_factory):
    """The SFT stage run (guard stop at step 30, then resume) and what the tests need from it."""
    data = tmp_path_factory.mktemp("sft_data") / "memorize.jsonl"
    data.write_text("\n".join(json.dumps(s, ensure_ascii=False) for s in MEMORIZE) + "\n", encoding="utf-8")
    cfg = sft_base.config(sft={"inputs": [str(data)], "steps": 60, "learning_rate": 0.03, "warmup_steps": 3},
                          training={"warmup_steps": 3, "save_steps": 20})
    paths = sft_base.paths("memorize")
    stage = Path(paths.stage_uri("sft"))
    base_sha = sha256_file(sft_base.checkpoint)
    first: list[str] = []
    os.environ["LLM_PIPELINE_INJECT_NAN_STEP"] = "30"
    try:
        with pytest.raises(GuardTripped) as tripped:
            run_stage(cfg, paths, "sft", log=first.append)
    finally:
        del os.environ["LLM_PIPELINE_INJECT_NAN_STEP"]
    after_failure = {"latest": json.loads((stage / "train" / "latest_checkpoint.json").read_text()),
                     "manifest": read_manifest(str(stage)), "records": read_metrics(stage / "train" / "metrics.jsonl")}
    second: list[str] = []
    manifest, skipped = run_stage(cfg, paths, "sft", log=second.append)
    return {"cfg": cfg, "paths": paths, "stage": stage, "base_sha": base_sha, "tripped": tripped.value,
            "after_failure": after_failure, "manifest": manifest, "skipped": skipped, "logs": (first, second)}


def inspect_checkpoints(adapter: Path, sft_ckpt: Path, base: Path, mindrecord: Path) -> dict:
    """Names/shapes of the adapter file, what mindspore.load_checkpoint reads from the final SFT checkpoint (LoRA only)
    and its optimizer file (train.checkpoint_split), the base's weights, the SFT rows."""
    from pipeline_lib.train.checkpoint_split import optimizer_file

    code = textwrap.dedent("""
        import json, sys
        import numpy as np, mindspore as ms
        from pipeline_lib.train.sft_data import read_sft_mindrecord
        adapter, sft, opt, base = (ms.load_checkpoint(p) for p in sys.argv[1:5])
        ids, labels = read_sft_mindrecord(sys.argv[5])
        weights = [n for n in base if "." in n and not n.startswith(("adam_m.", "adam_v."))]
        print("RESULT " + json.dumps({
            "adapter": {n: list(p.shape) for n, p in adapter.items()},
            "adapter_dtypes": sorted({str(p.dtype) for p in adapter.values()}),
            "sft": {n: list(p.shape) for n, p in sft.items()},
            "same_as_adapter": all(np.array_equal(sft[n].asnumpy(), adapter[n].asnumpy()) for n in adapter),
            "optimizer": sorted(opt), "global_step": int(opt["global_step"].asnumpy().reshape(-1)[0]),
            "moments": sorted(n[len("adam_m."):] for n in opt if n.startswith("adam_m.")),
            "weights": len(weights),
            "rows": list(ids.shape), "labels_ok": bool(((labels == ids) | (labels == -100)).all()),
            "trained": int((labels[:, 1:] != -100).sum())}))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    out = subprocess.run([sys.executable, "-c", code, str(adapter), str(sft_ckpt), str(optimizer_file(sft_ckpt)),
                          str(base), str(mindrecord)],
                         capture_output=True, text=True, env=env, cwd=adapter.parent, timeout=300)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, out.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def test_guard_stops_on_nan_and_the_rerun_resumes_from_the_last_good_checkpoint(memorized):
    assert "step 30" in str(memorized["tripped"]) and memorized["tripped"].diagnoses[0]["reason"] == "nonfinite"
    failed = memorized["after_failure"]
    assert failed["manifest"] is None and failed["latest"]["step"] == 20  # the NaN step was never kept
    assert any("sft: training 60 steps from" in ln and "(resume)" not in ln for ln in memorized["logs"][0])
    assert any("sft: training 60 steps from" in ln and "(resume)" in ln for ln in memorized["logs"][1])
    m = memorized["manifest"].metrics
    assert not memorized["skipped"] and m["resumed"] is True and m["steps"] == 60
    # the resumed attempt replays steps 21-29 exactly: weights, optimizer state and data position restored.
    # metrics.jsonl holds each step once: the failed attempt's rows past its checkpoint were superseded.
    before = {r["step"]: r for r in failed["records"]}
    after = read_metrics(memorized["stage"] / "train" / "metrics.jsonl")
    assert [r["step"] for r in after] == list(range(1, 61))
    assert {r["attempt"] for r in after if r["step"] <= 20} == {1} and {r["attempt"] for r in after if r["step"] > 20} == {2}
    redone = {r["step"]: r["loss"] for r in after}
    assert before[30]["loss"] != before[30]["loss"] and redone[30] == redone[30]  # NaN, then redone
    assert all(abs(before[s]["loss"] - redone[s]) < 1e-4 for s in range(21, 30)), \
        {s: (before[s]["loss"], redone[s]) for s in range(21, 30)}


def test_tensorboard_event_files_of_both_attempts_hold_the_loss(memorized):
    """The SFT stage's event files (mindformers' tensorboard section) under the lineage's folder: both attempts (the
    guard stop and the resume) wrote into the same run's folder, the loss of every step 1..60 among them."""
    from tensorboard_events import event_files, read_scalars

    cfg, paths = memorized["cfg"], memorized["paths"]
    folder = Path(cfg.run.output_root) / "_tensorboard" / cfg.run.name / paths.run_id / "sft"
    assert len(event_files(folder / "rank_0")) >= 2  # one per attempt
    loss = read_scalars(folder)["loss"]
    assert sorted(loss) == list(range(1, 61))
    assert loss[60] == pytest.approx(losses(memorized["stage"])[-1], rel=1e-4)


def test_lora_alone_memorizes_four_new_pairs(memorized):
    curve = losses(memorized["stage"])
    assert len(curve) == 60 and all(v == v for v in curve)
    assert curve[0] > 1.0, f"the base already knows the swapped answers: {curve[:3]}"
    assert max(curve[-5:]) < 0.15, f"LoRA did not memorize 4 samples: {curve[::10]} ... {curve[-5:]}"
    m = memorized["manifest"].metrics
    assert m["loss_first"] == curve[0] and m["loss_last"] == curve[-1]


def test_adapter_holds_only_lora_factors_and_the_base_is_bitwise_unchanged(memorized, sft_base):
    stage, cfg, m = memorized["stage"], memorized["cfg"], memorized["manifest"].metrics
    assert sha256_file(sft_base.checkpoint) == memorized["base_sha"]  # the base file is never rewritten
    sft_ckpt = Path(json.loads((stage / "train" / "latest_checkpoint.json").read_text())["path"])
    found = inspect_checkpoints(stage / m["adapter_checkpoint"], sft_ckpt, sft_base.checkpoint,
                                stage / "data" / "sft.mindrecord")
    expected = {n: list(s) for n, s in expected_lora_shapes(cfg.model, ["wq", "wk", "wv", "wo"], 8).items()}
    assert found["adapter"] == expected  # only LoRA factors: no base weight, no optimizer state
    for layer in (0, 1):
        p = f"model.layers.{layer}.attention."
        assert found["adapter"][p + "wq.mindpet_delta_lora_a"] == [8, 64]   # A: rank x in
        assert found["adapter"][p + "wq.mindpet_delta_lora_b"] == [64, 8]   # B: out x rank
        assert found["adapter"][p + "wk.mindpet_delta_lora_b"] == [32, 8]   # GQA: 2 KV heads x 16
        assert found["adapter"][p + "wv.mindpet_delta_lora_b"] == [32, 8]
        assert found["adapter"][p + "wo.mindpet_delta_lora_a"] == [8, 64]
    count = sum(a * b for a, b in found["adapter"].values())
    assert count == 2 * 8 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64)) == 7168
    assert count == trainable_count(cfg.model, ["wq", "wk", "wv", "wo"], 8) == m["trainable_params"]
    assert found["moments"] == sorted(expected)  # the optimizer trained exactly these, nothing else
    # the final SFT checkpoint holds what LoRA trains (the adapter's factors) and no base weight, no optimizer state;
    # its optimizer file the moments and the counters; its frozen weights were found equal to the base bitwise
    # (loaded, not random, frozen) before they were left to it
    assert found["sft"] == expected and found["same_as_adapter"] and found["global_step"] == 60
    assert {"global_step", "step_num", "epoch_num", "scale_sense"} <= set(found["optimizer"])
    assert not any(n.startswith(("model.", "lm_head.")) for n in found["optimizer"])
    split = json.loads(Path(str(sft_ckpt) + ".verified.json").read_text())["split"]
    assert split["frozen_in_base"] == found["weights"] == 2 * 9 + 3
    assert split["base"] == {"path": str(sft_base.checkpoint), "sha256": memorized["base_sha"],
                             "size": sft_base.checkpoint.stat().st_size}
    assert sft_ckpt.stat().st_size < sft_base.checkpoint.stat().st_size / 20
    assert found["rows"] == [4, 65] and found["labels_ok"] and found["trained"] > 30

    config = json.loads((stage / m["adapter_config"]).read_text())
    assert (config["lora_rank"], config["lora_alpha"], config["scaling"]) == (8, 16.0, 2.0)
    assert config["target_modules"] == ["wq", "wk", "wv", "wo"]
    assert config["base_checkpoint"]["sha256"] == memorized["base_sha"] == m["base_sha256"]
    assert config["parameters"] == expected and config["trainable_params"] == 7168
    assert m["base_checkpoint"] == str(sft_base.checkpoint)


def test_manifest_outputs_and_a_finished_stage_is_skipped(memorized):
    stage, manifest = memorized["stage"], memorized["manifest"]
    outputs = {o["path"] for o in manifest.outputs}
    assert {"adapter/adapter.ckpt", "adapter/adapter_config.json", "data/sft.mindrecord", "sft.yaml", "loss.png",
            "quarantine.jsonl", "excluded.jsonl", "sft_stats.json", "train/metrics.jsonl"} <= outputs
    assert not any(p.startswith("train/checkpoint") for p in outputs)
    m = manifest.metrics
    assert m["tables"]["sft_data"]["rows"][-1]["file"] == "TOTAL" and m["images"] == {"loss": "loss.png"}
    assert m["samples"]["kept"] == 4 and m["samples"]["rows"] == 4
    sft_yaml = (stage / "sft.yaml").read_text()
    for fact in ("pet_type: lora", "run_mode: finetune", "model_name: sft_test_llama_lora", "lora_rank: 8",
                 "target_modules: .*wq$|.*wk$|.*wv$|.*wo$", "type: LossGuard", "type: PipelineMetrics"):
        assert fact in sft_yaml, fact
    assert run_stage(memorized["cfg"], memorized["paths"], "sft", log=lambda line: None)[1] is True
