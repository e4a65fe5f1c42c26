"""ToyText: gymnasium's toy-text games as text games with named actions (via ``TextGymEnv``).

Description:
    ``ToyTextGame(game)`` turns a discrete gymnasium toy-text env into a gymnasium env with
    ``Text`` observations and actions; ``ToyTextEnv(game)`` wraps that in ``TextGymEnv``
    with the game's rules as the system prompt and a scripted expert. Games (``GAMES``):

    * ``FrozenLake-v1`` / ``FrozenLake8x8-v1`` (default ``is_slippery=False``): walk from S
      to G over frozen ice F without falling into a hole H. Moves ``left down right up``.
    * ``Taxi-v4``: pick a passenger up at one of the stops R, G, Y, B and drop them off at
      their destination. Actions ``south north east west pickup dropoff``.
    * ``CliffWalking-v1``: walk along a cliff C from the bottom-left corner to the goal G
      in the bottom-right; stepping on the cliff sends you back to the start. Moves
      ``up right down left``.
    * ``Blackjack-v1``: beat the dealer. Actions ``stick hit``.

    ``env_kwargs`` go to ``gymnasium.make(game, ...)`` (e.g. ``{"is_slippery": True}``,
    ``{"map_name": "8x8"}``, ``{"is_rainy": True}``); its time limit applies.

Action Space:
    ``Text`` of 1 to 32 characters from letters, digits, space and ``.,!-_'``. The action is
    the one action name among the reply's words (case-insensitive): ``"south"``,
    ``"Go south."``; a reply naming no action or several gets ``"Unknown action ...
    Reply with one of: ..."`` and the board again, without a move.

Observation Space:
    A text board, one character per cell, with ``@`` (FrozenLake, CliffWalking) or ``T``
    (Taxi) marking the player, then a status line (position; for Taxi where the passenger
    is and the destination). Blackjack: the player's cards and the dealer's shown card.
    After a step, a line on what happened comes first when something did (a wall, an
    illegal pickup, a hole, the cliff, the goal, the dealer's hand).

Rewards:
    ``reward="outcome"`` (default): 1.0 on the step that wins (FrozenLake and CliffWalking:
    reaching G; Taxi: the right dropoff; Blackjack: beating the dealer), 0.0 otherwise.
    ``reward="native"``: gymnasium's own rewards (Taxi -1 per step, +20, -10; ...).
    ``success`` is the win.

Episode End:
    The game's own termination (G or a hole; the dropoff; stick or bust) and time limit,
    or ``max_turns`` turns (``GameSpec.max_turns`` per game by default; invalid replies
    count).

Splits:
    Taxi and Blackjack: ``test`` iff ``crc32(initial observation) % 5 == 0`` (Taxi: 77 of
    its 300 start states). FrozenLake and CliffWalking have one start state, so one task:
    a single split (``splits == ("train",)``; a "test" reset plays the same task).
    ``task_id``: ``f"{game}-s{initial state}"`` where the dynamics are deterministic (the
    start state is the whole task), else seed-based; ``state_key``: the discrete state
    (Blackjack: ``(player sum, dealer card, usable ace)``).

Scripted players:
    The expert plays a policy from value iteration on ``env.unwrapped.P`` that maximises
    the probability of winning (discount ``GAMMA``; in the deterministic games this is a
    shortest path, which always wins); Blackjack's expert hits below 17 (below 18 with a
    usable ace). Random: a uniformly random action name. Weak: the expert's move with
    p=``WEAK_FOLLOW_PROB`` = 0.4, else random. Measured for ``turnrl/Taxi-v0`` (Taxi-v4,
    32 turns) with ``python -m turnrl baselines turnrl/Taxi-v0 --episodes 200``: test
    split random 0.01, weak 0.51, expert 1.00 (mean 12.8 turns; at most 18 over all
    300 start states); train split random 0.00, weak 0.38, expert 1.00.

Version History:
    v0: initial version (gymnasium 1.x ids).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium
import numpy as np
from gymnasium import spaces

from turnrl.envs.adapters.text_gym import TextGymEnv
from turnrl.envs.messages import TextSpace

__all__ = ["GAMES", "GAMMA", "GameSpec", "ToyTextEnv", "ToyTextGame", "win_policy"]

GAMMA = 0.99
WEAK_FOLLOW_PROB = 0.4
"""Probability that ``ToyTextEnv.weak_expert_action`` plays the expert's move."""
ACTION_CHARSET = string.ascii_letters + string.digits + " .,!-_'"
MAX_ACTION_CHARS = 32
TAXI_STOPS = "RGYB"
Reward = Literal["outcome", "native"]


@dataclass(frozen=True)
class GameSpec:
    """How one toy-text game reads as text.

    Attributes:
        actions: Action names, by the game's action index.
        rules: The system prompt.
        max_turns: Default turn limit of ``ToyTextEnv``.
        many_starts: Whether the game has many start states (then it has a test split).
        win_on_termination: Whether every termination is a win (else a win needs reward > 0).
        default_kwargs: ``gymnasium.make`` kwargs the game defaults to.
    """

    actions: tuple[str, ...]
    rules: str
    max_turns: int
    many_starts: bool
    win_on_termination: bool
    default_kwargs: Mapping[str, Any] = field(default_factory=dict)


_FROZEN_RULES = ("You cross a frozen lake on a grid. S is the start, F is frozen ice (safe), H is a hole "
                 "(falling in ends the game), G is the goal; @ marks you. Row 1 is the top row. Reach G. "
                 "Reply with one move: left, down, right or up.")
GAMES: Mapping[str, GameSpec] = {
    "FrozenLake-v1": GameSpec(("left", "down", "right", "up"), _FROZEN_RULES, 16, False, False,
                              {"is_slippery": False}),
    "FrozenLake8x8-v1": GameSpec(("left", "down", "right", "up"), _FROZEN_RULES, 40, False, False,
                                 {"is_slippery": False}),
    "Taxi-v4": GameSpec(
        ("south", "north", "east", "west", "pickup", "dropoff"),
        "You drive a taxi in a 5x5 city. On the map, | is a wall, : is an open border between cells, "
        "R, G, Y and B are the four stops and T is your taxi; row 1 is the top, column 1 the left. "
        "Drive to the passenger, pick them up, drive to their destination and drop them off. "
        "Reply with one action: south, north, east, west, pickup or dropoff.",
        32, True, True),
    "CliffWalking-v1": GameSpec(
        ("up", "right", "down", "left"),
        "You walk along a cliff on a 4x12 grid. o is safe ground, C is the cliff (stepping on it sends "
        "you back to the start), G is the goal; @ marks you. Row 1 is the top row. Reach G. "
        "Reply with one move: up, right, down or left.",
        24, False, True),
    "Blackjack-v1": GameSpec(
        ("stick", "hit"),
        "You play blackjack against the dealer. Cards count their value; J, Q and K count 10; an ace "
        "counts 1 or 11. Get closer to 21 than the dealer without going over. Reply with one action: "
        "hit (take a card) or stick (stop; the dealer then plays).",
        8, True, False),
}


def win_policy(P: Mapping[int, Mapping[int, list]], n_states: int, n_actions: int,
               is_win: Callable[[float, bool], bool], gamma: float = GAMMA, tol: float = 1e-12,
               max_iters: int = 100_000) -> np.ndarray:
    """Value iteration for the probability of winning, discounted by ``gamma`` per step.

    Args:
        P: The toy-text transition table ``P[s][a] = [(prob, next_state, reward, terminated), ...]``.
        n_states: Number of states.
        n_actions: Number of actions.
        is_win: ``is_win(reward, terminated)``: whether a transition wins.
        gamma: Discount; below 1 it prefers shorter wins (a shortest path when deterministic).

    Returns:
        The greedy action per state (int array of ``n_states``).
    """
    rows = [(s, a, p, s2, float(is_win(r, d)), float(bool(d))) for s in range(n_states)
            for a in range(n_actions) for p, s2, r, d in P[s][a]]
    S, A, prob, S2, win, done = (np.array(c) for c in zip(*rows))
    S, A, S2 = S.astype(int), A.astype(int), S2.astype(int)
    q = np.zeros((n_states, n_actions))
    for _ in range(max_iters):
        v = q.max(axis=1)
        new = np.zeros_like(q)
        np.add.at(new, (S, A), prob * (win + (1.0 - done) * (1.0 - win) * gamma * v[S2]))
        if np.max(np.abs(new - q)) < tol:
            q = new
            break
        q = new
    return q.argmax(axis=1)


class ToyTextGame(gymnasium.Env[str, str]):
    """A gymnasium toy-text game with ``Text`` observations and actions (see the module docstring).

    Args:
        game: A name in ``GAMES``.
        env_kwargs: Extra ``gymnasium.make`` kwargs (over the game's defaults).
        reward: ``"outcome"`` (1.0 for the win) or ``"native"`` (gymnasium's rewards).

    Raises:
        ValueError: On an unknown game or reward mode.
    """

    metadata = {"render_modes": []}

    def __init__(self, game: str = "Taxi-v4", env_kwargs: Mapping[str, Any] | None = None,
                 reward: Reward = "outcome") -> None:
        if game not in GAMES:
            raise ValueError(f"game must be one of {sorted(GAMES)}, got {game!r}")
        if reward not in ("outcome", "native"):
            raise ValueError(f"reward must be 'outcome' or 'native', got {reward!r}")
        self.game, self.game_spec = game, GAMES[game]
        self.env_kwargs = {**dict(self.game_spec.default_kwargs), **dict(env_kwargs or {})}
        self.reward_mode = reward
        self.inner = gymnasium.make(game, **self.env_kwargs)
        self.base = self.inner.unwrapped
        self.observation_space = TextSpace()
        self.action_space = spaces.Text(max_length=MAX_ACTION_CHARS, min_length=1, charset=ACTION_CHARSET)
        P = getattr(self.base, "P", None)
        self.deterministic = (P is not None and all(len(t) == 1 for acts in P.values() for t in acts.values())
                              and not self.env_kwargs.get("fickle_passenger", False))
        self._policy = None if P is None else win_policy(
            P, self.base.observation_space.n, self.base.action_space.n, self._is_win)
        self._state: Any = None
        self._start: Any = None

    @property
    def actions(self) -> tuple[str, ...]:
        """The action names, by the game's action index."""
        return self.game_spec.actions

    def _is_win(self, reward: float, terminated: bool) -> bool:
        return bool(terminated) and (self.game_spec.win_on_termination or float(reward) > 0)

    def parse_action(self, text: str) -> int | None:
        """The action index named in ``text`` (exactly one distinct name among its words), else None."""
        named = {w for w in re.findall(r"[a-z]+", text.lower()) if w in self.actions}
        return self.actions.index(named.pop()) if len(named) == 1 else None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        state, _ = self.inner.reset(seed=seed)
        self._state = self._start = _plain(state)
        info: dict[str, Any] = {"state_key": self._state}
        if self.deterministic:
            info["task_id"] = f"{self.game}-s{self._start}"
        return self.describe(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        index = self.parse_action(action)
        if index is None:
            note = f"Unknown action {action!r}. Reply with one of: {', '.join(self.actions)}."
            return self.describe(note), 0.0, False, False, {"state_key": self._state, "valid_action": False}
        before = self._state
        state, reward, terminated, truncated, _ = self.inner.step(index)
        self._state = _plain(state)
        win = self._is_win(reward, terminated)
        note = self._event(before, index, float(reward), bool(terminated), win)
        shown = float(win) if self.reward_mode == "outcome" else float(reward)
        info = {"state_key": self._state, "valid_action": True, "success": win}
        return self.describe(note), shown, bool(terminated), bool(truncated), info

    def close(self) -> None:
        self.inner.close()

    # ------------------------------------------------------------ rendering
    def describe(self, note: str = "") -> str:
        """The observation text of the current state, after an optional event line."""
        if self.game.startswith("FrozenLake"):
            body = self._grid_text([[c.decode() for c in row] for row in self.base.desc], self.base.ncol)
        elif self.game == "CliffWalking-v1":
            rows, cols = self.base.shape
            grid = [["o"] * cols for _ in range(rows)]
            grid[rows - 1][1:cols - 1] = ["C"] * (cols - 2)
            grid[rows - 1][cols - 1] = "G"
            body = self._grid_text(grid, cols)
        elif self.game == "Taxi-v4":
            body = self._taxi_text()
        else:
            body = self._blackjack_text()
        return f"{note}\n{body}" if note else body

    def _grid_text(self, grid: list[list[str]], cols: int) -> str:
        row, col = divmod(int(self._state), cols)
        grid = [list(r) for r in grid]
        grid[row][col] = "@"
        return "\n".join("".join(r) for r in grid) + f"\nYou are at row {row + 1}, column {col + 1}."

    def _taxi_text(self) -> str:
        taxi_row, taxi_col, passenger, destination = self.base.decode(self._state)
        grid = [[c.decode() for c in row] for row in self.base.desc]
        grid[1 + taxi_row][2 * taxi_col + 1] = "T"
        where = "in the taxi" if passenger == 4 else f"at {TAXI_STOPS[passenger]}"
        return ("\n".join("".join(r) for r in grid)
                + f"\nTaxi at row {taxi_row + 1}, column {taxi_col + 1}. Passenger {where}. "
                  f"Destination: {TAXI_STOPS[destination]}.")

    def _blackjack_text(self) -> str:
        total, shown, usable = self._state
        ace = " with a usable ace" if usable else ""
        return f"Your cards: {_cards(self.base.player)} (sum {total}{ace}). The dealer shows {_card(shown)}."

    def _event(self, before: Any, index: int, reward: float, terminated: bool, win: bool) -> str:
        name = self.actions[index]
        if self.game == "Blackjack-v1":
            if not terminated:
                return f"You hit and draw {_card(self.base.player[-1])}."
            if name == "hit":
                return "You hit and go bust: you lose."
            dealer = f"The dealer's cards: {_cards(self.base.dealer)}."
            return f"You stick. {dealer} " + ("You win." if win else "It is a draw." if reward == 0 else "You lose.")
        if win:
            return "You win: the passenger is delivered." if self.game == "Taxi-v4" else "You reached the goal."
        if terminated:
            return "You fell into a hole."
        if self.game == "CliffWalking-v1" and reward <= -100:
            return "You stepped on the cliff and are back at the start."
        if self.game == "Taxi-v4" and index >= 4 and before == self._state:
            return f"Illegal {name}."
        if before == self._state:
            return f"You cannot move {name}."
        return ""

    # -------------------------------------------------------------- players
    def expert_move(self) -> str:
        """The expert's action name for the current state (see the module docstring)."""
        if self._policy is not None:
            return self.actions[int(self._policy[int(self._state)])]
        total, _, usable = self._state
        return "hit" if total < (18 if usable else 17) else "stick"


class ToyTextEnv(TextGymEnv):
    """A toy-text game as a turnrl chat env: ``TextGymEnv(ToyTextGame(game))`` with the
    game's rules, splits and expert (see the module docstring).

    Args:
        game: A name in ``GAMES`` (default ``"Taxi-v4"``).
        env_kwargs: Extra ``gymnasium.make`` kwargs for the game.
        reward: ``"outcome"`` or ``"native"``.
        max_turns: Turn limit (default ``GameSpec.max_turns``).
        tool_parser: Parser name (no tools; calls get "unknown tool").
    """

    def __init__(self, game: str = "Taxi-v4", env_kwargs: Mapping[str, Any] | None = None,
                 reward: Reward = "outcome", *, max_turns: int | None = None, tool_parser: str = "hermes") -> None:
        inner = ToyTextGame(game, env_kwargs, reward)
        super().__init__(
            inner, system_prompt=inner.game_spec.rules,
            max_turns=inner.game_spec.max_turns if max_turns is None else max_turns,
            expert=lambda env, observation: env.expert_move(),
            random_player=lambda env, observation, rng: env.actions[int(rng.integers(len(env.actions)))],
            split_fn="auto" if inner.game_spec.many_starts else None, name=game, tool_parser=tool_parser,
        )

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """The expert's move with p=``WEAK_FOLLOW_PROB``, else a random action name.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        return self.expert_action() if rng.random() < WEAK_FOLLOW_PROB else self.random_action(rng)


def _plain(state: Any) -> Hashable:
    """A toy-text state as plain Python ints (Blackjack: a tuple of ints)."""
    return tuple(int(x) for x in state) if isinstance(state, tuple) else int(state)


def _card(value: int) -> str:
    return "A" if value == 1 else str(value)


def _cards(values: list[int]) -> str:
    return ", ".join(_card(v) for v in values)
