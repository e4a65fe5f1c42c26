"""DPO: the loss by hand, pairs from groups and from JSONL, and real updates of the tiny model."""

import json
import math

import numpy as np
import pytest
import torch

from turnrl.rollout.scripted import scripted_episode
from turnrl.algorithms.pre_rl.dpo import DPOConfig, DPOTrainer, dpo_loss, load_pairs, pairs_from_groups, sequence_logprobs
from turnrl.envs import GuessNumberEnv
from tests.algorithms.test_credit_estimators import traj
from tests.tolerances import float_tol, logprob_tol_for, max_abs


def test_dpo_loss_by_hand():
    # beta .5: chosen reward .5 * (-1 + 1.5) = .25, rejected .5 * (-2 + 1.5) = -.25, h = .5
    loss, stats = dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]), 0.5)
    assert float(loss) == pytest.approx(-math.log(1 / (1 + math.exp(-0.5))))
    assert stats["accuracy"] == 1.0 and stats["margin"] == pytest.approx(1.0)
    assert stats["chosen_reward"] == pytest.approx(0.25) and stats["rejected_reward"] == pytest.approx(-0.25)


def test_pairs_from_groups_take_best_and_worst_and_skip_ties():
    trajs = [traj([0, 1], "ab", 0), traj([0], "a", 0), traj([0.5], "a", 0), traj([1], "a", 1), traj([1], "a", 1)]
    pairs = pairs_from_groups(trajs)
    assert len(pairs) == 1 and pairs[0].chosen is trajs[0] and pairs[0].rejected is trajs[1]


def test_load_pairs_renders_single_and_multi_turn_continuations(tmp_path, renderer):
    prompt = [{"role": "system", "content": "You are playing a guessing game."},
              {"role": "user", "content": "Guess my number between 1 and 8. Reply with a number."}]
    rows = [{"prompt": prompt, "chosen": "4", "rejected": "9"},
            {"prompt": prompt, "chosen": [{"role": "assistant", "content": "4"}, {"role": "user", "content": "correct"}],
             "rejected": [{"role": "assistant", "content": "1"}, {"role": "user", "content": "higher"},
                          {"role": "assistant", "content": "2"}]}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    pairs = load_pairs(path, renderer)
    assert len(pairs) == 2
    single = pairs[0].chosen
    assert single.num_turns == 1 and renderer.tokenizer.decode(
        [i for i, m in zip(single.token_ids, single.loss_mask) if m]) == "4" + renderer.tokenizer.eos_token
    assert pairs[1].rejected.num_turns == 2 and pairs[1].rejected.messages[-1]["content"] == "2"
    for bad, why in [("{", "not JSON"), ('{"prompt": []}', "keys"),
                     (json.dumps({"prompt": prompt, "chosen": [{"role": "user", "content": "x"}], "rejected": "1"}),
                      "starts with the assistant")]:
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match=why):
            load_pairs(path, renderer)


@pytest.mark.slow
def test_dpo_steps_raise_the_chosen_over_the_rejected(renderer, tokenizer, fresh_model):
    env = GuessNumberEnv(n=32, max_turns=6)
    pairs = []
    for seed in range(8):
        good = scripted_episode(env, seed, renderer, "expert")
        bad = scripted_episode(env, seed, renderer, "weak", rng=np.random.default_rng(seed))
        if good.reward > bad.reward:
            pairs.extend(pairs_from_groups([good, bad]))
    assert len(pairs) >= 3
    trainer = DPOTrainer(fresh_model, DPOConfig(beta=0.1, lr=3e-3, batch_size=len(pairs)), tokenizer.pad_token_id)
    history = trainer.train(pairs, steps=8, progress=False)
    # policy == reference at the start: the margin is two policy-vs-reference gaps of sequence
    # logprobs (chosen, rejected), each a sum of at most n token logprobs within rounding of each
    # other (the model's logprob bound, tests/tolerances.py) plus the sum's own rounding
    sequences = [t for p in pairs for t in (p.chosen, p.rejected)]
    n = max(sum(t.loss_mask) for t in sequences)
    seq_lp = sequence_logprobs(trainer.ref_model, sequences, tokenizer.pad_token_id)
    tol = 2 * (n * logprob_tol_for(trainer.ref_model, [t.token_ids for t in sequences])
               + float_tol(torch.float32, n, max_abs(seq_lp)))
    assert history[0]["margin"] == pytest.approx(0.0, abs=tol)
    assert history[-1]["margin"] > 1.0 and history[-1]["loss"] < history[0]["loss"]
    chosen = sequence_logprobs(fresh_model, [p.chosen for p in pairs], tokenizer.pad_token_id)
    ref = sequence_logprobs(trainer.ref_model, [p.chosen for p in pairs], tokenizer.pad_token_id)
    assert not torch.allclose(chosen, ref)
    with pytest.raises(ValueError, match="at least one"):
        trainer.step([])
