"""decoding.decode against hand-computed paths on a numpy bigram "model", and the sampling maths."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.evaluate.decoding import decode, filtered_probs, fixed_batch, sample_token, truncate_prompt

PAD, BOS, EOS, V = 0, 2, 3, 8
# Preferred next token after each token. After PAD the table prefers 1: a decoder that read the
# logits at a padded position instead of the last real one would emit 1s.
NEXT = {0: 1, 1: 1, 2: 4, 3: 1, 4: 5, 5: EOS, 6: 7, 7: 6}


def bigram_table() -> np.ndarray:
    table = np.full((V, V), -1.0)
    for cur, nxt in NEXT.items():
        table[cur, nxt] = 2.0
    return table


class BigramModel:
    """logits[b, j] = table[ids[b, j]]: the next token depends only on the current one."""

    def __init__(self):
        self.table = bigram_table()
        self.calls = []

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.calls.append(batch.copy())
        return self.table[batch]


def test_greedy_matches_hand_computed_paths():
    model = BigramModel()
    prompts = [[BOS], [BOS, 6], [6, 7, 6, 7, 6]]
    gens = decode(model, prompts, EOS, PAD, seq_length=8, max_new_tokens=4)
    # By hand: 2->4->5->EOS; 6->7->6->7->6 (4 new tokens); the third fills seq_length=8 after 3.
    assert [g.tokens for g in gens] == [[4, 5], [7, 6, 7, 6], [7, 6, 7]]
    assert [g.stop_reason for g in gens] == ["eos", "max_new_tokens", "seq_length"]
    assert [g.prompt_len for g in gens] == [1, 2, 5]
    first = model.calls[0]
    assert first.shape == (3, 8) and first.dtype == np.int32
    assert first[0].tolist() == [BOS, PAD, PAD, PAD, PAD, PAD, PAD, PAD]  # right-padded to seq_length
    assert len(model.calls) == 4  # stops once every row is done


def test_greedy_tie_goes_to_lowest_id():
    flat = lambda batch: np.zeros(batch.shape + (V,))  # noqa: E731
    assert decode(flat, [[BOS]], EOS, PAD, 8, 3)[0].tokens == [0, 0, 0]


def test_batch_does_not_change_a_rows_greedy_tokens():
    alone = decode(BigramModel(), [[BOS, 6]], EOS, PAD, 8, 4)[0].tokens
    together = decode(BigramModel(), [[6, 7, 6, 7, 6], [BOS, 6], [BOS]], EOS, PAD, 8, 4)[1].tokens
    assert alone == together == [7, 6, 7, 6]


def test_filtered_probs_top_k_top_p_temperature():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(p)
    np.testing.assert_allclose(filtered_probs(logits), p)
    np.testing.assert_allclose(filtered_probs(logits, top_k=2), [0.625, 0.375, 0, 0])
    # top-p keeps tokens while the mass before them is < top_p: 0 and 0.5 < 0.75, then 0.8 stops.
    np.testing.assert_allclose(filtered_probs(logits, top_p=0.75), [0.625, 0.375, 0, 0])
    np.testing.assert_allclose(filtered_probs(logits, top_p=0.85), np.r_[p[:3] / 0.95, 0])
    np.testing.assert_allclose(filtered_probs(logits, top_p=0.01), [1, 0, 0, 0])
    np.testing.assert_allclose(filtered_probs(logits, temperature=0.5), p ** 2 / (p ** 2).sum())


def test_sample_token_follows_the_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(7)
    draws = np.bincount([sample_token(logits, rng) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(draws, [0.5, 0.3, 0.15, 0.05], atol=0.015)
    rng = np.random.default_rng(7)
    assert {sample_token(logits, rng, top_k=2) for _ in range(500)} == {0, 1}


def _noisy(batch):
    rng = np.random.default_rng(int(batch.sum()))
    return rng.standard_normal(batch.shape + (V,))


def test_sampling_is_seeded_and_per_row_seeds_ignore_the_batch():
    prompts = [[BOS], [BOS, 4], [BOS, 6]]
    run = lambda seed: [g.tokens for g in decode(_noisy, prompts, EOS, PAD, 16, 6, "sample", seed=seed)]  # noqa: E731
    assert run(11) == run(11)
    assert run(11) != run(12)
    # A prompt's sample with per-row seeds does not depend on its neighbours (the model is causal).
    causal = lambda b: bigram_table()[b] + np.cumsum(b, axis=1)[..., None] * 0.37 % 1.0  # noqa: E731
    alone = decode(causal, [[BOS, 6]], EOS, PAD, 16, 6, "sample", temperature=2.0, seed=[99])
    batch = decode(causal, [[BOS], [BOS, 6], [7]], EOS, PAD, 16, 6, "sample", temperature=2.0, seed=[1, 99, 2])
    assert alone[0].tokens == batch[1].tokens


def test_top_k_one_sampling_equals_greedy():
    prompts = [[BOS], [BOS, 6], [6, 7, 6, 7, 6]]
    greedy = decode(BigramModel(), prompts, EOS, PAD, 8, 4)
    sampled = decode(BigramModel(), prompts, EOS, PAD, 8, 4, "sample", temperature=3.0, top_k=1, seed=5)
    assert [g.tokens for g in greedy] == [g.tokens for g in sampled]


@pytest.mark.parametrize("kwargs, match", [
    ({"prompts_ids": [[]]}, "empty"),
    ({"prompts_ids": [[BOS] * 8]}, "seq_length=8"),
    ({"strategy": "beam"}, "strategy"),
    ({"temperature": 0.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_bad_arguments_name_the_field(kwargs, match):
    args = {"logits_fn": BigramModel(), "prompts_ids": [[BOS]], "eos_id": EOS, "pad_id": PAD, "seq_length": 8,
            "max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        decode(**args)


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match="shape"):
        decode(lambda b: np.zeros((1, 8, V)), [[BOS], [BOS]], EOS, PAD, 8, 2)
    with pytest.raises(ValueError, match="not finite"):
        decode(lambda b: np.full(b.shape + (V,), np.nan), [[BOS]], EOS, PAD, 8, 2)


def test_fixed_batch_pads_rows_and_drops_their_logits():
    seen = []
    fn = fixed_batch(lambda b: (seen.append(b.shape), bigram_table()[b])[1], batch_size=4, pad_id=PAD)
    gens = decode(fn, [[BOS], [BOS, 6]], EOS, PAD, 8, 4)
    assert [g.tokens for g in gens] == [[4, 5], [7, 6, 7, 6]]
    assert set(seen) == {(4, 8)}
    with pytest.raises(ValueError, match="batch_size=4"):
        fn(np.zeros((5, 8), np.int32))


def test_truncate_prompt_keeps_bos_and_the_tail():
    ids = [BOS] + list(range(10, 30))
    out = truncate_prompt(ids, seq_length=16, max_new_tokens=6, keep_first=1)
    assert out == [BOS] + list(range(21, 30)) and len(out) == 10
    assert truncate_prompt([BOS, 5], 16, 6, keep_first=1) == [BOS, 5]
    assert truncate_prompt(list(range(40)), 16, 100) == [39]  # room for 15 new tokens, one prompt token kept
