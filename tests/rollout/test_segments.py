"""Segmented trajectories: a template that rewrites history, or a compaction, starts a new
segment, and the learner scores every sampled token under exactly the context the sampler saw.

Real parts: the shared tiny Qwen2 (``policy_model``), ``TransformersPolicy``, real envs, and
chat templates that rewrite history (a window over the latest messages; content trimming).
"""

import pytest
import torch

from turnrl.chat.renderer import ChatRenderer
from turnrl.policies.sampling import SamplingParams
from turnrl.chat.tokenizer import CHAT_TEMPLATE
from turnrl.algorithms import collate, token_logprobs
from turnrl.algorithms.learner.critic import Critic
from turnrl.algorithms.segments import forward_segments, segment_index
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task
from tests.helpers import STRIPPING, WINDOWED, with_template
from tests.tolerances import head_bound, logprob_tol_for, max_abs, network_tol

pytestmark = pytest.mark.slow

def collect(model, tokenizer, template, seed=7, **collector_kwargs):
    from tests.conftest import RecordingPolicy  # the conftest's recording policy (a real TransformersPolicy)

    tok = with_template(tokenizer, template)
    policy = RecordingPolicy(model, tok, seed=seed)
    collector = RolloutCollector(lambda: GuessNumberEnv(n=32, max_turns=5), policy, ChatRenderer(tok),
                                 **{"max_context_tokens": 1024, **collector_kwargs})
    trajectories = collector.collect([Task(0), Task(1)], group_size=2, params=SamplingParams(max_new_tokens=10))
    return trajectories, policy, tok


def test_segment_index_marks_each_segment_and_zero_padding():
    index = segment_index([[0, 3, 5], [0]], [7, 4], width=8)
    assert index.tolist() == [[0, 0, 0, 1, 1, 2, 2, 0], [0, 0, 0, 0, 0, 0, 0, 0]]


def test_forward_segments_equals_each_segment_run_alone(tiny_model):
    torch.manual_seed(0)
    ids = torch.randint(5, 200, (2, 9))
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2], [0] * 9])

    def logits(i, m):
        return tiny_model(input_ids=i, attention_mask=m).logits

    with torch.no_grad():
        out = forward_segments(logits, ids, mask, segments)
        alone = [logits(ids[:1, a:b], torch.ones(1, b - a, dtype=torch.long))[0] for a, b in ((0, 4), (4, 7), (7, 9))]
        second = logits(ids[1:, :6], mask[1:, :6])[0]
    # rounding only (other shapes): the network's bound at the logits' size (tests/tolerances.py)
    tol = network_tol(tiny_model.config, torch.float32, max_abs(*alone, second), seq_len=ids.shape[1])
    torch.testing.assert_close(out[0], torch.cat(alone), rtol=0, atol=tol)
    torch.testing.assert_close(out[1, :6], second, rtol=0, atol=tol)
    assert float(out[1, 6:].abs().max()) == 0.0


@pytest.mark.parametrize("template", [WINDOWED, STRIPPING], ids=["window", "trim"])
def test_learner_scores_segmented_rollouts_exactly_as_the_sampler_saw_them(policy_model, tokenizer, template):
    trajectories, policy, tok = collect(policy_model, tokenizer, template)
    assert all(t.num_turns >= 2 for t in trajectories)
    if template is WINDOWED:  # the window drops a message every turn: a segment per turn
        assert all(t.num_segments == t.num_turns for t in trajectories)
    assert max(t.num_segments for t in trajectories) > 1
    # what the sampler was given each turn is exactly a segment's ids up to that turn
    prompts = [p for call_prompts, _ in policy.calls for p in call_prompts]
    for traj in trajectories:
        starts = [*traj.segment_starts, len(traj.token_ids)]
        for s, e in traj.turn_spans:
            seg = max(i for i, a in enumerate(starts[:-1]) if a <= s)
            assert traj.token_ids[starts[seg]:s] in prompts
            assert traj.loss_mask[s:e] == [1] * (e - s)
    batch = collate(trajectories, tok.pad_token_id)
    with torch.no_grad():
        learner, _, _ = token_logprobs(policy_model, batch.input_ids, batch.attention_mask,
                                    score_mask=batch.loss_mask, segments=batch.segment_index)
        flat, _, _ = token_logprobs(policy_model, batch.input_ids, batch.attention_mask, score_mask=batch.loss_mask)
    mask = batch.loss_mask.bool()
    # rounding only (cached decode vs the learner's segmented forward): the model's logprob bound over
    # the segments (each at most its row)
    tol = logprob_tol_for(policy_model, [t.token_ids for t in trajectories])
    assert float((learner - batch.old_logprobs).abs()[mask].max()) <= tol
    # guard: scoring the concatenated segments as one sequence is a different context
    assert float((flat - batch.old_logprobs).abs()[mask].max()) > 1e-2


def test_critic_and_shared_forward_read_each_segment_alone(policy_model, tokenizer):
    trajectories, _, tok = collect(policy_model, tokenizer, WINDOWED)
    batch = collate(trajectories, tok.pad_token_id)
    critic = Critic.from_policy(policy_model)
    # rounding only (a segment alone vs within its row): the decoder's bound at the size of the value
    # head's partial sums (head_bound: the head after the decoder's final norm, tests/tolerances.py)
    tol = network_tol(policy_model.config, torch.float32, head_bound(critic.head, critic.backbone.norm),
                      seq_len=batch.input_ids.shape[1])
    with torch.no_grad():
        values = critic(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.segment_index)
        for row, traj in enumerate(trajectories):  # each segment alone, as a batch of one
            starts = [*traj.segment_starts, len(traj.token_ids)]
            for a, b in zip(starts, starts[1:]):
                ids = torch.tensor([traj.token_ids[a:b]])
                alone = critic(ids, torch.ones_like(ids), torch.tensor([traj.loss_mask[a:b]], dtype=torch.float))
                torch.testing.assert_close(values[row, a + 1:b], alone[0, 1:], rtol=0, atol=tol)


def test_compaction_goes_on_in_a_new_segment_and_end_stops(policy_model, tokenizer):
    tight = {"max_context_tokens": 150}
    compacted, _, _ = collect(policy_model, tokenizer, CHAT_TEMPLATE, on_context_limit="compact", **tight)
    ended, _, _ = collect(policy_model, tokenizer, CHAT_TEMPLATE, on_context_limit="end", **tight)
    assert any(t.termination == "context_length" for t in ended)
    assert all(t.num_segments == 1 for t in ended)
    assert max(t.num_segments for t in compacted) > 1
    assert sum(t.num_turns for t in compacted) > sum(t.num_turns for t in ended)
    for traj in compacted:  # every prompt and turn the sampler saw fits the context
        for s, e in traj.turn_spans:
            assert e - max(a for a in traj.segment_starts if a <= s) <= 150


def test_observation_and_episode_token_bounds_end_the_episode_with_their_reason(policy_model, tokenizer):
    short_obs, _, _ = collect(policy_model, tokenizer, CHAT_TEMPLATE, max_observation_tokens=1)
    assert {t.termination for t in short_obs} == {"observation_length"}
    short_episode, _, _ = collect(policy_model, tokenizer, CHAT_TEMPLATE, max_episode_tokens=80)
    assert {t.termination for t in short_episode} <= {"episode_length", "terminated"}
    # every sampled turn ends within the bound (the observation after the last turn may pass it:
    # it is rendered before the bound ends the episode)
    assert all(end <= 80 for t in short_episode for _, end in t.turn_spans)
