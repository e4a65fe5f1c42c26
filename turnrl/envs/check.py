"""The env-author kit: ``check(env)`` runs the checks a turnrl env must pass before training.

Checks, in order (``CHECK_NAMES``):

* ``gymnasium_check_env``: gymnasium's own env checker passes (its warnings become notes).
* ``seed_determinism``: the same seed and split give the same expert episode twice.
* ``tool_schemas``: every tool's ``schema()`` is a valid function schema; names are unique.
* ``call_format``: the reset info gives the env's tools as ``info["tools"]`` (each one's
  ``schema()``), and the opening messages never hand-write them (a ``Tool: {`` listing, or a
  call of its tools in a registered format): tools reach the model through the chat template.
* ``expert_solves``: the expert succeeds on every checked seed of every split.
* ``splits_disjoint``: no task_id is drawn from both the train and the test split.
* ``chat_roundtrip``: expert episodes render token-exactly with the chat template.

A failing check never raises: it is recorded with its reason and a hint on what to fix, and
an exception inside a check is reported with its type, message and where it was raised.

An env is named by a registered id, ``module:env-id`` (the module is imported first, as
``gymnasium.make`` does, so it can register its ids) or ``module:ClassName`` (an env class that
need not be registered), or given as an object.
"""

from __future__ import annotations

import json
import re
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import gymnasium
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from gymnasium.utils.env_checker import data_equivalence

from turnrl.envs.base import SPLITS, hand_written_tools
from turnrl.env_ids import UnknownEnvError, env_id_of, resolve_env
from turnrl.chat.renderer import ChatRenderer
from turnrl.chat.tokenizer import build_tokenizer
from turnrl.rollout.scripted import corpus_texts, scripted_episode
from turnrl.tools import ToolCall, check_call, format_call, get_parser
from turnrl.tools.prompt import example_call

__all__ = ["CHECK_NAMES", "CheckReport", "CheckResult", "UnknownEnvError", "check", "env_id_of"]

DETERMINISM_SEEDS = 5
"""Seeds (per split) whose episodes are played twice by ``seed_determinism``."""
FORMAT_SEEDS = 5
# string values that also read as JSON: a call format must give them back as the strings they are
JSON_LOOKING_STRINGS = ("5", "true", "null", "[1]")
"""Seeds (per split) whose reset info and opening messages ``call_format`` reads."""
DISJOINT_SEEDS = 200
"""Resets per split whose task_ids ``splits_disjoint`` compares (at least ``seeds``)."""
CORPUS_SEEDS = 20
"""Seeds whose expert episodes train the ``chat_roundtrip`` tokenizer."""
ROUNDTRIP_SEEDS = 3
"""Seeds (per split) whose expert episodes ``chat_roundtrip`` renders."""
MAX_EPISODE_STEPS = 1000
"""An expert episode still running after this many steps is reported as never ending."""
RAISED_FIX = "the env raised while being checked: fix the error at the place named above, then rerun"
COMPARED_INFO_KEYS = ("task_id", "state_key", "success")
TOOL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_-]*$")
SHOWN_ITEMS = 10
"""Lists in failure details (seeds, ids, problems) show at most this many items."""


class CheckFailure(Exception):
    """Raised inside a check to fail it with a reason (never escapes ``check``)."""

@dataclass(frozen=True)
class CheckResult:
    """The outcome of one named check.

    Attributes:
        name: The check's name (one of ``CHECK_NAMES``, or ``make_env`` when the env
            could not be constructed).
        passed: Whether the check passed (a skipped check counts as passed).
        detail: What was checked when it passed; the reason when it failed.
        fix: What to change in the env, for a failed check ("" when it passed).
        notes: Remarks that do not fail the check (gymnasium warnings, skips).
    """

    name: str
    passed: bool
    detail: str
    fix: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckReport:
    """All check results for one env.

    Attributes:
        env_id: The gymnasium id, or the env's class name for an env given as an object.
        results: One result per check, in ``CHECK_NAMES`` order.
        seeds: The ``seeds`` argument of ``check`` (None when unknown).
    """

    env_id: str
    results: list[CheckResult]
    seeds: int | None = None

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[str]:
        """Names of the failed checks."""
        return [r.name for r in self.results if not r.passed]

    def result(self, name: str) -> CheckResult:
        """The result of the check ``name``; raises KeyError naming the checks run otherwise."""
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no check named {name!r} in this report; it has {[r.name for r in self.results]}")

    def format(self) -> str:
        """A readable report: a header, one PASS/FAIL line per check (with indented fix and
        note lines under it), and a summary line."""
        width = max((len(r.name) for r in self.results), default=0)
        lines = [f"turnrl env check: {self.env_id}" + (f" (seeds={self.seeds})" if self.seeds is not None else "")]
        for r in self.results:
            lines.append(f"  {'PASS' if r.passed else 'FAIL'}  {r.name:<{width}}  {r.detail}")
            if not r.passed and r.fix:
                lines.append(f"        {'':<{width}}  fix: {r.fix}")
            lines.extend(f"        {'':<{width}}  note: {note}" for note in r.notes)
        passed = sum(r.passed for r in self.results)
        verdict = "OK" if self.ok else f"FAILED ({', '.join(self.failed)})"
        lines.append(f"{passed}/{len(self.results)} checks passed: {verdict}")
        return "\n".join(lines)


@dataclass(frozen=True)
class AgentSettings:
    """The agent an env will be trained with, for ``check(..., agent=...)``: its tokenizer (which
    carries the chat template), the chat format (a name, or ``"auto"``: detected from the
    template), template variables and the token limits, as a run's ``agent.chat_format``,
    ``agent.template_kwargs``, ``agent.max_context_tokens`` and ``agent.max_new_tokens`` set them.
    With it, ``chat_roundtrip`` renders with this tokenizer and template (instead of a tiny one
    built from the env's text), the env reads this format's tool calls, and ``agent_limits``
    checks the expert's episodes against the limits."""

    tokenizer: Any
    max_context_tokens: int
    max_new_tokens: int
    chat_format: str = "auto"
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def renderer(self) -> ChatRenderer:
        return ChatRenderer(self.tokenizer, self.chat_format, template_kwargs=dict(self.template_kwargs))


def check(env_id_or_env: str | gymnasium.Env, *, seeds: int = 50, env_kwargs: dict | None = None,
          agent: AgentSettings | None = None) -> CheckReport:
    """Run every check on an env and report; failing checks are recorded, never raised.

    Args:
        env_id_or_env: A registered gymnasium id (built with ``gymnasium.make(id, **env_kwargs)``),
            ``module:env-id``, ``module:ClassName`` (built with ``ClassName(**env_kwargs)``), or an
            env object (wrapped or not). Its unwrapped env should be a ``MultiTurnEnv``;
            anything it lacks shows up as failed checks. The env is reset many times (an
            episode in progress is lost).
        seeds: Seeds ``0..seeds-1`` per split for ``expert_solves`` (the other seeded checks
            use ``min(seeds, their own default)``; ``splits_disjoint`` uses at least ``seeds``).
        env_kwargs: Keyword arguments for the env's constructor; only with an env name.
        agent: The tokenizer, chat format and limits the env will train with
            (``AgentSettings``; ``python -m turnrl check-env ENV --agent-path DIR``). An env built
            here by name is given the format's ``tool_parser`` unless ``env_kwargs`` sets one.
            Without it, ``chat_roundtrip`` uses a tiny tokenizer and ``agent_limits`` is skipped.

    Returns:
        A ``CheckReport`` with one ``CheckResult`` per check in ``CHECK_NAMES`` order, or a
        single failed ``make_env`` result when the env could not be constructed.

    Raises:
        UnknownEnvError: If the name cannot be resolved (the message says why and lists the
            turnrl ids).
        ValueError: If ``seeds`` is not a positive int, or ``env_kwargs`` comes with an env object.
    """
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ValueError(f"seeds must be a positive int, got {seeds!r}")
    if isinstance(env_id_or_env, str):
        env_id = env_id_or_env
        make, what = resolve_env(env_id)
        if agent is not None and "tool_parser" not in (env_kwargs or {}):
            env_kwargs = {**(env_kwargs or {}), "tool_parser": agent.renderer().format.tool_parser}
        try:
            env = make(**(env_kwargs or {}))
        except Exception as e:
            return CheckReport(env_id, [CheckResult(
                "make_env", False, f"{what}(**{env_kwargs or {}}) {_describe(e)}; "
                "no other check was run",
                fix="make the constructor accept these kwargs (or pass valid ones) and construct without errors",
            )], seeds)
    else:
        if env_kwargs:
            raise ValueError("env_kwargs only applies to an env id; construct the env object with them instead")
        env = env_id_or_env
        spec = getattr(env, "spec", None)
        env_id = spec.id if spec is not None else type(env.unwrapped).__name__
    checks = [replace(c, run=partial(c.run, agent=agent)) if c.name in AGENT_CHECKS else c for c in CHECKS]
    return CheckReport(env_id, [_run(c, env, seeds) for c in checks], seeds)


# ------------------------------------------------------------------ running
@dataclass(frozen=True)
class _Check:
    """A named check: ``run(env, seeds)`` returns the pass detail (and notes) or raises
    ``CheckFailure``; ``fix`` tells the env author what to change when it fails."""

    name: str
    run: Callable[[gymnasium.Env, int], tuple[str, tuple[str, ...]]]
    fix: str


def _run(c: _Check, env: gymnasium.Env, seeds: int) -> CheckResult:
    try:
        detail, notes = c.run(env, seeds)
    except CheckFailure as e:
        return CheckResult(c.name, False, str(e), fix=c.fix)
    except Exception as e:
        return CheckResult(c.name, False, _describe(e), fix=RAISED_FIX)
    return CheckResult(c.name, True, detail, notes=notes)


def _describe(e: BaseException) -> str:
    """``raised Type: message (at file.py:line in function)`` for an exception."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"raised {type(e).__name__}: {e}{where}"


def _splits(env: gymnasium.Env) -> tuple[str, ...]:
    """The env's splits: its ``splits`` attribute when it declares one, else ``("train", "test")``."""
    return tuple(getattr(env.unwrapped, "splits", SPLITS))


def _shown(items: Iterable[Any]) -> str:
    """``[a, b, ...]`` with at most ``SHOWN_ITEMS`` items and a count of the rest."""
    items = list(items)
    head = ", ".join(str(i) for i in items[:SHOWN_ITEMS])
    return f"[{head}{f', ... (+{len(items) - SHOWN_ITEMS} more)' if len(items) > SHOWN_ITEMS else ''}]"


def _expert_episode(env: gymnasium.Env, seed: int, split: str) -> list[tuple]:
    """Play the expert from ``reset(seed, split)`` to the end; one record per reset/step:
    ``(observation, reward, terminated, truncated, {compared info keys})`` (reset: reward None)."""
    obs, info = env.reset(seed=seed, options={"split": split})
    records = [(obs, None, None, None, {k: info.get(k) for k in COMPARED_INFO_KEYS})]
    for _ in range(MAX_EPISODE_STEPS):
        obs, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        records.append((obs, reward, terminated, truncated, {k: info.get(k) for k in COMPARED_INFO_KEYS}))
        if terminated or truncated:
            return records
    raise CheckFailure(
        f"seed {seed} ({split}): the expert episode did not end within {MAX_EPISODE_STEPS} steps"
    )


# ------------------------------------------------------------------- checks
def _check_gymnasium(env: gymnasium.Env, seeds: int) -> tuple[str, tuple[str, ...]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            gymnasium_check_env(env.unwrapped, skip_render_check=True)
        except AssertionError as e:  # the checker's own verdict
            raise CheckFailure(f"gymnasium's env checker: {e}") from e
    notes = tuple(dict.fromkeys(f"{w.category.__name__} during check_env: {w.message}" for w in caught))
    return "gymnasium.utils.env_checker.check_env passed", notes


def _check_determinism(env: gymnasium.Env, seeds: int) -> tuple[str, tuple[str, ...]]:
    n, splits = min(seeds, DETERMINISM_SEEDS), _splits(env)
    failing: dict[str, list[int]] = {}
    reasons: list[str] = []
    for split in splits:
        for seed in range(n):
            difference = _first_difference(_expert_episode(env, seed, split), _expert_episode(env, seed, split))
            if difference:
                failing.setdefault(split, []).append(seed)
                reasons.append(f"seed {seed} ({split}): {difference}")
    if failing:
        per_split = "; ".join(f"{split} seeds {_shown(s)}" for split, s in failing.items())
        raise CheckFailure(f"two runs of the same seed differ on {per_split}; e.g. " + "; ".join(reasons[:2]))
    return f"{n} seeds x {len(splits)} splits replay identical expert episodes", ()


def _first_difference(a: list[tuple], b: list[tuple]) -> str:
    """Where two episode records first differ ("" when equal)."""
    fields = ("observation", "reward", "terminated", "truncated")
    for t, (ra, rb) in enumerate(zip(a, b)):
        where = "reset" if t == 0 else f"step {t}"
        for name, x, y in zip(fields, ra[:4], rb[:4]):
            if not data_equivalence(x, y):
                if name == "observation" and isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y):
                    i = next(i for i, (mx, my) in enumerate(zip(x, y)) if not data_equivalence(mx, my))
                    return f"{where} observation message {i} differs: {_short(x[i])} vs {_short(y[i])}"
                return f"{where} {name} differs: {_short(x)} vs {_short(y)}"
        for key in COMPARED_INFO_KEYS:
            if not data_equivalence(ra[4][key], rb[4][key]):
                return f"{where} info[{key!r}] differs: {ra[4][key]!r} vs {rb[4][key]!r}"
    if len(a) != len(b):
        return f"episode lengths differ: {len(a) - 1} vs {len(b) - 1} steps"
    return ""


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_tool_schemas(env: gymnasium.Env, seeds: int) -> tuple[str, tuple[str, ...]]:
    tools = tuple(getattr(env.unwrapped, "tools", ()))
    problems, names = [], []
    for i, t in enumerate(tools):
        label = f"tool #{i} ({getattr(t, 'name', '?')!r})"
        try:
            schema = t.schema()
        except Exception as e:
            problems.append(f"{label}: schema() {_describe(e)}")
            continue
        problems.extend(f"{label}: {p}" for p in _schema_problems(schema))
        if isinstance(schema, dict) and isinstance(schema.get("function"), dict):
            names.append(schema["function"].get("name"))
    duplicates = sorted({str(n) for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"tool names are not unique: {duplicates}")
    if problems:
        raise CheckFailure(f"{len(problems)} schema problem(s): " + "; ".join(problems))
    if not tools:
        return "the env has no tools", ()
    return f"{len(tools)} tool schema(s) valid: {[t.name for t in tools]}", ()


def _schema_problems(schema: Any) -> list[str]:
    """What makes ``schema`` an invalid ``{"type": "function", "function": {...}}`` schema."""
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as e:
        return [f"schema is not JSON-serialisable ({e})"]
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"), dict):
        return [f'schema must be {{"type": "function", "function": {{...}}}}, got {_short(schema)}']
    fn, problems = schema["function"], []
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        problems.append(f"name {name!r} must be non-empty and match {TOOL_NAME.pattern}")
    if not isinstance(fn.get("description"), str) or not fn["description"].strip():
        problems.append("description is empty; describe what the tool does")
    params = fn.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        return [*problems, f'parameters must be an object schema {{"type": "object", ...}}, got {_short(params)}']
    properties = params.get("properties", {})
    if not isinstance(properties, dict):
        return [*problems, f"parameters.properties must be a dict, got {_short(properties)}"]
    required = params.get("required", [])
    if not isinstance(required, list):
        problems.append(f"parameters.required must be a list, got {_short(required)}")
    else:
        missing = [r for r in required if r not in properties]
        if missing:
            problems.append(f"required {missing} are not in properties {sorted(properties)}")
    for prop, spec in properties.items():
        if not isinstance(spec, dict) or not ("type" in spec or "enum" in spec):
            problems.append(f"property {prop!r} has no 'type'")
        if not isinstance(spec, dict) or not str(spec.get("description", "")).strip():
            problems.append(f"property {prop!r} has no 'description'")
    return problems


def _check_expert_solves(env: gymnasium.Env, seeds: int) -> tuple[str, tuple[str, ...]]:
    failures: dict[str, list[int]] = {}
    reasons: list[str] = []
    splits = _splits(env)
    for split in splits:
        for seed in range(seeds):
            try:
                records = _expert_episode(env, seed, split)
            except Exception as e:
                reason = str(e) if isinstance(e, CheckFailure) else f"seed {seed} ({split}): {_describe(e)}"
            else:
                _, _, terminated, truncated, info = records[-1]
                if info["success"]:
                    continue
                end = "terminated" if terminated else "truncated"
                turns = len(records) - 1
                reason = f"seed {seed} ({split}, {info['task_id']}): {end} after {turns} turn(s), success=False"
            failures.setdefault(split, []).append(seed)
            reasons.append(reason)
    if failures:
        per_split = "; ".join(f"{split} seeds {_shown(s)} ({len(s)}/{seeds})" for split, s in failures.items())
        raise CheckFailure(f"the expert failed on {per_split}; e.g. " + "; ".join(reasons[:2]))
    return f"the expert solved all {seeds} seeds of {', '.join(splits)}", ()


def _check_call_format(env: gymnasium.Env, seeds: int) -> tuple[str, tuple[str, ...]]:
    declared = {t.name: t.schema() for t in getattr(env.unwrapped, "tools", ())}
    n, splits = min(seeds, FORMAT_SEEDS), _splits(env)
    problems: dict[str, list[str]] = {}  # problem -> the seeds it was seen at
    offered = 0
    for split in splits:
        for seed in range(n):
            observation, info = env.reset(seed=seed, options={"split": split})
            found = _info_tools_problems(info, declared)
            offered += bool(info.get("tools"))
            parser = getattr(env.unwrapped, "tool_parser", None)  # after reset: a mixture's is its sub-env's
            text = "\n".join(str(m.get("content", "")) for m in observation)
            found += [f"the opening messages {p}" for p in hand_written_tools(text, declared, parser)]
            for problem in found:
                problems.setdefault(problem, []).append(f"{seed} ({split})")
    if problems:
        raise CheckFailure("; ".join(f"{problem} (seeds {_shown(where)})" for problem, where in problems.items()))
    if declared and not offered:
        raise CheckFailure(f"no reset of {n} seeds x {len(splits)} splits gives info['tools'] any tool, so the "
                           f"model is never shown {sorted(declared)}")
    if not declared:
        return "the env has no tools (info['tools'] is empty) and its prompts write no tool calls", ()
    return (f"{offered} of {n * len(splits)} resets give the tools in info['tools'] as their schema(); no opening "
            "messages hand-write tools or a call format"), ()


def _check_string_arguments(env: gymnasium.Env, seeds: int) -> tuple[str, tuple[str, ...]]:
    """Each string parameter of each tool, given a value that also reads as JSON ("5", "true",
    "null", "[1]"), survives the env's call format: written by its formatter (what warm-start
    targets and the tools prompt show), read by its parser and checked against the schema."""
    unwrapped = env.unwrapped
    tools = {t.name: t for t in getattr(unwrapped, "tools", ())}
    parser = getattr(unwrapped, "tool_parser", None)
    strings = [(t, key) for t in tools.values()
               for key, spec in t.parameters.get("properties", {}).items() if spec.get("type") == "string"]
    if not strings or parser is None:
        return "skipped", ("the env's tools take no string parameter",)
    problems = []
    for t, key in strings:
        for value in JSON_LOOKING_STRINGS:
            call = ToolCall(t.name, {**example_call(t).arguments, key: value})
            text = format_call(call, parser)
            parsed = get_parser(parser)(text)
            got = parsed.calls[0] if parsed.status == "ok" and len(parsed.calls) == 1 else None
            if got is not None:
                check_call(got, tools)  # gives the schema's strings their text as written (in place)
            if got is None or got.arguments.get(key) != value:
                read = got.arguments.get(key) if got is not None else parsed.error
                problems.append(f"{t.name}({key}={value!r}) written in {parser!r} as {_short(text, 60)} reads back "
                                f"as {read!r}")
    if problems:
        raise CheckFailure("; ".join(problems[:4]))
    return (f"{len(strings)} string parameter(s) x {len(JSON_LOOKING_STRINGS)} values round-trip through the "
            f"{parser!r} formatter, parser and schema"), ()


def _info_tools_problems(info: dict, declared: dict[str, dict]) -> list[str]:
    """How a reset's ``info["tools"]`` misses the env's tools (``declared``: name -> schema)."""
    if "tools" not in info:
        return [f"the reset info has no 'tools' key, so the model is never given {sorted(declared)}"] * bool(declared)
    schemas = info["tools"]
    if not isinstance(schemas, (list, tuple)):
        return [f"info['tools'] is a {type(schemas).__name__}, not a list of function schemas"]
    problems, names = [], []
    for schema in schemas:
        name = schema.get("function", {}).get("name") if isinstance(schema, dict) else None
        names.append(name)
        if name not in declared:
            problems.append(f"info['tools'] has {_short(name)}, which is not one of the env's tools {sorted(declared)}")
        elif schema != declared[name]:
            problems.append(f"info['tools'] describes {name!r} otherwise than its schema() ({_short(schema)} vs "
                            f"{_short(declared[name])})")
    if len(set(names)) != len(names):
        problems.append(f"info['tools'] names a tool twice: {names}")
    return problems


def _check_splits_disjoint(env: gymnasium.Env, seeds: int) -> tuple[str, tuple[str, ...]]:
    splits = _splits(env)
    if len(splits) < 2:
        return "skipped", (f"the env has a single split {splits}; nothing to compare",)
    n = max(seeds, DISJOINT_SEEDS)
    ids = {split: {env.reset(seed=s, options={"split": split})[1]["task_id"] for s in range(n)} for split in splits}
    overlaps = []
    for i, a in enumerate(splits):
        for b in splits[i + 1:]:
            shared = sorted(ids[a] & ids[b], key=str)
            if shared:
                overlaps.append(f"{len(shared)} task_ids are in both {a} and {b}: {_shown(shared)}")
    if overlaps:
        raise CheckFailure(f"over {n} resets per split, " + "; ".join(overlaps))
    sizes = ", ".join(f"{len(ids[s])} {s}" for s in splits)
    return f"{n} resets per split drew disjoint task_ids ({sizes} distinct)", ()


def _check_chat_roundtrip(env: gymnasium.Env, seeds: int, agent: AgentSettings | None = None
                          ) -> tuple[str, tuple[str, ...]]:
    renderer = agent.renderer() if agent is not None else ChatRenderer(build_tokenizer(corpus_texts(env, range(CORPUS_SEEDS))))
    n, splits, problems = min(seeds, ROUNDTRIP_SEEDS), _splits(env), []
    for split in splits:
        for seed in range(n):
            trajectory = scripted_episode(env, seed, renderer, split=split)
            problems.extend(f"seed {seed} ({split}): {p}" for p in _roundtrip_problems(renderer, trajectory))
    if problems:
        raise CheckFailure(f"{len(problems)} round-trip problem(s): " + "; ".join(problems[:3]))
    return (f"{n} seeds x {len(splits)} splits of expert episodes render token-exactly"
            + (f" ({renderer.format.name} template)" if agent is not None else "")), ()


def _check_agent_limits(env: gymnasium.Env, seeds: int, agent: AgentSettings | None = None
                        ) -> tuple[str, tuple[str, ...]]:
    """The expert's episodes, rendered as the agent will see them, fit its limits: every turn's
    prompt leaves ``max_new_tokens`` within ``max_context_tokens`` (else the collector ends the
    episode, termination ``context_length``), and every expert turn fits ``max_new_tokens`` (else
    a warm start trains on turns the sampler cuts)."""
    if agent is None:
        return "skipped", ("give the agent's tokenizer and limits (check-env --agent-path DIR) to check them",)
    renderer, problems = agent.renderer(), []
    n, splits = min(seeds, ROUNDTRIP_SEEDS), _splits(env)
    first, longest_turn, longest_prompt = [], 0, 0
    for split in splits:
        for seed in range(n):
            trajectory = scripted_episode(env, seed, renderer, split=split)
            for k, (start, end) in enumerate(trajectory.turn_spans):
                segment = max(s for s in trajectory.segment_starts if s <= start)
                prompt = start - segment
                longest_prompt, longest_turn = max(longest_prompt, prompt), max(longest_turn, end - start)
                if k == 0:
                    first.append(prompt)
                if prompt + agent.max_new_tokens > agent.max_context_tokens:
                    problems.append(f"seed {seed} ({split}) turn {k}: a {prompt}-token prompt + max_new_tokens "
                                    f"{agent.max_new_tokens} > max_context_tokens {agent.max_context_tokens}")
                if end - start > agent.max_new_tokens:
                    problems.append(f"seed {seed} ({split}) turn {k}: the expert's turn is {end - start} tokens > "
                                    f"max_new_tokens {agent.max_new_tokens}")
    if problems:
        raise CheckFailure(f"{len(problems)} turn(s) over the agent's limits: " + "; ".join(problems[:3]))
    notes = ()
    if max(first) > agent.max_context_tokens / 2:
        notes = (f"the opening prompt takes up to {max(first)} of the {agent.max_context_tokens} context tokens",)
    return (f"{n} seeds x {len(splits)} splits: prompts up to {longest_prompt} tokens + max_new_tokens "
            f"{agent.max_new_tokens} fit max_context_tokens {agent.max_context_tokens}; expert turns up to "
            f"{longest_turn} tokens fit max_new_tokens"), notes


def _roundtrip_problems(renderer: Any, trajectory: Any) -> list[str]:
    """How a rendered episode's ids (its last segment's), or its re-encoded observation messages,
    miss their text (the chat template's render of the messages, with the env's tools)."""
    problems, tokenizer = [], renderer.tokenizer
    decoded = tokenizer.decode(trajectory.token_ids[trajectory.segment_starts[-1]:], skip_special_tokens=False)
    expected = renderer.render(trajectory.messages, add_generation_prompt=False, tools=trajectory.tools)
    if decoded != expected:
        at = next((i for i, (x, y) in enumerate(zip(decoded, expected)) if x != y), min(len(decoded), len(expected)))
        problems.append(f"decoded ids differ from the chat template at char {at}: "
                        f"{_short(decoded[at:at + 40])} vs {_short(expected[at:at + 40])}")
    for m in trajectory.messages:
        if m["role"] == "assistant":
            continue
        ids = tokenizer(m["content"], add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(ids, skip_special_tokens=False)
        if back != m["content"]:
            problems.append(f"{m['role']} message {_short(m['content'], 60)} re-encodes to {_short(back, 60)}")
    return problems


CHECKS: tuple[_Check, ...] = (
    _Check("gymnasium_check_env", _check_gymnasium,
           "follow the gymnasium checker's message: reset(seed=...) must seed self.np_random via "
           "super().reset(seed=seed), and observations must lie in observation_space"),
    _Check("seed_determinism", _check_determinism,
           "draw every random choice from the rng passed to _new_task (self.np_random), never from "
           "Python's random, time or counters; keep expert_action a function of the env state"),
    _Check("tool_schemas", _check_tool_schemas,
           "build tools with turnrl.tools.tool on a typed function with a Google docstring "
           "(summary + an Args entry per parameter), or correct the hand-written Tool fields named above"),
    _Check("call_format", _check_call_format,
           "leave info['tools'] to MultiTurnEnv.reset (it gives [t.schema() for t in self.tools]), and state the "
           "task only in the opening messages: no tool listing, no example call (drop self.tools_prompt() and "
           "hand-written calls from the prompt; the chat template, or the renderer's tools_prompt() for a "
           "template without tools, shows the tools in the model's own format)"),
    _Check("string_arguments", _check_string_arguments,
           "register a formatter and a parser for the env's tool_parser that agree (turnrl.tools.register_formatter / "
           "register_parser): a string the formatter writes must read back as that string once check_call applies "
           "the tool's schema"),
    _Check("expert_solves", _check_expert_solves,
           "make expert_action() solve every task within max_turns (replay a failing seed with env.reset("
           "seed=..., options={'split': ...}) and step the expert), or fix the success judgement in _on_turn"),
    _Check("splits_disjoint", _check_splits_disjoint,
           "decide a task's split from the task itself (e.g. a stable hash of its id) and draw each split "
           "only from its own tasks in _new_task"),
    _Check("chat_roundtrip", _check_chat_roundtrip,
           "keep observations free of text the chat template rewrites "
           "(special tokens such as <|im_end|>, leading/trailing whitespace the template strips)"),
    _Check("agent_limits", _check_agent_limits,
           "raise agent.max_context_tokens (or shorten the system prompt, tool descriptions and observations) "
           "and raise agent.max_new_tokens to the expert's longest turn, or make the expert's turns shorter"),
)
CHECK_NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)
AGENT_CHECKS = ("chat_roundtrip", "agent_limits")  # the checks that take the agent's settings
