"""RetrievalQA: multi-hop questions answered by searching and reading a generated encyclopedia.

Description:
    The corpus is a fictional world generated in code (``turnrl.envs.tasks.corpus.build_world``,
    312 short documents about countries, cities, people, companies, rivers and inventions,
    shared by both splits). A task is a chain of 2-4 facts from a named entity, asked as one
    question, e.g. ``"In which country does the birthplace of the founder of Zentrix lie?"``
    (company -> founder -> birthplace -> country: 3 hops). The system prompt states the task
    and the answer format (the two tools come through ``info["tools"]`` and the chat
    template); the user prompt is the question.

Action Space:
    The assistant's text: tool calls in the env's ``tool_parser`` format, or a final
    ``Answer: <text>`` (the text up to the end of its line is the answer). Tools:

    * ``search(query: str, k: int = 3)``: the top ``k`` (1..10) documents by BM25
      (``turnrl.tools.bm25``) as ``"1. Title: first sentence"`` lines;
    * ``open(title: str)``: the document's text (title case and spacing are ignored); an
      unknown title is an error that lists the closest titles.

Observation Space:
    One ``tool`` message per call (result or ``"Error: ..."``). Turn rules:

    * malformed tool call (or a call in another format than ``tool_parser``'s) -> user message
      ``"Error: could not parse your tool call: <reason>"`` and a well-formed call;
    * tool calls -> their results; continue (an ``Answer:`` in such a turn is ignored);
    * otherwise the first ``Answer: <text>`` is final;
    * neither (or an empty answer) -> user message
      ``'Call search or open, or reply "Answer: <answer>".'``.

Rewards:
    1.0 on a correct final answer, 0.0 otherwise (outcome only). Grading is normalised exact
    match against the gold answer and its aliases (``"Orun"`` for ``"Orun River"``):
    lowercase, punctuation dropped, the articles a/an/the dropped, spaces collapsed.

Episode End:
    Terminated by the final answer (right or wrong); truncated after ``max_turns`` turns,
    by default ``2 * hops + 2`` of the episode's question (the expert needs ``hops + 2``:
    one search, one ``open`` per hop, the answer).

Splits:
    A question is test iff ``zlib.crc32(question) % 5 == 0`` (1 bucket in 5); tasks are
    drawn by rejection sampling (a uniform hop count in ``[min_hops, max_hops]``, a uniform
    start entity, uniform relations along the chain, no entity visited twice, leaf
    relations such as years only last). ``task_id`` is ``"<start title>/<relation>/..."``,
    e.g. ``"Zentrix/founder/birthplace/country"``. ``state_key`` is the sorted tuple of chain
    positions whose documents have been opened (position ``i`` holds the fact of hop
    ``i + 1``), e.g. ``()``, ``(0,)``, ``(0, 1)``: documents off the chain and searches do
    not change it.

Scripted players:
    ``expert_action`` searches the start entity's name, opens the chain's documents in
    order, then answers (``hops + 2`` turns; it solves every task: checked on 1000 seeds of
    each split, and 300 per split for each fixed hop count 1..4). ``random_action`` picks
    uniformly a search (1-3 words of the question), an ``open`` of a uniform title, or an
    answer naming a uniform title. ``weak_expert_action``
    plays the expert's move with p=0.7, else a random move that is not an answer, until
    the chain is read; then it answers correctly with p=0.5, else names another entity of
    the answer's kind (a plausible guess from the same documents).
    Measured with ``python -m turnrl baselines turnrl/RetrievalQA-v0 --episodes 200``
    (test split, success and mean turns): random 0.01 (2.7), weak 0.45 (6.3), expert 1.00
    (5.1); the train split gives the same to two decimals.

Version History:
    v0: initial version (corpus seed 2024).
"""

from __future__ import annotations

from collections.abc import Mapping

import difflib
import re
import string
import zlib
from dataclasses import dataclass

import numpy as np

from turnrl.envs.base import Message, MultiTurnEnv, TurnOutcome
from turnrl.envs.tasks.corpus import CORPUS_SEED, RELATIONS, Entity, World, build_world
from turnrl.tools import ParseResult, Tool, ToolCall, ToolResult, format_call, tool

__all__ = ["Library", "Question", "RetrievalQAEnv", "is_correct", "make_question", "normalize_answer"]

TEST_BUCKETS, TEST_BUCKET = 5, 0
MIN_HOPS, MAX_HOPS = 1, 4
MAX_K = 10
CLOSE_MATCHES = 5
ANSWER = re.compile(r"Answer:\s*([^\n]*)")
FORMAT_REMINDER = 'Call search or open, or reply "Answer: <answer>".'
EXAMPLE_CALL = ToolCall("search", {"query": "Zentrix"})
"""The call the malformed-call feedback (and a renderer's ``tools_prompt()``) shows."""
WEAK_FOLLOW_PROB, WEAK_CORRECT_PROB = 0.7, 0.5
MAX_DRAWS = 10_000
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans(string.punctuation, " " * len(string.punctuation))


def normalize_answer(text: str) -> str:
    """Lowercase, punctuation to spaces, articles (a/an/the) dropped, whitespace collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def is_correct(answer: str, gold: tuple[str, ...]) -> bool:
    """Whether ``answer`` equals one of ``gold`` (the answer and its aliases) after normalisation."""
    given = normalize_answer(answer)
    return bool(given) and any(given == normalize_answer(g) for g in gold)


@dataclass(frozen=True)
class Question:
    """A multi-hop question: a start entity and a chain of relations.

    Attributes:
        start: Title of the entity the question names.
        relations: Relation names, applied in order (``len`` = hops).
        chain: Titles of the documents to read, one per hop (``chain[0] == start``).
        answers: The gold answer first, then its aliases.
        text: The question as asked.
    """

    start: str
    relations: tuple[str, ...]
    chain: tuple[str, ...]
    answers: tuple[str, ...]
    text: str

    @property
    def hops(self) -> int:
        return len(self.relations)

    @property
    def answer(self) -> str:
        """The gold answer (an entity title or a leaf value)."""
        return self.answers[0]

    @property
    def task_id(self) -> str:
        return "/".join((self.start, *self.relations))

    @property
    def split(self) -> str:
        return "test" if zlib.crc32(self.text.encode()) % TEST_BUCKETS == TEST_BUCKET else "train"


def make_question(world: World, start: str, relations: tuple[str, ...]) -> Question:
    """The question that follows ``relations`` from the entity titled ``start``.

    Raises:
        ValueError: If ``start`` is not a title, a relation is unknown or undefined for the
            entity reached, or a leaf relation is not last.
    """
    entity = world.get(start)
    if entity is None:
        raise ValueError(f"no entity titled {start!r} in the world (seed {world.seed})")
    if not relations:
        raise ValueError("relations must name at least one relation (one hop)")
    chain: list[str] = []
    phrase = entity.mention
    for i, name in enumerate(relations):
        if name not in RELATIONS:
            raise ValueError(f"unknown relation {name!r}; the relations are {sorted(RELATIONS)}")
        if name not in entity.facts:
            raise ValueError(f"{entity.title!r} ({entity.kind}) has no {name!r}; it has {sorted(entity.facts)}")
        relation = RELATIONS[name]
        chain.append(entity.title)
        value = entity.facts[name]
        if i == len(relations) - 1:
            text = relation.question.format(x=phrase)
            target = world.get(value) if relation.target is not None else None
            answers = (value, *(target.aliases if target is not None else ()))
            return Question(chain[0], tuple(relations), tuple(chain), answers, text)
        if relation.target is None:
            raise ValueError(f"leaf relation {name!r} (a value, not an entity) can only end the chain")
        phrase = relation.noun_phrase.format(x=phrase)
        entity = world.get(value)
    raise AssertionError("unreachable")


class Library:
    """The ``search`` and ``open`` tools over one world's documents.

    Args:
        world: The generated world (``turnrl.envs.tasks.corpus.build_world``).
    """

    def __init__(self, world: World) -> None:
        self.world = world

    def search(self, query: str, k: int = 3) -> str:
        """Search the encyclopedia; returns the best-matching document titles with their first sentence.

        Args:
            query: Words to look for, e.g. a name such as "Zentrix".
            k: How many results to return (1 to 10).
        """
        if not 1 <= k <= MAX_K:
            raise ValueError(f"k must be between 1 and {MAX_K}, got {k}")
        hits = self.world.index.top_k(query, k)
        if not hits:
            return f"No documents match {query!r}. Search for a name or another word from the question."
        return "\n".join(f"{rank}. {self.world.entities[i].title}: {self.world.entities[i].snippet}"
                         for rank, (i, _) in enumerate(hits, start=1))

    def open(self, title: str) -> str:
        """Open a document by its exact title and return its text.

        Args:
            title: The document title as shown by search, e.g. "Zentrix".
        """
        entity = self.world.get(title)
        if entity is None:
            raise ValueError(f"no document titled {title!r}. {self.close_matches(title)}")
        return entity.text

    def close_matches(self, title: str) -> str:
        """A hint naming the titles most similar to ``title`` (by spelling, then by search)."""
        by_lower = {t.lower(): t for t in self.world.titles}
        close = difflib.get_close_matches(title.lower(), list(by_lower), n=CLOSE_MATCHES, cutoff=0.6)
        names = [by_lower[c] for c in close]
        for i, _ in self.world.index.top_k(title, CLOSE_MATCHES):
            if len(names) < CLOSE_MATCHES and self.world.entities[i].title not in names:
                names.append(self.world.entities[i].title)
        if not names:
            return "Use search(query) to find titles."
        return f"Close matches: {', '.join(names)}. Use search(query) to find other titles."

    def tools(self) -> tuple[Tool, Tool]:
        """``search`` and ``open`` as tools (schemas derived from the methods)."""
        return tool(self.search), tool(self.open)


def system_prompt() -> str:
    """The system message: the task and the answer format (the tools come through the template)."""
    return (
        "You answer questions about a fictional world by reading its encyclopedia with the search and "
        "open tools.\n"
        "Open documents by their exact title and follow the facts from one document to the next.\n"
        "When you know the answer, reply: Answer: <answer>"
    )


class RetrievalQAEnv(MultiTurnEnv):
    """Multi-hop question answering with ``search`` and ``open`` over a generated corpus.

    Args:
        min_hops: Fewest hops per question (1..4).
        max_hops: Most hops per question (``min_hops``..4); each task draws its hop count
            uniformly from ``[min_hops, max_hops]``.
        max_turns: A fixed turn limit; None (default) gives each episode ``2 * hops + 2``
            (before the first reset, ``2 * max_hops + 2``).
        tool_parser: Parser name for the tool-call format.
        corpus_seed: Seed of the generated world (the v0 corpus is ``CORPUS_SEED``).
    """

    def __init__(
        self,
        min_hops: int = 2,
        max_hops: int = 4,
        *,
        max_turns: int | None = None,
        tool_parser: str = "hermes",
        corpus_seed: int = CORPUS_SEED,
        executors: Mapping[str, str] | None = None,
        executor_options: Mapping[str, Mapping] | None = None,
    ) -> None:
        for name, value in (("min_hops", min_hops), ("max_hops", max_hops)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not MIN_HOPS <= value <= MAX_HOPS:
                raise ValueError(f"{name} must be an int in [{MIN_HOPS}, {MAX_HOPS}], got {value!r}")
        if min_hops > max_hops:
            raise ValueError(f"min_hops ({min_hops}) must not exceed max_hops ({max_hops})")
        self.min_hops, self.max_hops = int(min_hops), int(max_hops)
        self.world = build_world(corpus_seed)
        self.library = Library(self.world)
        self.tools = self.library.tools()
        self._fixed_max_turns = max_turns is not None
        super().__init__(tool_parser=tool_parser, max_turns=2 * self.max_hops + 2 if max_turns is None else max_turns,
                         executors=executors, executor_options=executor_options)
        self._system_prompt = system_prompt()
        self._opened: set[str] = set()
        self._searched = False

    # ----------------------------------------------------------------- hooks
    def _new_task(self, rng: np.random.Generator, split: str) -> Question:
        entities = self.world.entities
        hops = int(rng.integers(self.min_hops, self.max_hops + 1))
        for _ in range(MAX_DRAWS):
            drawn = _random_chain(self.world, entities[int(rng.integers(len(entities)))], hops, rng)
            if drawn is None:
                continue
            question = make_question(self.world, *drawn)
            if question.split == split:
                return question
        raise RuntimeError(f"no {split!r} question of {hops} hops found in {MAX_DRAWS} draws")

    def _task_id(self, task: Question) -> str:
        return task.task_id

    def _start_episode(self, task: Question) -> list[Message]:
        self._opened, self._searched = set(), False
        if not self._fixed_max_turns:
            self.max_turns = 2 * task.hops + 2
        return [{"role": "system", "content": self._system_prompt}, {"role": "user", "content": task.text}]

    def _on_turn(self, action: str, parse: ParseResult, tool_results: tuple[ToolResult, ...]) -> TurnOutcome:
        if parse.status == "malformed":  # the base class tells the model what was wrong
            return TurnOutcome()
        if parse.calls:
            for result in tool_results:
                if not result.ok:
                    continue
                if result.call.name == "open":
                    self._opened.add(self.world.get(result.call.arguments["title"]).title)
                elif result.call.name == "search":
                    self._searched = True
            return TurnOutcome()
        match = ANSWER.search(action)
        if match is None or not match.group(1).strip():
            return TurnOutcome(messages=({"role": "user", "content": FORMAT_REMINDER},))
        correct = is_correct(match.group(1), self._task.answers)
        return TurnOutcome(reward=1.0 if correct else 0.0, terminated=True, success=correct)

    def _state_key(self) -> tuple[int, ...]:
        return tuple(i for i, title in enumerate(self._task.chain) if title in self._opened)

    def example_call(self) -> ToolCall:
        """``EXAMPLE_CALL``: a search for a name."""
        return EXAMPLE_CALL

    # --------------------------------------------------------------- players
    def expert_action(self) -> str:
        """Search the start entity's name (while nothing is searched or read yet), open the next
        unread chain document, or answer once the whole chain is read."""
        self._require_active("expert_action()")
        question: Question = self._task
        pending = [t for t in question.chain if t not in self._opened]
        if not pending:
            return f"Answer: {question.answer}"
        if not self._searched and len(pending) == len(question.chain):
            return self._call("search", query=question.start)
        return self._call("open", title=pending[0])

    def random_action(self, rng: np.random.Generator) -> str:
        """Uniformly one of: search 1-3 random words of the question, open a uniform title,
        or answer a uniform title."""
        self._require_active("random_action()")
        kind = int(rng.integers(3))
        titles = self.world.titles
        if kind == 0:
            words = re.findall(r"[A-Za-z0-9]+", self._task.text)
            picked = rng.choice(len(words), size=min(len(words), int(rng.integers(1, 4))), replace=False)
            return self._call("search", query=" ".join(words[int(i)] for i in sorted(picked)))
        if kind == 1:
            return self._call("open", title=titles[int(rng.integers(len(titles)))])
        return f"Answer: {titles[int(rng.integers(len(titles)))]}"

    def weak_expert_action(self, rng: np.random.Generator) -> str:
        """A weak player: while the chain is unread, the expert's move with p=0.7, else a random
        search or open; once it is read, the right answer with p=0.5, else a wrong answer of the
        answer's kind (another entity of that kind, or another leaf value of that relation).

        Args:
            rng: The player's own generator (the env's ``np_random`` is not touched).
        """
        self._require_active("weak_expert_action()")
        question: Question = self._task
        if any(t not in self._opened for t in question.chain):
            if rng.random() < WEAK_FOLLOW_PROB:
                return self.expert_action()
            action = self.random_action(rng)
            while action.startswith("Answer:"):
                action = self.random_action(rng)
            return action
        if rng.random() < WEAK_CORRECT_PROB:
            return self.expert_action()
        wrong = [v for v in _same_kind_values(self.world, question) if v != question.answer]
        return f"Answer: {wrong[int(rng.integers(len(wrong)))]}"

    def _call(self, name: str, **arguments: object) -> str:
        return format_call(ToolCall(name, dict(arguments)), self.tool_parser)


def _random_chain(world: World, start: Entity, hops: int,
                  rng: np.random.Generator) -> tuple[str, tuple[str, ...]] | None:
    """A uniform relation path of ``hops`` hops from ``start`` (None at a dead end)."""
    entity, visited, relations = start, {start.title}, []
    for i in range(hops):
        last = i == hops - 1
        options = []
        for name in sorted(entity.facts):
            target = RELATIONS[name].target
            if target is None and not last:
                continue
            if target is not None and entity.facts[name] in visited:
                continue
            options.append(name)
        if not options:
            return None
        name = options[int(rng.integers(len(options)))]
        relations.append(name)
        if RELATIONS[name].target is not None:
            entity = world.get(entity.facts[name])
            visited.add(entity.title)
    return start.title, tuple(relations)


def _same_kind_values(world: World, question: Question) -> list[str]:
    """Every value of the question's last relation across the world (sorted, distinct)."""
    relation = RELATIONS[question.relations[-1]]
    if relation.target is not None:
        return [e.title for e in world.of_kind(relation.target)]
    return sorted({e.facts[relation.name] for e in world.of_kind(relation.source) if relation.name in e.facts})
