"""Rollouts are token-exact: the learner scores exactly what the sampler sampled.

Trajectories come from ``RolloutCollector`` + ``TransformersPolicy`` on real envs (see the
``rollouts`` fixture in tests/conftest.py): 2 tasks x 2 samples per env, multi-turn.
"""


import pytest
import torch

from turnrl.algorithms import collate, token_logprobs

from tests.tolerances import entropy_tol_for, logprob_tol_for

pytestmark = pytest.mark.slow

ENVS = ["guess_number", "calc_math"]
TEMPERATURES = [1.0, 0.7]


def learner_logprobs(model, trajectories, pad_id, temperature):
    batch = collate(trajectories, pad_id)
    with torch.no_grad():
        logprobs, _, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=temperature)
    return batch, logprobs


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("env_name", ENVS)
def test_sampler_logprobs_equal_learner_recomputed_logprobs(rollouts, policy_model, tokenizer, env_name, temperature):
    trajectories, _ = rollouts(env_name, temperature)
    assert len(trajectories) == 4 and all(t.num_turns >= 2 for t in trajectories)
    batch, logprobs = learner_logprobs(policy_model, trajectories, tokenizer.pad_token_id, temperature)
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) == sum(t.num_generated_tokens for t in trajectories) > 0
    diff = (logprobs - batch.old_logprobs).abs()[mask]
    # rounding only (cached decode vs the learner's forward): the model's logprob bound at its logits' size
    tol = logprob_tol_for(policy_model, [t.token_ids for t in trajectories], temperature)
    assert float(diff.max()) <= tol, f"max |sampler - learner| logprob = {float(diff.max()):.3g} > {tol:.3g}"
    # every sampled token is scored: none sits at column 0 (which has no logprob)
    assert not bool(mask[:, 0].any())


@pytest.mark.parametrize("env_name", ENVS)
def test_learner_at_the_wrong_temperature_disagrees_with_sampler(rollouts, policy_model, tokenizer, env_name):
    """Guards the test above: it can fail. Temperature-0.7 samples scored at 1.0 differ."""
    trajectories, _ = rollouts(env_name, 0.7)
    batch, logprobs = learner_logprobs(policy_model, trajectories, tokenizer.pad_token_id, 1.0)
    diff = (logprobs - batch.old_logprobs).abs()[batch.loss_mask.bool()]
    assert float(diff.max()) > 1e-2


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("env_name", ENVS)
def test_trajectory_ids_decode_to_chat_template_render_of_messages(rollouts, tokenizer, env_name, temperature):
    trajectories, _ = rollouts(env_name, temperature)
    for traj in trajectories:
        assert traj.termination in ("terminated", "truncated")
        text = tokenizer.decode(traj.token_ids, skip_special_tokens=False)
        assert traj.segment_starts == [0]  # the tiny template preserves its prefix: one segment
        assert text == tokenizer.apply_chat_template(traj.messages, tools=traj.tools or None, tokenize=False)
        assert sum(m["role"] == "assistant" for m in traj.messages) == traj.num_turns


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("env_name", ENVS)
def test_turn_spans_hold_exactly_the_ids_the_policy_generated(rollouts, tokenizer, env_name, temperature):
    """Each turn's span is ``Generation.token_ids`` verbatim (never re-tokenized), and the
    prompt of each turn was exactly the trajectory's ids before that span."""
    trajectories, policy = rollouts(env_name, temperature)
    eos = tokenizer.eos_token_id
    assert len(policy.calls) == max(t.num_turns for t in trajectories)
    length_cuts = [0] * len(trajectories)
    for turn, (prompts, generations) in enumerate(policy.calls):
        # the collector batches the episodes still live, in trajectory order
        live = [i for i, t in enumerate(trajectories) if t.num_turns > turn]
        assert len(prompts) == len(generations) == len(live)
        for i, prompt, gen in zip(live, prompts, generations):
            traj = trajectories[i]
            start, end = traj.turn_spans[turn]
            assert prompt == traj.token_ids[:start]
            assert traj.token_ids[start:end] == gen.token_ids
            assert traj.logprobs[start:end] == gen.logprobs
            assert traj.loss_mask[start:end] == [1] * len(gen.token_ids)
            assert eos not in gen.token_ids[:-1]
            assert gen.finish_reason == ("stop" if gen.token_ids[-1] == eos else "length")
            body = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
            assistant = [m for m in traj.messages if m["role"] == "assistant"][turn]
            assert assistant["content"] == tokenizer.decode(body, skip_special_tokens=False)
            length_cuts[i] += gen.finish_reason == "length"
    assert length_cuts == [t.length_truncated_turns for t in trajectories]


def test_rollouts_cover_both_finish_reasons(rollouts):
    """The trajectories above include turns ended by the end-of-turn id and turns cut by
    ``max_new_tokens``, so both renderer paths are exercised."""
    reasons = {g.finish_reason for env in ENVS for _, gens in rollouts(env, 1.0)[1].calls for g in gens}
    assert reasons == {"stop", "length"}


@pytest.mark.parametrize("env_name", ENVS)
def test_scoring_only_sampled_tokens_gives_the_same_logprobs_and_entropies(rollouts, policy_model, tokenizer, env_name):
    """``token_logprobs(..., score_mask=loss_mask)`` (the learner's fast path) agrees with
    scoring every token, on the sampled tokens, and is 0 elsewhere."""
    trajectories, _ = rollouts(env_name, 1.0)
    batch = collate(trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        full, full_entropy, _ = token_logprobs(policy_model, batch.input_ids, batch.attention_mask, with_entropy=True)
        part, part_entropy, _ = token_logprobs(policy_model, batch.input_ids, batch.attention_mask, with_entropy=True,
                                            score_mask=batch.loss_mask)
    mask = batch.loss_mask.bool()
    # rounding only (the head on the scored rows alone; the sampler's cached decode): the model's
    # logprob and entropy bounds at its logits' size and spread (tests/tolerances.py)
    tol = logprob_tol_for(policy_model, [t.token_ids for t in trajectories])
    entropy_tol = entropy_tol_for(policy_model, [t.token_ids for t in trajectories])
    assert torch.allclose(part[mask], full[mask], rtol=0, atol=tol)
    assert torch.allclose(part_entropy[mask], full_entropy[mask], rtol=0, atol=entropy_tol)
    assert (part[~mask] == 0).all() and (part_entropy[~mask] == 0).all()
    assert float((part - batch.old_logprobs).abs()[mask].max()) <= tol
