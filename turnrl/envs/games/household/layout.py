"""Household worlds as data: the catalogue of rooms, receptacles and objects, and the frozen
``Task`` (layout + initial placement + goal) that one episode plays.

Names follow ALFWorld: receptacles and objects are ``"<kind> <n>"`` (``"cabinet 2"``,
``"apple 1"``), numbered per kind across the whole house in creation order.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from types import MappingProxyType

# ------------------------------------------------------------------ catalogue
OPENABLE_KINDS = frozenset({"fridge", "microwave", "cabinet", "drawer", "safe"})
"""Receptacles that start closed and must be opened to see, take or put inside."""
IN_KINDS = OPENABLE_KINDS | {"sinkbasin", "bathtubbasin", "garbagecan"}
"""Receptacles one puts things *in* (the others are surfaces one puts things *on*)."""
LAMP_KINDS = frozenset({"desk", "sidetable"})
"""Surfaces that may hold the house's desklamp."""
LAMP = "desklamp 1"

ROOM_KINDS: MappingProxyType = MappingProxyType({
    # room: (receptacle kinds always present, kinds drawn as extras without replacement)
    "kitchen": (("fridge", "microwave", "sinkbasin", "countertop"),
                ("cabinet", "cabinet", "drawer", "drawer", "diningtable", "garbagecan", "shelf", "countertop")),
    "livingroom": (("sofa", "sidetable"),
                   ("coffeetable", "tvstand", "armchair", "drawer", "cabinet", "shelf", "garbagecan")),
    "bedroom": (("bed", "desk"), ("dresser", "sidetable", "drawer", "drawer", "shelf", "safe", "garbagecan")),
    "bathroom": (("sinkbasin", "toilet"), ("bathtubbasin", "cabinet", "countertop", "drawer", "garbagecan", "shelf")),
    "office": (("desk", "shelf"), ("drawer", "drawer", "cabinet", "armchair", "safe", "sidetable")),
})
ROOM_NAMES: tuple[str, ...] = tuple(ROOM_KINDS)

_FOOD = ("apple", "tomato", "potato", "egg", "lettuce", "bread")
_SMALL = ("book", "cellphone", "keychain", "pen", "pencil", "creditcard", "remotecontrol", "alarmclock", "cd",
          "statue", "vase")
OBJECT_KINDS: tuple[str, ...] = (
    *_FOOD, "mug", "cup", "plate", "bowl", "pan", "knife", "fork", "spoon", "spatula", "ladle", *_SMALL,
    "soapbar", "cloth", "dishsponge", "towel", "spraybottle", "toiletpaper", "candle", "pillow",
)
CLEANABLE = frozenset({*_FOOD, "mug", "cup", "plate", "bowl", "pan", "knife", "fork", "spoon", "spatula", "ladle",
                       "soapbar", "cloth", "dishsponge"})
HEATABLE = frozenset({*_FOOD, "mug", "cup", "plate"})
COOLABLE = frozenset({*_FOOD, "mug", "cup", "plate", "bowl", "pan"})
LOOKABLE = frozenset(_SMALL)

FAMILIES: tuple[str, ...] = ("pick", "clean", "heat", "cool", "look", "pick_two")
"""ALFWorld's task families: pick_and_place, pick_clean_then_place, pick_heat_then_place,
pick_cool_then_place, look_at_obj_in_light, pick_two_obj_and_place."""
FAMILY_STATE = MappingProxyType({"clean": "clean", "heat": "hot", "cool": "cool"})
"""The object state a family's goal asks for."""
APPLIANCE = MappingProxyType({"clean": "sinkbasin", "hot": "microwave", "cool": "fridge"})
"""The receptacle kind that gives an object each state."""
STATE_VERB = MappingProxyType({"clean": "clean", "hot": "heat", "cool": "cool"})
ELIGIBLE = MappingProxyType({
    "pick": frozenset(OBJECT_KINDS), "pick_two": frozenset(OBJECT_KINDS), "clean": CLEANABLE,
    "heat": HEATABLE, "cool": COOLABLE, "look": LOOKABLE,
})
"""Object kinds a family's goal may name."""

TEST_BUCKETS = 5
"""A task is in the test split when ``crc32(description) % TEST_BUCKETS == 0``."""


def article(word: str) -> str:
    """``"an apple"`` / ``"a mug"``."""
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def prep(kind: str) -> str:
    """The preposition of ``put X <prep> <kind>``: ``"in"`` or ``"on"``."""
    return "in" if kind in IN_KINDS else "on"


# ------------------------------------------------------------------ data
@dataclass(frozen=True)
class Receptacle:
    """A fixed piece of furniture or appliance that holds objects.

    Attributes:
        name: ``"<kind> <n>"``, unique in the house.
        kind: e.g. ``"cabinet"``.
        room: The room it stands in.
    """

    name: str
    kind: str
    room: str

    @property
    def openable(self) -> bool:
        return self.kind in OPENABLE_KINDS

    @property
    def prep(self) -> str:
        return prep(self.kind)


@dataclass(frozen=True)
class Goal:
    """What the agent must achieve.

    Attributes:
        family: One of ``FAMILIES``.
        obj_kind: The object kind the goal names (``"mug"``).
        target_kind: The receptacle kind to put it in/on (None for ``look``).
    """

    family: str
    obj_kind: str
    target_kind: str | None = None

    @property
    def count(self) -> int:
        """How many objects must end up in target receptacles."""
        return 2 if self.family == "pick_two" else 1

    @property
    def state(self) -> str | None:
        """The state (``"clean"``, ``"hot"``, ``"cool"``) the placed objects need, if any."""
        return FAMILY_STATE.get(self.family)

    @property
    def text(self) -> str:
        """ALFWorld's phrasing, e.g. ``"put a clean mug in cabinet"``."""
        obj, target = self.obj_kind, self.target_kind
        if self.family == "look":
            return f"look at {article(obj)} under the desklamp"
        if self.family == "pick_two":
            return f"find two {obj} and put them {prep(target)} {target}"
        adjective = {"clean": "clean ", "heat": "hot ", "cool": "cool "}.get(self.family, "")
        return f"put {article(adjective + obj)} {prep(target)} {target}"


@dataclass(frozen=True)
class Layout:
    """The fixed part of a house: rooms, doors, receptacles, objects and the desklamp.

    Attributes:
        rooms: Room names in generation order.
        doors: Undirected room pairs (the rooms form a tree).
        receptacles: All receptacles, grouped by room in room order.
        objects: ``(name, kind)`` of every movable object.
        lamp: The receptacle the desklamp stands on (None when the house has none).
    """

    rooms: tuple[str, ...]
    doors: tuple[tuple[str, str], ...]
    receptacles: tuple[Receptacle, ...]
    objects: tuple[tuple[str, str], ...]
    lamp: str | None
    _hops: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hops", _all_pairs_hops(self.rooms, self.doors))

    def neighbours(self, room: str) -> tuple[str, ...]:
        """Rooms a door leads to from ``room``, in door order."""
        return tuple(b if a == room else a for a, b in self.doors if room in (a, b))

    def in_room(self, room: str) -> tuple[Receptacle, ...]:
        """The receptacles of ``room`` in listing order."""
        return tuple(r for r in self.receptacles if r.room == room)

    def distance(self, a: str, b: str) -> int:
        """Doors between rooms ``a`` and ``b``."""
        return self._hops[a, b][0]

    def next_hop(self, a: str, b: str) -> str:
        """The neighbour of ``a`` on the path to ``b`` (``b != a``)."""
        return self._hops[a, b][1]


@dataclass(frozen=True)
class Task:
    """One episode's world: the layout, where each object starts, the start room and the goal."""

    layout: Layout
    placement: tuple[tuple[str, str], ...]
    start_room: str
    goal: Goal

    @property
    def description(self) -> str:
        """A canonical text of the goal and the whole layout (what the split hash covers)."""
        lay = self.layout
        rooms = "; ".join(f"{room}: {', '.join(r.name for r in lay.in_room(room))}" for room in lay.rooms)
        doors = ", ".join(f"{a}-{b}" for a, b in lay.doors)
        placed = ", ".join(f"{o}@{r}" for o, r in self.placement)
        return (f"goal: {self.goal.text} | start: {self.start_room} | rooms: {rooms} | doors: {doors} | "
                f"lamp: {lay.lamp} | objects: {placed}")

    @property
    def split(self) -> str:
        return "test" if zlib.crc32(self.description.encode()) % TEST_BUCKETS == 0 else "train"

    @property
    def task_id(self) -> str:
        """``"<goal text> #<12 hex digits of sha1(description)>"``."""
        digest = hashlib.sha1(self.description.encode()).hexdigest()[:12]
        return f"{self.goal.text} #{digest}"


def _all_pairs_hops(rooms: tuple[str, ...], doors: tuple[tuple[str, str], ...]) -> dict:
    """``{(a, b): (distance, next hop from a)}`` by breadth-first search (ties: door order)."""
    adjacent: dict[str, list[str]] = {r: [] for r in rooms}
    for a, b in doors:
        adjacent[a].append(b)
        adjacent[b].append(a)
    hops = {}
    for start in rooms:
        hops[start, start] = (0, start)
        frontier = [(n, n) for n in adjacent[start]]
        depth = 1
        while frontier:
            nxt = []
            for room, first in frontier:
                if (start, room) in hops:
                    continue
                hops[start, room] = (depth, first)
                nxt.extend((n, first) for n in adjacent[room] if (start, n) not in hops)
            frontier, depth = nxt, depth + 1
    return hops
