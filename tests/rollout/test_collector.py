"""RolloutCollector: grouping, task seeding, per-episode failure, truncation, context limit."""

import pytest

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.envs import GuessNumberEnv
from turnrl.envs.games.guess_number import is_held_out
from turnrl.rollout import RolloutCollector, Task
from turnrl.rollout.metrics import rollout_metrics

PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0)


class FlakyGuessNumberEnv(GuessNumberEnv):
    """A GuessNumber env whose ``step`` raises on its second turn (a broken env or tool)."""

    def step(self, action):
        if self._turn == 1:
            raise RuntimeError("flaky env: second step")
        return super().step(action)


def make_collector(policy_model, tokenizer, renderer, env_fn=GuessNumberEnv, seed=0, **kwargs):
    return RolloutCollector(env_fn, TransformersPolicy(policy_model, tokenizer, seed=seed), renderer, **kwargs)


def task_id_of(seed, split="train"):
    return GuessNumberEnv().reset(seed=seed, options={"split": split})[1]["task_id"]


@pytest.mark.slow
def test_collect_returns_b_times_g_trajectories_grouped_by_task(policy_model, tokenizer, renderer):
    tasks = [Task(11), Task(12), Task(13, "test")]
    trajectories = make_collector(policy_model, tokenizer, renderer).collect(tasks, 2, PARAMS)
    assert len(trajectories) == 6
    assert [t.group_id for t in trajectories] == [0, 0, 1, 1, 2, 2]
    for g, task in enumerate(tasks):
        group = trajectories[2 * g: 2 * g + 2]
        assert {t.task_id for t in group} == {task_id_of(task.seed, task.split)}
    upper, secret = map(int, trajectories[4].task_id.removeprefix("guess-").split("-"))
    assert is_held_out(upper, secret)  # a test-split task
    for t in trajectories:
        assert len(t.turn_rewards) == t.num_turns == len(t.state_keys) >= 1
        assert t.state_keys[0] == (1, 32)  # the feasible interval at the start
        assert t.reward == sum(t.turn_rewards) and t.error is None


@pytest.mark.slow
def test_same_seed_gives_same_task_across_calls_and_collectors(policy_model, tokenizer, renderer):
    tasks = [Task(s) for s in range(5)]
    first = make_collector(policy_model, tokenizer, renderer, seed=0)
    a = first.collect(tasks, 1, PARAMS)
    b = first.collect(tasks, 1, PARAMS)  # pooled envs are reset with the task seed again
    c = make_collector(policy_model, tokenizer, renderer, seed=99).collect(tasks, 1, PARAMS)
    ids = [t.task_id for t in a]
    assert ids == [t.task_id for t in b] == [t.task_id for t in c] == [task_id_of(s) for s in range(5)]
    assert len(set(ids)) > 1


def test_group_size_below_one_is_rejected(policy_model, tokenizer, renderer):
    with pytest.raises(ValueError, match="group_size"):
        make_collector(policy_model, tokenizer, renderer).collect([Task(0)], 0, PARAMS)


@pytest.mark.slow
def test_env_raising_in_step_ends_only_its_own_episode(policy_model, tokenizer, renderer, caplog):
    made = []

    def env_fn():  # the first pooled env (episode 0) is the flaky one
        made.append(FlakyGuessNumberEnv() if not made else GuessNumberEnv())
        return made[-1]

    trajectories = make_collector(policy_model, tokenizer, renderer, env_fn=env_fn).collect(
        [Task(0), Task(1)], 2, PARAMS)
    broken, others = trajectories[0], trajectories[1:]
    assert broken.termination == "env_error"
    assert "flaky env: second step" in broken.error and "RuntimeError" in broken.error
    assert broken.num_turns == 2 and len(broken.turn_rewards) == 2 and broken.turn_rewards[-1] == 0.0
    assert not broken.success
    # the failed episode's conversation is closed cleanly: ids still render its messages
    assert tokenizer.decode(broken.token_ids, skip_special_tokens=False) == tokenizer.apply_chat_template(
        broken.messages, tools=broken.tools or None, tokenize=False)
    assert broken.messages[-1]["role"] == "assistant"
    for t in others:
        assert t.termination in ("terminated", "truncated") and t.error is None
        assert t.num_turns == 6 or t.success
        assert len(t.turn_rewards) == t.num_turns
    assert any("env raised" in r.getMessage() for r in caplog.records)
    assert rollout_metrics(trajectories)["env_error_rate"] == 0.25


def test_max_turns_reached_gives_termination_truncated(policy_model, tokenizer, renderer):
    collector = make_collector(policy_model, tokenizer, renderer, env_fn=lambda: GuessNumberEnv(max_turns=2))
    trajectories = collector.collect([Task(0), Task(1), Task(2)], 2, PARAMS)
    for t in trajectories:
        if t.success:  # a lucky guess ends the episode early instead
            assert t.termination == "terminated" and t.turn_rewards[-1] == 1.0
        else:
            assert t.termination == "truncated" and t.num_turns == 2 and t.turn_rewards == [0.0, 0.0]
    assert sum(t.termination == "truncated" for t in trajectories) >= 4
    assert rollout_metrics(trajectories)["truncation_rate"] == sum(
        t.termination == "truncated" for t in trajectories) / len(trajectories)


def test_episode_over_context_budget_ends_with_context_length(policy_model, tokenizer, renderer):
    opening = renderer.start(list(GuessNumberEnv().reset(seed=0)[0]))
    budget = len(opening.token_ids) + PARAMS.max_new_tokens + 2  # room for one turn only
    collector = make_collector(policy_model, tokenizer, renderer, max_context_tokens=budget)
    trajectories = collector.collect([Task(0)], 2, PARAMS)
    for t in trajectories:
        assert t.termination == "context_length" and t.num_turns == 1
        assert len(t.turn_rewards) == len(t.state_keys) == 1
        # the ids end with the next generation prompt (never sampled)
        assert tokenizer.decode(t.token_ids, skip_special_tokens=False) == tokenizer.apply_chat_template(
            t.messages, tools=t.tools or None, tokenize=False, add_generation_prompt=True)
    assert rollout_metrics(trajectories)["context_limit_rate"] == 1.0
