"""Paraphrased questions of the synthetic world: questions whose words differ from the answer page's.

The world's own questions repeat the page's words (`kbwalk.QUESTION` says "born", the page says "born"), so
BM25 finds the page nearly every time. This module rewrites one-hop KB-walk questions the ways real users
word them, to measure where dense retrieval beats BM25 (`searchgym bench retrieval-paraphrase`).

The spec:

- **Source.** One-hop chain questions from `KBWalker(world, seed)` with no fuzzing and no comparisons: each names
  one entity and asks one of its relations or attributes ("In which city was Krimar Therth born?"), so the page
  whose text holds the answer is that entity's own page, and recall@k of it scores a single search. Questions are
  drawn in the walker's order, duplicates skipped.
- **Kinds.** Each kept question gives one row per kind in `KINDS`, in that order:
  - `original`: the KB-walk question as it is;
  - `synonym`: the relation words replaced by synonyms, entity name kept (`SYNONYM_QUESTION`: "What is the
    hometown of Krimar Therth?"); the synonym template shares no content word (`content_words`) with the
    original's, so outside the name the two questions share no content word;
  - `misspelled`: the original question with the entity's name misspelled by 1 or 2 typing edits (`misspell`:
    a neighbouring key, a dropped, doubled or swapped letter, a wrong vowel), never on a word's first letter,
    in the name's rarest word (the one a user has never seen written), at optimal-string-alignment distance 1 or
    2 from the name, and never another entity's exact name;
  - `described`: the entity named by a description made of its own KB facts instead of its name
    (`DESCRIPTIONS`: "What is the capital of the country of 3,120,554 people whose currency is the florin?"),
    never using the asked fact, kept only when no other entity of the KB fits it; every fact it uses is stated
    on the answer page, so one search can find the page;
  - `synonym_misspelled`: the synonym question with the misspelled name (a hurried user).
  A question is kept only when every kind can be made of it (a unique description exists, no kind gives the
  answer away), so all kinds hold the same questions and compare paired.
- **Answers.** Every row keeps the original's answers and answer page (`metadata["answer_page"]`, its doc id in
  `metadata["answer_doc_id"]`); `metadata["paraphrase_kind"]` labels the kind, `metadata["original"]` holds the
  original question and `metadata["question_id"]` is shared by the rows of one question.
- **Determinism.** The set is a function of (world size, world seed, seed): the walker draws with `seed`, the
  edits and template choices with a `random.Random` seeded from `seed`, consumed in question order, so the first
  n questions are the same whatever n.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

from searchgym.envs.judges import normalize_answer
from searchgym.envs.tasks import Task
from searchgym.world import names, schema
from searchgym.world.kbwalk import NAMED_PREFIX, QUESTION, Candidate, KBWalker
from searchgym.world.world import Entity, World

KINDS: tuple[str, ...] = ("original", "synonym", "misspelled", "described", "synonym_misspelled")
PARAPHRASE_KINDS = KINDS[1:]
MAX_EDITS = 2

# The question of a relation or attribute in other words than `kbwalk.QUESTION`'s (and, mostly, the page's).
SYNONYM_QUESTION: dict[tuple[str, str], str] = {
    ("person", "born_in"): "What is the hometown of {x}?",
    ("person", "studied_at"): "What is the alma mater of {x}?",
    ("person", "employer"): "Which firm had {x} on its payroll?",
    ("city", "country"): "Which nation is {x} part of?",
    ("city", "mayor"): "Who is the elected head of {x}?",
    ("country", "capital"): "What is the main administrative centre of {x}?",
    ("company", "founded_by"): "Who set up {x}?",
    ("company", "headquarters"): "Where does {x} have its head office?",
    ("university", "located_in"): "Which town is home to {x}?",
    ("university", "founded_by"): "Who set up {x}?",
    ("river", "flows_through"): "Which nation does {x} cross?",
    ("river", "source"): "Where are the headwaters of {x}?",
    ("mountain", "country"): "Which nation is {x} part of?",
    ("film", "directed_by"): "Who helmed {x}?",
    ("film", "filmed_in"): "Where was {x} shot?",
    ("film", "based_on"): "What is the source material of {x}?",
    ("book", "written_by"): "Who penned {x}?",
    ("book", "publisher"): "Which press brought out {x}?",
    ("event", "location"): "Which town hosted {x}?",
    ("event", "organised_by"): "Which firm put on {x}?",
    ("person", "birth_year"): "When did {x} come into the world?",
    ("person", "occupation"): "What did {x} do for a living?",
    ("city", "population"): "How many inhabitants does {x} have?",
    ("city", "founded_year"): "When did {x} come into being?",
    ("country", "population"): "How many inhabitants does {x} have?",
    ("country", "official_language"): "Which tongue is spoken in {x}?",
    ("country", "currency"): "What money is used in {x}?",
    ("company", "founded_year"): "When did {x} come into being?",
    ("company", "industry"): "What sector is {x} active in?",
    ("company", "employees"): "What is the headcount of {x}?",
    ("university", "founded_year"): "When did {x} come into being?",
    ("university", "students"): "How large is the enrolment of {x}?",
    ("river", "length_km"): "What distance does {x} cover?",
    ("mountain", "elevation_m"): "How tall is {x}?",
    ("film", "release_year"): "When did {x} come out?",
    ("film", "genre"): "What kind of movie is {x}?",
    ("book", "publication_year"): "When did {x} come out?",
    ("book", "genre"): "What category of literature is {x}?",
    ("event", "year"): "When did {x} happen?",
    ("event", "attendance"): "What was the turnout at {x}?",
}

# Descriptions of an entity by its own facts (all stated on its page): (fields, template) per type, tried in a
# seeded order; one is used when it leaves out the asked fact and no other entity of the KB fits it.
DESCRIPTIONS: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "person": (
        (("occupation", "born_in", "birth_year"), "the {occupation} born in {born_in} in {birth_year}"),
        (
            ("occupation", "birth_year", "studied_at"),
            "the {occupation} born in {birth_year} who studied at {studied_at}",
        ),
        (
            ("occupation", "studied_at", "employer"),
            "the {occupation} who studied at {studied_at} and worked for {employer}",
        ),
        (
            ("born_in", "birth_year", "employer"),
            "the person born in {born_in} in {birth_year} who worked for {employer}",
        ),
    ),
    "city": (
        (("country", "founded_year"), "the city in {country} founded in {founded_year}"),
        (("founded_year", "population"), "the city founded in {founded_year} that is home to {population} people"),
        (("country", "mayor"), "the city in {country} whose mayor is {mayor}"),
    ),
    "country": (
        (("capital",), "the country whose capital is {capital}"),
        (("population", "currency"), "the country of {population} people whose currency is the {currency}"),
    ),
    "company": (
        (
            ("industry", "founded_year", "headquarters"),
            "the {industry} company founded in {founded_year} and headquartered in {headquarters}",
        ),
        (("founded_by", "founded_year"), "the company founded by {founded_by} in {founded_year}"),
        (
            ("industry", "headquarters", "employees"),
            "the {industry} company in {headquarters} with {employees} employees",
        ),
    ),
    "university": (
        (("located_in", "founded_year"), "the university in {located_in} founded in {founded_year}"),
        (("founded_by",), "the university whose founder is {founded_by}"),
        (("located_in", "students"), "the university in {located_in} with {students} students"),
    ),
    "river": (
        (("length_km", "source"), "the {length_km} river that rises on {source}"),
        (("length_km", "flows_through"), "the {length_km} river in {flows_through}"),
        (("source",), "the river that rises on {source}"),
    ),
    "mountain": (
        (("elevation_m", "country"), "the {elevation_m} mountain in {country}"),
        (("elevation_m",), "the {elevation_m} mountain"),
        (("country",), "the mountain in {country}"),
    ),
    "film": (
        (
            ("genre", "release_year", "filmed_in"),
            "the {genre} film released in {release_year} and filmed in {filmed_in}",
        ),
        (("directed_by", "release_year"), "the film released in {release_year} and directed by {directed_by}"),
        (("based_on",), "the film based on {based_on}"),
    ),
    "book": (
        (("genre", "publication_year", "publisher"), "the {genre} book published in {publication_year} by {publisher}"),
        (("written_by", "publication_year"), "the book by {written_by} published in {publication_year}"),
        (("genre", "written_by"), "the {genre} by {written_by}"),
    ),
    "event": (
        (("location", "year"), "the event held in {location} in {year}"),
        (("organised_by", "year"), "the event organised by {organised_by} in {year}"),
        (("location", "attendance"), "the event in {location} attended by {attendance} people"),
    ),
}

# Words that carry no relation: function words and question words (content_words leaves them out).
FUNCTION_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with what which who whom whose how when where did does do has have had its many much".split()
)

# Lower-case QWERTY neighbours, for a slipped finger.
_KEYBOARD_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
KEY_NEIGHBOURS: dict[str, str] = {}
for _r, _row in enumerate(_KEYBOARD_ROWS):
    for _c, _key in enumerate(_row):
        _near = [_row[_c + d] for d in (-1, 1) if 0 <= _c + d < len(_row)]
        for _other in (_r - 1, _r + 1):
            if 0 <= _other < len(_KEYBOARD_ROWS):
                _near += [_KEYBOARD_ROWS[_other][j] for j in (_c - 1, _c) if 0 <= j < len(_KEYBOARD_ROWS[_other])]
        KEY_NEIGHBOURS[_key] = "".join(sorted(set(_near)))
VOWELS = "aeiou"
EDIT_OPS = ("neighbour", "drop", "double", "swap", "vowel")
_WORD = re.compile(r"[a-z0-9]+")


def content_words(text: str) -> set[str]:
    """The lower-cased words of `text` other than function and question words."""
    return {w for w in _WORD.findall(text.lower()) if w not in FUNCTION_WORDS}


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and adjacent swaps, each 1."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def misspell(word: str, rng: random.Random, edits: int = 1) -> str:
    """`word` with `edits` (1 or 2) typing slips, none on its first letter; the result differs from `word` and is
    within `edits` of it (`edit_distance`). Needs a word of at least 3 letters."""
    if not 1 <= edits <= MAX_EDITS:
        raise ValueError(f"edits must be 1 to {MAX_EDITS}, got {edits}")
    if len(word) < 3:
        raise ValueError(f"cannot misspell {word!r}: fewer than 3 letters")
    for _ in range(100):
        out = word
        for _ in range(edits):
            out = _slip(out, rng)
        if 1 <= edit_distance(word, out) <= edits:
            return out
    raise ValueError(f"no misspelling of {word!r} found")  # not reached for words of 3+ letters


def _slip(word: str, rng: random.Random) -> str:
    """One typing slip somewhere after the first letter."""
    while True:
        op, i = rng.choice(EDIT_OPS), rng.randrange(1, len(word))
        ch = word[i]
        if op == "neighbour" and ch.lower() in KEY_NEIGHBOURS:
            new = rng.choice(KEY_NEIGHBOURS[ch.lower()])
            return word[:i] + (new.upper() if ch.isupper() else new) + word[i + 1 :]
        if op == "drop" and len(word) > 3:
            return word[:i] + word[i + 1 :]
        if op == "double":
            return word[: i + 1] + ch + word[i + 1 :]
        if op == "swap" and i + 1 < len(word) and word[i] != word[i + 1]:
            return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
        if op == "vowel" and ch in VOWELS:
            return word[:i] + rng.choice([v for v in VOWELS if v != ch]) + word[i + 1 :]


class Paraphraser:
    """Draws one-hop questions of a world and makes every kind of paraphrase of each (see the module docstring)."""

    def __init__(self, world: World, *, seed: int = 0) -> None:
        self.world, self.seed = world, seed
        self.rng = random.Random(names.mix(seed, 0x9A4A))
        self.walker = KBWalker(world, seed=seed, fuzz_prob=0.0, comparison_prob=0.0, hop_weights={1: 1.0})
        self.rejections: Counter[str] = Counter()
        self._signatures: dict[str, Counter[tuple]] = {}
        self._names: set[str] | None = None
        self._word_counts: Counter[str] | None = None

    def questions(self) -> Iterator[list[Task]]:
        """An endless stream: for each kept question, its rows, one per kind of `KINDS`."""
        seen: set[str] = set()
        for candidate in self.walker.candidates():
            if candidate.question in seen:
                continue
            seen.add(candidate.question)
            rows = self._rows(candidate, len(seen) - 1)
            if rows is not None:
                yield rows

    def paraphrase_set(self, n: int) -> list[Task]:
        """The rows of the first `n` kept questions (n * len(KINDS) tasks)."""
        out: list[Task] = []
        if n < 1:
            return out
        for rows in self.questions():
            out.extend(rows)
            if len(out) >= n * len(KINDS):
                break
        return out

    # --- one question -----------------------------------------------------------------------

    def _rows(self, candidate: Candidate, number: int) -> list[Task] | None:
        entity = self.world.entity(int(candidate.metadata["path"][0]["id"]))
        asked = candidate.metadata["relations"][-1]
        key = (entity.type, asked)
        named = NAMED_PREFIX.get(entity.type, "") + entity.name
        misspelled = self._misspelled_name(entity.name)
        described = self._description(entity, asked)
        if described is None:
            return self._reject("no unique description without the asked fact")
        description, description_fields = described
        written = {
            "original": candidate.question,
            "synonym": _question(SYNONYM_QUESTION[key], named),
            "misspelled": candidate.question.replace(entity.name, misspelled),
            "described": _question(QUESTION[key], description),
            "synonym_misspelled": _question(SYNONYM_QUESTION[key], named.replace(entity.name, misspelled)),
        }
        if any(_gives_away(q, candidate.answers) for q in written.values()):
            return self._reject("a paraphrase gives the answer away")
        question_id = f"para{self.world.seed}-{self.seed}-{number:06d}"
        base = {
            "source": "paraphrase",
            "question_id": question_id,
            "original": candidate.question,
            "hops": 1,
            "entity": entity.name,
            "entity_type": entity.type,
            "entity_id": entity.doc_id,
            "asked": asked,
            "answer_type": candidate.metadata["answer_type"],
            "answer_page": entity.url,
            "answer_doc_id": entity.doc_id,
        }
        extra: dict[str, dict[str, Any]] = {
            "misspelled": {"misspelled_name": misspelled, "edits": edit_distance(entity.name, misspelled)},
            "described": {"description": description, "description_fields": list(description_fields)},
            "synonym_misspelled": {"misspelled_name": misspelled, "edits": edit_distance(entity.name, misspelled)},
        }
        return [
            Task(
                f"{question_id}-{kind}",
                written[kind],
                tuple(candidate.answers),
                {**base, "paraphrase_kind": kind, **extra.get(kind, {})},
            )
            for kind in KINDS
        ]

    def _misspelled_name(self, name: str) -> str:
        """The name with its rarest word (the longest among equals) misspelled by 1 or 2 edits; never another
        entity's name."""
        words = name.split(" ")
        counts = self._name_word_counts()
        eligible = [i for i, w in enumerate(words) if len(w) >= 4 and w[0].isupper()] or [
            i for i, w in enumerate(words) if len(w) >= 3
        ]
        target = min(eligible, key=lambda i: (counts[words[i]], -len(words[i]), i))
        edits = self.rng.randint(1, MAX_EDITS)
        for _ in range(20):
            out = " ".join(misspell(w, self.rng, edits) if i == target else w for i, w in enumerate(words))
            if out not in self._all_names():
                return out
        raise ValueError(f"every misspelling of {name!r} tried is another entity's name")

    def _description(self, entity: Entity, asked: str) -> tuple[str, tuple[str, ...]] | None:
        """A description of the entity by its own facts, leaving out the asked one, that fits it alone (with the
        facts it uses)."""
        options = list(enumerate(DESCRIPTIONS[entity.type]))
        self.rng.shuffle(options)
        counts = self._signature_counts(entity.type)
        for i, (fields, template) in options:
            if asked in fields or counts[(i, *_facts(entity, fields))] != 1:
                continue
            return template.format(**{f: self._fact_text(entity, f) for f in fields}), fields
        return None

    def _fact_text(self, entity: Entity, field: str) -> str:
        if field in entity.rels:
            return self.world.name(entity.rels[field])
        return schema.format_value(schema.attribute(entity.type, field).kind, entity.attrs[field])

    def _signature_counts(self, entity_type: str) -> Counter[tuple]:
        """How many entities of the type share each description's facts (one pass over the type, once)."""
        if entity_type not in self._signatures:
            counts: Counter[tuple] = Counter()
            for eid in self.world.type_range(entity_type):
                e = self.world.entity(eid)
                for i, (fields, _) in enumerate(DESCRIPTIONS[entity_type]):
                    counts[(i, *_facts(e, fields))] += 1
            self._signatures[entity_type] = counts
        return self._signatures[entity_type]

    def _all_names(self) -> set[str]:
        if self._names is None:
            self._names = {self.world.name(eid) for eid in range(self.world.size)}
        return self._names

    def _name_word_counts(self) -> Counter[str]:
        """How many of the world's names hold each word (a rare word is one a user has never seen written)."""
        if self._word_counts is None:
            self._word_counts = Counter(w for n in self._all_names() for w in set(n.split(" ")))
        return self._word_counts

    def _reject(self, reason: str) -> None:
        self.rejections[reason] += 1
        return None


def paraphrase_set(world: World, n: int, *, seed: int = 0) -> list[Task]:
    """The rows of the first `n` questions of `world` that every kind can be made of: n * len(KINDS) tasks, the
    rows of one question together, in `KINDS` order."""
    return Paraphraser(world, seed=seed).paraphrase_set(n)


def _facts(entity: Entity, fields: tuple[str, ...]) -> tuple:
    return tuple(entity.rels[f] if f in entity.rels else entity.attrs[f] for f in fields)


def _question(template: str, x: str) -> str:
    question = template.format(x=x)
    return question[0].upper() + question[1:]


def _gives_away(question: str, answers: tuple[str, ...]) -> bool:
    padded = f" {normalize_answer(question)} "
    return any(f" {normalize_answer(a)} " in padded for a in answers if normalize_answer(a))
