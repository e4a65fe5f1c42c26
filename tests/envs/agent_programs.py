"""Agent programs of the kinds people train, as ``AgentEnv`` subclasses, for the agent tests
(tests/envs/test_agent_rollouts.py in process, tests/train/test_agent_train.py through
``python -m turnrl.train env=custom env._target_=tests.envs.agent_programs.NAME``).

Each program keeps every call it sends in ``SENT[api_key]`` (its messages and tools, as sent),
so a test can render them with the chat template and compare with the trajectory's ids:

* ``ToolLoop``: a plain ``openai`` SDK tool loop (``add``), nudging the model to use the tool
  when it answers without it, at most ``ROUNDS`` calls; reward: the sum in the answer.
* ``AgentsSDK``: an ``openai-agents`` ``Agent`` with two function tools (``add``,
  ``multiply``) on the Chat Completions model, run by ``Runner``.
* ``Compacting``: a chat harness that, after ``KEEP`` calls, replaces its history with one
  summary message and goes on (a new segment).
* ``SubAgent``: a harness whose second step hands a question to a sub-agent with a fresh
  context (two calls), then goes on with the sub-agent's answer as a tool result.
* ``ParallelSubAgents``: two sub-agents whose calls are in flight at once.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections import defaultdict

import openai

from turnrl.envs.agent import AgentEnv
from turnrl.policies.openai_chat import ChatMessage, ToolParam, template_messages, template_tools

SENT: dict[str, list[tuple[list[dict], list[dict] | None]]] = defaultdict(list)
TASKS = [{"id": f"sum-{a}-{b}", "a": a, "b": b} for a in range(1, 5) for b in range(1, 5)]
ROUNDS = 3
KEEP = 2
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def keep(api_key: str, messages: list[dict], tools) -> None:
    """Keep a call in ``SENT[api_key]`` and, when ``TURNRL_AGENT_LOG`` names a file (a training
    run in another process), as a JSON line there."""
    tools = tools if isinstance(tools, list) and tools else None
    SENT[api_key].append((copy.deepcopy(messages), copy.deepcopy(tools)))
    log = os.environ.get("TURNRL_AGENT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"key": api_key, "messages": messages, "tools": tools}) + "\n")


async def create(client: openai.AsyncOpenAI, api_key: str, messages: list[dict], tools: list[dict] | None = None):
    """``client.chat.completions.create``, the call kept (``keep``)."""
    keep(api_key, messages, tools)
    kwargs = {"tools": tools} if tools else {}
    reply = await client.chat.completions.create(model="policy", messages=messages, **kwargs)
    return reply.choices[0].message.model_dump(exclude_none=True)


def question(task: dict) -> str:
    return f"What is {task['a']} + {task['b']}?"


def answered(task: dict, message: dict) -> float:
    return 1.0 if str(task["a"] + task["b"]) in (message.get("content") or "") else 0.0


class ToolLoop(AgentEnv):
    tasks = TASKS

    async def run(self, base_url: str, api_key: str, task: dict) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            messages = [{"role": "system", "content": "You add numbers with the add tool."},
                        {"role": "user", "content": question(task)}]
            for _ in range(ROUNDS):
                message = await create(client, api_key, messages, [ADD])
                messages.append(message)
                if not message.get("tool_calls"):
                    if answered(task, message):
                        return 1.0
                    messages.append({"role": "user", "content": "Use the add tool."})
                    continue
                for call in message["tool_calls"]:
                    try:
                        args = json.loads(call["function"]["arguments"])
                        result = str(int(args["a"]) + int(args["b"]))
                    except (KeyError, TypeError, ValueError) as e:
                        result = f"error: {e}"
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            return 0.0


class AgentsSDK(AgentEnv):
    tasks = TASKS

    async def run(self, base_url: str, api_key: str, task: dict) -> float:
        from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
        from agents import set_tracing_disabled
        from agents.exceptions import MaxTurnsExceeded

        set_tracing_disabled(True)  # no traces leave the machine

        @function_tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @function_tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            return a * b

        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        original = client.chat.completions.create

        async def kept(**kwargs):  # keep what the SDK sends
            keep(api_key, kwargs["messages"], kwargs.get("tools"))
            return await original(**kwargs)

        client.chat.completions.create = kept
        agent = Agent(name="calculator", instructions="Compute with your tools; answer with the number.",
                      tools=[add, multiply], model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                      model_settings=ModelSettings())
        try:
            result = await Runner.run(agent, f"What is ({task['a']} + {task['b']}) * 2?", max_turns=ROUNDS)
        except MaxTurnsExceeded:
            return 0.0
        finally:
            await client.close()
        return 1.0 if str((task["a"] + task["b"]) * 2) in str(result.final_output) else 0.0


class Compacting(AgentEnv):
    tasks = TASKS

    async def run(self, base_url: str, api_key: str, task: dict) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            system = {"role": "system", "content": "You are a careful adder."}
            messages = [system, {"role": "user", "content": question(task)}]
            for turn in range(1, ROUNDS + 2):
                message = await create(client, api_key, messages)
                if answered(task, message):
                    return 1.0
                messages += [message, {"role": "user", "content": f"Not yet ({turn}). Try again."}]
                if turn == KEEP:  # compaction: the history so far becomes one summary
                    messages = [system, {"role": "user", "content": f"{question(task)} (Summary: {turn} tries, none "
                                                                    "right.) Try again."}]
            return 0.0


class SubAgent(AgentEnv):
    tasks = TASKS

    async def run(self, base_url: str, api_key: str, task: dict) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            messages = [{"role": "user", "content": question(task)}]
            message = await create(client, api_key, messages)
            # the sub-agent: a fresh context of its own, two calls
            sub = [{"role": "system", "content": "You check sums."}, {"role": "user", "content": f"Check: {question(task)}"}]
            first = await create(client, api_key, sub)
            sub += [first, {"role": "user", "content": "Say the number only."}]
            checked = await create(client, api_key, sub)
            messages += [message, {"role": "user", "content": f"A checker says: {checked.get('content', '')}"}]
            final = await create(client, api_key, messages)
            return answered(task, final)


class ParallelSubAgents(AgentEnv):
    tasks = TASKS

    async def run(self, base_url: str, api_key: str, task: dict) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            async def sub(role: str) -> dict:
                messages = [{"role": "system", "content": f"You are the {role}."},
                            {"role": "user", "content": question(task)}]
                first = await create(client, api_key, messages)
                return await create(client, api_key, [*messages, first, {"role": "user", "content": "Sure?"}])

            left, right = await asyncio.gather(sub("first checker"), sub("second checker"))
            return max(answered(task, left), answered(task, right))


def rendered(tok, messages: list[dict], tools) -> str:
    """The chat template's render of a request's ``messages`` and ``tools``, as a server renders it."""
    tools = template_tools([ToolParam.model_validate(t) for t in tools]) if tools else None
    return tok.apply_chat_template(template_messages([ChatMessage.model_validate(m) for m in messages]), tools=tools,
                                   tokenize=False, add_generation_prompt=True)


def check_turns(tok, ids: list[int], turn_spans, segment_starts: list[int], calls: list) -> list[list[int]]:
    """Assert that each turn's prompt (the ids before it in its segment) decodes to the template's
    render of one of ``calls`` (each used once; every call makes a turn), and that a segment's
    first prompt is exactly that render's tokenization. Returns each turn's prompt ids."""
    left, prompts = list(calls), []
    for k, (start, end) in enumerate(turn_spans):
        seg = max(s for s in segment_starts if s <= start)
        prompt = ids[seg:start]
        text = tok.decode(prompt, skip_special_tokens=False)
        match = next((c for c in left if rendered(tok, *c) == text), None)
        assert match is not None, f"turn {k}: its prompt is no call's render:\n{text}"
        left.remove(match)
        if not any(s >= seg for s, _ in turn_spans[:k]):  # the segment's first turn: a whole render, tokenized
            assert prompt == tok(text, add_special_tokens=False)["input_ids"], f"turn {k}: not the render's tokens"
        prompts.append(prompt)
    assert not left, f"{len(left)} calls made no turn"
    return prompts


def match_runs(trajectories: list, runs: list[list], check) -> list:
    """Pair each trajectory with the one program run (its list of calls) that ``check(trajectory,
    calls)`` accepts; returns what ``check`` returned for each."""
    runs, out = list(runs), []
    for trajectory in trajectories:
        for calls in runs:
            try:
                out.append(check(trajectory, calls))
            except AssertionError:
                continue
            runs.remove(calls)
            break
        else:
            raise AssertionError(f"no program run made the turns of episode {trajectory!r:.300}")
    return out
