"""Scripted players: episodes of an env's expert (or weak expert) rendered token-exactly,
for supervised warm starts and for checking envs end to end."""

from __future__ import annotations

import logging

import numpy as np

from turnrl.chat.renderer import ChatRenderer, Conversation
from turnrl.chat.tokenizer import tools_block
from turnrl.rollout.termination import failure_termination
from turnrl.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


# the scripted players of an env (agent.warmstart.player)
PLAYERS = ("expert", "weak")


def scripted_episode(env, seed: int, renderer: ChatRenderer, player: str = "expert", split: str = "train",
                     rng: np.random.Generator | None = None) -> Trajectory:
    """Play one episode with the env's scripted player and render it as a ``Trajectory``.

    Args:
        env: a turnrl env (``expert_action()`` and ``weak_expert_action(rng)`` on the unwrapped env).
        seed: the env seed (the task).
        renderer: renders observations; the player's text is tokenized as a whole turn plus
            the end-of-turn id and marked as "sampled" (logprobs 0), so SFT trains on it.
        player: ``"expert"`` or ``"weak"``.
        split: the task split.
        rng: randomness of the weak player.

    An env that raises in ``reset`` or ``step`` ends the episode with its failure's termination
    (``turnrl.rollout.termination.failure_termination``; ``error`` holds the exception), so a
    caller drops it (``is_infra_failure``) instead of losing its whole stage.
    """
    if player not in PLAYERS:
        raise ValueError(f"player must be one of {PLAYERS}, got {player!r}")
    rng = rng if rng is not None else np.random.default_rng(seed)
    try:
        obs, info = env.reset(seed=seed, options={"split": split})
    except Exception as exc:  # the env failed, not the player: an episode without turns
        log.warning("env raised during the reset of a scripted episode (seed %d): %r", seed, exc)
        return Trajectory.from_conversation(Conversation(), [], False, 0, str(seed), failure_termination(exc),
                                            error=repr(exc))
    base = env.unwrapped  # (after the reset: a DeadlineEnv plays on a new env after a timeout)
    conv = renderer.start(list(obs), tools=info.get("tools"))
    eos = renderer.tokenizer.eos_token_id
    rewards, state_keys = [], [info.get("state_key")]
    success, termination = False, "truncated"
    while True:
        text = renderer.scripted_turn(conv, base.expert_action() if player == "expert" else base.weak_expert_action(rng))
        ids = renderer.encode(text) + [eos]
        action = renderer.add_sampled(conv, ids, [0.0] * len(ids))
        try:
            obs, reward, terminated, truncated, info = env.step(action)
        except Exception as exc:  # ends this episode (its turns so far are kept, marked as failed)
            log.warning("env raised during a scripted episode (seed %d): %r", seed, exc)
            renderer.add_observation(conv, [], add_generation_prompt=False)
            return Trajectory.from_conversation(conv, [*rewards, 0.0], False, 0, str(info.get("task_id", seed)),
                                                failure_termination(exc), state_keys=state_keys, error=repr(exc))
        rewards.append(float(reward))
        success = bool(info.get("success", False))
        if terminated or truncated:
            termination = "terminated" if terminated else "truncated"
            renderer.add_observation(conv, [], add_generation_prompt=False)
            break
        renderer.add_observation(conv, list(obs), add_generation_prompt=True)
        state_keys.append(info.get("state_key"))
    return Trajectory.from_conversation(conv, rewards, success, 0, str(info.get("task_id", seed)), termination,
                                        state_keys=state_keys)


def corpus_texts(env, seeds: range, player: str = "expert") -> list[str]:
    """Texts of scripted episodes (every message, and the chat template's tools block of each
    episode's ``info["tools"]``), to train a tokenizer on."""
    rng = np.random.default_rng(0)
    texts = []
    for split in ("train", "test"):
        for seed in seeds:
            try:
                obs, info = env.reset(seed=seed, options={"split": split})
                base = env.unwrapped  # (after the reset: a DeadlineEnv plays on a new env after a timeout)
                if info.get("tools"):
                    texts.append(tools_block(info["tools"]))
                texts.extend(m["content"] for m in obs)
                while True:
                    text = base.expert_action() if player == "expert" else base.weak_expert_action(rng)
                    texts.append(text)
                    obs, _, terminated, truncated, _ = env.step(text)
                    texts.extend(m["content"] for m in obs)
                    if terminated or truncated:
                        break
            except NotImplementedError:  # an env without this scripted player (an agent program): its opening texts
                pass
            except Exception as exc:  # a failing env costs this episode's texts from the failure on
                log.warning("env raised during a corpus episode (seed %d, %s): %r", seed, split, exc)
    return texts
