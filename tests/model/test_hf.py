"""Hugging Face Llama safetensors import/export (pipeline_lib.model.hf) on tiny checkpoints the tests write.

- names and shapes: HF -> mindformers -> HF gives the same tensors (tied and untied); wrong shapes, a mismatched
  config.json, a missing head and unknown tensors are refused with the tensor, both shapes and the field to fix;
- rotary layout: a numpy proof that the interleaved -> half-split permutation turns interleaved RoPE into
  transformers' rotate_half RoPE, and that HF checkpoints need no permutation: the logits of mindformers'
  LlamaForCausalLM (MindSpore subprocess, tests/model_io.CausalLM) on a converted random checkpoint equal a numpy
  transcription of transformers' Llama forward (GQA, tied and untied); its parameter names are exactly the
  converted ones; export back to model.safetensors + config.json gives the original tensors;
- continued pretraining: the pretrain stage with model.hf_checkpoint starts from those weights (its step-1 loss
  equals the numpy forward's loss on the first batch) and a missing folder fails before anything is launched.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from pretrain_fixtures import ROOT, new_run  # noqa: E402

from pipeline_lib.config import config_from_dict  # noqa: E402
from pipeline_lib.model.hf import (HFImportError, check_hf_folder, convert_hf_to_mindformers,  # noqa: E402
                                   export_mindformers_to_hf, half_to_interleaved, hf_config_for,
                                   hf_to_mindformers, interleaved_to_half, load_hf_tensors, mindformers_to_hf)

SMALL = {"seq_length": 16, "vocab_size": 100, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "n_kv_heads": 2,
         "intermediate_size": 96}


def model_cfg(**over):
    return config_from_dict({"run": {"device_target": "CPU"}, "model": {**SMALL, **over}}).model


def hf_tensors(m, seed: int = 0, scale: float = 0.2) -> dict[str, np.ndarray]:
    """Random HF-named Llama weights for model config `m` (lm_head omitted when tied, as HF saves them)."""
    rng = np.random.default_rng(seed)
    hd = m.hidden_size // m.num_heads

    def w(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm():
        return (1 + 0.1 * rng.standard_normal(m.hidden_size)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(m.vocab_size, m.hidden_size), "model.norm.weight": norm()}
    for i in range(m.num_layers):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": w(m.num_heads * hd, m.hidden_size),
              p + "self_attn.k_proj.weight": w(m.kv_heads * hd, m.hidden_size),
              p + "self_attn.v_proj.weight": w(m.kv_heads * hd, m.hidden_size),
              p + "self_attn.o_proj.weight": w(m.hidden_size, m.num_heads * hd),
              p + "mlp.gate_proj.weight": w(m.intermediate_size, m.hidden_size),
              p + "mlp.up_proj.weight": w(m.intermediate_size, m.hidden_size),
              p + "mlp.down_proj.weight": w(m.hidden_size, m.intermediate_size),
              p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm()}
    if not m.tie_word_embeddings:
        t["lm_head.weight"] = w(m.vocab_size, m.hidden_size)
    return t


def write_hf(folder: Path, m, tensors=None, **config_over) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors if tensors is not None else hf_tensors(m), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**hf_config_for(m), **config_over}))
    return folder


# ---------------------------------------------------------------- numpy transcription of transformers' Llama

def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], -1)


def hf_logits(t: dict, m, ids: np.ndarray) -> np.ndarray:
    """transformers LlamaForCausalLM forward (eager attention), float64."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    b, s = ids.shape
    hd, heads, kv = m.hidden_size // m.num_heads, m.num_heads, m.kv_heads
    inv = 1.0 / (10000.0 ** (np.arange(0, hd, 2) / hd))
    freqs = np.arange(s)[:, None] * inv[None]
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb)[None, None], np.sin(emb)[None, None]
    mask = np.triu(np.full((s, s), -np.inf), 1)
    h = t["model.embed_tokens.weight"][ids]
    for i in range(m.num_layers):
        p = f"model.layers.{i}."
        x = _rms(h, t[p + "input_layernorm.weight"], m.rms_norm_eps)
        q = (x @ t[p + "self_attn.q_proj.weight"].T).reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
        k = (x @ t[p + "self_attn.k_proj.weight"].T).reshape(b, s, kv, hd).transpose(0, 2, 1, 3)
        v = (x @ t[p + "self_attn.v_proj.weight"].T).reshape(b, s, kv, hd).transpose(0, 2, 1, 3)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = np.repeat(k, heads // kv, axis=1), np.repeat(v, heads // kv, axis=1)  # repeat_kv
        a = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = (a @ v).transpose(0, 2, 1, 3).reshape(b, s, heads * hd)
        h = h + o @ t[p + "self_attn.o_proj.weight"].T
        x = _rms(h, t[p + "post_attention_layernorm.weight"], m.rms_norm_eps)
        g = x @ t[p + "mlp.gate_proj.weight"].T
        h = h + ((g / (1 + np.exp(-g))) * (x @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    h = _rms(h, t["model.norm.weight"], m.rms_norm_eps)
    head = t["model.embed_tokens.weight"] if m.tie_word_embeddings else t["lm_head.weight"]
    return h @ head.T


# ---------------------------------------------------------------- pure numpy

@pytest.mark.parametrize("tie", [False, True])
def test_round_trip_gives_the_same_tensors(tie):
    m = model_cfg(tie_word_embeddings=tie)
    t = hf_tensors(m)
    mf = hf_to_mindformers(t, m)
    assert "model.tok_embeddings.embedding_weight" in mf and "model.layers.1.attention.wk.weight" in mf
    assert mf["model.layers.0.feed_forward.w1.weight"] is t["model.layers.0.mlp.gate_proj.weight"]
    assert mf["model.layers.0.feed_forward.w2.weight"] is t["model.layers.0.mlp.down_proj.weight"]
    assert mf["model.layers.0.feed_forward.w3.weight"] is t["model.layers.0.mlp.up_proj.weight"]
    assert mf["model.norm_out.weight"] is t["model.norm.weight"]
    assert ("lm_head.weight" in mf) is (not tie) and len(mf) == 2 * 9 + 2 + (not tie)
    back = mindformers_to_hf({**mf, "adam_m.model.norm_out.weight": mf["model.norm_out.weight"],
                              "global_step": np.array([3])}, m)
    assert sorted(back) == sorted(t)
    for name in t:
        np.testing.assert_array_equal(back[name], t[name])


def first_batch_loss(mindrecord_dir, t: dict, m, rows: int, pad: int) -> float:
    """The numpy forward's masked mean NLL over the first `rows` rows of the first MindRecord file in
    `mindrecord_dir` (mindformers masks inputs equal to pad): what the trainer's step-1 loss must be."""
    from mindspore.mindrecord import FileReader

    reader = FileReader(str(sorted(Path(mindrecord_dir).glob("*.mindrecord"))[0]))
    batch = np.stack([item["input_ids"] for _, item in zip(range(rows), reader.get_next())]).astype(np.int64)
    reader.close()
    tokens, labels = batch[:, :-1], batch[:, 1:]
    logits = hf_logits(t, m, tokens)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    mask = tokens != pad
    return float((nll * mask).sum() / mask.sum())


def test_tied_checkpoint_with_a_saved_head_and_untied_config_without_head():
    tied = model_cfg(tie_word_embeddings=True)
    t = hf_tensors(model_cfg())  # has lm_head.weight
    assert "lm_head.weight" not in hf_to_mindformers(t, tied)  # the shared head is not a parameter of mindformers
    untied = model_cfg()
    with pytest.raises(HFImportError, match=r"lacks 1 tensor.*lm_head\.weight.*model\.tie_word_embeddings: true"):
        hf_to_mindformers(hf_tensors(tied), untied)


def test_shape_mismatch_names_tensor_both_shapes_and_field(tmp_path):
    m = model_cfg()
    t = hf_tensors(model_cfg(intermediate_size=128))
    with pytest.raises(HFImportError) as err:
        hf_to_mindformers(t, m)
    text = str(err.value)
    assert "model.layers.0.mlp.gate_proj.weight (mindformers model.layers.0.feed_forward.w1.weight)" in text
    assert "shape (128, 64)" in text and "expects (96, 64)" in text and "set model.intermediate_size" in text
    # the fast folder check says the same from the headers alone (config.json agrees with model.*)
    folder = write_hf(tmp_path / "wrong", m, t)
    with pytest.raises(HFImportError, match=r"gate_proj\.weight .*shape \(128, 64\).*\(96, 64\).*model\.intermediate_size"):
        check_hf_folder(folder, m)
    t = hf_tensors(m)
    t["model.layers.1.self_attn.k_proj.weight"] = t["model.layers.1.self_attn.q_proj.weight"]  # 4 instead of 2 KV heads
    with pytest.raises(HFImportError, match=r"k_proj\.weight .*\(64, 64\).*expects \(32, 64\).*model\.n_kv_heads"):
        hf_to_mindformers(t, m)
    t = hf_tensors(m) | {"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)}
    with pytest.raises(HFImportError, match=r"q_proj\.bias.*not part of a plain Llama"):
        hf_to_mindformers(t, m)


def test_config_mismatch_lists_every_field(tmp_path):
    m = model_cfg()
    folder = write_hf(tmp_path / "cfg", m, num_hidden_layers=3, vocab_size=128, rope_theta=500000.0)
    with pytest.raises(HFImportError) as err:
        check_hf_folder(folder, m)
    text = str(err.value)
    assert "config.json num_hidden_layers=3 but model.num_layers=2: set model.num_layers: 3" in text
    assert "config.json vocab_size=128 but model.vocab_size=100: set model.vocab_size: 128" in text
    assert "rope_theta=500000.0" in text
    with pytest.raises(HFImportError, match=r"model\.hf_checkpoint=.*no such folder"):
        check_hf_folder(tmp_path / "absent", m)


def test_interleaved_permutation_turns_meta_rope_into_rotate_half_rope():
    rng = np.random.default_rng(1)
    heads, hd, hidden, s = 2, 8, 16, 5
    w = rng.standard_normal((heads * hd, hidden))
    x = rng.standard_normal((s, hidden))
    inv = 1.0 / (10000.0 ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(s)[:, None] * inv[None]  # (s, hd/2)

    def rope_interleaved(q):  # Meta: complex pairs (2i, 2i+1)
        z = q.reshape(s, heads, hd // 2, 2)
        c, sn = np.cos(ang)[:, None], np.sin(ang)[:, None]
        return np.stack([z[..., 0] * c - z[..., 1] * sn, z[..., 0] * sn + z[..., 1] * c], -1).reshape(s, heads, hd)

    def rope_half(q):  # transformers / mindformers: rotate_half over the two halves
        q = q.reshape(s, heads, hd)
        emb = np.concatenate([ang, ang], -1)[:, None]
        return q * np.cos(emb) + _rotate_half(q) * np.sin(emb)

    wp = interleaved_to_half(w, heads)
    np.testing.assert_array_equal(half_to_interleaved(wp, heads), w)
    a, b = rope_interleaved(x @ w.T), rope_half(x @ wp.T)
    # the same rotated vectors, dimensions reordered: attention scores q.k are identical
    perm = interleaved_to_half(np.arange(heads * hd)[:, None].astype(float), heads)[:, 0].astype(int)
    np.testing.assert_allclose(b.reshape(s, -1), a.reshape(s, -1)[:, perm], atol=1e-12)
    assert not np.allclose(rope_half(x @ w.T), a)  # without the permutation the layouts disagree


# ---------------------------------------------------------------- MindSpore: logits equivalence and export

LOGITS_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from model_io import CausalLM  # tests/model_io.py: PYTHONPATH has tests/
    out = {}
    for name, yaml_path, ckpt in json.loads(sys.argv[1]):
        model = CausalLM(yaml_path, ckpt, workdir=sys.argv[3] + "/" + name)
        ids = np.load(sys.argv[2])
        np.save(sys.argv[3] + f"/{name}_logits.npy", model.logits(ids))
        out[name] = {p.name: list(p.shape) for p in model.network.get_parameters()}
    print("PARAMS " + json.dumps(out))
""")


@pytest.mark.slow
def test_mindformers_logits_equal_transformers_forward_and_export_round_trips(tmp_path):
    from pipeline_lib.train.mindformers_yaml import build_run_config, write_run_yaml

    runs, ids = [], np.random.default_rng(2).integers(1, 100, size=(2, 16)).astype(np.int32)
    np.save(tmp_path / "ids.npy", ids)
    cases = {}
    for name, tie in (("untied", False), ("tied", True)):
        cfg = config_from_dict({"run": {"device_target": "CPU"}, "model": {**SMALL, "tie_word_embeddings": tie}})
        t = hf_tensors(cfg.model, seed=3 if tie else 4)
        folder = write_hf(tmp_path / f"hf_{name}", cfg.model, t)
        ckpt = convert_hf_to_mindformers(folder, tmp_path / f"{name}.ckpt", cfg.model)
        run = build_run_config(cfg, stage="pretrain", dataset_dir=str(tmp_path), output_dir=str(tmp_path / f"out_{name}"),
                               train_rows=64)
        yaml_path = write_run_yaml(cfg, tmp_path / f"{name}.yaml", run, stage="pretrain")
        runs.append((name, str(yaml_path), str(ckpt)))
        cases[name] = (cfg.model, t, ckpt)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), GLOG_v="3",
               LOG_MF_PATH=str(tmp_path / "log"),
               MS_OM_PATH=str(tmp_path / "om"))
    proc = subprocess.run([sys.executable, "-c", LOGITS_SCRIPT, json.dumps(runs), str(tmp_path / "ids.npy"),
                           str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PARAMS ")), None)
    assert line, proc.stderr[-4000:]
    params = json.loads(line[len("PARAMS "):])
    from pipeline_lib.model.hf import expected_mf_shapes

    for name, (m, t, ckpt) in cases.items():
        # the converted names are exactly mindformers 1.9's LlamaForCausalLM parameters
        assert {k: tuple(v) for k, v in params[name].items()} == expected_mf_shapes(m)
        ours = np.load(tmp_path / f"{name}_logits.npy")
        ref = hf_logits(t, m, ids)
        assert ours.shape == ref.shape == (2, 16, 100)
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=2e-4, err_msg=name)
        assert np.abs(ref).max() > 1.0  # logits far from uniform: the weights matter
        # permuting wq/wk (as if HF stored interleaved pairs) changes the logits: the test sees the layout
        wrong = dict(t)
        for i in range(m.num_layers):
            q = f"model.layers.{i}.self_attn.q_proj.weight"
            wrong[q] = interleaved_to_half(t[q], m.num_heads)
        assert np.abs(hf_logits(wrong, m, ids) - ref).max() > 1e-2
        # export back to HF names: the same tensors and a config.json describing model.*
        out = export_mindformers_to_hf(ckpt, tmp_path / f"export_{name}", m)
        back = load_hf_tensors(out)
        assert sorted(back) == sorted(t)
        for k in t:
            np.testing.assert_array_equal(back[k], t[k], err_msg=k)
        config = json.loads((out / "config.json").read_text())
        assert config["tie_word_embeddings"] is m.tie_word_embeddings and config["num_key_value_heads"] == 2
        check_hf_folder(out, m)


def test_bf16_safetensors_are_widened_exactly(tmp_path):
    m = model_cfg()
    t = hf_tensors(m)
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in t.items()}  # truncate to bf16
    header = {k: {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [0, 0]} for k, v in bits.items()}
    offset, blobs = 0, []
    for k, v in bits.items():
        header[k]["data_offsets"] = [offset, offset + v.nbytes]
        offset += v.nbytes
        blobs.append(v.tobytes())
    raw = json.dumps(header).encode()
    folder = tmp_path / "bf16"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))
    (folder / "config.json").write_text(json.dumps(hf_config_for(m, "bfloat16")))
    assert check_hf_folder(folder, m)["dtypes"] == ["BF16"]
    loaded = load_hf_tensors(folder)
    for k, v in bits.items():
        np.testing.assert_array_equal(loaded[k], (v.astype(np.uint32) << 16).view(np.float32))


# ---------------------------------------------------------------- the stage continues from HF weights

@pytest.mark.train
def test_stage_continues_pretraining_from_hf_checkpoint(pretrain_data, tmp_path):

    from pipeline_lib.train.metrics import read_metrics
    from pipeline_lib.stages import run_stage

    cfg, _ = new_run(pretrain_data, "hf-probe")
    t = hf_tensors(cfg.model, seed=5, scale=0.2)
    folder = write_hf(tmp_path / "hf", cfg.model, t)

    cfg, paths = new_run(pretrain_data, "hf-missing", model={"hf_checkpoint": str(tmp_path / "absent")})
    with pytest.raises(HFImportError, match="no such folder"):
        run_stage(cfg, paths, "pretrain", log=lambda line: None)
    assert not Path(paths.stage_uri("pretrain")).exists()

    cfg, paths = new_run(pretrain_data, "hf-continue", model={"hf_checkpoint": str(folder)},
                         training={"steps": 2, "save_steps": 2, "warmup_steps": 1,
                                   "shuffle": False})  # step 1 = the first rows, as the numpy forward
    lines: list[str] = []
    manifest, _ = run_stage(cfg, paths, "pretrain", log=lines.append)
    out = Path(paths.stage_uri("pretrain"))
    assert manifest.metrics["base"]["hf_checkpoint"] == str(folder)
    assert (out / "base" / "hf_import.ckpt").exists() and "hf_import.ckpt" in (out / "run.yaml").read_text()

    pad = json.loads((Path(paths.stage_uri("data")) / "tokenizer" / "tokenizer_config.json").read_text())["pad_id"]
    expected = first_batch_loss(Path(paths.stage_uri("data")) / "mindrecord" / "train", t, cfg.model, 4, pad)
    step1 = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}[1]["loss"]
    assert abs(expected - np.log(2048)) > 0.3  # far from a random init's ~ln(2048) = 7.62
    assert step1 == pytest.approx(expected, rel=2e-4), (step1, expected)



def test_a_two_shard_index_reads_as_the_single_file(tmp_path):
    """Llama-2-7b-hf ships model.safetensors.index.json + 2 shards: the import sees the same tensors."""
    from safetensors.numpy import save_file

    from pipeline_lib.model.hf import INDEX_FILE, read_hf_shapes

    m = model_cfg()
    t = hf_tensors(m, seed=9)
    single = write_hf(tmp_path / "single", m, t)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    names = sorted(t)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in parts.items():
        save_file({n: t[n] for n in part}, str(sharded / file))
    (sharded / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": sum(v.nbytes for v in t.values())},
                                                  "weight_map": {n: f for f, p in parts.items() for n in p}}))
    (sharded / "config.json").write_text((single / "config.json").read_text())
    (sharded / "stale.safetensors").write_bytes(b"not listed in the index: never read")
    one, two = load_hf_tensors(single), load_hf_tensors(sharded)
    assert sorted(one) == sorted(two) == names
    for k in names:
        np.testing.assert_array_equal(two[k], one[k], err_msg=k)
    assert read_hf_shapes(sharded) == read_hf_shapes(single)
    summary = check_hf_folder(sharded, m)
    assert summary["files"] == sorted(parts) and summary["tensors"] == len(names)
    mf_one, mf_two = hf_to_mindformers(one, m), hf_to_mindformers(two, m)
    assert sorted(mf_one) == sorted(mf_two)
    for k in mf_one:
        np.testing.assert_array_equal(mf_two[k], mf_one[k], err_msg=k)


def test_a_corrupt_safetensors_header_is_a_clear_error_not_a_memory_error(tmp_path):
    """Issue 45 item 10: a header length of 2^62 was read whole (MemoryError traceback)."""
    import struct

    m = model_cfg()
    folder = write_hf(tmp_path / "bad", m, hf_tensors(m))
    (weights,) = folder.glob("*.safetensors")
    body = weights.read_bytes()
    weights.write_bytes(struct.pack("<Q", 1 << 62) + body[8:])
    with pytest.raises(HFImportError, match=r"not a safetensors file \(its header length 4,611,686,018,427,387,904 "
                                            r"is beyond the file"):
        check_hf_folder(folder, m)
    n = struct.unpack("<Q", body[:8])[0]
    weights.write_bytes(body[:8] + b"[" * n + body[8 + n:])  # as long as the real header, not JSON
    with pytest.raises(HFImportError, match="header is not JSON"):
        check_hf_folder(folder, m)
    (folder / "config.json").write_text("[" * 100_000)
    with pytest.raises(HFImportError, match="config.json is not a model config"):
        check_hf_folder(folder, m)
