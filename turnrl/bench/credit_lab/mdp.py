"""Small multi-turn MDPs with known structure, for measuring credit assignment exactly.

A ``TabularMDP`` is a finite-horizon episodic MDP: ``S`` states, ``A`` actions, transition
probabilities ``P[s, a, s']``, a deterministic reward ``R[s, a, s']`` for each transition,
absorbing ``terminal`` states (entering one ends the episode) and a turn limit ``horizon``
(the episode is truncated after that many turns). Each task of a batch starts from one of
``starts`` (a GRPO group is the samples of one task). One turn is one action.

Builders (``MDPS``, looked up by name, every knob a keyword argument):

* ``corridor``: walk right from a start cell to the goal at the end; sparse outcome reward
  (1 at the goal) or shaped (``shaped=True``: +-1/length per cell of progress, the goal's 1
  on top); repeated states when the walk turns back; episodes end at the goal (ragged).
* ``key_door``: fetch a key at the left end, then open the door at the right end; the state
  is (cell, has key), so every cell is revisited; reward 1 only at the open door. With
  ``bare_door=x`` the door also opens without the key, ending the episode with the lesser
  reward ``x``: outcomes then take three values (0, ``x``, 1), not two.
* ``bandit_chain``: ``horizon`` turns, each in one of ``contexts`` random contexts with its
  own best arm; a reward every turn (dense), fixed episode length.

Every builder takes ``stop_prob``: at each turn the episode also ends with that probability
(a terminal sink, reward 0), so episode lengths vary (ragged) whatever the task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from turnrl.registry import Registry

MDPS: Registry[Callable[..., "TabularMDP"]] = Registry("credit-lab MDP")


@dataclass(frozen=True)
class TabularMDP:
    """A finite-horizon tabular MDP (see the module docstring).

    Attributes:
        name: what it is, with its knobs (for tables).
        P: ``[S, A, S]`` transition probabilities (rows sum to 1; terminal rows are ignored).
        R: ``[S, A, S]`` reward of each transition.
        terminal: ``[S]`` bool, absorbing states; entering one ends the episode.
        success: ``[S]`` bool, terminal states that count as a success.
        horizon: turn limit.
        starts: start state of each task.
        state_names: ``[S]`` printable names (the env's ``state_key``).
    """

    name: str
    P: np.ndarray
    R: np.ndarray
    terminal: np.ndarray
    success: np.ndarray
    horizon: int
    starts: tuple[int, ...]
    state_names: tuple[str, ...]

    def __post_init__(self):
        s, a, s2 = self.P.shape
        if s != s2 or self.R.shape != self.P.shape or self.terminal.shape != (s,) or self.success.shape != (s,):
            raise ValueError(f"{self.name}: inconsistent shapes P{self.P.shape} R{self.R.shape} "
                             f"terminal{self.terminal.shape} success{self.success.shape}")
        if not np.allclose(self.P.sum(axis=2), 1.0):
            raise ValueError(f"{self.name}: transition rows must sum to 1")
        if self.horizon < 1:
            raise ValueError(f"{self.name}: horizon must be >= 1, got {self.horizon}")
        if not self.starts or any(self.terminal[s0] for s0 in self.starts):
            raise ValueError(f"{self.name}: starts must be non-terminal states, got {self.starts}")

    @property
    def num_states(self) -> int:
        return self.P.shape[0]

    @property
    def num_actions(self) -> int:
        return self.P.shape[1]


def _with_stop(name: str, P: np.ndarray, R: np.ndarray, terminal: np.ndarray, success: np.ndarray,
               stop_prob: float) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Add a terminal sink reached with ``stop_prob`` from every transition (reward 0)."""
    if not 0.0 <= stop_prob < 1.0:
        raise ValueError(f"stop_prob must be in [0, 1), got {stop_prob}")
    if stop_prob == 0.0:
        return name, P, R, terminal, success
    s, a, _ = P.shape
    P2 = np.zeros((s + 1, a, s + 1))
    P2[:s, :, :s] = (1.0 - stop_prob) * P
    P2[:s, :, s] = stop_prob
    P2[s, :, s] = 1.0
    R2 = np.zeros((s + 1, a, s + 1))
    R2[:s, :, :s] = R
    return (f"{name} stop={stop_prob:g}", P2, R2, np.append(terminal, True), np.append(success, False))


@MDPS.register("corridor")
def corridor(length: int = 4, horizon: int = 8, slip: float = 0.1, shaped: bool = False, stop_prob: float = 0.0,
             num_starts: int = 2) -> TabularMDP:
    """Cells ``0..length``, actions left/right (a move goes the other way with ``slip``), goal
    at ``length`` (terminal, reward 1). Tasks start at cells ``0, 1, ...`` (``num_starts`` of
    them: tasks of different difficulty in one batch)."""
    if length < 1 or not 1 <= num_starts <= length:
        raise ValueError(f"corridor needs length >= 1 and 1 <= num_starts <= length, got {length}, {num_starts}")
    n = length + 1
    P, R = np.zeros((n, 2, n)), np.zeros((n, 2, n))
    for s in range(n):
        for a, step in ((0, -1), (1, 1)):
            for prob, move in ((1.0 - slip, step), (slip, -step)):
                s2 = min(max(s + move, 0), length)
                P[s, a, s2] += prob
                R[s, a, s2] = (1.0 if s2 == length else 0.0) + ((s2 - s) / length if shaped else 0.0)
    terminal = np.zeros(n, bool)
    terminal[length] = True
    name = f"corridor L={length} H={horizon}" + (" shaped" if shaped else "")
    name, P, R, terminal, success = _with_stop(name, P, R, terminal, terminal.copy(), stop_prob)
    names = tuple(f"cell{s}" for s in range(n)) + (("stopped",) if stop_prob else ())
    return TabularMDP(name, P, R, terminal, success, horizon, tuple(range(num_starts)), names)


@MDPS.register("key_door")
def key_door(length: int = 3, horizon: int = 12, slip: float = 0.0, shaped: bool = False, stop_prob: float = 0.0,
             bare_door: float | None = None) -> TabularMDP:
    """Cells ``0..length``; the key lies at cell 0, the door at ``length``. State = (cell, has
    key); reaching cell 0 takes the key; reaching the door with the key ends the episode with
    reward 1 (without it, the door is a wall cell like any other). Tasks start in the middle
    without the key, and at the door's side with it. ``shaped``: +0.5 for taking the key.
    ``bare_door``: reaching the door without the key ends the episode too, with this reward (a
    lesser exit, not a success): graded outcomes 0 (turn limit), ``bare_door`` and 1."""
    if length < 2:
        raise ValueError(f"key_door needs length >= 2, got {length}")
    cells = length + 1
    n = 2 * cells + 1 + (bare_door is not None)  # (cell, key) + the opened door (+ the door forced without the key)
    door = 2 * cells
    forced = door + 1

    def index(cell: int, key: int) -> int:
        return key * cells + cell

    P, R = np.zeros((n, 2, n)), np.zeros((n, 2, n))
    for key in (0, 1):
        for cell in range(cells):
            s = index(cell, key)
            for a, step in ((0, -1), (1, 1)):
                for prob, move in ((1.0 - slip, step), (slip, -step)):
                    c2 = min(max(cell + move, 0), length)
                    k2 = 1 if key or c2 == 0 else 0
                    s2 = index(c2, k2)
                    if c2 == length and (k2 or bare_door is not None):
                        s2 = door if k2 else forced
                    P[s, a, s2] += prob
                    R[s, a, s2] = ((1.0 if s2 == door else bare_door if s2 == forced else 0.0)
                                   + (0.5 if shaped and k2 and not key else 0.0))
    terminal = np.zeros(n, bool)
    terminal[door:] = True
    for end in range(door, n):
        P[end, :, end] = 1.0
    success = np.zeros(n, bool)
    success[door] = True
    name = (f"key_door L={length} H={horizon}" + (" shaped" if shaped else "")
            + (f" bare_door={bare_door:g}" if bare_door is not None else ""))
    name, P, R, terminal, success = _with_stop(name, P, R, terminal, success, stop_prob)
    names = tuple(f"cell{c}{'+key' if k else ''}" for k in (0, 1) for c in range(cells)) + ("open",)
    names += ("forced",) if bare_door is not None else ()
    names += ("stopped",) if stop_prob else ()
    return TabularMDP(name, P, R, terminal, success, horizon, (index(length // 2, 0), index(length - 1, 1)), names)


@MDPS.register("bandit_chain")
def bandit_chain(horizon: int = 8, contexts: int = 2, arms: int = 3, stop_prob: float = 0.0) -> TabularMDP:
    """``horizon`` turns; each turn's state is one of ``contexts`` contexts drawn uniformly
    (independently of the action); arm ``a`` in context ``c`` pays ``((a + c) % arms) /
    (arms - 1)``, so each context has its own best arm. A reward every turn; no terminal
    state but the optional stop sink. Tasks start in context 0 and in context 1."""
    if contexts < 2 or arms < 2:
        raise ValueError(f"bandit_chain needs contexts >= 2 and arms >= 2, got {contexts}, {arms}")
    P = np.full((contexts, arms, contexts), 1.0 / contexts)
    pay = np.array([[((a + c) % arms) / (arms - 1) for a in range(arms)] for c in range(contexts)])
    R = np.repeat(pay[:, :, None], contexts, axis=2)
    terminal = np.zeros(contexts, bool)
    name = f"bandit_chain H={horizon}"
    name, P, R, terminal, success = _with_stop(name, P, R, terminal, terminal.copy(), stop_prob)
    names = tuple(f"ctx{c}" for c in range(contexts)) + (("stopped",) if stop_prob else ())
    return TabularMDP(name, P, R, terminal, success, horizon, (0, 1), names)


def make_mdp(name: str, **kwargs) -> TabularMDP:
    """The MDP ``name`` of ``MDPS`` built with ``kwargs`` (a wrong keyword names the valid ones)."""
    builder = MDPS.get(name)
    try:
        return builder(**kwargs)
    except TypeError as err:
        import inspect

        raise TypeError(f"credit-lab MDP {name!r} takes {sorted(inspect.signature(builder).parameters)}, "
                        f"got {sorted(kwargs)}: {err}") from None
