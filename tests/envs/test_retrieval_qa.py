import json
import re
import zlib

import numpy as np
import pytest

from turnrl.envs import check
from turnrl.envs.baselines import play_episode
from turnrl.envs.tasks.corpus import CORPUS_SEED, KINDS, RELATIONS, build_world
from turnrl.envs.tasks.retrieval_qa import (
    FORMAT_REMINDER,
    Library,
    RetrievalQAEnv,
    is_correct,
    make_question,
    normalize_answer,
)
from turnrl.tools import get_parser

WORLD = build_world()


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def fresh(seed=0, split="train", **kwargs):
    env = RetrievalQAEnv(**kwargs)
    obs, info = env.reset(seed=seed, options={"split": split})
    return env, obs, info


def first(kind, having=()):
    return next(e for e in WORLD.of_kind(kind) if all(r in e.facts for r in having))


# ---------------------------------------------------------------- the corpus
def test_world_is_cached_deterministic_and_consistent():
    assert build_world() is WORLD and WORLD.seed == CORPUS_SEED
    assert len(WORLD.entities) == 312 and {e.kind for e in WORLD.entities} == set(KINDS)
    assert len({t.lower() for t in WORLD.titles}) == len(WORLD.titles)
    other = build_world(7)
    assert other.titles != WORLD.titles
    for e in WORLD.entities:
        assert e.title in e.text and len(e.text) < 1000
        for name, value in e.facts.items():
            relation = RELATIONS[name]
            assert relation.source == e.kind
            assert value in e.text  # every fact is stated in the entity's own document
            if relation.target is not None:
                assert WORLD.get(value).kind == relation.target
            assert value not in e.snippet  # the snippet names no fact: following a chain needs open


def test_corpus_v0_is_pinned():
    # The v0 tasks depend on this exact corpus: a change here needs a new env version.
    fingerprint = zlib.crc32("\n".join(e.title + "|" + e.text for e in WORLD.entities).encode())
    assert fingerprint == 1391981381


def test_search_finds_every_document_by_its_title():
    library = Library(WORLD)
    for e in WORLD.entities:
        top = library.search(e.title, k=1)
        assert top == f"1. {e.title}: {e.snippet}"


def test_search_formats_results_and_handles_no_match_and_bad_k():
    library = Library(WORLD)
    city = first("city")
    lines = library.search(city.title).split("\n")
    assert len(lines) == 3 and all(re.match(r"^[123]\. [^:]+: ", line) for line in lines)
    assert len(library.search("city river", k=10).split("\n")) == 10
    assert len(library.search(city.title, k=10).split("\n")) < 10  # only documents that match
    assert library.search("zzzz qqqq").startswith("No documents match 'zzzz qqqq'.")
    with pytest.raises(ValueError, match="k must be between 1 and 10"):
        library.search("x", k=11)


def test_open_ignores_case_and_spacing_and_suggests_close_titles():
    library = Library(WORLD)
    river = WORLD.of_kind("river")[0]
    assert library.open(f"  {river.title.upper()} ") == river.text
    with pytest.raises(ValueError, match=re.escape(river.title)) as raised:
        library.open(river.title[:-2])  # a typo
    assert str(raised.value).startswith(f"no document titled {river.title[:-2]!r}. Close matches: ")


# -------------------------------------------------------------- questions
def test_hand_built_questions_and_answers():
    company = first("company")
    founder = WORLD.get(company.facts["founder"])
    city = WORLD.get(founder.facts["birthplace"])
    q = make_question(WORLD, company.title, ("founder", "birthplace", "country"))
    assert q.text == f"In which country does the birthplace of the founder of {company.title} lie?"
    assert q.chain == (company.title, founder.title, city.title) and q.hops == 3
    assert q.answers == (city.facts["country"],)
    assert q.task_id == f"{company.title}/founder/birthplace/country"
    invention = first("invention")
    q = make_question(WORLD, invention.title, ("inventor", "birth_year"))
    assert q.text == f"In which year was the inventor of the {invention.title} born?"
    assert q.answer == WORLD.get(invention.facts["inventor"]).facts["birth_year"]
    city = first("city", having=("river",))
    q = make_question(WORLD, city.title, ("river",))
    assert q.answers == (city.facts["river"], city.facts["river"].removesuffix(" River"))


@pytest.mark.parametrize(
    "start, relations, message",
    [("Nowhere", ("country",), "no entity titled"), (None, (), "at least one"),
     (None, ("founder",), "has no 'founder'"), (None, ("flows",), "unknown relation"),
     (None, ("language", "capital"), "leaf relation")],
)
def test_make_question_rejects_bad_chains(start, relations, message):
    with pytest.raises(ValueError, match=message):
        make_question(WORLD, start or first("country").title, relations)


def test_answer_normalisation():
    assert normalize_answer("  The Orun-River. ") == "orun river"
    assert normalize_answer("A  Halvex Loom!") == "halvex loom"
    gold = ("Orun River", "Orun")
    assert is_correct("the orun river", gold) and is_correct("ORUN.", gold) and is_correct("Orun", gold)
    assert not is_correct("Orun Riverside", gold) and not is_correct("", gold) and not is_correct("the", gold)


# ------------------------------------------------------------------- env
def test_prompt_tools_and_turn_limit():
    env, obs, info = fresh(seed=3)
    system, user = obs
    names = [t.name for t in env.tools]
    assert names == ["search", "open"]
    assert info["tools"] == [t.schema() for t in env.tools]
    for t in env.tools:
        assert json.dumps(t.schema()) not in system["content"]
    assert env.tools[0].parameters["required"] == ["query"]
    assert call("search", query="Zentrix") not in system["content"] and "Answer: <answer>" in system["content"]
    assert user["content"] == env.task.text and info["state_key"] == ()
    assert env.max_turns == 2 * env.task.hops + 2
    assert RetrievalQAEnv(max_hops=3).max_turns == 8
    env, _, _ = fresh(seed=3, max_turns=4)
    assert env.max_turns == 4


def test_expert_episode_reads_the_chain_and_answers():
    env, obs, info = fresh(seed=11)
    q = env.task
    action = env.expert_action()
    assert action == call("search", query=q.start)
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith(f"1. {q.start}: ")
    for i, title in enumerate(q.chain):
        action = env.expert_action()
        assert action == call("open", title=title)
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == ({"role": "tool", "content": WORLD.get(title).text},)
        assert info["state_key"] == tuple(range(i + 1)) and reward == 0.0 and not terminated
    assert env.expert_action() == f"Answer: {q.answer}"
    obs, reward, terminated, truncated, info = env.step(f"I read it all.\nAnswer: {q.answer.upper()}")
    assert obs == () and reward == 1.0 and terminated and info["success"] and info["turn"] == q.hops + 2


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_every_seed_in_hops_plus_two_turns(split):
    env = RetrievalQAEnv()
    for seed in range(300):
        success, turns = play_episode(env, seed, "expert", split)
        assert success and turns == env.task.hops + 2, (seed, env.task.task_id)


def test_expert_solves_with_other_parsers_and_fixed_turns():
    for parser in ("json_fenced", "xml"):
        env = RetrievalQAEnv(tool_parser=parser, min_hops=4, max_hops=4)
        for seed in range(10):
            assert play_episode(env, seed, "expert", "test")[0]
            assert get_parser(parser)(env.unwrapped._call("open", title="x")).status == "ok"


def test_wrong_answer_terminates_without_reward():
    env, _, _ = fresh(seed=2)
    obs, reward, terminated, truncated, info = env.step("Answer: Atlantis")
    assert reward == 0.0 and terminated and not truncated and not info["success"]


def test_splits_are_crc32_buckets_and_disjoint():
    env = RetrievalQAEnv()
    ids = {}
    for split in ("train", "test"):
        ids[split] = set()
        for seed in range(200):
            _, info = env.reset(seed=seed, options={"split": split})
            assert (zlib.crc32(env.task.text.encode()) % 5 == 0) == (split == "test")
            assert 2 <= env.task.hops <= 4 and info["task_id"] == env.task.task_id
            ids[split].add(info["task_id"])
    assert not ids["train"] & ids["test"] and len(ids["test"]) > 150


def test_determinism_and_hop_range():
    a, b = RetrievalQAEnv(), RetrievalQAEnv()
    for seed in range(20):
        assert a.reset(seed=seed)[0] == b.reset(seed=seed)[0]
    env = RetrievalQAEnv(min_hops=1, max_hops=1)
    hops = {env.reset(seed=s)[1]["task_id"].count("/") for s in range(30)}
    assert hops == {1}
    tasks = {RetrievalQAEnv().reset(seed=s)[1]["task_id"] for s in range(30)}
    assert len(tasks) > 25


def test_state_key_counts_only_chain_documents_opened():
    env, _, _ = fresh(seed=5, min_hops=3, max_hops=3)
    q = env.task
    off_chain = next(t for t in WORLD.titles if t not in q.chain)
    steps = [
        (call("search", query=q.start), ()),
        (call("open", title=off_chain), ()),  # off the chain: no change
        (call("open", title=q.chain[1].lower()), (1,)),  # out of order, any case
        (call("open", title="No Such Place"), (1,)),  # an error opens nothing
        (call("open", title=q.chain[0]) + call("open", title=q.chain[2]), (0, 1, 2)),
        (call("open", title=q.chain[0]), (0, 1, 2)),  # re-reading changes nothing
    ]
    for action, key in steps:
        *_, info = env.step(action)
        assert info["state_key"] == key
    # the same state reached another way gives the same key
    other, _, _ = fresh(seed=5, min_hops=3, max_hops=3)
    for title in q.chain:
        *_, info = other.step(call("open", title=title))
    assert info["state_key"] == (0, 1, 2)
    assert other.expert_action() == env.expert_action() == f"Answer: {q.answer}"


@pytest.mark.parametrize(
    "action, role, start",
    [
        ('<tool_call>\n{"name": "search", "arguments": {"query": "x}\n</tool_call>', "user",
         "Error: could not parse your tool call: tool call 1 is not valid JSON"),
        ('<tool_call>\n{"name": "open"', "user", "Error: could not parse your tool call: unclosed <tool_call>"),
        (call("browse", url="x"), "tool", "Error: unknown tool 'browse'. Available tools: open, search."),
        (call("search", query="x", k="3"), "tool",
         "Error: bad arguments for tool 'search': argument 'k' must be integer"),
        (call("search", query="x", k=0), "tool", "Error: tool 'search' raised ValueError: k must be between 1 and 10"),
        (call("open"), "tool", "Error: bad arguments for tool 'open': missing required argument 'title'"),
        (call("open", title="Zentrixx"), "tool",
         "Error: tool 'open' raised ValueError: no document titled 'Zentrixx'."),
        ("I do not know.", "user", FORMAT_REMINDER),
        ("Answer:   ", "user", FORMAT_REMINDER),
        ("", "user", FORMAT_REMINDER),
        ("\x00\x01 garbage {{{", "user", FORMAT_REMINDER),
    ],
)
def test_garbage_actions_give_messages_and_the_episode_continues(action, role, start):
    env, _, _ = fresh(seed=1)
    obs, reward, terminated, truncated, info = env.step(action)
    assert len(obs) == 1 and obs[0]["role"] == role and obs[0]["content"].startswith(start)
    assert reward == 0.0 and not terminated and info["state_key"] == ()
    while not env.done:
        *_, info = env.step(env.expert_action())
    assert info["success"]


def test_answer_in_a_tool_call_turn_is_ignored():
    env, _, _ = fresh(seed=4)
    obs, reward, terminated, *_ = env.step(call("search", query="river") + f"\nAnswer: {env.task.answer}")
    assert len(obs) == 1 and obs[0]["role"] == "tool" and not terminated and reward == 0.0


def test_truncated_after_max_turns():
    env, _, _ = fresh(seed=0)
    for _ in range(env.max_turns):
        obs, reward, terminated, truncated, info = env.step(call("search", query="city"))
    assert truncated and not terminated and not info["success"]


@pytest.mark.slow
def test_random_and_weak_players():
    env, _, _ = fresh(seed=0)
    parse = get_parser("hermes")
    rng = np.random.default_rng(0)
    kinds = set()
    for _ in range(60):
        action = env.random_action(rng)
        kinds.add("answer" if action.startswith("Answer: ") else parse(action).calls[0].name)
        assert action.startswith("Answer: ") or parse(action).status == "ok"
    assert kinds == {"search", "open", "answer"}
    weak = np.mean([play_episode(env, s, "weak", "test")[0] for s in range(200)])
    random = np.mean([play_episode(env, s, "random", "test")[0] for s in range(100)])
    assert 0.2 <= weak <= 0.6 and random <= 0.05


@pytest.mark.parametrize(
    "kwargs, message",
    [({"min_hops": 0}, "min_hops"), ({"max_hops": 5}, "max_hops"), ({"min_hops": 3, "max_hops": 2}, "exceed"),
     ({"max_turns": 0}, "max_turns"), ({"corpus_seed": -1}, "seed")],
)
def test_bad_constructor_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RetrievalQAEnv(**kwargs)


def test_registered_env_passes_the_checker():
    report = check("turnrl/RetrievalQA-v0", seeds=20)
    assert report.ok, report.format()


def test_hydra_group_builds_the_env():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from turnrl.train.factories import env_factory
    from turnrl.conf.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="turnrl.conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=["env=retrieval_qa"]))
    assert cfg.env.id == "turnrl/RetrievalQA-v0" and cfg.agent.max_new_tokens == 64
    env = env_factory(cfg)()
    assert (env.unwrapped.min_hops, env.unwrapped.max_hops) == (2, 4)
    assert play_episode(env, 0, "expert", "test")[0]


def test_answer_may_follow_on_the_next_line_and_only_its_line_counts():
    env, _, _ = fresh(seed=6)
    *_, info = env.step(f"Answer:\n{env.task.answer}\nThat is all.")
    assert info["success"]
    env, _, _ = fresh(seed=6)
    *_, info = env.step(f"Answer: {env.task.answer} or maybe not")
    assert env.done and not info["success"]
