"""Framework-agnostic decoding over a logits function: greedy and seeded sampling.

What: `decode(logits_fn, prompts_ids, eos_id, pad_id, seq_length, max_new_tokens, ...)` grows every
prompt of a batch one token per step. Each step feeds the whole batch, right-padded with `pad_id` to
exactly `seq_length`, to `logits_fn(batch[B, seq_length]) -> logits[B, seq_length, vocab]`, reads each
row's logits at its last real position and picks the next token: argmax (greedy; ties go to the
lowest id, as numpy.argmax and the ArgMax kernels do) or a sample after temperature, top-k and top-p.
A row stops at `eos_id` (not included in its tokens), after `max_new_tokens`, or when it fills
`seq_length`.

Why this shape: on CPU mindformers' `generate` kernels are missing (ArgMaxExt/TopkExt/SortExt) and
there is no KV cache, but a forward in `set_train(False)` works; a causal model's logits at position
i do not depend on what follows i, so right padding is harmless. The same function drives a numpy
bigram table in tests and a MindSpore model in the worker (see pipeline_lib.model.llama.logits_fn).

Limits: no KV cache, so a step costs a full forward of seq_length tokens (fine for evaluation, not
for serving); the pad id is not masked out of the choice (parity with `generate`), a trained model
never predicts it. Sampling is reproducible: one numpy Generator per row, seeded from `seed` (an int,
spread over rows, or one seed per row so a prompt's sample does not depend on its batch).
Raises ValueError naming the argument for an empty or too-long prompt, bad sampling knobs, or logits
of the wrong shape or with NaN.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import numpy as np

LogitsFn = Callable[[np.ndarray], np.ndarray]
Strategy = Literal["greedy", "sample"]


@dataclass
class Generation:
    """One decoded row: new tokens (EOS excluded), why it stopped, and the prompt length used."""

    tokens: list[int] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"  # "eos" | "max_new_tokens" | "seq_length"
    prompt_len: int = 0


def check_sampling(strategy: str, temperature: float, top_k: int, top_p: float) -> None:
    if strategy not in ("greedy", "sample"):
        raise ValueError(f"strategy={strategy!r}: must be 'greedy' or 'sample' (evaluate.decoding)")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: must be > 0 (evaluate.temperature); use "
                         "strategy='greedy' for deterministic output")
    if top_k < 0:
        raise ValueError(f"top_k={top_k!r}: must be >= 0, 0 switches it off (evaluate.top_k)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r}: must be in (0, 1], 1 switches it off (evaluate.top_p)")


def filtered_probs(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> np.ndarray:
    """Sampling distribution over one row of logits after temperature, top-k, then top-p.

    top-k keeps the k largest logits (all tokens tied with the k-th are kept); top-p keeps the
    smallest prefix of tokens, by descending probability, whose mass reaches top_p (the most
    likely token is always kept). Returns float64 probabilities summing to 1.
    """
    x = np.asarray(logits, dtype=np.float64) / temperature
    if 0 < top_k < x.size:
        kth = np.partition(x, -top_k)[-top_k]
        x = np.where(x >= kth, x, -np.inf)
    x = x - x.max()
    probs = np.exp(x)
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        sorted_p = probs[order]
        before = np.cumsum(sorted_p) - sorted_p  # mass strictly before each token
        keep = np.zeros_like(probs, dtype=bool)
        keep[order[before < top_p]] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs


def sample_token(logits: np.ndarray, rng: np.random.Generator, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0) -> int:
    """Draw one token id from `filtered_probs` with `rng` (one uniform draw per token)."""
    probs = filtered_probs(logits, temperature, top_k, top_p)
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.size - 1))


def _row_rngs(seed: int | Sequence[int], n: int) -> list[np.random.Generator]:
    if isinstance(seed, (int, np.integer)):
        return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ValueError(f"seed has {len(seeds)} per-row seeds for {n} prompts; pass one int or one seed per prompt")
    return [np.random.default_rng(int(s)) for s in seeds]


def decode(logits_fn: LogitsFn, prompts_ids: Sequence[Sequence[int]], eos_id: int, pad_id: int,
           seq_length: int, max_new_tokens: int, strategy: Strategy = "greedy", temperature: float = 1.0,
           top_k: int = 0, top_p: float = 1.0, seed: int | Sequence[int] = 0) -> list[Generation]:
    """Decode every prompt of one batch; returns one Generation per prompt, in order.

    `logits_fn` always receives an int32 array of shape [len(prompts_ids), seq_length]; wrap it with
    `fixed_batch` when the model was compiled for another batch size.
    """
    check_sampling(strategy, temperature, top_k, top_p)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be >= 1 (evaluate.max_new_tokens)")
    n = len(prompts_ids)
    if n == 0:
        return []
    buf = np.full((n, seq_length), pad_id, dtype=np.int32)
    lengths = np.zeros(n, dtype=np.int64)
    for i, ids in enumerate(prompts_ids):
        if len(ids) == 0:
            raise ValueError(f"prompts_ids[{i}] is empty: a prompt needs at least one token (e.g. BOS)")
        if len(ids) >= seq_length:
            raise ValueError(f"prompts_ids[{i}] has {len(ids)} tokens, seq_length={seq_length} leaves no room "
                             "for a new token; truncate the prompt (see truncate_prompt) or raise model.seq_length")
        buf[i, :len(ids)] = ids
        lengths[i] = len(ids)
    gens = [Generation(prompt_len=int(lengths[i])) for i in range(n)]
    active = np.ones(n, dtype=bool)
    rngs = _row_rngs(seed, n) if strategy == "sample" else None
    rows = np.arange(n)
    for _ in range(max_new_tokens):
        logits = np.asarray(logits_fn(buf))
        if logits.ndim != 3 or logits.shape[:2] != (n, seq_length):
            raise ValueError(f"logits_fn returned shape {logits.shape}; expected ({n}, {seq_length}, vocab)")
        last = logits[rows, lengths - 1]
        for i in np.flatnonzero(active):
            row = last[i]
            if not np.all(np.isfinite(row)):
                raise ValueError(f"logits of prompt {i} at position {lengths[i] - 1} are not finite; "
                                 "check the checkpoint (NaN weights?)")
            tok = int(np.argmax(row)) if rngs is None else sample_token(row, rngs[i], temperature, top_k, top_p)
            if tok == eos_id:
                gens[i].stop_reason, active[i] = "eos", False
                continue
            buf[i, lengths[i]] = tok
            lengths[i] += 1
            gens[i].tokens.append(tok)
            if len(gens[i].tokens) >= max_new_tokens:
                active[i] = False  # stop_reason stays "max_new_tokens"
            elif lengths[i] >= seq_length:
                gens[i].stop_reason, active[i] = "seq_length", False
        if not active.any():
            break
    return gens


def fixed_batch(logits_fn: LogitsFn, batch_size: int, pad_id: int) -> LogitsFn:
    """Wrap a logits function compiled for exactly `batch_size` rows so it accepts 1..batch_size rows.

    Missing rows are filled with pad tokens (a leading non-pad token keeps them well defined) and
    their logits are dropped. Raises ValueError when more rows than `batch_size` arrive.
    """
    def wrapped(batch: np.ndarray) -> np.ndarray:
        n = batch.shape[0]
        if n > batch_size:
            raise ValueError(f"{n} rows for a model compiled with batch_size={batch_size}; split the prompts")
        if n == batch_size:
            return logits_fn(batch)
        full = np.full((batch_size, batch.shape[1]), pad_id, dtype=batch.dtype)
        full[:n] = batch
        full[n:, 0] = batch[0, 0]
        return np.asarray(logits_fn(full))[:n]
    return wrapped


def truncate_prompt(ids: Sequence[int], seq_length: int, max_new_tokens: int, keep_first: int = 0) -> list[int]:
    """Keep a prompt's last tokens so that max_new_tokens still fit (at least one new token always fits).

    `keep_first` tokens at the start (e.g. BOS) are kept in front of the kept tail.
    """
    room = max(1, min(max_new_tokens, seq_length - 1 - keep_first))
    budget = seq_length - room
    ids = list(ids)
    if len(ids) <= budget:
        return ids
    head = ids[:keep_first]
    return head + ids[len(ids) - (budget - len(head)):]
