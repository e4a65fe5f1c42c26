"""RolloutCollector steps the live episodes of a turn concurrently: slow tools overlap, the
executor's max_concurrency bounds the calls in flight, and results stay in row order."""

import threading
import time

import pytest

from turnrl.agents import SamplingParams
from turnrl.agents.sampling import Generation
from turnrl.envs.base import MultiTurnEnv, TurnOutcome
from turnrl.rollout import RolloutCollector, Task
from turnrl.tools import tool

NAP_S = 0.3
CALL = '<tool_call>\n{"name": "nap", "arguments": {"x": 1}}\n</tool_call>'
PARAMS = SamplingParams(max_new_tokens=64)


class InFlight:
    def __init__(self):
        self.now = self.max = self.calls = 0
        self.lock = threading.Lock()

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.calls += 1
            self.max = max(self.max, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


COUNTER = InFlight()


@tool
def nap(x: int) -> str:
    """Sleep a while (a slow tool), then echo.

    Args:
        x: Value to echo.
    """
    with COUNTER:
        time.sleep(NAP_S)
    return f"slept {x}"


class NapEnv(MultiTurnEnv):
    """Two turns: call the slow tool, then answer with the task's number."""

    tools = (nap,)
    default_max_turns = 2

    def _new_task(self, rng, split):
        return int(rng.integers(1000))

    def _task_id(self, task):
        return f"nap-{task}"

    def _start_episode(self, task):
        self._napped = False
        return [{"role": "user", "content": f"Nap, then say {task}."}]

    def _on_turn(self, action, parse, tool_results):
        if tool_results:
            self._napped = all(r.ok for r in tool_results)
            return TurnOutcome()
        return TurnOutcome(terminated=True, success=self._napped, reward=float(self._napped))

    def _state_key(self):
        return self._napped

    def expert_action(self):
        return "done" if self._napped else CALL


class ScriptedTextPolicy:
    """A scripted backend: answers every live episode with the tool call on its first turn and
    "done" after, as real token ids of the real tokenizer (logprob 0, finish "stop")."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.batches = []

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        text = CALL if len(self.batches) == 1 else "done"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return [Generation(list(ids), [0.0] * len(ids), "stop") for _ in prompts]


def collect(tokenizer, renderer, env_workers, **env_kwargs):
    COUNTER.max = COUNTER.calls = 0
    collector = RolloutCollector(lambda: NapEnv(**env_kwargs), ScriptedTextPolicy(tokenizer), renderer,
                                 max_context_tokens=4096, env_workers=env_workers)
    start = time.monotonic()
    trajectories = collector.collect([Task(s) for s in range(4)], group_size=2, params=PARAMS)
    return trajectories, time.monotonic() - start


def test_slow_tools_of_eight_episodes_overlap(tokenizer, renderer):
    trajectories, seconds = collect(tokenizer, renderer, env_workers=16)
    assert COUNTER.calls == 8 and COUNTER.max == 8  # all eight calls were in flight together
    assert seconds < 4 * NAP_S  # vs 8 * 0.3 s = 2.4 s one after another
    assert all(t.success and t.tool_calls == 1 and t.tool_errors == 0 for t in trajectories)


def test_max_concurrency_bounds_calls_in_flight(tokenizer, renderer):
    trajectories, seconds = collect(tokenizer, renderer, env_workers=16,
                                    executor_options={"inprocess": {"max_concurrency": 2}})
    assert COUNTER.calls == 8 and COUNTER.max == 2
    assert seconds >= 4 * NAP_S  # 8 calls, 2 at a time
    assert all(t.success for t in trajectories)


def test_results_keep_row_order_and_match_sequential_stepping(tokenizer, renderer):
    parallel, _ = collect(tokenizer, renderer, env_workers=16)
    sequential, seconds = collect(tokenizer, renderer, env_workers=1)
    assert COUNTER.max == 1 and seconds >= 8 * NAP_S
    assert [t.task_id for t in parallel] == [t.task_id for t in sequential]
    assert [t.group_id for t in parallel] == [0, 0, 1, 1, 2, 2, 3, 3]
    for a, b in zip(parallel, sequential):
        assert (a.token_ids, a.messages, a.state_keys, a.turn_rewards) == (b.token_ids, b.messages, b.state_keys, b.turn_rewards)
    # each row carries its own task: the last user message names the task's number
    for t in parallel:
        assert t.messages[0]["content"] == f"Nap, then say {t.task_id.removeprefix('nap-')}."


def test_env_workers_must_be_positive(tokenizer, renderer):
    with pytest.raises(ValueError, match="env_workers"):
        RolloutCollector(NapEnv, ScriptedTextPolicy(tokenizer), renderer, env_workers=0)
