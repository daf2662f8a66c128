"""The synthetic world's schema: entity types, their relations and attributes, and how values print.

The world generator (`world.py`) renders these facts into pages; KB-walk QA (`kbwalk.py`) walks
them into questions. Both read this one table, so a fact a question relies on is a fact a page states.
Every relation is functional (one target per entity), so a forward walk has exactly one answer.
"""

from __future__ import annotations

from dataclasses import dataclass

ENTITY_TYPES: tuple[str, ...] = (
    "person",
    "city",
    "country",
    "company",
    "university",
    "river",
    "mountain",
    "film",
    "book",
    "event",
)

# Share of the world's pages per type (normalised by the generator; every type gets at least one).
TYPE_WEIGHTS: dict[str, float] = {
    "person": 0.30,
    "city": 0.12,
    "country": 0.02,
    "company": 0.12,
    "university": 0.05,
    "river": 0.05,
    "mountain": 0.04,
    "film": 0.11,
    "book": 0.11,
    "event": 0.08,
}


@dataclass(frozen=True)
class Relation:
    """A functional link from an entity of `source` type to one entity of `target` type."""

    source: str
    name: str
    target: str


@dataclass(frozen=True)
class Attribute:
    """A literal fact of an entity: an integer (`year`, `count`, `length`) or a string (`label`)."""

    source: str
    name: str
    kind: str  # "year" | "count" | "km" | "m" | "label"


RELATIONS: tuple[Relation, ...] = (
    Relation("person", "born_in", "city"),
    Relation("person", "studied_at", "university"),
    Relation("person", "employer", "company"),
    Relation("city", "country", "country"),
    Relation("city", "mayor", "person"),
    Relation("country", "capital", "city"),
    Relation("company", "founded_by", "person"),
    Relation("company", "headquarters", "city"),
    Relation("university", "located_in", "city"),
    Relation("university", "founded_by", "person"),
    Relation("river", "flows_through", "country"),
    Relation("river", "source", "mountain"),
    Relation("mountain", "country", "country"),
    Relation("film", "directed_by", "person"),
    Relation("film", "filmed_in", "city"),
    Relation("film", "based_on", "book"),
    Relation("book", "written_by", "person"),
    Relation("book", "publisher", "company"),
    Relation("event", "location", "city"),
    Relation("event", "organised_by", "company"),
)

ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("person", "birth_year", "year"),
    Attribute("person", "occupation", "label"),
    Attribute("city", "population", "count"),
    Attribute("city", "founded_year", "year"),
    Attribute("country", "population", "count"),
    Attribute("country", "official_language", "label"),
    Attribute("country", "currency", "label"),
    Attribute("company", "founded_year", "year"),
    Attribute("company", "industry", "label"),
    Attribute("company", "employees", "count"),
    Attribute("university", "founded_year", "year"),
    Attribute("university", "students", "count"),
    Attribute("river", "length_km", "km"),
    Attribute("mountain", "elevation_m", "m"),
    Attribute("film", "release_year", "year"),
    Attribute("film", "genre", "label"),
    Attribute("book", "publication_year", "year"),
    Attribute("book", "genre", "label"),
    Attribute("event", "year", "year"),
    Attribute("event", "attendance", "count"),
)


def relations_of(entity_type: str) -> tuple[Relation, ...]:
    return tuple(r for r in RELATIONS if r.source == entity_type)


def attributes_of(entity_type: str) -> tuple[Attribute, ...]:
    return tuple(a for a in ATTRIBUTES if a.source == entity_type)


def attribute(entity_type: str, name: str) -> Attribute:
    for a in ATTRIBUTES:
        if a.source == entity_type and a.name == name:
            return a
    raise KeyError(f"{entity_type} has no attribute {name!r}")


def format_value(kind: str, value: int | str) -> str:
    """The one way a value is written on pages and in answers: years bare, counts with commas."""
    if kind == "label":
        return str(value)
    if kind == "year":
        return str(int(value))
    if kind == "count":
        return f"{int(value):,}"
    if kind == "km":
        return f"{int(value):,} km"
    if kind == "m":
        return f"{int(value):,} m"
    raise ValueError(f"unknown attribute kind {kind!r}")


def answer_aliases(kind: str, value: int | str) -> list[str]:
    """Accepted spellings of a value as an answer: the page form first, then plain digits and units."""
    shown = format_value(kind, value)
    aliases = [shown]
    if kind in ("count", "km", "m"):
        aliases.append(str(int(value)))
        aliases.append(f"{int(value):,}")
        if kind == "km":
            aliases.append(f"{int(value)} kilometres")
        if kind == "m":
            aliases.append(f"{int(value)} metres")
    return list(dict.fromkeys(aliases))
