"""Random-policy and scripted-expert success rates of an env, the numbers each env documents.

``python -m turnrl baselines [ENV_ID ...] --episodes 200`` prints a markdown table; env
docstrings quote the figures it measures. The random player is the env's
``random_action(rng)`` (a uniformly random well-formed action), the expert its
``expert_action()``; episode ``i`` uses reset seed ``i`` and player rng
``default_rng(10_000 + i)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

PLAYERS: tuple[str, ...] = ("random", "weak", "expert")
PLAYER_RNG_OFFSET = 10_000
MAX_EPISODE_STEPS = 1000


@dataclass(frozen=True)
class Baseline:
    """Success of one scripted player on one env split.

    Attributes:
        env_id: The gymnasium id.
        player: ``"random"``, ``"weak"`` or ``"expert"``.
        split: ``"train"`` or ``"test"``.
        episodes: Episodes played.
        success_rate: Fraction of episodes with ``info["success"]``; None when the env does
            not define the player.
        mean_turns: Mean assistant turns per episode (None when not played).
    """

    env_id: str
    player: str
    split: str
    episodes: int
    success_rate: float | None
    mean_turns: float | None


def play_episode(env: gymnasium.Env, seed: int, player: str, split: str = "test",
                 rng: np.random.Generator | None = None) -> tuple[bool, int]:
    """Play one episode with a scripted player; returns ``(success, turns)``.

    Raises:
        ValueError: On an unknown player name.
        NotImplementedError: When the env lacks the player's hook.
        RuntimeError: When the episode has not ended after ``MAX_EPISODE_STEPS`` steps.
    """
    if player not in PLAYERS:
        raise ValueError(f"player must be one of {PLAYERS}, got {player!r}")
    rng = rng if rng is not None else np.random.default_rng(PLAYER_RNG_OFFSET + seed)
    base = env.unwrapped
    env.reset(seed=seed, options={"split": split})
    for turn in range(1, MAX_EPISODE_STEPS + 1):
        if player == "expert":
            action = base.expert_action()
        elif player == "weak":
            action = base.weak_expert_action(rng)
        else:
            action = base.random_action(rng)
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return bool(info.get("success", False)), turn
    raise RuntimeError(f"episode of seed {seed} did not end within {MAX_EPISODE_STEPS} steps")


def measure(env_id: str, player: str, episodes: int = 200, split: str = "test",
            env_kwargs: Mapping[str, Any] | None = None) -> Baseline:
    """Success rate of ``player`` over reset seeds ``0..episodes-1`` of ``split``."""
    env = gymnasium.make(env_id, disable_env_checker=True, **dict(env_kwargs or {}))
    try:
        results = [play_episode(env, seed, player, split) for seed in range(episodes)]
    except NotImplementedError:
        return Baseline(env_id, player, split, episodes, None, None)
    finally:
        env.close()
    return Baseline(env_id, player, split, episodes, float(np.mean([s for s, _ in results])),
                    float(np.mean([t for _, t in results])))


def measure_all(env_ids: Iterable[str], episodes: int = 200, split: str = "test",
                players: Iterable[str] = PLAYERS) -> list[Baseline]:
    """``measure`` for every env id and player."""
    return [measure(env_id, player, episodes, split) for env_id in env_ids for player in players]


def format_table(rows: Iterable[Baseline]) -> str:
    """A markdown table: one line per env, a success (mean turns) column per player."""
    by_env: dict[str, dict[str, Baseline]] = {}
    for row in rows:
        by_env.setdefault(row.env_id, {})[row.player] = row
    players = [p for p in PLAYERS if any(p in r for r in by_env.values())]
    lines = ["| env | " + " | ".join(f"{p} success (turns)" for p in players) + " |",
             "|---|" + "---|" * len(players)]
    for env_id, cells in by_env.items():
        shown = []
        for p in players:
            b = cells.get(p)
            shown.append("n/a" if b is None or b.success_rate is None
                         else f"{b.success_rate:.2f} ({b.mean_turns:.1f})")
        lines.append(f"| {env_id} | " + " | ".join(shown) + " |")
    return "\n".join(lines)
