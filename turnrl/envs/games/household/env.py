"""Household: long-horizon household chores in a procedurally generated house, after ALFWorld.

Description:
    A house of a few rooms (always a kitchen, plus livingroom, bedroom, bathroom or office)
    joined by doors; each room has receptacles (``fridge 1``, ``cabinet 2``, ``countertop
    1``, ``sinkbasin 1``, ``microwave 1``, ``desk 1``, ...; fridges, microwaves, cabinets,
    drawers and safes start closed) holding objects (``apple 1``, ``mug 2``, ...). The goal
    is one of ALFWorld's six task families: pick-and-place (``put a mug in cabinet``),
    clean-and-place (``put a clean knife on countertop``: clean it at a sinkbasin),
    heat-and-place (microwave), cool-and-place (fridge), look-at-under-light (``look at a
    book under the desklamp``: hold it at the desklamp and use the lamp) and pick-two
    (``find two cd and put them in shelf``). Goals name kinds: any mug, any cabinet.
    The agent carries at most one object. Generation is in ``household.generate``.

Action Space:
    The assistant's text; its first non-empty line is the command, matched case- and
    space-insensitively (a leading ``>``, quotes and a final ``.`` are ignored):
    ``go to <room>`` / ``go to <receptacle>``, ``open X``, ``close X``, ``take <obj> from
    <recep>``, ``put <obj> in/on <recep>`` (``in``, ``on`` or ``in/on``), ``clean <obj>
    with sinkbasin N``, ``heat <obj> with microwave N``, ``cool <obj> with fridge N``,
    ``use desklamp 1``, ``look``, ``inventory``, ``examine X``. ``go to <receptacle>`` works
    for receptacles of the current room, ``go to <room>`` for rooms a door leads to.

Observation Space:
    The prompt: a system message with the rules and the command forms, and a user message
    with the room description (``You are in the kitchen. Looking around, you see a fridge
    1, ... Doors lead to the bedroom.``) and ``Your task is to: <goal>.``. Each turn: one
    user message with the feedback, in ALFWorld's words (``You arrive at the cabinet 1. The
    cabinet 1 is closed.``, ``You open the fridge 1. The fridge 1 is open. In it, you see an
    apple 1.``, ``You pick up the mug 1 from the countertop 1.``). Observation is partial:
    only the current place is described, closed containers hide their content. An
    inadmissible command (unknown, or illegal now) gets ``Nothing happens.`` and changes
    nothing. With ``admissible_hints=True`` (the default, as in ALFWorld-based agent work)
    every user message ends with ``Admissible commands: <c1>, <c2>, ...``; without hints,
    ``Nothing happens.`` is followed by a reminder of the command forms.

Rewards:
    1.0 on the turn the goal holds (the outcome), 0.0 otherwise.

Episode End:
    Terminated when the goal holds (success); truncated after ``max_turns`` turns
    (default 50). Every task's expert solution takes ``[min_expert_steps,
    max_expert_steps]`` commands (default 8..30, mean about 15).

Splits:
    A task (goal + layout + start room + placement) is ``test`` when
    ``crc32(Task.description) % 5 == 0``, else ``train``; tasks are drawn by rejection.
    ``task_id`` is ``"<goal text> #<12 hex digits of sha1(description)>"``. ``state_key``
    is the world state: room, receptacle the agent stands at, held object, every object's
    receptacle, open receptacles, which objects are clean/hot/cool, and the lamp (not the
    turn, nor what the agent has seen so far).

Scripted players:
    ``expert_action`` is the searching planner of ``household.planner``: it uses only what
    the agent has seen (explores receptacles in a fixed nearest-first order) and replans
    from the current state, so it solves every task from any detour. ``random_action`` is
    uniform over the admissible commands. ``weak_expert_action`` plays a uniformly random
    admissible command with p=0.75, else the expert's (the expert recovers from detours so
    well that a lower p stays near 1.0: p=0.45 gives 0.96). Measured by ``python -m turnrl
    baselines turnrl/Household-v0 --episodes 200`` (test split), success (mean turns):
    random 0.01 (49.8), weak 0.39 (43.6), expert 1.00 (14.4); over 3000 seeds per split the
    expert solved every task in 8..30 turns (mean 15.3). Speed on a shared 2-core CPU: about
    4 ms per expert episode (reset ~2 ms including redraws, ~0.12 ms per step).

Version History:
    v0: initial version.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.games.household.game import NOTHING_HAPPENS, World
from turnrl.envs.games.household.generate import HouseConfig, generate_task
from turnrl.envs.games.household.layout import FAMILIES, Task
from turnrl.envs.games.household.planner import expert_command
from turnrl.tools import ParseResult, ToolResult

DEFAULT_MAX_EXPERT_STEPS = 30
WEAK_RANDOM_PROB = 0.75
"""Probability that ``weak_expert_action`` plays a random admissible command."""
DONE = "You have completed the task."
SYSTEM_PROMPT = (
    "You are a household robot in a house of several rooms. Each turn, reply with exactly one "
    "command, one of:\n"
    "go to <room> | go to <receptacle> | open <receptacle> | close <receptacle> | "
    "take <object> from <receptacle> | put <object> in/on <receptacle> | "
    "clean <object> with <sinkbasin> | heat <object> with <microwave> | cool <object> with <fridge> | "
    "use <desklamp> | examine <something> | look | inventory\n"
    "Use the names you are shown, e.g. go to cabinet 1, take apple 1 from countertop 1. You can carry "
    "one object at a time. Closed receptacles must be opened to see or reach what is inside."
)
FORMAT_HINT = (
    "Reply with one command such as: go to countertop 1, open fridge 1, take apple 1 from countertop 1, "
    "put apple 1 in fridge 1, look."
)


class HouseholdEnv(MultiTurnEnv):
    """ALFWorld-style household tasks over many turns (see the module docstring).

    Args:
        rooms: ``(low, high)`` number of rooms (1..5).
        receptacles: ``(low, high)`` extra receptacles per room beyond its fixed ones.
        distractors: ``(low, high)`` objects of non-goal kinds.
        families: Task families to draw (subset of ``FAMILIES``).
        admissible_hints: End every observation with the list of admissible commands.
        min_expert_steps: Redraw tasks the expert solves in fewer commands.
        max_expert_steps: Redraw tasks the expert needs more commands for; None means 30.
            Set explicitly, it must be <= ``max_turns``. With the default and a ``max_turns``
            below 30 (short smoke runs) the expert no longer finishes every task.
        max_turns: Turn limit (default 50).
        tool_parser: Parser name (the env has no tools; calls get "unknown tool").
    """

    default_max_turns = 50

    def __init__(
        self,
        rooms: Sequence[int] = (2, 3),
        receptacles: Sequence[int] = (1, 3),
        distractors: Sequence[int] = (4, 8),
        families: Sequence[str] = FAMILIES,
        admissible_hints: bool = True,
        min_expert_steps: int = 8,
        max_expert_steps: int | None = None,
        *,
        max_turns: int | None = None,
        tool_parser: str = "hermes",
    ) -> None:
        if isinstance(families, str):
            raise ValueError(f"families must be a list of family names from {FAMILIES}, got the string {families!r}")
        longest = DEFAULT_MAX_EXPERT_STEPS if max_expert_steps is None else int(max_expert_steps)
        self.config = HouseConfig(tuple(rooms), tuple(receptacles), tuple(distractors), tuple(families),
                                  int(min_expert_steps), longest)
        if not isinstance(admissible_hints, bool):
            raise ValueError(f"admissible_hints must be a bool, got {admissible_hints!r}")
        self.admissible_hints = admissible_hints
        super().__init__(tool_parser=tool_parser, max_turns=max_turns)
        if max_expert_steps is not None and self.config.max_expert_steps > self.max_turns:
            raise ValueError(f"max_expert_steps ({self.config.max_expert_steps}) must be <= max_turns "
                             f"({self.max_turns}), or the expert could not finish every task")
        self.world: World | None = None

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> Task:
        return generate_task(rng, split, self.config)

    def _task_id(self, task: Task) -> str:
        return task.task_id

    def _start_episode(self, task: Task) -> list[Message]:
        self.world = World(task)
        intro = f"{self.world.room_text()}\n\nYour task is to: {task.goal.text}."
        return [{"role": "system", "content": SYSTEM_PROMPT}, _user(self._with_hints(intro))]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        feedback = self.world.execute(action)
        if feedback is None:
            text = NOTHING_HAPPENS if self.admissible_hints else f"{NOTHING_HAPPENS} {FORMAT_HINT}"
            return TurnOutcome(messages=(_user(self._with_hints(text)),))
        if self.world.goal_met():
            return TurnOutcome(messages=(_user(f"{feedback} {DONE}"),), reward=1.0, terminated=True, success=True)
        return TurnOutcome(messages=(_user(self._with_hints(feedback)),))

    def _state_key(self) -> Hashable:
        return self.world.state_key()

    def _with_hints(self, text: str) -> str:
        if not self.admissible_hints:
            return text
        return f"{text}\n\nAdmissible commands: {', '.join(self.world.admissible())}"

    # --------------------------------------------------------------- players
    def admissible_commands(self) -> list[str]:
        """The commands legal in the current state, in a fixed order."""
        self._require_active("admissible_commands()")
        return self.world.admissible()

    def expert_action(self) -> str:
        """The searching planner's next command (``household.planner``)."""
        self._require_active("expert_action()")
        return expert_command(self.world)

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random admissible command."""
        commands = self.admissible_commands()
        return commands[int(rng.integers(len(commands)))]

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A random admissible command with p=``WEAK_RANDOM_PROB``, else the expert's.

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        return self.random_action(rng) if rng.random() < WEAK_RANDOM_PROB else self.expert_action()


def _user(content: str) -> Message:
    return {"role": "user", "content": content}
