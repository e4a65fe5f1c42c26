"""``RoutedPolicy`` over two real ``turnrl serve-policy`` subprocesses serving the same tiny model.

Greedy decoding makes each row's generation a function of its prompt alone, so equality with
the in-process greedy generations proves that rows come back in order wherever they ran. The
last test kills one server while a batch runs on both (it must stay last in this file: the
servers are shared by the module).
"""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from turnrl.policies.sampling import SamplingParams
from turnrl.policies.hf.policy import TransformersPolicy
from turnrl.models.causal_lm import load_pretrained
from turnrl.policies.http import OpenAIPolicy, PolicyRequestError
from turnrl.policies.server import spawn_policy_server
from turnrl.policies.routing import RoutedPolicy
from turnrl.envs import GuessNumberEnv

NAME = "tiny"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model, tokenizer):
    """The random-init tiny model: it (almost) never ends a turn, so every turn runs max_new_tokens."""
    path = tmp_path_factory.mktemp("routed_policy")
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def servers(checkpoint):
    args = ["--threads", "1", "--served-model-name", NAME]
    with ThreadPoolExecutor(2) as pool:
        # seeded apart: two members of a group sampled on the two servers differ (equal seeds would
        # give equal replies, and the two episodes one history)
        started = list(pool.map(lambda i: spawn_policy_server(checkpoint, [*args, "--seed", str(i)]), range(2)))
    yield started
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def served_model(checkpoint):
    model, _ = load_pretrained(str(checkpoint))
    return model.eval()


@pytest.fixture(scope="module")
def prompts(renderer):
    env = GuessNumberEnv(n=32, max_turns=6)
    made = [renderer.start(list(env.reset(seed=s)[0])).token_ids for s in range(6)]
    return [p[: len(p) - 2 * i] + p[len(p) - 3:] if i else p for i, p in enumerate(made)]  # varied lengths


def backends(servers, tokenizer, **kwargs):
    return [OpenAIPolicy(s.url, NAME, tokenizer=tokenizer, retries=1, backoff_s=0.01, **kwargs) for s in servers]


def stats_rows(server):
    return httpx.get(server.url + "/stats").json()["rows"]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("strategy", ["round_robin", "least_loaded", "sticky"])
def test_batch_is_split_across_backends_and_keeps_row_order(servers, served_model, tokenizer, prompts, strategy):
    params = SamplingParams(max_new_tokens=4, greedy=True)
    expected = TransformersPolicy(served_model, tokenizer).generate(prompts, params)
    before = [stats_rows(s) for s in servers]
    routed = RoutedPolicy(backends(servers, tokenizer), strategy=strategy)
    got = routed.generate(prompts, params)
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    assert [s.rows for s in routed.stats] == [3, 3] and all(s.in_flight == 0 for s in routed.stats)
    assert [stats_rows(s) - b for s, b in zip(servers, before)] == [3, 3]  # the servers saw the split


@pytest.mark.slow
@pytest.mark.e2e
def test_round_robin_rotation_continues_across_calls(servers, tokenizer, prompts):
    routed = RoutedPolicy(backends(servers, tokenizer), strategy="round_robin")
    params = SamplingParams(max_new_tokens=2, greedy=True)
    routed.generate(prompts[:1], params)
    routed.generate(prompts[:1], params)
    routed.generate(prompts[:1], params)
    assert [s.rows for s in routed.stats] == [2, 1]


@pytest.mark.slow
@pytest.mark.e2e
def test_least_loaded_sends_rows_to_the_idle_backend(servers, tokenizer, prompts):
    routed = RoutedPolicy(backends(servers, tokenizer), strategy="least_loaded")
    params = SamplingParams(max_new_tokens=200, greedy=True)
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(routed.generate, prompts[:1], params)  # one long row keeps a backend busy
        while not any(s.in_flight for s in routed.stats):
            time.sleep(0.001)
        loaded = [i for i, s in enumerate(routed.stats) if s.in_flight][0]
        for prompt in prompts[1:3]:  # one after another (round robin would send the second to the busy one)
            routed.generate([prompt], SamplingParams(max_new_tokens=2, greedy=True))
        assert routed.stats[loaded].in_flight == 1  # still busy: the test measured what it meant to
        busy.result()
    rows = [s.rows for s in routed.stats]
    assert rows[loaded] == 1 and rows[1 - loaded] == 2  # both short rows went to the idle backend


@pytest.mark.slow
@pytest.mark.e2e
def test_a_dead_backend_is_routed_around_and_client_errors_are_raised(servers, served_model, tokenizer, prompts):
    dead = OpenAIPolicy("http://127.0.0.1:9", NAME, tokenizer=tokenizer, retries=0)  # nothing listens on port 9
    routed = RoutedPolicy([dead, *backends(servers[:1], tokenizer)], cooldown_s=60)
    params = SamplingParams(max_new_tokens=3, greedy=True)
    expected = TransformersPolicy(served_model, tokenizer).generate(prompts, params)
    assert [g.token_ids for g in routed.generate(prompts, params)] == [e.token_ids for e in expected]
    assert routed.stats[0].failures == 1 and "ConnectError" in routed.stats[0].last_error
    routed.generate(prompts[:2], params)  # cooling down: not tried again
    assert routed.stats[0].failures == 1 and routed.stats[1].rows == 8
    everyone_dead = RoutedPolicy([dead, dead], cooldown_s=0)
    with pytest.raises(ConnectionError, match="every policy backend failed"):
        everyone_dead.generate(prompts[:2], params)
    wrong = RoutedPolicy([OpenAIPolicy(s.url, "nope", tokenizer=tokenizer) for s in servers])
    with pytest.raises(PolicyRequestError, match="does not serve a model named 'nope': it serves"):
        wrong.generate(prompts[:2], params)


def test_rejects_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="at least one"):
        RoutedPolicy([])
    with pytest.raises(ValueError, match="strategy"):
        RoutedPolicy([OpenAIPolicy("http://127.0.0.1:9", NAME)], strategy="random")
    with pytest.raises(ValueError, match="generate"):
        RoutedPolicy([object()])



class Recorded(OpenAIPolicy):
    """A real client that also keeps the prompts it was sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prompts = set()

    def generate(self, prompts, params):
        self.prompts.update(tuple(p) for p in prompts)
        return super().generate(prompts, params)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("strategy", ["sticky", "round_robin"])
def test_sticky_routing_keeps_each_episode_on_one_server_and_spreads_new_ones(servers, tokenizer, renderer, strategy):
    """Multi-turn GuessNumber episodes through the collector: with ``sticky`` every turn of an
    episode goes to the server that sampled its first turn, and the first turns are spread evenly;
    round robin splits episodes across servers."""
    from turnrl.rollout import RolloutCollector, Task

    clients = [Recorded(s.url, NAME, tokenizer=tokenizer, retries=1, backoff_s=0.01) for s in servers]
    routed = RoutedPolicy(clients, strategy=strategy)
    collector = RolloutCollector(lambda: GuessNumberEnv(n=1000, max_turns=4), routed, renderer, max_context_tokens=1024,
                                 env_workers=1)
    # 9 episodes: an odd batch, so round robin's rotation does not line up with the episodes by chance
    trajectories = collector.collect([Task(0), Task(1), Task(2)], 3, SamplingParams(max_new_tokens=3, temperature=1.0))
    split, homes = 0, []
    for t in trajectories:  # a group's members share their first prompt: the later turns tell them apart
        later = [tuple(t.token_ids[:start]) for start, _ in t.turn_spans[1:]]
        assert later  # multi-turn: the tiny random model never guesses right
        holders = [{i for i, c in enumerate(clients) if p in c.prompts} for p in later]
        assert all(len(h) == 1 for h in holders)
        split += len(set.union(*holders)) > 1
        homes.append(min(holders[0]))
    if strategy == "sticky":
        assert split == 0 and sorted(homes.count(i) for i in range(2)) == [4, 5]  # new episodes spread evenly
        turns = sum(len(t.turn_spans) for t in trajectories)
        assert sum(st.sticky for st in routed.stats) == turns - len(trajectories)  # every later turn stayed
    else:
        assert split > 0  # round robin scatters an episode's turns
    routed.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_killing_a_server_mid_batch_moves_its_rows_to_the_other(servers, served_model, tokenizer, prompts):
    """Runs last: it kills ``servers[0]``."""
    params = SamplingParams(max_new_tokens=120, greedy=True)
    expected = TransformersPolicy(served_model, tokenizer).generate(prompts, params)
    routed = RoutedPolicy(backends(servers, tokenizer, timeout_s=30))
    victim = servers[0]
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(routed.generate, prompts, params)
        deadline = time.monotonic() + 20
        while httpx.get(victim.url + "/stats").json()["in_flight"] == 0:
            assert time.monotonic() < deadline, "the victim never received its rows"
            time.sleep(0.005)
        victim.process.kill()  # mid-generation: its connections break, then it refuses them
        victim.process.wait()
        got = running.result(timeout=60)
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    assert routed.stats[0].failures == 1 and routed.stats[0].rows == 0 and routed.stats[1].rows == 6
    again = routed.generate(prompts[:2], SamplingParams(max_new_tokens=2, greedy=True))  # the survivor serves alone
    assert len(again) == 2 and routed.stats[1].rows == 8
