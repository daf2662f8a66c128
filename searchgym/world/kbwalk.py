"""KB-walk QA: multi-hop questions made by walking the synthetic world's functional relations.

A chain question starts at a named entity and follows 0 to 3 relations before asking for a final
relation or attribute ("In which year was the university attended by the founder of Orvane Mills
founded?" walks company -founded_by-> person -studied_at-> university, then asks founded_year: 3 hops).
Every relation is functional, so the walk has exactly one answer once the start is unambiguous.
Fuzzing replaces the start's name by a description ("the textiles company founded in 1873 and
headquartered in Velmora") kept only when exactly one entity in the KB fits it. Comparison questions
ask which of two entities has the larger value of a numeric attribute.

Candidates are checked here for what the KB can decide (unique description, answer not given away in
the question, no revisited entity); `oracle.py` then checks that the environment's own tools reach
the answer.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from searchgym.envs.judges import normalize_answer
from searchgym.envs.tasks import Task
from searchgym.world import schema
from searchgym.world.world import Entity, World

# How a relation's target is referred to, given a noun phrase {x} for the source.
TARGET_PHRASE: dict[tuple[str, str], str] = {
    ("person", "born_in"): "the city where {x} was born",
    ("person", "studied_at"): "the university attended by {x}",
    ("person", "employer"): "the company {x} worked for",
    ("city", "country"): "the country in which {x} lies",
    ("city", "mayor"): "the mayor of {x}",
    ("country", "capital"): "the capital of {x}",
    ("company", "founded_by"): "the founder of {x}",
    ("company", "headquarters"): "the city where {x} is headquartered",
    ("university", "located_in"): "the city where {x} is located",
    ("university", "founded_by"): "the founder of {x}",
    ("river", "flows_through"): "the country through which {x} flows",
    ("river", "source"): "the mountain on which {x} rises",
    ("mountain", "country"): "the country in which {x} stands",
    ("film", "directed_by"): "the director of {x}",
    ("film", "filmed_in"): "the city where {x} was filmed",
    ("film", "based_on"): "the book on which {x} is based",
    ("book", "written_by"): "the author of {x}",
    ("book", "publisher"): "the publisher of {x}",
    ("event", "location"): "the city where {x} took place",
    ("event", "organised_by"): "the organiser of {x}",
}

# The final question, for a relation or an attribute of the entity {x}.
QUESTION: dict[tuple[str, str], str] = {
    ("person", "born_in"): "In which city was {x} born?",
    ("person", "studied_at"): "Which university did {x} attend?",
    ("person", "employer"): "Which company did {x} work for?",
    ("city", "country"): "In which country does {x} lie?",
    ("city", "mayor"): "Who is the mayor of {x}?",
    ("country", "capital"): "What is the capital of {x}?",
    ("company", "founded_by"): "Who founded {x}?",
    ("company", "headquarters"): "In which city is {x} headquartered?",
    ("university", "located_in"): "In which city is {x} located?",
    ("university", "founded_by"): "Who founded {x}?",
    ("river", "flows_through"): "Through which country does {x} flow?",
    ("river", "source"): "On which mountain does {x} rise?",
    ("mountain", "country"): "In which country does {x} stand?",
    ("film", "directed_by"): "Who directed {x}?",
    ("film", "filmed_in"): "In which city was {x} filmed?",
    ("film", "based_on"): "Which book is {x} based on?",
    ("book", "written_by"): "Who wrote {x}?",
    ("book", "publisher"): "Which company published {x}?",
    ("event", "location"): "In which city did {x} take place?",
    ("event", "organised_by"): "Which company organised {x}?",
    ("person", "birth_year"): "In which year was {x} born?",
    ("person", "occupation"): "What was the occupation of {x}?",
    ("city", "population"): "What is the population of {x}?",
    ("city", "founded_year"): "In which year was {x} founded?",
    ("country", "population"): "What is the population of {x}?",
    ("country", "official_language"): "What is the official language of {x}?",
    ("country", "currency"): "What is the currency of {x}?",
    ("company", "founded_year"): "In which year was {x} founded?",
    ("company", "industry"): "In which industry does {x} operate?",
    ("company", "employees"): "How many employees does {x} have?",
    ("university", "founded_year"): "In which year was {x} founded?",
    ("university", "students"): "How many students does {x} have?",
    ("river", "length_km"): "How long is {x}?",
    ("mountain", "elevation_m"): "How high is {x}?",
    ("film", "release_year"): "In which year was {x} released?",
    ("film", "genre"): "What is the genre of {x}?",
    ("book", "publication_year"): "In which year was {x} published?",
    ("book", "genre"): "What is the genre of {x}?",
    ("event", "year"): "In which year did {x} take place?",
    ("event", "attendance"): "How many people attended {x}?",
}

# Numeric attributes two entities can be compared on: (type, attribute, question, larger value wins?).
COMPARISONS: tuple[tuple[str, str, str, bool], ...] = (
    ("city", "population", "Which city has the larger population, {a} or {b}?", True),
    ("person", "birth_year", "Who was born earlier, {a} or {b}?", False),
    ("company", "founded_year", "Which company was founded earlier, {a} or {b}?", False),
    ("university", "founded_year", "Which university is older, {a} or {b}?", False),
    ("river", "length_km", "Which river is longer, {a} or {b}?", True),
    ("mountain", "elevation_m", "Which mountain is higher, {a} or {b}?", True),
    ("film", "release_year", "Which film was released earlier, {a} or {b}?", False),
)

# Facts that describe an entity without naming it, for fuzzing: (fields, template).
DESCRIPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "person": (("occupation", "born_in", "birth_year"), "the {occupation} born in {born_in} in {birth_year}"),
    "city": (("country", "founded_year"), "the city in {country} founded in {founded_year}"),
    "company": (
        ("industry", "founded_year", "headquarters"),
        "the {industry} company founded in {founded_year} and headquartered in {headquarters}",
    ),
    "university": (("located_in", "founded_year"), "the university in {located_in} founded in {founded_year}"),
    "river": (("length_km", "source"), "the {length_km} river that rises on {source}"),
    "mountain": (("elevation_m", "country"), "the {elevation_m} mountain in {country}"),
    "film": (
        ("genre", "release_year", "filmed_in"),
        "the {genre} film released in {release_year} and filmed in {filmed_in}",
    ),
    "book": (
        ("genre", "publication_year", "publisher"),
        "the {genre} book published in {publication_year} by {publisher}",
    ),
    "event": (("location", "year"), "the event held in {location} in {year}"),
}

NAMED_PREFIX = {"film": "the film ", "book": "the book "}  # titles read as titles in a question


@dataclass(frozen=True)
class Candidate:
    """A question before validation, with the evidence an oracle needs to check it."""

    question: str
    answers: tuple[str, ...]
    metadata: dict[str, Any]


class KBWalker:
    """Draws chain and comparison questions from a world; rejects what the KB shows to be flawed."""

    def __init__(
        self,
        world: World,
        *,
        seed: int = 0,
        fuzz_prob: float = 0.25,
        comparison_prob: float = 0.15,
        hop_weights: dict[int, float] | None = None,
        max_hops: int = 4,
    ):
        self.world = world
        self.rng = random.Random(seed)
        self.fuzz_prob, self.comparison_prob = fuzz_prob, comparison_prob
        self.hop_weights = hop_weights or {1: 0.3, 2: 0.35, 3: 0.2, 4: 0.15}
        if not set(self.hop_weights) <= set(range(1, max_hops + 1)):
            raise ValueError(f"hops must be between 1 and {max_hops}")
        self.rejections: Counter[str] = Counter()
        self._description_counts: Counter[tuple] | None = None

    def candidates(self) -> Iterator[Candidate]:
        """An endless stream of candidates that pass the KB checks (rejections are counted)."""
        while True:
            if self.rng.random() < self.comparison_prob:
                candidate = self._comparison()
            else:
                candidate = self._chain(
                    self.rng.choices(list(self.hop_weights), weights=list(self.hop_weights.values()))[0]
                )
            if candidate is not None:
                yield candidate

    # --- chain questions ---------------------------------------------------------------------

    def _chain(self, hops: int) -> Candidate | None:
        start = self.world.entity(self._random_eid(self.rng.choice(schema.ENTITY_TYPES)))
        path = [start]
        relations: list[str] = []
        for _ in range(hops - 1):  # the walk before the final question
            relation = self.rng.choice(schema.relations_of(path[-1].type))
            nxt = self.world.entity(path[-1].rels[relation.name])
            if any(e.eid == nxt.eid for e in path):
                return self._reject("walk revisits an entity")
            path.append(nxt)
            relations.append(relation.name)
        last = path[-1]
        answers: tuple[str, ...]
        final = self.rng.choice(
            [r.name for r in schema.relations_of(last.type)] + [a.name for a in schema.attributes_of(last.type)]
        )
        if final in last.rels:
            target = self.world.entity(last.rels[final])
            if any(e.eid == target.eid for e in path):
                return self._reject("walk revisits an entity")
            answers, answer_type = (target.name,), "entity"
        else:
            kind = schema.attribute(last.type, final).kind
            answers, answer_type = tuple(schema.answer_aliases(kind, last.attrs[final])), kind
        fuzzed = self.rng.random() < self.fuzz_prob
        start_phrase = self.description(start) if fuzzed else self._named(start)
        if start_phrase is None:
            return self._reject("no unique description of the start entity")
        phrase = start_phrase
        for entity, relation_name in zip(path, relations, strict=False):  # the last entity has no walked relation
            phrase = TARGET_PHRASE[(entity.type, relation_name)].format(x=phrase)
        question = QUESTION[(last.type, final)].format(x=phrase)
        question = question[0].upper() + question[1:]
        if self._gives_away(question, answers):
            return self._reject("answer appears in the question")
        return Candidate(
            question,
            answers,
            {
                "kind": "chain",
                "hops": hops,
                "fuzzed": fuzzed,
                "path": [self._ref(e) for e in path],
                "relations": relations + [final],
                "answer_type": answer_type,
                "answer_page": last.url,
                "answer_on_page": answers[0],
                "start_query": start_phrase if fuzzed else start.name,
            },
        )

    # --- comparison questions ----------------------------------------------------------------

    def _comparison(self) -> Candidate | None:
        entity_type, attr, template, larger_wins = self.rng.choice(COMPARISONS)
        a = self.world.entity(self._random_eid(entity_type))
        b = self.world.entity(self._random_eid(entity_type))
        if a.eid == b.eid or a.attrs[attr] == b.attrs[attr]:
            return self._reject("comparison without a unique winner")
        winner = a if (int(a.attrs[attr]) > int(b.attrs[attr])) == larger_wins else b  # the COMPARISONS are numbers
        question = template.format(a=a.name, b=b.name)  # the template already says "film", "city"
        kind = schema.attribute(entity_type, attr).kind
        return Candidate(
            question,
            (winner.name,),
            {
                "kind": "comparison",
                "hops": 2,
                "fuzzed": False,
                "path": [self._ref(a), self._ref(b)],
                "relations": [attr],
                "answer_type": "entity",
                "answer_page": winner.url,
                "values_on_page": [schema.format_value(kind, a.attrs[attr]), schema.format_value(kind, b.attrs[attr])],
            },
        )

    # --- helpers -----------------------------------------------------------------------------

    def _random_eid(self, entity_type: str) -> int:
        block = self.world.type_range(entity_type)
        return block[self.rng.randrange(len(block))]

    def _named(self, entity: Entity) -> str:
        return NAMED_PREFIX.get(entity.type, "") + entity.name

    def _ref(self, entity: Entity) -> dict[str, Any]:
        return {"id": entity.doc_id, "type": entity.type, "name": entity.name, "url": entity.url}

    def description(self, entity: Entity) -> str | None:
        """A description of the entity, or None when another entity of the KB fits it too."""
        if entity.type not in DESCRIPTIONS:
            return None
        if self._signature_counts()[self._signature(entity)] != 1:
            return None
        fields, template = DESCRIPTIONS[entity.type]
        return template.format(**{f: self._fact_text(entity, f) for f in fields})

    def _fact_text(self, entity: Entity, field: str) -> str:
        if field in entity.rels:
            return self.world.name(entity.rels[field])
        return schema.format_value(schema.attribute(entity.type, field).kind, entity.attrs[field])

    def _signature(self, entity: Entity) -> tuple:
        fields, _ = DESCRIPTIONS[entity.type]
        return (entity.type, *(entity.rels[f] if f in entity.rels else entity.attrs[f] for f in fields))

    def _signature_counts(self) -> Counter[tuple]:
        """How many entities share each description (built once, by one pass over the world)."""
        if self._description_counts is None:
            self._description_counts = Counter(self._signature(e) for e in self.world if e.type in DESCRIPTIONS)
        return self._description_counts

    @staticmethod
    def _gives_away(question: str, answers: tuple[str, ...]) -> bool:
        padded = f" {normalize_answer(question)} "
        return any(f" {normalize_answer(a)} " in padded for a in answers if normalize_answer(a))

    def _reject(self, reason: str) -> None:
        self.rejections[reason] += 1
        return None


def start_gives_link(task: Task) -> bool:
    """Whether a chain question's described start names a later entity of its path ("the city in Zethinia founded in
    657" names Zethinia, the country the next hop looks up), so one hop needs no lookup: 12% of a 20,000-page
    world's questions of 2 to 4 hops."""
    meta = task.metadata
    if meta.get("kind") != "chain" or not meta.get("fuzzed"):
        return False
    start = str(meta.get("start_query", ""))
    return any(ref["name"] in start for ref in meta.get("path", [])[1:])


def to_task(candidate: Candidate, task_id: str, split: str) -> Task:
    return Task(
        task_id, candidate.question, candidate.answers, {**candidate.metadata, "split": split, "source": "kbwalk"}
    )
