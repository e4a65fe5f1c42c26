"""The scripted household expert: a planner that searches like the agent must.

It is not omniscient: it knows what the agent has seen (``World.visited`` rooms, whose
receptacles were listed on entry, and ``World.explored`` receptacles, whose content was
shown) and, since only the agent moves things, where every seen object is now. It decides
each command from the current state alone, so it recovers from any detour:

1. Holding an object of the wrong kind: put it down here (opening the receptacle first),
   or go to the room's first receptacle.
2. Holding a goal object: for ``look``, go to the desklamp and use it; if the goal needs a
   state (clean/hot/cool) the object lacks, go to the nearest seen appliance and apply it;
   otherwise go to the nearest seen target receptacle, open it if closed, put the object.
3. Hands empty: take the nearest seen goal object that does not count yet (open its
   receptacle if it was closed again).
4. Anything needed but unseen: explore in a fixed order, the nearest unexplored receptacle
   of a visited room first (current room in listing order, then by doors), else walk
   towards the nearest unvisited room. Receptacle kinds are known once their room is
   visited, so appliances and targets only need rooms explored.

"Nearest" orders by doors away, then "already here", then listing order.
"""

from __future__ import annotations

from collections.abc import Iterable

from turnrl.envs.games.household.game import World
from turnrl.envs.games.household.layout import APPLIANCE, LAMP, LAMP_KINDS, STATE_VERB, Receptacle


def expert_command(w: World) -> str:
    """The expert's next command for the world ``w`` (always admissible)."""
    g, held = w.goal, w.held
    if held is not None and w.kind(held) != g.obj_kind:
        return _drop(w, held)
    if held is not None:
        if g.family == "look":
            if w.layout.lamp in w.explored:
                return _approach(w, w.recep(w.layout.lamp)) or f"use {LAMP}"
            return _explore(w, kinds=LAMP_KINDS)
        if g.state is not None and held not in w.states[g.state]:
            return _to_kind(w, APPLIANCE[g.state], f"{STATE_VERB[g.state]} {held} with {{}}")
        return _to_kind(w, g.target_kind, f"put {held} {{prep}} {{}}")
    seen = [o for o in w.goal_objects() if w.where[o] in w.explored and not w.counts_for_goal(o)]
    if seen:
        obj = min(seen, key=lambda o: _cost(w, w.recep(w.where[o])))
        r = w.recep(w.where[obj])
        return _approach(w, r) or _open_or(w, r, f"take {obj} from {r.name}")
    return _explore(w)


def _cost(w: World, r: Receptacle) -> tuple[int, int, int]:
    return (w.layout.distance(w.room, r.room), r.name != w.at, w.layout.receptacles.index(r))


def _approach(w: World, r: Receptacle) -> str | None:
    """The next move towards ``r``; None when already there."""
    if r.room != w.room:
        return f"go to {w.layout.next_hop(w.room, r.room)}"
    return None if w.at == r.name else f"go to {r.name}"


def _open_or(w: World, r: Receptacle, command: str) -> str:
    return f"open {r.name}" if not w.is_open(r.name) else command


def _to_kind(w: World, kind: str, template: str) -> str:
    """Go to the nearest seen receptacle of ``kind`` and run ``template`` there (``{}`` is the
    receptacle, ``{prep}`` its preposition); explore rooms when none is known yet."""
    known = [r for r in w.layout.receptacles if r.kind == kind and r.room in w.visited]
    if not known:
        return _explore_rooms(w)
    r = min(known, key=lambda r: _cost(w, r))
    command = template.format(r.name, prep=r.prep)
    if command.startswith("put "):
        return _approach(w, r) or _open_or(w, r, command)
    return _approach(w, r) or command


def _drop(w: World, held: str) -> str:
    if w.at is None:
        return f"go to {w.layout.in_room(w.room)[0].name}"
    r = w.recep(w.at)
    return _open_or(w, r, f"put {held} {r.prep} {r.name}")


def _explore(w: World, kinds: Iterable[str] | None = None) -> str:
    kinds = None if kinds is None else frozenset(kinds)
    todo = [r for r in w.layout.receptacles
            if r.room in w.visited and r.name not in w.explored and (kinds is None or r.kind in kinds)]
    if todo:
        r = min(todo, key=lambda r: _cost(w, r))
        return _approach(w, r) or f"open {r.name}"
    return _explore_rooms(w)


def _explore_rooms(w: World) -> str:
    unvisited = [room for room in w.layout.rooms if room not in w.visited]
    if not unvisited:
        raise RuntimeError(f"the household planner found nothing left to explore for goal {w.goal.text!r}; "
                           "the task generator must place every object the goal needs")
    room = min(unvisited, key=lambda room: (w.layout.distance(w.room, room), w.layout.rooms.index(room)))
    return f"go to {w.layout.next_hop(w.room, room)}"
