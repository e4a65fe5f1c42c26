"""``SessionMap`` and its prefix fingerprints: the longest remembered prefix wins, equal prefixes
always match, the map stays within its capacity."""

import random

import pytest

from turnrl.policies.http import prefix_cache_counters
from turnrl.policies.sessions import SessionMap, fingerprints


def test_fingerprints_match_exactly_the_equal_prefixes():
    rng = random.Random(0)
    a = [rng.randrange(150_000) for _ in range(300)]
    b = a[:200] + [x + 1 for x in a[200:]]
    fa, fb = fingerprints(a), fingerprints(b)
    assert len(fa) == 300 and (fa[:200] == fb[:200]).all() and not (fa[200:] == fb[200:]).any()
    assert (fingerprints(a[:57]) == fa[:57]).all()  # a prefix's fingerprints are the sequence's first ones
    assert fingerprints([5])[-1] != fingerprints([5, 0])[-1]  # a trailing id 0 counts
    assert len(set(fa.tolist())) == 300


def test_the_owner_is_the_backend_of_the_longest_remembered_prefix():
    sessions = SessionMap()
    assert sessions.owner([1, 2, 3]) is None
    sessions.record([1, 2], 0)
    sessions.record([1, 2, 3, 4], 1)  # the same episode, a later turn, on another backend
    assert sessions.owner([1, 2, 3, 4, 5, 6]) == 1
    assert sessions.owner([1, 2, 3]) == 0
    assert sessions.owner([1, 2]) == 0  # the same prompt again
    assert sessions.owner([9, 1, 2]) is None
    sessions.forget(1)
    assert sessions.owner([1, 2, 3, 4, 5]) == 0


def test_the_map_keeps_the_most_recent_sequences_within_its_capacity():
    sessions = SessionMap(capacity=3)
    for i in range(5):
        sessions.record([i, i], i)
    assert len(sessions) == 3 and sessions.owner([0, 0, 9]) is None and sessions.owner([4, 4, 9]) == 4
    with pytest.raises(ValueError, match="capacity"):
        SessionMap(capacity=0)


def test_prefix_cache_counters_are_read_from_vllms_metrics_text():
    text = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 800.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 900.0
vllm:prefix_cache_hits_created 1.7e9
"""
    assert prefix_cache_counters(text) == (2000.0, 900.0)
    assert prefix_cache_counters("other_metric 3\n") is None
