"""The learner's forward with shared prompts run once (``turnrl.algorithms.learner.shared_prompt``)."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from turnrl.algorithms.learner import shared_prompt
from turnrl.algorithms.learner.critic import Critic
from turnrl.algorithms.learner.scoring import token_logprobs
from turnrl.algorithms.learner.shared_prompt import prompt_groups, shared_prompt_hidden, suffix_buckets

from tests.tolerances import entropy_tol, grad_tol, logit_magnitude, logprob_tol, max_abs, network_tol


def _model(seed=0):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(config)


def _batch(spec, seed=0):
    """Right-padded rows from ``spec``: ``(prompt length, [tail lengths])`` per prompt; each
    prompt's rows open with the same random ids, their tails (the scored tokens) differ."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for prompt_len, tails in spec:
        prompt = torch.randint(1, 97, (prompt_len,), generator=g)
        rows += [(prompt, torch.randint(1, 97, (n,), generator=g)) for n in tails]
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask, score = torch.zeros_like(ids), torch.zeros((len(rows), width))
    for i, (p, t) in enumerate(rows):
        ids[i, :len(p) + len(t)] = torch.cat([p, t])
        mask[i, :len(p) + len(t)] = 1
        score[i, len(p):len(p) + len(t)] = 1
    return ids, mask, score


def test_rows_group_by_the_ids_before_the_position_that_predicts_their_first_scored_token():
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 7, 9, 9], [5, 6, 1, 1, 0], [5, 6, 7, 8, 0], [4, 4, 0, 0, 0]])
    mask = (ids != 0).long()
    score = torch.tensor([[0, 0, 0, 1, 0], [0, 0, 0, 1, 1], [0, 0, 0, 1, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]])
    start, groups = prompt_groups(ids, mask, score)
    # first scored 3, 3, 3, 2 -> start 2, 2, 2, 1; nothing scored: one before the row's end
    assert start.tolist() == [2, 2, 2, 1, 1]
    assert groups == [[0, 1, 2], [3], [4]]


@pytest.mark.parametrize("spec", [
    [(20, [5, 9, 3]), (11, [7, 12]), (15, [4])],  # groups of 3, 2 and 1, prompts of 3 lengths
    [(30, [6, 8, 2, 10])],  # one task's samples
    [(30, [6, 8, 2, 60, 5]), (12, [9, 50])],  # long rows among short ones: run in buckets
])
def test_sharing_gives_the_plain_forwards_logprobs_entropies_and_gradients(spec):
    model = _model()
    ids, mask, score = _batch(spec)
    results = []
    for share in (False, True):
        model.zero_grad()
        logprobs, entropy, _ = token_logprobs(model, ids, mask, 0.9, with_entropy=True, score_mask=score,
                                           share_prompts=share)
        (logprobs * torch.linspace(0.5, 1.5, ids.shape[1])).sum().backward()
        results.append((logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert bool((lp0[:, 1:] != 0).eq(score[:, 1:] != 0).all()) and bool((lp1 != 0).eq(lp0 != 0).all())
    # rounding only (the prompt run once, the rows' tails from its keys and values): the model's
    # logprob/entropy bounds at its logits' size, and per parameter the gradient bound at the
    # reference gradient's size over the batch's tokens (tests/tolerances.py)
    with torch.no_grad():
        logits = logit_magnitude(model, ids, mask, 0.9)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=logprob_tol(model.config, torch.float32, logits, ids.shape[1]))
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=entropy_tol(model.config, torch.float32, logits, ids.shape[1]))
    for name in g0:
        tol = grad_tol(model.config, torch.float32, max_abs(g0[name]), tokens=int(mask.sum()))
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=tol, msg=name)


def test_each_shared_prompt_runs_once_and_hidden_states_match_from_the_predicting_position_on():
    model = _model(1)
    decoder = model.get_decoder()
    ids, mask, score = _batch([(20, [5, 9, 3]), (11, [7, 12])], seed=1)
    calls = []
    handle = decoder.register_forward_pre_hook(lambda m, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                               with_kwargs=True)
    with torch.no_grad():
        shared = shared_prompt_hidden(decoder, ids, mask, score)
    handle.remove()
    # one call over the 2 distinct prompts (padded to the longest, 19 = 20 - 1), then the rows'
    # tokens from there (scored tokens and the one before them: 6, 10, 4, 8, 13) in two buckets,
    # the 13 and 10 apart from the 8, 6 and 4 (suffix_buckets)
    assert calls == [torch.Size([2, 19]), torch.Size([2, 13]), torch.Size([3, 8])]
    with torch.no_grad():
        plain = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
    start, _ = prompt_groups(ids, mask, score)
    for row, n in enumerate(mask.sum(-1).tolist()):
        s = int(start[row])
        # rounding only: the decoder's bound at the hidden states' size (tests/tolerances.py)
        tol = network_tol(model.config, torch.float32, max_abs(plain[row, s:n]), seq_len=ids.shape[1])
        torch.testing.assert_close(shared[row, s:n], plain[row, s:n], rtol=0, atol=tol)
        assert not shared[row, :s].any() and not shared[row, n:].any()


def test_suffix_buckets_split_off_long_rows_while_a_split_saves_a_quarter():
    # one long row among short ones: alone (cost 1*200*300 + 7*20*120 against 8*200*300)
    assert suffix_buckets([20, 18, 200, 15, 20, 19, 17, 20], 100) == [[2], [0, 4, 7, 5, 1, 6, 3]]
    # similar lengths: one bucket; a single row: one bucket
    assert suffix_buckets([20, 18, 22, 19], 100) == [[2, 0, 3, 1]]
    assert suffix_buckets([7], 10) == [[0]]
    # three levels: split twice, longest first
    assert suffix_buckets([400, 10, 100, 12, 98, 11], 50) == [[0], [2, 4], [3, 5, 1]]


def test_no_sharing_without_enough_shared_tokens_or_on_left_padded_rows(monkeypatch):
    decoder = _model().get_decoder()
    ids, mask, score = _batch([(3, [20, 25]), (4, [30])])
    # 3 of 85 tokens would be saved
    assert shared_prompt_hidden(decoder, ids, mask, score) is None
    monkeypatch.setattr(shared_prompt, "MIN_SAVED_FRACTION", 0.0)
    assert shared_prompt_hidden(decoder, ids, mask, score) is not None
    ids, mask, score = _batch([(10, [3, 5])])
    left = (torch.flip(ids, [1]), torch.flip(mask, [1]), torch.flip(score, [1]))
    assert shared_prompt_hidden(decoder, *left) is None
    singletons = _batch([(10, [3]), (12, [5])])
    assert shared_prompt_hidden(decoder, *singletons) is None


def test_the_critic_values_are_the_same_with_shared_prompts():
    model = _model(2)
    ids, mask, score = _batch([(16, [4, 7, 5]), (9, [6])], seed=2)
    critic = Critic(model.get_decoder(), 32)
    torch.nn.init.normal_(critic.head.weight)
    values = critic(ids, mask, score)
    plain = critic.head(model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state).squeeze(-1)
    target = score.bool().clone()
    target[:, 0] = False
    rows, cols = target.nonzero(as_tuple=True)
    assert shared_prompt_hidden(critic.backbone, ids, mask, score) is not None
    # rounding only: the decoder's bound (the value head one more layer) at the values' size
    tol = network_tol(model.config, torch.float32, max_abs(plain[rows, cols - 1]), seq_len=ids.shape[1])
    torch.testing.assert_close(values[rows, cols], plain[rows, cols - 1], rtol=0, atol=tol)
    assert not values[~target].any()
