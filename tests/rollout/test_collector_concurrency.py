"""RolloutCollector steps the live episodes of a turn concurrently: slow tools overlap, the
executor's max_concurrency bounds the calls in flight, and results stay in row order.

Nothing here reads a clock. The slow tool blocks on a ``threading.Barrier`` of ``parties``
calls: a call returns only once ``parties`` calls are in it at the same moment, so a passing
call proves that many were in flight together however slow or loaded the machine is, and
stepping that cannot overlap them breaks the barrier (after ``WAIT_S``) into a tool error. The
peak number of calls in flight, counted under a lock, checks the upper bounds."""

import threading

import pytest

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.sampling import Generation
from turnrl.envs.base import MultiTurnEnv, TurnOutcome
from turnrl.rollout import RolloutCollector, Task
from turnrl.tools import tool

WAIT_S = 20.0  # how long a call waits for the others before the barrier breaks (< the executor's 30 s timeout)
CALL = '<tool_call>\n{"name": "nap", "arguments": {"x": 1}}\n</tool_call>'
PARAMS = SamplingParams(max_new_tokens=64)


class InFlight:
    """Counts the ``nap`` calls in flight (now, peak, total) and holds each one at a barrier of
    ``parties`` calls; ``broken`` counts the calls that gave up waiting."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset(1)

    def reset(self, parties: int, wait_s: float = WAIT_S) -> None:
        self.now = self.max = self.calls = self.broken = 0
        self.barrier = threading.Barrier(parties, timeout=wait_s)

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.calls += 1
            self.max = max(self.max, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1
            self.broken += exc[0] is threading.BrokenBarrierError


COUNTER = InFlight()


@tool
def nap(x: int) -> str:
    """Wait until enough other naps are in flight (a slow tool), then echo.

    Args:
        x: Value to echo.
    """
    with COUNTER:
        COUNTER.barrier.wait()
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


def collect(tokenizer, renderer, env_workers, parties, wait_s=WAIT_S, **env_kwargs):
    """Collect 4 tasks x 2 samples (8 episodes, one nap call each) with every call held until
    ``parties`` calls are in flight at once (or ``wait_s`` passed)."""
    COUNTER.reset(parties, wait_s)
    collector = RolloutCollector(lambda: NapEnv(**env_kwargs), ScriptedTextPolicy(tokenizer), renderer,
                                 max_context_tokens=4096, env_workers=env_workers)
    return collector.collect([Task(s) for s in range(4)], group_size=2, params=PARAMS)


def test_slow_tools_of_eight_episodes_overlap(tokenizer, renderer):
    trajectories = collect(tokenizer, renderer, env_workers=16, parties=8)
    assert COUNTER.broken == 0  # the barrier of 8 let every call through: all eight were in flight together
    assert COUNTER.calls == 8 and COUNTER.max == 8
    assert all(t.success and t.tool_calls == 1 and t.tool_errors == 0 for t in trajectories)


def test_env_workers_bound_the_episodes_stepped_at_once(tokenizer, renderer):
    trajectories = collect(tokenizer, renderer, env_workers=4, parties=4)
    assert COUNTER.broken == 0 and COUNTER.calls == 8 and COUNTER.max == 4  # two rounds of four
    assert all(t.success and t.tool_errors == 0 for t in trajectories)


def test_overlap_beyond_env_workers_never_comes(tokenizer, renderer):
    """The measurement can fail: 4 workers never put 8 calls in flight, so the barrier breaks (a
    short wait is enough: no amount of waiting reaches 8) and every episode ends with a tool error."""
    trajectories = collect(tokenizer, renderer, env_workers=4, parties=8, wait_s=0.5)
    assert COUNTER.broken == 8 and COUNTER.max <= 4
    assert all(t.tool_errors == 1 and not t.success for t in trajectories)


def test_max_concurrency_bounds_calls_in_flight(tokenizer, renderer):
    trajectories = collect(tokenizer, renderer, env_workers=16, parties=2,
                           executor_options={"inprocess": {"max_concurrency": 2}})
    assert COUNTER.broken == 0 and COUNTER.calls == 8 and COUNTER.max == 2  # 8 calls, 2 at a time
    assert all(t.success for t in trajectories)


def test_results_keep_row_order_and_match_sequential_stepping(tokenizer, renderer):
    parallel = collect(tokenizer, renderer, env_workers=16, parties=8)
    assert COUNTER.broken == 0 and COUNTER.max == 8
    sequential = collect(tokenizer, renderer, env_workers=1, parties=1)
    assert COUNTER.calls == 8 and COUNTER.max == 1  # one episode stepped at a time
    assert [t.task_id for t in parallel] == [t.task_id for t in sequential]
    assert [t.group_id for t in parallel] == [0, 0, 1, 1, 2, 2, 3, 3]
    for a, b in zip(parallel, sequential):
        assert (a.token_ids, a.messages, a.state_keys, a.turn_rewards) == (b.token_ids, b.messages, b.state_keys, b.turn_rewards)
    # each row carries its own task: the first user message names the task's number
    for t in parallel:
        assert t.messages[0]["content"] == f"Nap, then say {t.task_id.removeprefix('nap-')}."


def test_env_workers_must_be_positive(tokenizer, renderer):
    with pytest.raises(ValueError, match="env_workers"):
        RolloutCollector(NapEnv, ScriptedTextPolicy(tokenizer), renderer, env_workers=0)
