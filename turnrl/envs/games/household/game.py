"""``World``: the mutable state of one household episode, its rules and its text.

The agent stands in a room, either in the middle of it or at one of its receptacles, and
holds at most one object. It sees only where it is: entering a room lists the room's
receptacles and doors; arriving at a receptacle shows what is on it, or in it when it is
open (closed containers hide their content until opened).

Commands (canonical, lower case; ``admissible()`` lists the ones legal now, in a fixed
order): ``look``, ``inventory``, ``go to <room>`` (a neighbouring room), ``go to
<receptacle>`` (one in this room), ``open/close <receptacle>``, ``take <obj> from <recep>``,
``put <obj> in|on <recep>``, ``clean <obj> with sinkbasin N``, ``heat <obj> with microwave N``,
``cool <obj> with fridge N``, ``use desklamp 1``, ``examine <receptacle|held obj>``.
``put`` also accepts either preposition and ALFWorld's ``in/on``.
"""

from __future__ import annotations

import re
from collections.abc import Hashable

from turnrl.envs.games.household.layout import (
    APPLIANCE,
    CLEANABLE,
    COOLABLE,
    HEATABLE,
    LAMP,
    STATE_VERB,
    Receptacle,
    Task,
    article,
)

NOTHING_HAPPENS = "Nothing happens."
_PUT = re.compile(r"^put (.+?) (?:in/on|in|on) (.+)$")
_SPACES = re.compile(r"\s+")
_STATE_OK = {"clean": CLEANABLE, "hot": HEATABLE, "cool": COOLABLE}


def normalize(text: str) -> str:
    """The canonical form of a typed command: first non-empty line, lower case, single
    spaces, without a leading ``>`` or surrounding quotes and trailing ``.``; ``put``'s
    preposition becomes ``in`` (the admissible list is matched preposition-blind)."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = _SPACES.sub(" ", line.strip().lower()).lstrip("> ").strip().strip("`'\"").rstrip(".!").strip()
    m = _PUT.match(line)
    return f"put {m.group(1)} in {m.group(2)}" if m else line


def _listing(names: list[str]) -> str:
    """``"a mug 1, an apple 2 and a knife 1"`` (``"nothing"`` when empty)."""
    if not names:
        return "nothing"
    items = [article(n) for n in names]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _rooms(names: tuple[str, ...]) -> str:
    items = [f"the {n}" for n in names]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class World:
    """One episode's state; ``execute(command)`` applies a command and returns the feedback.

    Besides the world itself it tracks what the agent has seen (``visited`` rooms,
    ``explored`` receptacles whose content it saw): only the scripted planner uses that.
    """

    def __init__(self, task: Task) -> None:
        self.task, self.layout, self.goal = task, task.layout, task.goal
        self._recep = {r.name: r for r in self.layout.receptacles}
        self._kind = dict(self.layout.objects)
        self._order = {name: i for i, (name, _) in enumerate(self.layout.objects)}
        self.room: str = task.start_room
        self.at: str | None = None
        self.held: str | None = None
        self.where: dict[str, str] = dict(task.placement)
        self.opened: set[str] = set()
        self.states: dict[str, set[str]] = {"clean": set(), "hot": set(), "cool": set()}
        self.lamp_on = False
        self.visited: set[str] = {self.room}
        self.explored: set[str] = set()

    # ------------------------------------------------------------ queries
    def recep(self, name: str) -> Receptacle:
        return self._recep[name]

    def kind(self, obj: str) -> str:
        return self._kind[obj]

    def is_open(self, name: str) -> bool:
        """Whether a receptacle's content can be seen and reached (surfaces always)."""
        return not self._recep[name].openable or name in self.opened

    def contents(self, name: str) -> list[str]:
        """Objects in/on a receptacle, in layout order (the desklamp last, on its surface)."""
        objs = sorted((o for o, r in self.where.items() if r == name), key=self._order.__getitem__)
        return objs + ([LAMP] if name == self.layout.lamp else [])

    def goal_objects(self) -> list[str]:
        """Objects of the goal's kind, in layout order."""
        return [o for o, k in self.layout.objects if k == self.goal.obj_kind]

    def counts_for_goal(self, obj: str) -> bool:
        """Whether ``obj`` already sits in a target receptacle with the required state."""
        g = self.goal
        r = self.where.get(obj)
        return (g.target_kind is not None and r is not None and self._recep[r].kind == g.target_kind
                and (g.state is None or obj in self.states[g.state]))

    def goal_met(self) -> bool:
        """Whether the goal holds now."""
        g = self.goal
        if g.family == "look":
            return (self.held is not None and self.kind(self.held) == g.obj_kind and self.lamp_on
                    and self.at == self.layout.lamp)
        return sum(self.counts_for_goal(o) for o in self.goal_objects()) >= g.count

    def state_key(self) -> Hashable:
        """The world state: place, held object, every object's receptacle, open receptacles,
        object states and the lamp (not what the agent has seen)."""
        return (
            self.room, self.at, self.held,
            tuple(self.where.get(o, "") for o, _ in self.layout.objects),
            tuple(sorted(self.opened)),
            tuple(tuple(sorted(self.states[s])) for s in ("clean", "hot", "cool")),
            self.lamp_on,
        )

    # --------------------------------------------------------- admissible
    def admissible(self) -> list[str]:
        """The commands legal now, in a fixed order (the random player draws from these)."""
        cmds = ["look", "inventory"]
        cmds += [f"go to {n}" for n in self.layout.neighbours(self.room)]
        cmds += [f"go to {r.name}" for r in self.layout.in_room(self.room) if r.name != self.at]
        here, held = self.at, self.held
        if here is not None:
            r = self._recep[here]
            if r.openable:
                cmds.append(f"close {here}" if here in self.opened else f"open {here}")
            if self.is_open(here):
                if held is None:
                    cmds += [f"take {o} from {here}" for o in self.contents(here) if o != LAMP]
                else:
                    cmds.append(f"put {held} {r.prep} {here}")
            if held is not None:
                for state, kind in APPLIANCE.items():
                    if r.kind == kind and self.kind(held) in _STATE_OK[state]:
                        cmds.append(f"{STATE_VERB[state]} {held} with {here}")
            if here == self.layout.lamp:
                cmds.append(f"use {LAMP}")
            cmds.append(f"examine {here}")
        if held is not None:
            cmds.append(f"examine {held}")
        return cmds

    # ------------------------------------------------------------ execute
    def execute(self, command: str) -> str | None:
        """Apply a command (any text; see ``normalize``); the feedback, or None when it is
        not admissible now (the state is then unchanged)."""
        cmd = normalize(command)
        legal = {normalize(c): c for c in self.admissible()}
        if cmd not in legal:
            return None
        cmd = legal[cmd]
        verb, _, rest = cmd.partition(" ")
        if cmd == "look":
            return self._look()
        if cmd == "inventory":
            return f"You are carrying: {article(self.held)}." if self.held else "You are not carrying anything."
        if verb == "go":
            return self._go(rest.removeprefix("to "))
        if verb in ("open", "close"):
            (self.opened.add if verb == "open" else self.opened.discard)(rest)
            if verb == "close":
                return f"You close the {rest}."
            self.explored.add(rest)
            return f"You open the {rest}. {self._content_text(rest)}"
        if verb == "take":
            obj, _, recep = rest.partition(" from ")
            del self.where[obj]
            self.held = obj
            return f"You pick up the {obj} from the {recep}."
        if verb == "put":
            m = _PUT.match(cmd)
            obj, recep = m.group(1), m.group(2)
            self.where[obj], self.held = recep, None
            return f"You put the {obj} {self._recep[recep].prep} the {recep}."
        if verb in ("clean", "heat", "cool"):
            obj, _, recep = rest.partition(" with ")
            state = {"clean": "clean", "heat": "hot", "cool": "cool"}[verb]
            self.states[state].add(obj)
            if state in ("hot", "cool"):
                self.states["cool" if state == "hot" else "hot"].discard(obj)
            return f"You {verb} the {obj} using the {recep}."
        if verb == "use":
            if self.lamp_on:
                return f"The {LAMP} is already on."
            self.lamp_on = True
            return f"You turn on the {LAMP}."
        if verb == "examine":
            if rest == self.held:
                states = [s for s in ("clean", "hot", "cool") if rest in self.states[s]]
                return f"This is {article(' and '.join(states) + ' ' + rest if states else rest)}."
            return self._content_text(rest)
        raise AssertionError(f"unhandled admissible command {cmd!r}")  # pragma: no cover

    # ------------------------------------------------------------- text
    def room_text(self) -> str:
        """What one sees on entering (or looking around) the current room."""
        receps = [r.name for r in self.layout.in_room(self.room)]
        doors = self.layout.neighbours(self.room)
        door_text = f"Doors lead to {_rooms(doors)}." if doors else "There are no doors to other rooms."
        return f"You are in the {self.room}. Looking around, you see {_listing(receps)}. {door_text}"

    def _content_text(self, name: str) -> str:
        """The content shown at receptacle ``name``; showing it marks it ``explored``."""
        if not self.is_open(name):
            return f"The {name} is closed."
        self.explored.add(name)
        items = _listing(self.contents(name))
        if self._recep[name].openable:
            return f"The {name} is open. In it, you see {items}."
        return f"{'In' if self._recep[name].prep == 'in' else 'On'} the {name}, you see {items}."

    def _look(self) -> str:
        if self.at is None:
            return self.room_text()
        return f"You are at the {self.at} in the {self.room}. {self._content_text(self.at)}"

    def _go(self, place: str) -> str:
        if place in self._recep:
            self.at = place
            return f"You arrive at the {place}. {self._content_text(place)}"
        self.room, self.at = place, None
        self.visited.add(place)
        return self.room_text()
