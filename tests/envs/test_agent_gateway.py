"""``AgentEnv`` and its gateway driven by hand: real agent programs (the official ``openai``
client, a command) call the gateway on loopback, and each ``step`` answers one call with a
turn's text, as the rollout collector does with sampled text.

Checked: what the program's calls become (the opening messages and tools at ``reset``; a call
that extends the history gives only its new messages, one that rewrote it ``info["context"]``),
what a reply holds (structured ``tool_calls`` read by the parser, ``content``, usage, the whole
reply as server-sent events), the refusals (``n``, ``logprobs``, an unknown key, a session that
ended), rewards (a number, ``AgentResult`` with ``call_rewards``, ``verify``, a command's JSON
line), and every failure ending the episode with the error the collector classes as the
infrastructure's (``AgentFailed``, ``StepTimeout``).
"""

import asyncio
import json
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.envs.agent_programs import AgentsSDK
from turnrl.envs.agent import AgentEnv, AgentFailed, AgentResult
from turnrl.envs.agent.env import TEST_SHARE
from turnrl.rollout.env_calls import StepTimeout
from turnrl.rollout.termination import failure_termination, is_infra_failure

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
TASKS = {"train": [{"id": "t1", "a": 1, "b": 2}], "test": [{"id": "t2", "a": 5, "b": 7}]}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": %d, "b": %d}}\n</tool_call>'


def client(base_url: str, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)


class Seen:
    """What the agent programs of a test saw: each reply (the message, usage) and each error."""

    def __init__(self) -> None:
        self.replies: list = []
        self.errors: list[BaseException] = []


def tool_loop(seen: Seen, stream: bool = False):
    """A plain ``openai`` tool loop: call ``add`` as the model asks, until it answers; reward 1
    when the answer holds the sum."""

    async def agent(base_url, api_key, task):
        c = client(base_url, api_key)
        messages = [{"role": "system", "content": "Use the add tool."},
                    {"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
        while True:
            if stream:
                chunks = [chunk async for chunk in await c.chat.completions.create(
                    model="any", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True})]
                message = _joined(chunks)
                seen.replies.append((message, chunks[-1].usage))
            else:
                reply = await c.chat.completions.create(model="any", messages=messages, tools=TOOLS)
                message = reply.choices[0].message.model_dump(exclude_none=True)
                seen.replies.append((message, reply.usage, reply.choices[0].finish_reason))
            messages.append(message)
            if not message.get("tool_calls"):
                return 1.0 if str(task["a"] + task["b"]) in (message.get("content") or "") else 0.0
            for call in message["tool_calls"]:
                args = json.loads(call["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])})

    return agent


def _joined(chunks) -> dict:
    """The message a stream of chunks spells."""
    content, calls = "", []
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                calls.append({"id": call.id, "type": "function",
                              "function": {"name": call.function.name, "arguments": call.function.arguments}})
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return {k: v for k, v in message.items() if v is not None}


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_gets_structured_calls_and_each_call_extends_the_conversation(stream):
    seen = Seen()
    env = AgentEnv(tool_loop(seen, stream), TASKS)
    try:
        obs, info = env.reset(seed=0)
        assert obs == [{"role": "system", "content": "Use the add tool."},
                       {"role": "user", "content": "What is 1 + 2?"}]
        assert info["tools"] == TOOLS and info["task_id"] == "t1" and info["split"] == "train"
        env.sampled_turn(40, 17, "stop")
        obs, reward, terminated, truncated, info = env.step("Adding.\n" + CALL % (1, 2))
        assert (reward, terminated, truncated, info["tool_calls"]) == (0.0, False, False, 1)
        message, usage = seen.replies[0][:2]
        assert message["content"] == "Adding."
        [call] = message["tool_calls"]
        assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
        assert call["id"].startswith("call_")
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (40, 17, 57)
        if not stream:
            assert seen.replies[0][2] == "tool_calls"
        # the program's next call extends the conversation: only the tool's result is new
        assert obs == [{"role": "tool", "tool_call_id": call["id"], "content": "3"}] and "context" not in info
        obs, reward, terminated, truncated, info = env.step("The sum is 3.")
        assert (obs, reward, terminated, truncated, info["success"]) == ([], 1.0, True, False, True)
        assert seen.replies[1][0] == {"role": "assistant", "content": "The sum is 3."}
    finally:
        env.close()


def test_a_call_that_rewrote_its_history_or_tools_comes_whole_as_context():
    async def agent(base_url, api_key, task):
        c = client(base_url, api_key)
        first = [{"role": "user", "content": "one"}]
        reply = await c.chat.completions.create(model="m", messages=first)
        kept = [*first, reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "two"}]
        await c.chat.completions.create(model="m", messages=kept)  # extends
        summary = [{"role": "system", "content": "summary: one, two"}, {"role": "user", "content": "three"}]
        await c.chat.completions.create(model="m", messages=summary)  # compacted
        await c.chat.completions.create(model="m", messages=summary, tools=TOOLS)  # same messages, new tools
        return 0.5

    env = AgentEnv(agent, TASKS)
    try:
        obs, info = env.reset(seed=0)
        assert obs == [{"role": "user", "content": "one"}] and info["tools"] == []
        obs, _, _, _, info = env.step("A")
        assert obs == [{"role": "user", "content": "two"}] and "context" not in info
        obs, _, _, _, info = env.step("B")
        summary = [{"role": "system", "content": "summary: one, two"}, {"role": "user", "content": "three"}]
        assert info["context"] == summary == obs and info["tools"] == []
        obs, _, _, _, info = env.step("C")
        assert info["context"] == summary and info["tools"] == TOOLS
        obs, reward, terminated, _, info = env.step("D")
        assert (reward, terminated, info["success"]) == (0.5, True, True)
        assert info["state_key"] is None
    finally:
        env.close()


def test_an_agent_written_history_message_keeps_its_tool_calls_for_the_template():
    """An assistant message the program wrote itself (not a reply) reaches the renderer with its
    ``tool_calls`` key, so the template renders it as written."""
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "x1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}]},
               {"role": "tool", "tool_call_id": "x1", "content": "2"}, {"role": "assistant", "content": "Two."},
               {"role": "user", "content": "again"}]

    async def agent(base_url, api_key, task):
        await client(base_url, api_key).chat.completions.create(model="m", messages=history, tools=TOOLS)
        return 0.0

    env = AgentEnv(agent, TASKS)
    try:
        obs, _ = env.reset(seed=0)
        assert obs[1] == {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 1}}}]}
        assert obs[3] == {"role": "assistant", "content": "Two.", "tool_calls": []}
        assert obs[2] == {"role": "tool", "tool_call_id": "x1", "content": "2"}
        _, reward, terminated, _, info = env.step("ok")
        assert (reward, terminated, info["success"]) == (0.0, True, False)
    finally:
        env.close()


def test_refusals_name_what_to_send():
    errors: list = []

    async def agent(base_url, api_key, task):
        c = client(base_url, api_key)
        messages = [{"role": "user", "content": "x"}]
        for kwargs in ({"n": 2}, {"logprobs": True}, {"tool_choice": "required", "tools": TOOLS}):
            try:
                await c.chat.completions.create(model="m", messages=messages, **kwargs)
            except openai.BadRequestError as e:
                errors.append(str(e))
        try:
            await client(base_url.replace(api_key, "not-a-key"), "not-a-key").chat.completions.create(
                model="m", messages=messages)
        except openai.AuthenticationError as e:
            errors.append(str(e))
        models = await c.models.list()
        errors.append([m.id for m in models.data])
        await c.chat.completions.create(model="m", messages=messages)
        return 0.0

    env = AgentEnv(agent, TASKS)
    try:
        env.reset(seed=0)
        env.step("fine")
    finally:
        env.close()
    assert "n=2" in errors[0] and "n=1" in errors[0]
    assert "logprobs" in errors[1] and "records" in errors[1]
    assert "required" in errors[2]
    assert "unknown or ended agent session key" in errors[3]
    assert errors[4] == ["turnrl-policy"]


def test_the_bearer_key_reaches_the_session_as_the_base_url_does():
    async def agent(base_url, api_key, task):
        root = base_url.split("/s/")[0] + "/v1"
        reply = await client(root, api_key).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return 1.0 if reply.choices[0].message.content == "hello" else 0.0

    env = AgentEnv(agent, TASKS)
    try:
        env.reset(seed=0)
        assert env.step("hello")[1] == 1.0
    finally:
        env.close()


def test_stop_strings_end_the_replys_text():
    async def agent(base_url, api_key, task):
        reply = await client(base_url, api_key).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stop=["Observation:"])
        return 1.0 if reply.choices[0].message.content == "Thought: look\n" else 0.0

    env = AgentEnv(agent, TASKS)
    try:
        env.reset(seed=0)
        assert env.step("Thought: look\nObservation: made up")[1] == 1.0
    finally:
        env.close()


def test_past_max_turns_the_episode_is_truncated_and_the_program_told_410():
    seen = Seen()

    def agent(base_url, api_key, task):  # a plain function: it cannot be cancelled, so it reads the 410
        c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages = [{"role": "user", "content": "go"}]
        try:
            while True:
                reply = c.chat.completions.create(model="m", messages=messages)
                messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        except openai.APIStatusError as e:
            seen.errors.append(e)
            raise

    env = AgentEnv(agent, TASKS, max_turns=2)
    try:
        env.reset(seed=0)
        assert env.step("a")[2:4] == (False, False)
        obs, reward, terminated, truncated, info = env.step("b")
        assert (obs, reward, terminated, truncated) == ([], 0.0, False, True)
        _wait(lambda: seen.errors)
        assert seen.errors[0].status_code == 410 and "turn limit" in str(seen.errors[0])
    finally:
        env.close()


def test_a_new_reset_or_close_stops_the_program_and_answers_its_waiting_call():
    seen = Seen()

    def agent(base_url, api_key, task):
        c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        try:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        except openai.APIStatusError as e:
            seen.errors.append(e)

    env = AgentEnv(agent, TASKS)
    env.reset(seed=0)
    env.step("first")  # the program's second call now waits for a turn
    env.reset(seed=1)  # ... which this episode will never sample
    _wait(lambda: seen.errors)
    assert seen.errors[0].status_code == 410 and "new episode" in str(seen.errors[0])
    env.step("second")
    env.close()
    _wait(lambda: len(seen.errors) == 2)
    assert "closed" in str(seen.errors[1])


def test_cancelling_an_async_program_ends_it():
    ended: list = []

    async def agent(base_url, api_key, task):
        c = client(base_url, api_key)
        try:
            await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
            await asyncio.sleep(60)
        except BaseException as e:
            ended.append(type(e))
            raise

    env = AgentEnv(agent, TASKS, call_timeout_s=60)
    env.reset(seed=0)
    threading.Timer(0.3, env.close).start()  # close while step waits for the program
    with pytest.raises((StepTimeout, AgentFailed, RuntimeError)):
        env.step("first")
    _wait(lambda: ended)
    assert ended == [asyncio.CancelledError]


@pytest.mark.parametrize("result, reward, success, rewards", [
    (0.25, 0.25, True, None), (0, 0.0, False, None), ({"reward": 1, "success": False}, 1.0, False, None),
    (AgentResult(2.0, call_rewards=[0.5, 1.5]), 1.5, True, [0.5, 1.5])])
def test_what_a_program_returns_is_the_reward(result, reward, success, rewards):
    env = AgentEnv(_calls_then(2, result), TASKS)
    try:
        env.reset(seed=0)
        env.step("x")
        _, got, terminated, _, info = env.step("y")
        assert (got, terminated, info["success"], info.get("turn_rewards")) == (reward, True, success, rewards)
    finally:
        env.close()


def test_verify_computes_the_reward_from_the_result_and_the_conversation():
    def verify(task, result, messages):
        return AgentResult(float(messages[-1]["content"] == "42" and result == "done"), success=True)

    env = AgentEnv(_calls_then(1, "done"), TASKS, verify=verify)
    try:
        env.reset(seed=0)
        assert env.step("42")[1] == 1.0
    finally:
        env.close()


def _calls_then(calls: int, result):
    async def agent(base_url, api_key, task):
        c = client(base_url, api_key)
        messages = [{"role": "user", "content": "q"}]
        for _ in range(calls):
            reply = await c.chat.completions.create(model="m", messages=messages)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "n"}]
        return result
    return agent


@pytest.mark.parametrize("result, match", [
    (None, "no finite reward"), (float("nan"), "no finite reward"), ("text", "no finite reward"),
    (AgentResult(1.0, call_rewards=[1.0, 2.0, 3.0]), "3 rewards for 1 model calls")])
def test_a_result_without_a_reward_fails_the_episode(result, match):
    env = AgentEnv(_calls_then(1, result), TASKS)
    try:
        env.reset(seed=0)
        with pytest.raises(AgentFailed, match=match) as e:
            env.step("x")
        assert is_infra_failure(failure_termination(e.value))
    finally:
        env.close()


def test_a_program_that_raises_fails_its_episode_as_the_infrastructures():
    async def agent(base_url, api_key, task):
        await client(base_url, api_key).chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        raise KeyError("the harness broke")

    env = AgentEnv(agent, TASKS)
    try:
        env.reset(seed=0)
        with pytest.raises(AgentFailed, match="raised: KeyError: 'the harness broke'") as e:
            env.step("x")
        assert failure_termination(e.value) == "env_error"
    finally:
        env.close()


def test_a_program_that_never_calls_the_model_fails_at_reset():
    async def agent(base_url, api_key, task):
        return 1.0

    env = AgentEnv(agent, TASKS)
    with pytest.raises(AgentFailed, match="ended before its first model call"):
        env.reset(seed=0)
    env.close()


@pytest.mark.slow
def test_a_slow_program_passes_its_deadline_as_a_step_timeout():
    async def agent(base_url, api_key, task):
        c = client(base_url, api_key)
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        await asyncio.sleep(30)  # a tool that hangs
        return 1.0

    env = AgentEnv(agent, TASKS, call_timeout_s=0.5)
    try:
        env.reset(seed=0)
        start = time.monotonic()
        with pytest.raises(StepTimeout, match="call_timeout_s") as e:
            env.step("x")
        assert time.monotonic() - start < 5 and failure_termination(e.value) == "step_timeout"
    finally:
        env.close()
    env = AgentEnv(agent, TASKS, run_timeout_s=0.5)
    try:
        env.reset(seed=0)
        with pytest.raises(StepTimeout, match="run_timeout_s"):
            env.step("x")
    finally:
        env.close()


def test_parallel_calls_of_sub_agents_are_taken_one_per_turn():
    async def agent(base_url, api_key, task):
        c = client(base_url, api_key)

        async def sub(name: str) -> str:
            reply = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": name}])
            return reply.choices[0].message.content

        answers = await asyncio.gather(sub("left"), sub("right"))
        return 1.0 if sorted(answers) == ["A", "B"] else 0.0

    env = AgentEnv(agent, TASKS)
    try:
        obs, _ = env.reset(seed=0)
        first = obs[0]["content"]
        obs, _, _, _, info = env.step("A")
        assert info["context"] == obs and {first, obs[0]["content"]} == {"left", "right"}
        assert env.step("B")[1:3] == (1.0, True)
    finally:
        env.close()


COMMAND_AGENT = """
import json, os, openai
task = json.loads(os.environ["TURNRL_TASK"])
c = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
reply = c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{task['a']}+{task['b']}"}])
print("log line")
print(json.dumps({"reward": float(reply.choices[0].message.content == str(task["a"] + task["b"])), "success": True}))
"""


@pytest.mark.slow
def test_a_command_reads_the_base_url_from_its_environment_and_prints_its_reward():
    env = AgentEnv([sys.executable, "-c", COMMAND_AGENT], TASKS)
    try:
        obs, _ = env.reset(seed=0, options={"split": "test"})
        assert obs == [{"role": "user", "content": "5+7"}]
        _, reward, terminated, _, info = env.step("12")
        assert (reward, terminated, info["success"], info["task_id"]) == (1.0, True, True, "t2")
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("script, match", [
    ("import sys; sys.stderr.write('boom'); sys.exit(3)", "exited with status 3.*boom"),
    ("print('not json')", "is not JSON"), ("pass", "printed no result")])
def test_a_failing_command_fails_at_reset_with_what_it_said(script, match):
    env = AgentEnv([sys.executable, "-c", script], TASKS)
    with pytest.raises(AgentFailed, match=match):
        env.reset(seed=0)
    env.close()


def test_tasks_split_by_a_stable_hash_and_draws_follow_the_seed():
    tasks = [{"q": i} for i in range(200)]

    async def agent(base_url, api_key, task):
        await client(base_url, api_key).chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        return 0.0

    env = AgentEnv(agent, tasks)
    try:
        assert 200 / TEST_SHARE / 2 < len(env.split_tasks["test"]) < 200 / TEST_SHARE * 2
        assert sum(map(len, env.split_tasks.values())) == 200
        ids = [env.reset(seed=s)[1]["task_id"] for s in (3, 4, 3)]
        assert ids[0] == ids[2] and ids[0].startswith("task-")
        test_ids = {env.reset(seed=s, options={"split": "test"})[1]["task_id"] for s in range(4)}
        train_ids = {env.reset(seed=s)[1]["task_id"] for s in range(4)}
        assert not test_ids & train_ids
    finally:
        env.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"agent": None, "tasks": [1]}, "needs an agent"), ({"tasks": None}, "needs tasks"), ({"tasks": []}, "non-empty"),
    ({"tasks": {"dev": [1]}}, "splits are"), ({"max_turns": 0}, "max_turns must be a positive"),
    ({"call_timeout_s": -1}, "call_timeout_s")])
def test_bad_arguments_say_what_to_pass(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AgentEnv(**{"agent": _calls_then(1, 0.0), "tasks": [1], **kwargs})


def test_an_empty_split_is_refused_at_reset():
    env = AgentEnv(_calls_then(1, 0.0), {"train": [{"id": 1}]})
    with pytest.raises(ValueError, match="no 'test' tasks"):
        env.reset(seed=0, options={"split": "test"})
    env.close()


def test_a_subclass_overrides_run_and_tasks():
    class Echo(AgentEnv):
        tasks = [{"id": "only", "text": "hi"}]

        async def run(self, base_url, api_key, task):
            reply = await client(base_url, api_key).chat.completions.create(
                model="m", messages=[{"role": "user", "content": task["text"]}])
            return float(reply.choices[0].message.content == task["text"])

    env = Echo()
    try:
        obs, info = env.reset(seed=0, options={"split": "train" if Echo().split_tasks["train"] else "test"})
        assert obs == [{"role": "user", "content": "hi"}]
        assert env.step("hi")[1] == 1.0
    finally:
        env.close()


def test_unauthenticated_clients_reach_nothing():
    env = AgentEnv(_calls_then(1, 0.0), TASKS)
    try:
        env.reset(seed=0)
        root = env._session.gateway.url
        assert httpx.post(f"{root}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                          trust_env=False).status_code == 401
        assert httpx.get(f"{root}/s/guess/v1/models", trust_env=False).status_code == 401
        bad = httpx.post(f"{env._session.base_url}/chat/completions", json={"messages": []}, trust_env=False)
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    finally:
        env.close()


def _wait(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_gateway_threads_do_not_pile_up():
    before = threading.active_count()
    for seed in range(5):
        env = AgentEnv(_calls_then(1, 0.0), TASKS)
        env.reset(seed=seed)
        env.step("x")
        env.close()
    _wait(lambda: threading.active_count() <= before + 1)


def test_an_openai_agents_sdk_agent_calls_both_tools_and_each_call_extends_the_last():
    """The ``openai-agents`` SDK's Chat Completions model: the structured calls it gets back run
    its two function tools, and the history it sends next is the previous call's plus the reply
    plus the tools' results (so the episode keeps one segment)."""
    env = AgentsSDK(tool_parser="hermes")
    try:
        obs, info = env.reset(seed=0)
        task = env._task
        assert {t["function"]["name"] for t in info["tools"]} == {"add", "multiply"}
        assert obs[-1]["content"] == f"What is ({task['a']} + {task['b']}) * 2?"
        total = task["a"] + task["b"]
        obs, _, _, _, info = env.step('<tool_call>\n{"name": "add", "arguments": {"a": %d, "b": %d}}\n</tool_call>'
                                      % (task["a"], task["b"]))
        assert "context" not in info and [m["role"] for m in obs] == ["tool"] and obs[0]["content"] == str(total)
        obs, _, _, _, info = env.step('<tool_call>\n{"name": "multiply", "arguments": {"a": %d, "b": 2}}\n</tool_call>'
                                      % total)
        assert "context" not in info and obs[0]["content"] == str(total * 2)
        obs, reward, terminated, _, info = env.step(f"It is {total * 2}.")
        assert (reward, terminated, info["success"]) == (1.0, True, True)
    finally:
        env.close()
