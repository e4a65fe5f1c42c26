"""The asynchronous rollout pipeline's schedule, bounds, hand-offs and failures.

The pipeline is driven here as the trainer drives it: a learner loop that takes step ``s``'s
batch, "updates" a real torch module (the weights the sampler loads), and publishes the new
weights. ``collect`` records which weights the sampler held when each step was collected and
how far the learner was at that moment, so the tests check the schedule itself: the version
of step ``s`` is ``max(0, s - 1 - k)``, sampling never runs more than ``k`` updates ahead of the
learner, ``k >= 1`` really overlaps (step ``s + 1`` is collected while update ``s`` runs), and
``k = 0`` never overlaps.
"""

import threading
import time

import pytest
import torch

from turnrl.rollout.collector import Task
from turnrl.rollout.pipeline import AsyncRollouts, RolloutBatch, policy_version


class Loop:
    """A learner and a sampler that share nothing but published snapshots."""

    def __init__(self, update_seconds: float = 0.0):
        self.learner = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.zeros_(self.learner.weight)
        self.sampler = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.zeros_(self.sampler.weight)
        self.updates_done = 0
        self.updating = threading.Event()
        self.update_seconds = update_seconds
        self.log = []  # (step, weights the sampler held, updates done, an update was running)

    def collect(self, step):
        held = int(self.sampler.weight[0, 0].item())  # the weights encode the update count
        self.log.append((step, held, self.updates_done, self.updating.is_set()))
        time.sleep(0.01)
        return [Task(seed=step)], []

    def update(self):
        self.updating.set()
        time.sleep(self.update_seconds)
        with torch.no_grad():
            self.learner.weight += 1.0
        self.updates_done += 1
        self.updating.clear()

    def run(self, k, steps, first=1, version=0, pending=None, drain_at=None):
        pipe = AsyncRollouts(self.collect, self.sampler.load_state_dict, k, first=first, last=steps,
                             version=version, pending=pending)
        batches, drained = [], None
        try:
            for step in range(first - len(pending or []), steps + 1):
                batch, _ = pipe.next(step)
                batches.append(batch)
                self.update()
                if step == drain_at:
                    drained = pipe.drain(step)
                pipe.publish(step, self.learner)
        finally:
            pipe.close()
        return batches, drained


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_each_step_is_sampled_with_the_weights_of_update_step_minus_1_minus_k(k):
    loop = Loop()
    batches, _ = loop.run(k, steps=8)
    assert [b.step for b in batches] == list(range(1, 9))
    assert [b.policy_version for b in batches] == [max(0, s - 1 - k) for s in range(1, 9)]
    assert [held for _, held, _, _ in loop.log] == [policy_version(s, k) for s in range(1, 9)]  # really loaded
    assert [b.staleness for b in batches] == [min(s - 1, k) for s in range(1, 9)]
    # never more than k updates ahead: when step s was collected, at most s - 1 updates were done
    # and at least s - 1 - k
    for step, _, done, _ in loop.log:
        assert step - 1 - k <= done <= step - 1


def test_k0_never_overlaps_and_k1_collects_the_next_step_during_the_update():
    sync = Loop(update_seconds=0.05)
    sync.run(0, steps=5)
    assert not any(running for *_, running in sync.log)
    assert [done for _, _, done, _ in sync.log] == [0, 1, 2, 3, 4]  # each step after the previous update

    overlapped = Loop(update_seconds=0.2)
    overlapped.run(1, steps=5)
    assert sum(running for *_, running in overlapped.log[1:]) >= 3, overlapped.log


def test_drain_returns_the_in_flight_steps_and_a_pipeline_resumed_from_them_goes_on_the_same():
    reference = Loop()
    batches, drained = reference.run(2, steps=8, drain_at=4)
    assert [b.step for b in drained] == [5, 6]  # sampled with the weights of updates 2 and 3
    assert [b.policy_version for b in drained] == [2, 3]

    resumed = Loop()  # the learner's and the sampler's weights as they were after update 4
    with torch.no_grad():
        resumed.learner.weight += 4.0
        resumed.sampler.weight += 4.0
    resumed.updates_done = 4
    rest, _ = resumed.run(2, steps=8, first=7, version=4, pending=drained)
    assert [(b.step, b.policy_version) for b in rest] == [(b.step, b.policy_version) for b in batches[4:]]
    assert [held for _, held, _, _ in resumed.log] == [4, 5]  # steps 7 and 8 only were collected again


def test_a_failing_collect_reaches_the_learner_with_its_cause():
    def collect(step):
        if step == 2:
            raise OSError("the env server went away")
        return [], []

    pipe = AsyncRollouts(collect, lambda state: None, 1, first=1, last=4)
    try:
        pipe.next(1)
        with pytest.raises(RuntimeError, match="rollout worker failed") as info:
            pipe.next(2)
        assert isinstance(info.value.__cause__, OSError)
    finally:
        pipe.close()


def test_a_missing_publish_is_an_error_not_a_hang():
    loop = Loop()
    pipe = AsyncRollouts(loop.collect, loop.sampler.load_state_dict, 0, first=1, last=3)
    try:
        pipe.next(1)
        loop.update()  # ... but no publish(1)
        with pytest.raises(RuntimeError, match=r"never published.*publish\(1, model\)"):
            pipe.next(2)
    finally:
        pipe.close()


def test_bad_arguments_are_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="max_staleness must be an int >= 0"):
        AsyncRollouts(lambda s: ([], []), lambda s: None, -1, first=1, last=2)
    with pytest.raises(ValueError, match=r"pending batches must be of steps \[3, 4\]"):
        AsyncRollouts(lambda s: ([], []), lambda s: None, 2, first=5, last=6,
                      pending=[RolloutBatch(2, 0, [], []), RolloutBatch(3, 1, [], [])])
