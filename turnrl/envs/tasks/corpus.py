"""A fictional world and its encyclopedia, generated deterministically in code.

``build_world(seed)`` draws countries, cities, people, companies, rivers and inventions
with their facts (born in, lies in, founded by, flows through, ...) from
``numpy.random.default_rng(seed)`` and writes one short encyclopedia document per entity.
The result is cached per seed, so building it costs once per process (a few ms).

Facts are functional relations (``RELATIONS``): each entity has at most one value per
relation, so a chain of relations from an entity has exactly one answer. Relation values
are entity titles, except the leaf relations (``target is None``: years, languages) whose
values are plain strings. Every fact of an entity is stated in that entity's own document;
documents also mention the reverse links (a city lists the people born there), which
makes search results realistically noisy.

Every document's first sentence (its search snippet, ``Entity.snippet``) names the entity
and its kind but no relation value, so following a chain needs ``open``.

The default world (``CORPUS_SEED``) is part of ``turnrl/RetrievalQA-v0``: changing the
generator changes the tasks and needs a new env version.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from turnrl.tools.bm25 import BM25Index

__all__ = ["CORPUS_SEED", "KINDS", "RELATIONS", "Entity", "Relation", "World", "build_world", "normalize_title"]

CORPUS_SEED = 2024
KINDS: tuple[str, ...] = ("country", "city", "person", "company", "river", "invention")
SIZES = MappingProxyType({"country": 10, "city": 50, "person": 150, "company": 50, "river": 12, "invention": 40})
CITIES_PER_RIVER = 3

ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st",
          "th", "sh", "gl", "pr", "sk")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou", "ia")
CODAS = ("", "", "n", "r", "s", "l", "x", "k", "m", "th", "nd", "st")
COUNTRY_ENDINGS = ("ia", "land", "mark", "ora", "istan")
LANGUAGE_ENDINGS = ("an", "ish", "ese", "ic")
COMPANY_ENDINGS = ("ix", "on", "ex", "ara", "ium", "ent", "co", "tek")
DEVICES = ("Loom", "Engine", "Lamp", "Press", "Dynamo", "Valve", "Compass", "Telegraph", "Kiln", "Pump", "Lens",
           "Turbine")
OCCUPATIONS = ("engineer", "chemist", "merchant", "architect", "painter", "physician", "banker", "astronomer",
               "sculptor", "shipwright", "botanist", "composer")
INDUSTRIES = ("shipping", "textile", "steel", "railway", "chemical", "banking", "publishing", "optics", "brewing",
              "mining")
DEVICE_KINDS = ("mechanical", "electrical", "optical", "hydraulic", "steam-powered")


@dataclass(frozen=True)
class Relation:
    """A functional relation between entities, with the phrases questions are built from.

    Attributes:
        name: The relation's key in ``Entity.facts``.
        source: The kind of entity that has the fact.
        target: The kind of the value's entity; None for a leaf value (a year, a language).
        noun_phrase: ``"the founder of {x}"``: names the value of ``x`` inside a longer
            question (None for leaves, which only end a chain).
        question: ``"Who founded {x}?"``: asks for the value of ``x``.
    """

    name: str
    source: str
    target: str | None
    noun_phrase: str | None
    question: str


RELATIONS = MappingProxyType({r.name: r for r in (
    Relation("founder", "company", "person", "the founder of {x}", "Who founded {x}?"),
    Relation("headquarters", "company", "city", "the city where {x} has its headquarters",
             "In which city does {x} have its headquarters?"),
    Relation("founded", "company", None, None, "In which year was {x} founded?"),
    Relation("birthplace", "person", "city", "the birthplace of {x}", "In which city was {x} born?"),
    Relation("employer", "person", "company", "the employer of {x}", "Which company does {x} work for?"),
    Relation("birth_year", "person", None, None, "In which year was {x} born?"),
    Relation("country", "city", "country", "the country in which {x} lies", "In which country does {x} lie?"),
    Relation("river", "city", "river", "the river that flows through {x}", "Which river flows through {x}?"),
    Relation("capital", "country", "city", "the capital of {x}", "What is the capital of {x}?"),
    Relation("language", "country", None, None, "What is the official language of {x}?"),
    Relation("inventor", "invention", "person", "the inventor of {x}", "Who invented {x}?"),
    Relation("maker", "invention", "company", "the company that manufactures {x}",
             "Which company manufactures {x}?"),
    Relation("mouth", "river", "city", "the city where {x} reaches the sea",
             "At which city does {x} reach the sea?"),
)})
"""Every relation by name; ``Entity.facts`` keys are names from here."""


@dataclass(frozen=True)
class Entity:
    """One thing in the world and its encyclopedia document.

    Attributes:
        kind: One of ``KINDS``.
        title: The unique document title, e.g. ``"Orun River"``.
        mention: How a question names it, e.g. ``"the Orun River"``.
        facts: Relation name -> value (an entity title, or a string for leaf relations).
        text: The document text (its first sentence is the snippet).
        aliases: Other accepted spellings of the title as an answer (e.g. ``"Orun"``).
    """

    kind: str
    title: str
    mention: str
    facts: MappingProxyType = field(hash=False)
    text: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def snippet(self) -> str:
        """The document's first sentence."""
        end = self.text.find(". ")
        return self.text if end < 0 else self.text[: end + 1]


@dataclass(frozen=True)
class World:
    """The generated entities, their documents and a BM25 index over them.

    Attributes:
        seed: The generator seed.
        entities: Every entity, documents in index order (``index`` document ``i`` is
            ``entities[i]``: its title and text).
        index: BM25 over ``title + text`` of each entity.
    """

    seed: int
    entities: tuple[Entity, ...]
    index: BM25Index = field(repr=False, compare=False)
    _by_title: MappingProxyType = field(repr=False, compare=False)

    @property
    def titles(self) -> tuple[str, ...]:
        """All document titles, in index order."""
        return tuple(e.title for e in self.entities)

    def get(self, title: str) -> Entity | None:
        """The entity titled ``title`` (case and spacing are ignored), or None."""
        return self._by_title.get(normalize_title(title))

    def of_kind(self, kind: str) -> tuple[Entity, ...]:
        """The entities of one kind, in index order."""
        return tuple(e for e in self.entities if e.kind == kind)


def normalize_title(title: str) -> str:
    """Lowercase, with runs of whitespace made one space and the ends stripped."""
    return " ".join(title.lower().split())


@functools.lru_cache(maxsize=8)
def build_world(seed: int = CORPUS_SEED) -> World:
    """Generate the world for ``seed`` (cached: the same object for the same seed).

    Raises:
        ValueError: If ``seed`` is not a non-negative int.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    rng = np.random.default_rng(seed)
    names = _Names(rng)
    facts: dict[str, dict[str, dict[str, str]]] = {kind: {} for kind in KINDS}

    stems = [names.word(2) for _ in range(SIZES["country"])]
    countries = [s + COUNTRY_ENDINGS[int(rng.integers(len(COUNTRY_ENDINGS)))] for s in stems]
    cities = [names.word(2) for _ in range(SIZES["city"])]
    city_country = _assign_evenly(rng, cities, countries)
    for stem, country in zip(stems, countries):
        own = [c for c in cities if city_country[c] == country]
        language = stem.capitalize() + LANGUAGE_ENDINGS[int(rng.integers(len(LANGUAGE_ENDINGS)))]
        facts["country"][country] = {"capital": own[0], "language": language}
    for city in cities:
        facts["city"][city] = {"country": city_country[city]}

    rivers = [names.word(2) + " River" for _ in range(SIZES["river"])]
    river_cities: dict[str, list[str]] = {}
    shuffled = [cities[int(i)] for i in rng.permutation(len(cities))]
    for i, river in enumerate(rivers):
        river_cities[river] = shuffled[i * CITIES_PER_RIVER:(i + 1) * CITIES_PER_RIVER]
        for city in river_cities[river]:
            facts["city"][city]["river"] = river
        facts["river"][river] = {"mouth": river_cities[river][-1]}

    people = names.people(SIZES["person"])
    companies = [names.word(2) + COMPANY_ENDINGS[int(rng.integers(len(COMPANY_ENDINGS)))].lower()
                 for _ in range(SIZES["company"])]
    companies = [c.capitalize() for c in companies]
    birth_year = {p: int(rng.integers(1800, 1951)) for p in people}
    occupation = {p: OCCUPATIONS[int(rng.integers(len(OCCUPATIONS)))] for p in people}
    for p in people:
        facts["person"][p] = {"birthplace": cities[int(rng.integers(len(cities)))], "birth_year": str(birth_year[p])}
    founders = [people[int(i)] for i in rng.choice(len(people), size=len(companies), replace=False)]
    founded_by = dict(zip(companies, founders))
    for company, founder in founded_by.items():
        facts["company"][company] = {
            "founder": founder,
            "headquarters": cities[int(rng.integers(len(cities)))],
            "founded": str(birth_year[founder] + int(rng.integers(25, 56))),
        }
    own_company = {founder: company for company, founder in founded_by.items()}
    for p in people:
        choices = [c for c in companies if c != own_company.get(p)]
        facts["person"][p]["employer"] = choices[int(rng.integers(len(choices)))]

    inventions = [names.word(2) + " " + DEVICES[int(rng.integers(len(DEVICES)))] for _ in range(SIZES["invention"])]
    invention_year, device_kind = {}, {}
    for invention in inventions:
        inventor = people[int(rng.integers(len(people)))]
        facts["invention"][invention] = {"inventor": inventor, "maker": companies[int(rng.integers(len(companies)))]}
        invention_year[invention] = birth_year[inventor] + int(rng.integers(22, 61))
        device_kind[invention] = DEVICE_KINDS[int(rng.integers(len(DEVICE_KINDS)))]
    population = {c: int(rng.integers(8, 900)) * 1000 for c in cities}
    length = {r: int(rng.integers(80, 2400)) for r in rivers}

    writer = _Writer(facts, occupation, population, length, invention_year, device_kind, river_cities)
    entities = tuple(writer.entity(kind, title) for kind in KINDS for title in facts[kind])
    by_title = MappingProxyType({normalize_title(e.title): e for e in entities})
    if len(by_title) != len(entities):
        raise RuntimeError(f"world seed {seed} produced duplicate titles; the name generator must keep them unique")
    index = BM25Index([f"{e.title}. {e.text}" for e in entities])
    return World(seed, entities, index, by_title)


class _Names:
    """Unique coined words (no word is used twice anywhere in one world)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _pick(self, options: tuple[str, ...]) -> str:
        return options[int(self.rng.integers(len(options)))]

    def word(self, syllables: int) -> str:
        for _ in range(1000):
            word = "".join(self._pick(ONSETS) + self._pick(VOWELS) for _ in range(syllables)) + self._pick(CODAS)
            if word not in self.used and len(word) >= 4:
                self.used.add(word)
                return word.capitalize()
        raise RuntimeError("the name generator ran out of unique words; enlarge ONSETS/VOWELS")

    def people(self, n: int) -> list[str]:
        """``n`` distinct full names drawn from smaller first- and last-name pools (names repeat)."""
        firsts = [self.word(2) for _ in range(max(8, n // 4))]
        lasts = [self.word(2) for _ in range(max(8, n // 3))]
        chosen: list[str] = []
        while len(chosen) < n:
            name = f"{self._pick(tuple(firsts))} {self._pick(tuple(lasts))}"
            if name not in chosen:
                chosen.append(name)
        return chosen


def _assign_evenly(rng: np.random.Generator, items: list[str], groups: list[str]) -> dict[str, str]:
    """A random map item -> group in which every group gets ``len(items) // len(groups)`` or one more."""
    order = rng.permutation(len(items))
    return {items[int(i)]: groups[rank % len(groups)] for rank, i in enumerate(order)}


@dataclass
class _Writer:
    """Writes the encyclopedia documents from the facts (and reverse links)."""

    facts: dict[str, dict[str, dict[str, str]]]
    occupation: dict[str, str]
    population: dict[str, int]
    length: dict[str, int]
    invention_year: dict[str, int]
    device_kind: dict[str, str]
    river_cities: dict[str, list[str]]

    def _with(self, kind: str, relation: str, value: str) -> list[str]:
        return [title for title, f in self.facts[kind].items() if f.get(relation) == value]

    def entity(self, kind: str, title: str) -> Entity:
        f = self.facts[kind][title]
        text = getattr(self, f"_{kind}")(title, f)
        mention = f"the {title}" if kind in ("river", "invention") else title
        aliases = (title.rsplit(" ", 1)[0],) if kind in ("river", "invention") else ()
        return Entity(kind, title, mention, MappingProxyType(dict(f)), _clean(text), aliases)

    def _country(self, title: str, f: dict[str, str]) -> str:
        cities = self._with("city", "country", title)
        return (f"{title} is a country. Its capital is {f['capital']}. Its official language is {f['language']}. "
                f"Its cities are {_listing(cities)}.")

    def _city(self, title: str, f: dict[str, str]) -> str:
        text = f"{title} is a city of {self.population[title]:,} people. It lies in {f['country']}."
        if "river" in f:
            text += f" The {f['river']} flows through {title}."
        born = self._with("person", "birthplace", title)
        if born:
            text += f" People born in {title} include {_listing(born[:4])}."
        hq = self._with("company", "headquarters", title)
        if hq:
            text += f" {_listing(hq)} {'has its' if len(hq) == 1 else 'have their'} headquarters here."
        return text

    def _person(self, title: str, f: dict[str, str]) -> str:
        article = "an" if self.occupation[title][0] in "aeiou" else "a"
        text = (f"{title} is {article} {self.occupation[title]}. {title} was born in {f['birth_year']} in "
                f"{f['birthplace']}. {title} works for {f['employer']}.")
        founded = self._with("company", "founder", title)
        if founded:
            text += f" {title} founded {_listing(founded)}."
        invented = self._with("invention", "inventor", title)
        if invented:
            text += f" {title} invented {_listing(['the ' + i for i in invented])}."
        return text

    def _company(self, title: str, f: dict[str, str]) -> str:
        industry = INDUSTRIES[sum(map(ord, title)) % len(INDUSTRIES)]
        text = (f"{title} is a {industry} company. It was founded in {f['founded']} by {f['founder']}. "
                f"Its headquarters are in {f['headquarters']}.")
        made = self._with("invention", "maker", title)
        if made:
            text += f" It manufactures {_listing(['the ' + i for i in made])}."
        staff = self._with("person", "employer", title)
        if staff:
            text += f" Its staff include {_listing(staff[:3])}."
        return text

    def _river(self, title: str, f: dict[str, str]) -> str:
        return (f"The {title} is a river {self.length[title]} km long. It flows through "
                f"{_listing(self.river_cities[title])}. It reaches the sea at {f['mouth']}.")

    def _invention(self, title: str, f: dict[str, str]) -> str:
        return (f"The {title} is a {self.device_kind[title]} device. It was invented by {f['inventor']} in "
                f"{self.invention_year[title]}. It is manufactured by {f['maker']}.")


def _listing(items: list[str]) -> str:
    """``"A"``, ``"A and B"``, ``"A, B and C"``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
