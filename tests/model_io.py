"""Forward-only access to a trained model: build it from a generated run yaml, load weights, get logits.

What: `CausalLM(yaml_path, checkpoint, adapter=None)` builds the network the yaml describes
(`mindformers.models.build_network`, so a yaml with `pet_config` gives the LoRA model), loads a
full checkpoint (and optionally an adapter-only file from `checkpoint_trainable/` on top), puts it in
`set_train(False)` and graph mode on the yaml's device (`workdir`, default <yaml dir>/model_io,
receives mindformers' logs and files; `quiet` drops its INFO lines). `logits(ids)` right-pads each row to
`seq_length` with the pad id (causal attention: padding does not change earlier positions) and
returns float32 logits `[batch, len, vocab]`. `greedy_decode` is numpy argmax over those logits.

Why not `model.generate`: on CPU it fails (`ArgMaxExt`/`TopkExt`/`SortExt` kernels missing, and
`use_past` needs an Ascend rotary op), so there is no KV cache here: every new token is one full
forward of `seq_length` positions. Each new batch size compiles a new graph (~5-10 s on CPU): keep
the batch size fixed.

Limits: single process (the yaml's parallel settings are replaced by stand-alone); sequences longer
than `seq_length` are refused. Raises ValueError for a missing checkpoint, weights the network
does not get from the files (names listed), or input that does not fit.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np


def _prepare_env(workdir: str) -> None:
    os.environ.setdefault("LOG_MF_PATH", os.path.join(workdir, "log"))
    os.environ.setdefault("MS_OM_PATH", os.path.join(workdir, "om"))
    os.environ.setdefault("GLOG_v", "3")


class CausalLM:
    """A Llama from a mindformers run yaml with loaded weights, for logits and greedy decoding."""

    def __init__(self, yaml_path: str | Path, checkpoint: str | Path, *, adapter: str | Path | None = None,
                 workdir: str | Path | None = None, quiet: bool = True):
        for name, path in (("checkpoint", checkpoint), ("adapter", adapter)):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}={str(path)!r}: no such checkpoint file")
        workdir = str(workdir or Path(yaml_path).resolve().parent / "model_io")
        _prepare_env(workdir)
        import mindspore as ms
        from mindformers import MindFormerConfig, build_context
        from mindformers.models.build_model import build_network
        from mindformers.tools.logger import get_logger

        if quiet:
            get_logger().setLevel(logging.WARNING)

        cfg = MindFormerConfig(os.path.realpath(str(yaml_path)))
        cfg.use_parallel = False
        cfg.output_dir = workdir
        cfg.load_checkpoint = ""
        cfg.parallel.parallel_mode = 0
        cfg.parallel.full_batch = False
        cfg.model.model_config.use_past = False
        cfg.model.model_config.checkpoint_name_or_path = ""
        # mindformers writes files (LoRA adapter_config.json) under LOCAL_DEFAULT_PATH (default ./output);
        # build_context points it at output_dir. Restore the caller's value afterwards.
        saved = os.environ.get("LOCAL_DEFAULT_PATH")
        os.environ["LOCAL_DEFAULT_PATH"] = os.path.realpath(workdir)
        try:
            build_context(cfg)
            self.network = build_network(cfg.model)
        finally:
            if saved is None:
                os.environ.pop("LOCAL_DEFAULT_PATH", None)
            else:
                os.environ["LOCAL_DEFAULT_PATH"] = saved
        self.network.set_train(False)
        self.ms = ms
        self.seq_length = int(cfg.model.model_config.seq_length)
        self.vocab_size = int(cfg.model.model_config.vocab_size)
        self.pad_id = int(cfg.model.model_config.pad_token_id)
        self.eos_id = int(cfg.model.model_config.eos_token_id)
        self._load(checkpoint, adapter)

    def _load(self, checkpoint, adapter) -> None:
        ms = self.ms
        wanted = {p.name for p in self.network.get_parameters()}
        loaded: set[str] = set()
        for path in (checkpoint, adapter):
            if path is None:
                continue
            params = ms.load_checkpoint(str(path), choice_func=lambda name: name in wanted)
            ms.load_param_into_net(self.network, params, strict_load=False)
            loaded |= set(params)
        missing = sorted(wanted - loaded)
        if missing:
            raise ValueError(f"checkpoint={str(checkpoint)!r} adapter={adapter!r} do not hold {len(missing)} network "
                             f"weights, e.g. {missing[:4]}; pass the stage's full checkpoint (LoRA: the "
                             "checkpoint/rank_0 file, or the base checkpoint plus adapter=<trainable file>)")

    def logits(self, input_ids) -> np.ndarray:
        """Float32 logits [batch, len, vocab] for int token ids [batch, len] (len <= seq_length)."""
        ids = np.asarray(input_ids, dtype=np.int32)
        if ids.ndim == 1:
            ids = ids[None, :]
        batch, length = ids.shape
        if not 1 <= length <= self.seq_length:
            raise ValueError(f"input length {length} must be within 1..seq_length={self.seq_length}")
        padded = np.full((batch, self.seq_length), self.pad_id, dtype=np.int32)
        padded[:, :length] = ids
        out = self.network(self.ms.Tensor(padded, self.ms.int32))
        logits = out[0] if isinstance(out, (tuple, list)) else out
        logits = logits.asnumpy().reshape(batch, self.seq_length, -1)
        return logits[:, :length, :].astype(np.float32)

    def greedy_decode(self, prompts: list[list[int]], max_new_tokens: int, *, stop_at_eos: bool = True,
                      batch_size: int | None = None) -> list[list[int]]:
        """New tokens per prompt by argmax; a full forward per token (no KV cache on CPU).

        Prompts are processed in fixed batches of `batch_size` (default len(prompts); the last batch is
        padded with copies) so one graph serves all calls. A prompt plus its new tokens must fit
        seq_length; decoding stops early at the window end.
        """
        if any(len(p) < 1 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if any(len(p) > self.seq_length for p in prompts):
            raise ValueError(f"a prompt is longer than seq_length={self.seq_length}")
        size = batch_size or len(prompts)
        results: list[list[int]] = []
        for start in range(0, len(prompts), size):
            chunk = [list(p) for p in prompts[start:start + size]]
            real = len(chunk)
            chunk += [list(chunk[-1]) for _ in range(size - real)]
            results += self._greedy_batch(chunk, max_new_tokens, stop_at_eos)[:real]
        return results

    def _greedy_batch(self, seqs: list[list[int]], max_new_tokens: int, stop_at_eos: bool) -> list[list[int]]:
        new = [[] for _ in seqs]
        done = [False] * len(seqs)
        for _ in range(max_new_tokens):
            lengths = [len(s) for s in seqs]
            if all(done) or max(lengths) >= self.seq_length:
                break
            window = np.full((len(seqs), max(lengths)), self.pad_id, dtype=np.int32)
            for i, s in enumerate(seqs):
                window[i, :len(s)] = s
            out = self.logits(window)
            for i, s in enumerate(seqs):
                if done[i]:
                    continue
                token = int(np.argmax(out[i, lengths[i] - 1]))
                s.append(token)
                new[i].append(token)
                done[i] = stop_at_eos and token == self.eos_id
        return new
