"""Supervised fine-tuning on scripted expert episodes."""

from dataclasses import replace

import pytest
import torch

from turnrl.rollout.scripted import scripted_episode
from turnrl.algorithms import collate
from turnrl.algorithms.pre_rl.sft import sft_loss
from turnrl.envs import CalcMathEnv, GuessNumberEnv

from tests.tolerances import float_tol, logprob_tol_for


@pytest.mark.slow
def test_sft_steps_on_scripted_expert_episodes_lower_the_loss(fresh_model, renderer, tokenizer):
    episodes = [scripted_episode(CalcMathEnv(), s, renderer) for s in range(2)]
    episodes += [scripted_episode(GuessNumberEnv(), s, renderer) for s in range(2)]
    batch = collate(episodes, tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=3e-3)
    fresh_model.train()
    losses = []
    for _ in range(3):
        loss = sft_loss(fresh_model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        losses.append(float(sft_loss(fresh_model, batch)))
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_sft_loss_is_the_mean_nll_of_the_assistant_tokens_only(tiny_model, renderer, tokenizer):
    episode = scripted_episode(CalcMathEnv(), 0, renderer)
    batch = collate([episode], tokenizer.pad_token_id)
    with torch.no_grad():
        loss = float(sft_loss(tiny_model, batch))
        logits = tiny_model(input_ids=batch.input_ids).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, batch.input_ids[0, 1:], reduction="none")
    mask = batch.loss_mask[0, 1:]
    # rounding only: each NLL within the model's logprob bound, plus the mean's sum over the tokens
    tol = (logprob_tol_for(tiny_model, batch.input_ids.tolist())
           + float_tol(torch.float32, nll.numel(), float(nll.abs().max())))
    assert loss == pytest.approx(float((nll * mask).sum() / mask.sum()), abs=tol)
    # the mask is what selects: some tokens are left out, and with none left out the loss is
    # the mean over every token (comparing the two means instead depends on the episode's text:
    # a random model's NLL is about log(vocab) everywhere)
    assert 0 < mask.sum() < mask.numel()
    every_target = torch.ones_like(batch.loss_mask)
    every_target[:, 0] = 0  # the first token has no context
    with torch.no_grad():
        everything = float(sft_loss(tiny_model, replace(batch, loss_mask=every_target)))
    assert everything == pytest.approx(float(nll.mean()), abs=tol)
