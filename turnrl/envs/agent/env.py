"""AgentEnv: an agent program that calls an OpenAI-compatible endpoint, as a turnrl env.

Description:
    ``AgentEnv(agent, tasks)`` trains a program that already exists (written with the
    ``openai`` SDK, an agent library, or any command that reads ``OPENAI_BASE_URL``) without
    rewriting it: each episode draws a task, opens a session on the agent gateway
    (``turnrl.envs.agent.gateway``) and starts ``agent(base_url, api_key, task)``
    (``turnrl.envs.agent.program``). Every chat completion the program sends is one turn: the
    env hands its messages to the rollout collector, which samples the turn token by token with
    the run's policy, and the sampled text answers the call. Groups, credit methods (each call
    is a turn), the learner, evaluation, the viewer and the suite see an ordinary env.
    Subclasses may instead override ``run`` (the agent) and set ``tasks``.

Action Space:
    The sampled turn's text. It answers the waiting call: ``content`` and structured
    ``tool_calls`` read by the model family's ``tool_parser`` (the run's ``agent.tool_parser``).
    The program runs its tools itself.

Observation Space:
    The messages of the program's next call, as the chat template reads them. A call whose
    messages begin with the previous call's messages and the reply it got (the same roles,
    contents and tool calls; tool-call ids are not compared) and that keeps the same tools
    continues the episode's current segment: the observation is the messages after them, so
    every sampled id stays as sampled. A call that rewrote its history (a compaction, dropped
    tool results, another system prompt, a sub-agent's own context, other tools) gets
    ``info["context"]``, all of its messages, and ``info["tools"]``: the collector starts a new
    segment rendered from them (``turnrl.chat.renderer``), so each turn's prompt is the
    template's render of exactly the messages the program sent. Calls sent at once (parallel
    sub-agents) are taken one per turn, in the order they arrived.

Rewards:
    0 on every turn but the last. When the program ends, its result: a number (the reward), an
    ``AgentResult`` (``reward``, ``success``, ``call_rewards``: one reward per call, which then
    replace the turns' rewards), or a mapping with those keys (a command prints it as JSON);
    ``verify(task, result, messages)`` (when given) computes the reward from the result and
    the final conversation instead. A program that raises, exits non-zero or returns no reward
    ends the episode with an ``AgentFailed`` error (``env_error``: the infrastructure's fault,
    kept out of the gradient by default).

Episode End:
    ``terminated`` when the program returns. ``truncated`` when it calls more than
    ``max_turns`` times (that call, and every later one, is answered 410 and the program is
    stopped). ``StepTimeout`` (``step_timeout``, the infrastructure's) when the program neither
    calls nor ends within ``call_timeout_s`` of its last reply, or its whole run passes
    ``run_timeout_s``. An episode the collector ends (a context limit) or a new ``reset`` or
    ``close`` stops the program and answers its waiting calls 410.

Info:
    ``task_id`` (the task's ``"id"`` when it is a mapping with one, else a hash of its JSON),
    ``state_key`` (a hash of the turn's new messages), ``turn``, ``split``; ``tools`` after
    ``reset`` and on a rewrite; ``context`` on a rewrite; ``success`` (the result's, else
    ``reward > 0``), ``tool_calls`` (calls in the reply), ``turn_rewards`` (with
    ``call_rewards``) after ``step``.

Splits:
    ``tasks`` is a mapping ``{"train": [...], "test": [...]}``, or a sequence split by a stable
    hash of each task's JSON (one in four is ``test``). A reset draws uniformly from the split
    with the env's seeded generator.

Version History:
    v0: initial version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium

from turnrl.envs.agent.gateway import Call, Session, shared_gateway
from turnrl.envs.agent.program import AgentFailed, AgentRun, task_json
from turnrl.envs.base import SPLITS
from turnrl.envs.messages import action_space, observation_space
from turnrl.rollout.env_calls import StepTimeout

__all__ = ["AgentEnv", "AgentFailed", "AgentResult"]

QUIET_LOGGERS = ("httpx", "httpx2")
"""The HTTP clients' loggers (the ``openai`` SDK logs each request at INFO), set to WARNING by
the first ``AgentEnv`` unless their level was set."""
TEST_SHARE = 4
"""One task in this many (by a stable hash) is in the test split of a task sequence."""


@dataclass(frozen=True)
class AgentResult:
    """What an agent program (or ``verify``) returns: the episode's ``reward``; ``success``
    (None: ``reward > 0``); ``call_rewards``, one reward per model call, in the order the calls
    were answered (None: ``reward`` on the last call)."""

    reward: float
    success: bool | None = None
    call_rewards: Sequence[float] | None = None


@dataclass
class _Finished:
    """The program's end: what it returned, or the exception that ended it."""

    result: Any


class AgentEnv(gymnasium.Env):
    """An agent program as an env (see the module docstring).

    Args:
        agent: an ``async def agent(base_url, api_key, task)`` or plain function returning the
            reward (or an ``AgentResult``), or a command (``str`` or argument list) reading
            ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``TURNRL_TASK`` and printing the reward
            last. None: the subclass's ``run`` method.
        tasks: the tasks (see Splits); None: the class attribute ``tasks``.
        verify: ``verify(task, result, messages) -> reward | AgentResult``: the reward from what
            the program returned and the final conversation (the last call's messages and reply).
        tool_parser: the tool-call format replies are read in (the trainer passes the model's).
        max_turns: most model calls per episode.
        call_timeout_s: seconds the program may take after a reply to call again or end.
        run_timeout_s: seconds a whole run may take.
    """

    metadata: dict = {"render_modes": []}
    tasks: Sequence[Any] | Mapping[str, Sequence[Any]] | None = None

    def __init__(self, agent: Callable | str | Sequence[str] | None = None,
                 tasks: Sequence[Any] | Mapping[str, Sequence[Any]] | None = None, *,
                 verify: Callable[[Any, Any, list[dict]], Any] | None = None, tool_parser: str = "hermes",
                 max_turns: int = 32, call_timeout_s: float = 300.0, run_timeout_s: float = 1800.0) -> None:
        super().__init__()
        if agent is None and type(self).run is AgentEnv.run:
            raise ValueError("AgentEnv needs an agent: pass agent=<async function, function or command>, or "
                             "subclass AgentEnv and override run(base_url, api_key, task)")
        self.agent = agent if agent is not None else self.run
        tasks = tasks if tasks is not None else type(self).tasks
        if tasks is None:
            raise ValueError("AgentEnv needs tasks: pass tasks=[...] (or {'train': [...], 'test': [...]}), or set "
                             "the class attribute tasks")
        self.split_tasks = _splits(tasks)
        for name, value in (("max_turns", max_turns), ("call_timeout_s", call_timeout_s),
                            ("run_timeout_s", run_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self.verify, self.tool_parser = verify, tool_parser
        self.max_turns, self.call_timeout_s, self.run_timeout_s = int(max_turns), float(call_timeout_s), float(run_timeout_s)
        self.observation_space, self.action_space = observation_space(), action_space()
        for name in QUIET_LOGGERS:  # one INFO line per model call would bury a run's log
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        self._session: Session | None = None
        self._run: AgentRun | None = None
        self._call: Call | None = None
        self._history: list[tuple] = []
        self._messages: list[dict] = []
        self._tools: list[dict] = []
        self._turn, self._deadline, self._split = 0, 0.0, "train"
        self._task: Any = None
        self._sampled: tuple[int, int, str] = (0, 0, "stop")

    async def run(self, base_url: str, api_key: str, task: Any) -> Any:
        """The agent program, for subclasses: call the model at ``base_url`` with ``api_key``,
        solve ``task`` and return the reward (or an ``AgentResult``)."""
        raise NotImplementedError

    def expert_action(self) -> str:
        """No scripted player: the agent program and the model play together."""
        raise NotImplementedError("an agent program has no scripted expert to warm-start on: train with "
                                  "agent.warmstart.steps=0 (from a model that already chats, agent.path=...)")

    def weak_expert_action(self, rng) -> str:
        """No scripted player (see ``expert_action``)."""
        return self.expert_action()

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        super().reset(seed=seed)
        self._end("a new episode started")
        split = (options or {}).get("split", "train")
        pool = self.split_tasks.get(split)
        if not pool:
            raise ValueError(f"no {split!r} tasks: the splits hold {({k: len(v) for k, v in self.split_tasks.items()})} "
                             "tasks; give tasks as {'train': [...], 'test': [...]} or more tasks")
        self._task, self._split = pool[int(self.np_random.integers(len(pool)))], split
        self._turn, self._history, self._messages, self._tools = 0, [], [], []
        self._deadline = time.monotonic() + self.run_timeout_s
        session = self._session = shared_gateway().open()
        self._run = AgentRun(self.agent, session.base_url, session.key, self._task,
                             lambda result: session.calls.put(_Finished(result)))
        event = self._next()
        if isinstance(event, _Finished):
            self._end("the agent program ended")
            raise self._failure(event.result, "ended before its first model call: an episode needs at least one "
                                              "call to the base URL it was given")
        obs, info = self._observe(event)
        return obs, {**info, "tools": list(self._tools)}

    def sampled_turn(self, prompt_tokens: int, completion_tokens: int, finish_reason: str) -> None:
        """The collector's facts about the turn the next ``step`` answers with (its usage)."""
        self._sampled = (int(prompt_tokens), int(completion_tokens), str(finish_reason))

    def step(self, action: str) -> tuple[list[dict], float, bool, bool, dict]:
        call = self._call
        if call is None:
            raise RuntimeError("step() before reset(), or after the episode ended: call reset() first")
        prompt_tokens, completion_tokens, finish = self._sampled
        self._sampled = (0, 0, "stop")
        reply = call.answer(str(action), self.tool_parser, prompt_tokens, completion_tokens, finish)
        self._call = None
        self._history.append(_key(reply.message()))
        self._messages = [*self._messages, {"role": "assistant", "content": reply.content or "",
                                            "tool_calls": reply.tool_calls}]
        self._turn += 1
        base = {"task_id": self._task_id(), "turn": self._turn, "split": self._split, "tool_calls": len(reply.tool_calls),
                "tool_errors": 0, "parse_status": "ok" if reply.tool_calls else "absent", "parse_error": False}
        event = self._next()
        if isinstance(event, _Finished):
            self._end("the agent program ended")
            return self._outcome(event.result, base)
        if self._turn >= self.max_turns:
            self._call = event  # answered 410 by _end
            self._end(f"the episode reached its turn limit ({self.max_turns} model calls, max_turns)")
            return [], 0.0, False, True, {**base, "state_key": None, "success": False}
        obs, info = self._observe(event)
        return obs, 0.0, False, False, {**base, **info, "success": False}

    def close(self) -> None:
        self._end("the env was closed")
        super().close()

    # ---------------------------------------------------------------- internals
    def _task_id(self) -> str:
        task = self._task
        if isinstance(task, Mapping) and isinstance(task.get("id"), (str, int)):
            return str(task["id"])
        return f"task-{zlib.crc32(task_json(task).encode()):08x}"

    def _next(self) -> Call | _Finished:
        """The program's next call, or its end; ``StepTimeout`` past a deadline."""
        assert self._session is not None
        now = time.monotonic()
        wait = min(self.call_timeout_s, self._deadline - now)
        event = self._session.take(wait)
        if isinstance(event, str):  # the session was ended meanwhile (close() from another thread)
            raise AgentFailed(event)
        if event is None:
            self._end("the episode passed its deadline")
            which = (f"ran for {self.run_timeout_s:g} s (run_timeout_s)" if self._deadline - time.monotonic() <= 0
                     else f"neither called the model nor ended within {self.call_timeout_s:g} s of its last reply "
                          "(call_timeout_s)")
            raise StepTimeout(f"the agent program {which}; it was stopped")
        return event

    def _observe(self, call: Call) -> tuple[list[dict], dict]:
        """The observation and info of the program's next ``call`` (see Observation Space)."""
        keys = [_key(m) for m in call.messages]
        messages = [_shaped(m) for m in call.messages]
        first = not self._history
        extends = (not first and call.tools == self._tools and len(keys) >= len(self._history)
                   and keys[:len(self._history)] == self._history)
        new = messages[len(self._history):] if extends else messages
        info: dict[str, Any] = {"task_id": self._task_id(), "turn": self._turn, "split": self._split,
                                "state_key": hashlib.sha1(repr([_key(m) for m in new]).encode()).hexdigest()}
        if not first and not extends:
            info["context"], info["tools"] = messages, list(call.tools)
        self._call, self._history, self._messages, self._tools = call, keys, messages, list(call.tools)
        return new, info

    def _outcome(self, result: Any, base: dict) -> tuple[list[dict], float, bool, bool, dict]:
        """The last step's result once the program returned ``result``."""
        if isinstance(result, BaseException):
            raise self._failure(result, "raised")
        if self.verify is not None:
            result = self.verify(self._task, result, list(self._messages))
        reward, success, call_rewards = _reward(result)
        info = {**base, "state_key": None, "success": reward > 0 if success is None else bool(success)}
        if call_rewards is not None:
            if len(call_rewards) != self._turn:
                raise AgentFailed(f"call_rewards holds {len(call_rewards)} rewards for {self._turn} model calls: give "
                                  "one per call, in the order they were answered")
            info["turn_rewards"] = list(call_rewards)
            reward = call_rewards[-1]
        return [], reward, True, False, info

    def _failure(self, result: Any, what: str) -> AgentFailed:
        if isinstance(result, AgentFailed):
            return result
        if isinstance(result, BaseException):
            error = AgentFailed(f"the agent program {what}: {type(result).__name__}: {result}")
            error.__cause__ = result
            return error
        return AgentFailed(f"the agent program {what}")

    def _end(self, why: str) -> None:
        """Stop the program and end its session (waiting calls are answered 410 ``why``)."""
        run, session, call = self._run, self._session, self._call
        self._run = self._session = self._call = None
        if call is not None:
            call.refuse(410, f"this agent session has ended: {why}")
        if session is not None:
            session.end(f"this agent session has ended: {why}")
        if run is not None:
            run.stop()


def _reward(result: Any) -> tuple[float, bool | None, list[float] | None]:
    """``(reward, success, call_rewards)`` of a program's (or ``verify``'s) result."""
    if isinstance(result, AgentResult):
        fields = (result.reward, result.success, result.call_rewards)
    elif isinstance(result, Mapping) and "reward" in result:
        fields = (result["reward"], result.get("success"), result.get("call_rewards"))
    else:
        fields = (result, None, None)
    reward, success, calls = fields
    values = [reward, *(calls or [])]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise AgentFailed(f"the agent program's result {result!r:.200} gives no finite reward: return a number, an "
                          "AgentResult or {'reward': ...} (or pass verify= to compute it)")
    if calls is not None and not isinstance(calls, Sequence):
        raise AgentFailed(f"call_rewards must be a list of numbers, got {calls!r:.200}")
    return float(reward), success, None if calls is None else [float(c) for c in calls]


def _splits(tasks: Sequence[Any] | Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """The tasks of each split (see Splits)."""
    if isinstance(tasks, Mapping):
        unknown = set(tasks) - set(SPLITS)
        if unknown:
            raise ValueError(f"tasks has splits {sorted(unknown)}; the splits are {list(SPLITS)}")
        return {split: list(tasks.get(split, ())) for split in SPLITS}
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or not tasks:
        raise ValueError(f"tasks must be a non-empty list of tasks or {{'train': [...], 'test': [...]}}, got {tasks!r:.100}")
    out: dict[str, list[Any]] = {split: [] for split in SPLITS}
    for task in tasks:
        out["test" if zlib.crc32(task_json(task).encode()) % TEST_SHARE == 0 else "train"].append(task)
    return out


def _shaped(message: dict) -> dict:
    """A call's message as the renderer takes it: an assistant message always carries
    ``tool_calls`` (``[]`` for none), so the renderer gives it to the template as written."""
    if message["role"] == "assistant" and "tool_calls" not in message:
        return {**message, "tool_calls": []}
    return dict(message)


def _key(message: dict) -> tuple:
    """What two messages must share to be the same history: role, content (None as ``""``) and
    tool calls by name and arguments (JSON text or an object; ids are the gateway's, not compared)."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        calls.append((function.get("name"), json.dumps(arguments, sort_keys=True, default=str)))
    return message["role"], message.get("content") or "", tuple(calls)
