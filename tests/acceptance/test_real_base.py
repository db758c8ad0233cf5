"""Acceptance: continued pretraining of a real Llama-class base with its own tokenizer, then LoRA, evaluate, export.

The base is what a user brings: a sentencepiece model with Llama-2's exact id layout and options (unk 0, bos 1,
eos 2, no pad piece, byte fallback; tests/conftest.py `llama2_tokenizer`) and a Hugging Face Llama folder
(config.json + a 2-shard model.safetensors.index.json, as Llama-2-7b-hf ships) made with numpy here. The whole
chain runs as a user runs it, `llm-pipeline run` in a subprocess with overrides (tokenizer.path,
model.hf_checkpoint, sft.template=llama2, tiny steps, preflight off), against the session's Prefect server:
- data: the tokenizer is loaded, not trained; tokenizer_config.json records pad 0 / unk 0 / bos 1 / eos 2;
- pretrain: run.yaml carries bos 1 / eos 2 / pad 0 and the step-1 loss equals a numpy transcription of
  transformers' Llama forward (tests/model/test_hf.py `hf_logits`) of the same weights on the first batch;
- sft: the llama2 template (markers as plain text) and sft.yaml with the same ids;
- evaluate: generations and perplexity of every checkpoint;
- export: `hf/` (model.safetensors + config.json + tokenizer.model) whose numpy-forward logits equal the
  exported MindIR's on the export stage's fixed inputs, and serving.json with the tokenizer's ids.
The run is module-scoped: one chain, several tests reading its folders.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "train"))
sys.path.insert(0, str(ROOT / "tests" / "model"))
from test_hf import first_batch_loss, hf_logits, hf_tensors  # noqa: E402  (the numpy reference forward)

from pipeline_lib.config import config_from_dict  # noqa: E402
from pipeline_lib.model.hf import INDEX_FILE, hf_config_for  # noqa: E402

MODEL = {"name": "real_base", "seq_length": 32, "vocab_size": 1000, "hidden_size": 32, "num_layers": 1,
         "num_heads": 4, "n_kv_heads": 2, "intermediate_size": 64}
RUN_ID = "real-base"


def write_sharded_hf(folder: Path, tensors: dict[str, np.ndarray], m) -> Path:
    """A Hugging Face folder whose weights are split over two files named by model.safetensors.index.json."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    files = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
             "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for file, part in files.items():
        save_file({n: tensors[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in part}
    total = sum(v.nbytes for v in tensors.values())
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(hf_config_for(m)))
    return folder


pytestmark = [pytest.mark.slow, pytest.mark.train]  # the whole chain, trained, on a Llama-2-layout base


@pytest.fixture(scope="module")
def chain(prefect_server, llama2_tokenizer, tmp_path_factory):
    """One `llm-pipeline run` of all five stages on the Llama-2-layout base; yields (cfg, run folder, tensors, s)."""
    root = tmp_path_factory.mktemp("real_base")
    m = config_from_dict({"model": MODEL}).model
    tensors = hf_tensors(m, seed=7, scale=0.2)
    hf = write_sharded_hf(root / "llama-hf", tensors, m)
    overrides = [f"run.output_root={root / 'runs'}", "run.device_target=CPU", "data.executor=local",
                 "data.num_workers=1", f"tokenizer.path={llama2_tokenizer}", f"model.hf_checkpoint={hf}",
                 *[f"model.{k}={v}" for k, v in MODEL.items()],
                 "training.micro_batch_size=2", "training.global_batch_size=2", "training.steps=2",
                 "training.warmup_steps=1", "training.save_steps=2", "training.preflight_steps=0",
                 "training.timeout_seconds=900", "training.shuffle=false",  # step 1 = the first rows (numpy check)
                 "sft.template=llama2", "sft.steps=2", "sft.warmup_steps=0", "sft.micro_batch_size=2", "sft.lora_rank=4",
                 "evaluate.prompt_files=[configs/eval/domain_qa.jsonl]", "evaluate.max_new_tokens=3",
                 "evaluate.batch_size=2", "evaluate.perplexity_max_rows=4"]
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", "configs/pipelines/tiny-cpu.yaml",
                           "--run-id", RUN_ID, *overrides], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seconds = time.time() - started
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    from pipeline_lib.config.load import load_config

    cfg = load_config(ROOT / "configs/pipelines/tiny-cpu.yaml", overrides)
    print(f"\nreal-base chain: {seconds:.0f} s")
    return cfg, root / "runs" / RUN_ID, tensors, seconds


def test_data_stage_keeps_the_base_tokenizer_and_records_its_ids(chain):
    _, run, _, _ = chain
    meta = json.loads((run / "data" / "tokenizer" / "tokenizer_config.json").read_text())
    assert (meta["pad_id"], meta["unk_id"], meta["bos_id"], meta["eos_id"]) == (0, 0, 1, 2)
    assert meta["source"].startswith("loaded from") and meta["vocab_size"] == 1000


def test_generated_yamls_carry_the_tokenizer_ids(chain):
    _, run, _, _ = chain
    for path in (run / "pretrain" / "run.yaml", run / "sft" / "sft.yaml"):
        mc = yaml.safe_load(path.read_text())["model"]["model_config"]
        assert (mc["bos_token_id"], mc["eos_token_id"], mc["pad_token_id"]) == (1, 2, 0), path


def test_continued_pretraining_starts_from_the_hf_weights(chain):
    """Step-1 loss = the numpy forward's masked mean NLL on the first batch (mindformers masks inputs == pad)."""
    cfg, run, tensors, _ = chain
    expected = first_batch_loss(run / "data" / "mindrecord" / "train", tensors, cfg.model, 2,
                                pad=0)  # the tokenizer's pad (= unk) id
    from pipeline_lib.train.metrics import read_metrics

    step1 = {r["step"]: r for r in read_metrics(run / "pretrain" / "metrics.jsonl")}[1]["loss"]
    assert abs(expected - np.log(1000)) > 0.3  # far from a random init's ~ln(vocab)
    assert step1 == pytest.approx(expected, rel=2e-4), (step1, expected)


def test_sft_used_the_plain_text_llama2_template(chain):
    _, run, _, _ = chain
    stats = json.loads((run / "sft" / "sft_stats.json").read_text())
    assert stats["template"]["name"] == "llama2" and stats["token_ids"] == {"pad_id": 0, "unk_id": 0, "bos_id": 1,
                                                                            "eos_id": 2}
    assert stats["total"]["kept"] > 0 and stats["total"]["row_trained_tokens"] > 0


def test_evaluate_ran_every_checkpoint(chain):
    _, run, _, _ = chain
    manifest = json.loads((run / "evaluate" / "manifest.json").read_text())
    gens = sorted(p.name for p in (run / "evaluate").rglob("generations.jsonl"))
    assert manifest["stage"] == "evaluate" and len(gens) >= 2


MINDIR_LOGITS = textwrap.dedent("""
    import sys
    import numpy as np
    from pipeline_lib.export.mindir import reload_logits
    np.save(sys.argv[3], reload_logits(sys.argv[1], np.load(sys.argv[2])))
""")


def test_export_writes_an_hf_folder_whose_logits_match_the_served_model(chain, tmp_path):
    from pipeline_lib.export.mindir import fixed_inputs
    from pipeline_lib.model.hf import check_hf_folder, load_hf_tensors

    cfg, run, tensors, _ = chain
    export = run / "export"
    hf = export / "hf"
    assert {"model.safetensors", "config.json", "tokenizer.model"} <= {p.name for p in hf.iterdir()}
    check_hf_folder(hf, cfg.model)
    exported = load_hf_tensors(hf)
    assert sorted(exported) == sorted(tensors)
    assert any(not np.array_equal(exported[k], tensors[k]) for k in tensors)  # trained, not the base copied
    spec = json.loads((export / "serving" / "serving.json").read_text())
    assert spec["special_ids"] == {"pad": 0, "unk": 0, "bos": 1, "eos": 2}
    inputs = fixed_inputs(spec["batch_size"], spec["seq_length"], cfg.model.vocab_size, 0, seed=cfg.run.seed)
    np.save(tmp_path / "ids.npy", inputs)
    proc = subprocess.run([sys.executable, "-c", MINDIR_LOGITS, str(export / "serving" / "model.mindir"),
                           str(tmp_path / "ids.npy"), str(tmp_path / "logits.npy")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = np.load(tmp_path / "logits.npy")
    ours = hf_logits(exported, cfg.model, inputs.astype(np.int64))
    assert served.shape == ours.shape
    np.testing.assert_allclose(served, ours, rtol=1e-4, atol=2e-4)
