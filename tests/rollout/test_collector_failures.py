"""RolloutCollector: every env failure ends one episode with a named, classed termination.

Real envs (GuessNumber) broken in the ways an env, a tool or a server breaks: raising in
``reset``, ``step`` or ``close``; an ``env_fn`` that raises; a step or reset that hangs; a step
result that breaks the env contract; a tool that could not run. The batch always completes,
the other episodes are untouched, and a hung call never keeps the process alive.
"""

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.envs import GuessNumberEnv
from turnrl.rollout import RolloutCollector, Task
from turnrl.rollout.env_calls import EnvCalls, StepTimeout
from turnrl.rollout.metrics import rollout_metrics
from turnrl.rollout.termination import INFRA_TERMINATIONS, MODEL_TERMINATIONS, TERMINATIONS, is_infra_failure
from turnrl.tools import ToolUnavailableError

PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0)


class BrokenEnv(GuessNumberEnv):
    """GuessNumber that fails as told: ``how`` in reset/step, at ``turn`` (a step index)."""

    def __init__(self, how=None, turn=0, **kwargs):
        super().__init__(max_turns=4, **kwargs)
        self.how, self.fail_turn, self.released = how, turn, threading.Event()

    def reset(self, *, seed=None, options=None):
        if self.how == "reset_raises":
            raise RuntimeError("reset broke")
        if self.how == "reset_hangs":
            self.released.wait(60)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self._turn != self.fail_turn or self.how is None or self.how.startswith("reset"):
            return super().step(action)
        obs, reward, terminated, truncated, info = super().step(action)
        if self.how == "step_raises":
            raise RuntimeError("step broke")
        if self.how == "step_hangs":
            self.released.wait(60)
        if self.how == "tool_unavailable":
            raise ToolUnavailableError("calculator", "its sandbox could not start")
        if self.how == "nan_reward":
            return obs, float("nan"), terminated, truncated, info
        if self.how == "bad_messages":
            return ({"role": "user", "content": 7},), reward, False, False, info
        if self.how == "not_a_tuple":
            return obs
        if self.how == "info_not_dict":
            return obs, reward, terminated, truncated, ["info"]
        return obs, reward, terminated, truncated, info

    def close(self):
        if self.how == "close_raises":
            raise RuntimeError("close broke")
        super().close()


def collector_for(policy_model, tokenizer, renderer, envs, **kwargs):
    """A collector whose pooled envs are ``envs`` in order (then plain GuessNumber)."""
    made = iter(envs)
    return RolloutCollector(lambda: next(made, None) or GuessNumberEnv(max_turns=4),
                            TransformersPolicy(policy_model, tokenizer, seed=0), renderer, **kwargs)


def assert_well_formed(t, tokenizer):
    assert len(t.turn_rewards) == t.num_turns == len(t.state_keys)
    assert all(r == r for r in t.turn_rewards)  # no NaN reaches the trajectory
    if t.token_ids:  # ids still render the messages exactly (the conversation was closed cleanly)
        assert tokenizer.decode(t.token_ids, skip_special_tokens=False) == tokenizer.apply_chat_template(
            t.messages, tools=t.tools or None, tokenize=False)


def test_terminations_are_classed_once_each():
    assert set(TERMINATIONS) == MODEL_TERMINATIONS | INFRA_TERMINATIONS
    assert not MODEL_TERMINATIONS & INFRA_TERMINATIONS
    assert is_infra_failure("env_error") and is_infra_failure("step_timeout") and is_infra_failure("tool_error")
    assert not is_infra_failure("truncated") and not is_infra_failure(None)


@pytest.mark.slow
@pytest.mark.parametrize("how, termination, turns", [
    ("reset_raises", "env_error", 0),
    ("step_raises", "env_error", 2),
    ("tool_unavailable", "tool_error", 2),
    ("nan_reward", "env_error", 2),
    ("bad_messages", "env_error", 2),
    ("not_a_tuple", "env_error", 2),
    ("info_not_dict", "env_error", 2),
])
def test_a_failing_env_ends_only_its_own_episode(policy_model, tokenizer, renderer, caplog, how, termination,
                                                 turns):
    collector = collector_for(policy_model, tokenizer, renderer, [BrokenEnv(how, turn=1)], step_timeout_s=30)
    trajectories = collector.collect([Task(0), Task(1)], 2, PARAMS)
    broken, others = trajectories[0], trajectories[1:]
    assert broken.termination == termination and not broken.success
    assert broken.num_turns == turns and broken.error
    if turns:
        assert broken.turn_rewards[-1] == 0.0
    assert [t.group_id for t in trajectories] == [0, 0, 1, 1]
    for t in trajectories:
        assert_well_formed(t, tokenizer)
    for t in others:
        assert t.termination in MODEL_TERMINATIONS and t.error is None
    assert any("env raised" in r.getMessage() for r in caplog.records)
    assert rollout_metrics(trajectories)["episodes"] == 4.0


@pytest.mark.slow
def test_an_env_fn_that_raises_ends_that_episode_and_is_tried_again(policy_model, tokenizer, renderer):
    calls = []

    def env_fn():
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionError("env server down")
        return GuessNumberEnv(max_turns=3)

    collector = RolloutCollector(env_fn, TransformersPolicy(policy_model, tokenizer, seed=0), renderer)
    first = collector.collect([Task(0)], 3, PARAMS)
    assert [t.termination == "env_error" for t in first] == [False, True, False]
    assert "env server down" in first[1].error and first[1].token_ids == []
    second = collector.collect([Task(0)], 3, PARAMS)  # the empty slot gets a new env
    assert len(calls) == 4 and not any(is_infra_failure(t.termination) for t in second)


@pytest.mark.slow
@pytest.mark.parametrize("how, turns", [("step_hangs", 2), ("reset_hangs", 0)])
def test_a_hung_env_call_ends_with_step_timeout_and_its_env_is_replaced(policy_model, tokenizer, renderer, how,
                                                                        turns):
    hung = BrokenEnv(how, turn=1)
    collector = collector_for(policy_model, tokenizer, renderer, [hung], step_timeout_s=0.5, env_workers=2)
    t0 = time.monotonic()
    trajectories = collector.collect([Task(0)], 2, PARAMS)
    assert time.monotonic() - t0 < 20
    assert trajectories[0].termination == "step_timeout" and trajectories[0].num_turns == turns
    assert "0.5 s" in trajectories[0].error
    assert trajectories[1].termination in MODEL_TERMINATIONS
    assert collector._pool[0] is None  # the stuck env is never stepped again
    again = collector.collect([Task(0)], 2, PARAMS)
    assert not any(is_infra_failure(t.termination) for t in again) and collector._pool[0] is not hung
    hung.released.set()


@pytest.mark.slow
def test_refill_samples_a_failed_member_again_once(policy_model, tokenizer, renderer):
    broken = BrokenEnv("step_raises", turn=0)
    refill = collector_for(policy_model, tokenizer, renderer, [broken], infra_failures="refill")
    trajectories = refill.collect([Task(0)], 2, PARAMS)
    # the refill reuses slot 0's env, which fails again: it stays failed, marked as retried
    assert trajectories[0].termination == "env_error" and trajectories[0].attempts == 2
    assert trajectories[1].attempts == 1 and trajectories[0].group_id == trajectories[1].group_id == 0

    flaky = BrokenEnv("step_raises", turn=0)
    original_step = flaky.step

    def fail_once(action):
        flaky.step = super(BrokenEnv, flaky).step  # the next episode steps normally
        return original_step(action)

    flaky.step = fail_once
    trajectories = collector_for(policy_model, tokenizer, renderer, [flaky], infra_failures="refill").collect(
        [Task(0)], 2, PARAMS)
    assert trajectories[0].attempts == 2 and trajectories[0].termination in MODEL_TERMINATIONS
    dropped = collector_for(policy_model, tokenizer, renderer, [BrokenEnv("step_raises", turn=0)]).collect(
        [Task(0)], 2, PARAMS)
    assert dropped[0].termination == "env_error" and dropped[0].attempts == 1


@pytest.mark.slow
def test_close_that_raises_is_logged_not_raised(policy_model, tokenizer, renderer, caplog):
    collector = collector_for(policy_model, tokenizer, renderer, [BrokenEnv("close_raises")])
    collector.collect([Task(0)], 2, PARAMS)
    collector.close()
    assert any("close broke" in r.getMessage() for r in caplog.records)


def test_env_calls_abandons_a_stuck_call_and_keeps_its_capacity():
    calls, release = EnvCalls(workers=2, timeout_s=0.2), threading.Event()
    results = calls.map([lambda: release.wait(30), lambda: 1, lambda: 2])
    assert isinstance(results[0], StepTimeout) and results[1:] == [1, 2]
    assert calls.stuck == 1
    assert calls.map([lambda: 3, lambda: 4]) == [3, 4]  # a replacement worker took the stuck one's place
    release.set()
    deadline = time.monotonic() + 10
    while calls.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls.stuck == 0  # the stuck thread exited once its call returned
    assert isinstance(calls.map([lambda: 1 / 0])[0], ZeroDivisionError)
    calls.close()


def test_env_calls_rejects_bad_settings():
    with pytest.raises(ValueError, match="workers"):
        EnvCalls(0, None)
    with pytest.raises(ValueError, match="timeout_s"):
        EnvCalls(1, 0)
    assert EnvCalls(1, None).inline and not EnvCalls(1, 5).inline


@pytest.mark.slow
def test_a_process_whose_env_hangs_forever_still_exits():
    script = textwrap.dedent("""
        import threading, time
        from turnrl.rollout.env_calls import EnvCalls
        calls = EnvCalls(workers=4, timeout_s=0.3)
        forever = threading.Event()
        print(type(calls.map([forever.wait, lambda: 1])[0]).__name__, flush=True)
    """)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "StepTimeout"
    assert time.monotonic() - t0 < 30  # the hung worker (a daemon thread) did not hold the exit


@pytest.mark.slow
@pytest.mark.e2e
def test_env_server_gone_then_back_ends_episodes_not_the_run(policy_model, tokenizer, renderer):
    """A remote env's server dies between batches (every reset fails: env_error, no crash),
    then a new server comes up on the same port: the next batch plays normally."""
    from turnrl.envs.remote import RemoteEnv
    from turnrl.envs.server import EnvServer

    server = EnvServer("turnrl/GuessNumber-v0", {"n": 32, "max_turns": 4}).start()
    port = server.port
    collector = RolloutCollector(lambda: RemoteEnv(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01),
                                 TransformersPolicy(policy_model, tokenizer, seed=0), renderer, step_timeout_s=60)
    before = collector.collect([Task(0)], 2, PARAMS)
    assert not any(is_infra_failure(t.termination) for t in before)
    server.stop()
    gone = collector.collect([Task(0)], 2, PARAMS)
    assert [t.termination for t in gone] == ["env_error", "env_error"]
    assert all("RemoteEnvError" in t.error and t.token_ids == [] for t in gone)
    with EnvServer("turnrl/GuessNumber-v0", {"n": 32, "max_turns": 4}, port=port):
        back = collector.collect([Task(0)], 2, PARAMS)
    assert not any(is_infra_failure(t.termination) for t in back)
    assert [t.task_id for t in back] == [t.task_id for t in before]
    collector.close()
