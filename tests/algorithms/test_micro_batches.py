"""Length-grouped micro-batches (``TrainBatch.micro_batches``) and the learner's causal forward
without a padding mask (``turnrl.algorithms.segments.causal_forward``)."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from turnrl.algorithms.batch import TrainBatch
from turnrl.algorithms.segments import causal_forward

from tests.tolerances import max_abs, network_tol


def _batch(lengths, width=None):
    width = width or max(lengths)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    n, zeros = len(lengths), torch.zeros(len(lengths), width)
    return TrainBatch(input_ids=mask.clone(), attention_mask=mask, loss_mask=zeros, old_logprobs=zeros,
                      turn_index=mask - 1, rewards=torch.zeros(n), group_index=torch.arange(n),
                      turn_rewards=torch.zeros(n, 1), num_turns=torch.ones(n, dtype=torch.long),
                      state_index=torch.zeros(n, 1, dtype=torch.long))


def test_rows_are_grouped_longest_first_within_both_budgets():
    lengths = [5, 30, 12, 31, 7, 29, 100, 6]
    batch = _batch(lengths)
    micros = batch.micro_batches(torch.arange(len(lengths)), max_rows=3, max_tokens=90)
    # 4 micro-batches, as filling each in turn makes ([6], [3, 1], [5, 2, 4], [7, 0]: 261 padded
    # tokens), cut where they pad least: 100 + 2 x 31 + 2 x 29 + 3 x 7 = 241
    assert [m.tolist() for m in micros] == [[6], [3, 1], [5, 2], [4, 7, 0]]
    assert sorted(torch.cat(micros).tolist()) == list(range(len(lengths)))  # every row once
    for m in micros:
        widths = [lengths[i] for i in m.tolist()]
        assert widths == sorted(widths, reverse=True) and len(m) <= 3
        assert len(m) == 1 or len(m) * widths[0] <= 90  # 100 > 90 goes alone
    # rows only (no token budget): sorted, split by count; a subset of rows keeps its own indices
    assert [m.tolist() for m in batch.micro_batches(torch.arange(8), max_rows=4)] == [[6, 3, 1, 5], [2, 4, 7, 0]]
    assert [m.tolist() for m in batch.micro_batches(torch.tensor([0, 2, 4]), max_rows=8, max_tokens=20)] == [[2], [4, 0]]
    assert batch.micro_batches(torch.arange(0), max_rows=4, max_tokens=10) == []
    assert [len(m) for m in batch.micro_batches(torch.arange(3), max_rows=0)] == [1, 1, 1]  # as with max_rows=1


def _runs(lengths, sizes):
    """(micro-batches, padded tokens) of cutting ``lengths`` (longest first) into runs of ``sizes``."""
    padded, start = 0, 0
    for size in sizes:
        padded, start = padded + size * lengths[start], start + size
    return len(sizes), padded


def test_the_cut_has_the_fewest_micro_batches_then_the_fewest_padded_tokens_of_all_cuts():
    """Against every cut of 300 random small batches (all 2^(n-1) ways to split the sorted rows)."""
    import random

    from turnrl.algorithms.batch import _cut

    rng = random.Random(0)
    for _ in range(300):
        lengths = sorted((rng.randint(1, 60) for _ in range(rng.randint(1, 10))), reverse=True)
        max_rows, max_tokens = rng.randint(1, 5), rng.choice([None, rng.randint(10, 200)])
        n, best = len(lengths), None
        for cuts in range(1 << (n - 1)):
            ends = [i + 1 for i in range(n - 1) if cuts >> i & 1] + [n]
            sizes = [end - begin for begin, end in zip([0] + ends[:-1], ends)]
            starts = [0] + ends[:-1]
            if all(size <= max_rows and (size == 1 or max_tokens is None or size * lengths[start] <= max_tokens)
                   for size, start in zip(sizes, starts)):
                best = min(best or (n + 1, 0), _runs(lengths, sizes))
        got = _cut(lengths, max_rows, max_tokens)
        assert sum(got) == n and _runs(lengths, got) == best


def test_one_long_episode_goes_alone_instead_of_padding_the_others():
    """A 622-token episode among ~317-token ones (a GuessNumber batch at 8 turns): two micro-batches
    either way, but the long one alone pads 4,758 tokens instead of 8,086 + 3 x 300."""
    lengths = [622] + [340] * 5 + [317] * 5 + [300] * 5
    batch = _batch(lengths)
    micros = batch.micro_batches(torch.arange(16), max_rows=64, max_tokens=8192)
    assert [len(m) for m in micros] == [1, 15]
    assert _runs(lengths, [1, 15]) == (2, 622 + 15 * 340)


def test_the_causal_forward_equals_the_masked_one_on_real_tokens():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                         num_hidden_layers=2, intermediate_size=48, vocab_size=50,
                                         attn_implementation="sdpa")).eval()
    lengths = [9, 4, 6]
    batch = _batch(lengths, width=12)  # three columns past the longest row
    ids = torch.randint(1, 50, batch.input_ids.shape) * batch.attention_mask
    calls = []

    def forward(i, m):
        calls.append((i.shape, m))
        return model(input_ids=i, attention_mask=m).logits

    with torch.no_grad():
        got = causal_forward(forward, ids, batch.attention_mask)
        expected = model(input_ids=ids, attention_mask=batch.attention_mask).logits
    assert calls == [((3, 9), None)]  # cut to the longest row, no mask
    real = batch.attention_mask.bool()
    # rounding only (a narrower forward, no mask): the network's bound at the logits' size
    tol = network_tol(model.config, torch.float32, max_abs(expected[real]), seq_len=ids.shape[1])
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=tol)
    assert got.shape == expected.shape and not got[:, 9:].any()
    # a left-padded row keeps the mask and the width
    left = batch.attention_mask.flip(-1)
    with torch.no_grad():
        causal_forward(forward, ids.flip(-1), left)
    assert calls[-1][0] == (3, 12) and calls[-1][1] is left
