"""The pipeline's Llama in MindSpore/mindformers, for inference: build it, move weights, get logits.

What: `prepare_env` (call before the first mindspore import), `build_llama(cfg, ...)` (the pipeline's
Llama, optionally with LoRA adapters through mindformers.pet.get_pet_model, in set_train(False)),
`read_checkpoint` / `write_checkpoint` (name -> numpy, dtypes kept, bf16 through float32),
`load_into` (strict: every network parameter must come from the checkpoint), `logits_fn(net)` for
decoding.decode, and `generate_greedy` (mindformers `generate`, used where its kernels exist).

Only worker processes (evaluate, export) call into it (MindSpore is imported inside the functions):
the orchestrating process never holds MindSpore state. Run from a scratch cwd: mindformers writes
./output otherwise.

The LlamaConfig keys are `llama_model_config`, the same definition the training yaml's model_config
uses (train/mindformers_yaml.py). Raises CheckpointMismatch naming the missing/misshaped parameters and the likely fix.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..config.platform import CPU_MODEL_OVERRIDES
from ..config.schema import PipelineConfig


def llama_model_config(cfg: PipelineConfig, *, batch_size: int, seq_length: int, on_cpu: bool, token_ids) -> dict:
    """The LlamaConfig keys of the pipeline's model: the yaml's `model.model_config` (without its `type`)
    and the keyword arguments of the LlamaConfig the evaluate/export workers build (pipeline_lib.model.llama),
    so training and inference build the same network. No KV cache (use_past), no checkpoint loading by
    the model itself; on CPU the measured overrides (platform.CPU_MODEL_OVERRIDES) apply."""
    m = cfg.model
    mc = {
        "batch_size": batch_size, "seq_length": seq_length,
        "hidden_size": m.hidden_size, "num_layers": m.num_layers, "num_heads": m.num_heads,
        "n_kv_heads": m.n_kv_heads, "intermediate_size": m.intermediate_size, "vocab_size": m.vocab_size,
        "rms_norm_eps": m.rms_norm_eps, **token_ids.model_config(), "ignore_token_id": -100,
        "tie_word_embeddings": m.tie_word_embeddings,
        "compute_dtype": m.compute_dtype, "param_init_type": m.param_init_type,
        "layernorm_compute_type": m.layernorm_compute_type, "softmax_compute_type": m.softmax_compute_type,
        "rotary_dtype": m.rotary_dtype, "use_flash_attention": m.use_flash_attention, "use_past": False,
        "checkpoint_name_or_path": "", "offset": 0,
    }
    if on_cpu:
        mc.update(CPU_MODEL_OVERRIDES)
    return mc



class CheckpointMismatch(ValueError):
    """A checkpoint does not fit the network built from the config."""


def prepare_env(log_dir: str | Path) -> None:
    """Quiet logs and keep mindformers/MindSpore files under `log_dir`; must precede `import mindspore`."""
    log_dir = Path(log_dir)
    os.environ.setdefault("GLOG_v", "3")
    os.environ.setdefault("LOG_MF_PATH", str(log_dir / "mindformers"))
    os.environ.setdefault("MS_OM_PATH", str(log_dir / "ms_om"))


def set_context(target: str) -> None:
    import mindspore as ms

    ms.set_context(mode=0, device_target=target)  # graph mode: ~10x faster than PyNative


def llama_kwargs(cfg: PipelineConfig, *, batch_size: int, seq_length: int, target: str, token_ids=None) -> dict:
    """LlamaConfig keyword arguments of the pipeline model (inference: no KV cache, no dropout).

    `token_ids` (token_ids.TokenIds): the tokenizer's ids; None means configured_ids(cfg.tokenizer)."""
    from .token_ids import configured_ids

    return llama_model_config(cfg, batch_size=batch_size, seq_length=seq_length, on_cpu=target == "CPU",
                              token_ids=token_ids or configured_ids(cfg.tokenizer))


def build_llama(cfg: PipelineConfig, *, batch_size: int, seq_length: int, target: str,
                lora: dict | None = None, token_ids=None):
    """The Llama of `cfg` wrapped by LogitsCell, in eval mode.

    `lora` = {"lora_rank", "lora_alpha", "target_modules" (regex)} adds mindformers' LoRA adapters
    (LoRADense: y = x W^T + (alpha / rank) * (x A^T) B^T) exactly as the SFT training graph does.
    """
    from ..runtime.deferred_imports import import_mindformers

    import_mindformers()
    from mindformers import LlamaConfig, LlamaForCausalLM

    net = LlamaForCausalLM(LlamaConfig(**llama_kwargs(cfg, batch_size=batch_size, seq_length=seq_length,
                                                       target=target, token_ids=token_ids)))
    if lora:
        from mindformers.pet import get_pet_model

        net = get_pet_model(net, {"pet_type": "lora", "lora_dropout": 0.0, **lora})
    cell = logits_cell(net)
    cell.set_train(False)
    return cell


def logits_cell(net):
    """A Cell returning only the float32 logits [B, S, vocab] of a mindformers causal LM."""
    import mindspore as ms
    from mindspore import nn

    class LogitsCell(nn.Cell):
        def __init__(self, network):
            super().__init__(auto_prefix=False)  # keep the checkpoint's parameter names
            self.network = network

        def construct(self, input_ids):
            out = self.network(input_ids)
            logits = out[0] if isinstance(out, tuple) else out
            return logits.astype(ms.float32)

    return LogitsCell(net)


def read_checkpoint(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(name -> array, name -> dtype name) of a .ckpt, a .safetensors file or a Checkpoint 2.0 folder
    (model/checkpoint_format.py); bfloat16 tensors come back as float32 arrays."""
    import mindspore as ms

    from .checkpoint_format import is_safetensors, read_weights

    path = Path(path)
    if path.exists() and is_safetensors(path):  # training.checkpoint_format=safetensors (Checkpoint 2.0)
        return read_weights(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} not found; pass an existing .ckpt or .safetensors file "
                                "or a Checkpoint 2.0 folder")
    arrays, dtypes = {}, {}
    for name, param in ms.load_checkpoint(str(path)).items():
        dtypes[name] = str(param.dtype).lower()
        arrays[name] = (param.astype(ms.float32) if param.dtype == ms.bfloat16 else param).asnumpy()
    return arrays, dtypes


def write_checkpoint(params: dict[str, np.ndarray], path: str | Path, dtypes: dict[str, str] | None = None) -> Path:
    """Save name -> array as a MindSpore .ckpt (each tensor cast back to its recorded dtype)."""
    import mindspore as ms

    dtypes = dtypes or {}
    items = []
    for name, arr in params.items():
        t = ms.Tensor(np.ascontiguousarray(arr))
        want = dtypes.get(name)
        if want and want != str(t.dtype).lower():
            t = t.astype(getattr(ms, want))
        items.append({"name": name, "data": t})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(items, str(path))
    return path


def load_into(net, params: dict[str, np.ndarray], what: str) -> None:
    """Load every parameter of `net` from `params`; refuse missing names and wrong shapes."""
    import mindspore as ms

    missing, misshaped, feed = [], [], {}
    for p in net.get_parameters():
        if p.name not in params:
            missing.append(p.name)
        elif tuple(params[p.name].shape) != tuple(p.shape):
            misshaped.append(f"{p.name}: checkpoint {tuple(params[p.name].shape)} vs model {tuple(p.shape)}")
        else:
            feed[p.name] = ms.Parameter(ms.Tensor(params[p.name]).astype(p.dtype), name=p.name)
    if missing or misshaped:
        hint = ("it looks like a LoRA adapter-only checkpoint: pass it as {'base': <ckpt>, 'adapter': <ckpt>}"
                if missing and all(".mindpet_delta_lora_" in k for k in params if k not in feed) else
                "check that model.* in the config matches the run that wrote the checkpoint")
        raise CheckpointMismatch(f"{what}: {len(missing)} parameters missing (e.g. {missing[:3]}), "
                                 f"{len(misshaped)} with another shape ({misshaped[:3]}); {hint}")
    ms.load_param_into_net(net, feed, strict_load=True)


def logits_fn(net):
    """numpy int32 [B, S] -> numpy float32 [B, S, vocab] through the compiled network."""
    import mindspore as ms

    def fn(batch: np.ndarray) -> np.ndarray:
        return net(ms.Tensor(np.asarray(batch, dtype=np.int32))).asnumpy()
    return fn


def generate_greedy(net, prompts_ids: list[list[int]], *, eos_id: int, pad_id: int,
                    max_new_tokens: int) -> list[list[int]]:
    """Greedy tokens from mindformers' own `generate` (Ascend; on CPU its kernels are missing and it raises).

    Returns the new tokens per prompt like decoding.decode: EOS and anything after it cut, batch
    padding (pad_id, never a real token) dropped, at most max_new_tokens.
    """
    model = net.network
    out = model.generate(input_ids=[list(p) for p in prompts_ids], do_sample=False, max_new_tokens=max_new_tokens,
                         eos_token_id=eos_id, pad_token_id=pad_id)
    result = []
    for prompt, row in zip(prompts_ids, out):
        new = [int(t) for t in np.asarray(row).reshape(-1)[len(prompt):]]
        new = new[:new.index(eos_id)] if eos_id in new else new
        while new and new[-1] == pad_id:
            new.pop()
        result.append(new[:max_new_tokens])
    return result
