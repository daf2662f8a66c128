"""A seeded fictional encyclopedia: entities, facts and pages that no language model has memorised.

Every fact is a pure function of (seed, size, eid), drawn on demand from a per-entity `random.Random`
seeded by a stable integer mix, so a million-page world streams to disk in flat memory and the
same (size, seed) gives byte-identical files in any process. Types occupy contiguous eid blocks in
`schema.ENTITY_TYPES` order. Facts that other entities must respect (birth years, founding years,
publication years, countries) are drawn by small cached functions that depend only on the entity
itself and on such facts of entities of earlier dependency levels, so there are no cycles.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import html
import json
import math
import random
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import quote

from searchgym.world import names, schema
from searchgym.world.page_templates import CAPITAL_TEMPLATES, FLAVOUR, LABELS, TEMPLATES

WORLD_URL_PREFIX = "https://world.searchgym.test/wiki/"
MIN_SIZE, MAX_SIZE = 100, 1_000_000
FORMAT_VERSION = 1
CURRENT_YEAR = 2024
_MIN_COUNT = {"country": 2}
_ENTITY_CACHE = 4096
_FACT_CACHE = 1 << 16
_PICK_TRIES = 8
_FLUSH_EVERY = 512

# rng purposes: each draws an independent stream for one entity.
_FACTS, _TEXT, _BIRTH, _FOUNDING, _AUTHORSHIP, _POPULATION, _LOCATION = range(1, 8)

OCCUPATIONS = (
    "architect",
    "botanist",
    "cartographer",
    "chemist",
    "composer",
    "economist",
    "engineer",
    "historian",
    "journalist",
    "linguist",
    "mathematician",
    "novelist",
    "painter",
    "physician",
    "poet",
    "sculptor",
    "surveyor",
    "astronomer",
    "film director",
    "photographer",
    "diplomat",
    "geologist",
    "lawyer",
    "philosopher",
    "shipbuilder",
    "actor",
    "playwright",
    "teacher",
    "translator",
    "violinist",
)
INDUSTRIES = (
    "shipbuilding",
    "textile",
    "publishing",
    "software",
    "mining",
    "brewing",
    "railway",
    "insurance",
    "pharmaceutical",
    "agricultural",
    "banking",
    "glassmaking",
    "aviation",
    "steel",
    "telecommunications",
    "retail",
    "printing",
    "chemical",
    "logistics",
    "tea trading",
)
CURRENCIES = (
    "crown",
    "florin",
    "mark",
    "thaler",
    "ducat",
    "guilder",
    "shilling",
    "dinar",
    "sovereign",
    "real",
    "kopek",
    "scudo",
    "lira",
    "peso",
    "rand",
)
FILM_GENRES = (
    "drama",
    "comedy",
    "thriller",
    "western",
    "musical",
    "documentary",
    "science fiction",
    "horror",
    "romance",
    "adventure",
    "crime",
    "war",
    "mystery",
    "animated",
)
BOOK_GENRES = (
    "novel",
    "poetry collection",
    "memoir",
    "biography",
    "short story collection",
    "essay collection",
    "travelogue",
    "historical novel",
    "detective novel",
    "children's book",
    "play",
    "science fiction novel",
)
_URL_SAFE = "_-.~()'!,:"


def page_url(title: str) -> str:
    """The world url of a page title: spaces as underscores, anything unsafe percent-quoted."""
    path = title.replace(" ", "_")
    plain = path.isascii() and path.replace("_", "").isalnum()
    return WORLD_URL_PREFIX + (path if plain else quote(path, safe=_URL_SAFE))


@dataclass(frozen=True)
class Entity:
    """One page's facts: attributes and functional relations (to eids) exactly as `schema` lists them."""

    eid: int
    type: str
    name: str
    attrs: dict[str, int | str]
    rels: dict[str, int]

    def __hash__(self) -> int:
        return hash(self.eid)

    @property
    def doc_id(self) -> str:
        return str(self.eid)

    @property
    def url(self) -> str:
        return page_url(self.name)


def type_counts(size: int) -> dict[str, int]:
    """Pages per type: TYPE_WEIGHTS scaled to size by largest remainder, every type present, summing to size."""
    total = sum(schema.TYPE_WEIGHTS.values())
    shares = {t: schema.TYPE_WEIGHTS[t] / total * size for t in schema.ENTITY_TYPES}
    counts = {t: max(_MIN_COUNT.get(t, 1), int(s)) for t, s in shares.items()}
    by_remainder = sorted(schema.ENTITY_TYPES, key=lambda t: int(shares[t]) - shares[t])
    for i in range(size - sum(counts.values())):
        counts[by_remainder[i % len(by_remainder)]] += 1
    while sum(counts.values()) > size:
        counts[max(counts, key=counts.__getitem__)] -= 1
    return counts


def _log_uniform(rng: random.Random, low: float, high: float) -> int:
    """An integer spread evenly in log scale, as populations and sizes are."""
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def _a(phrase: str) -> str:
    """The phrase with its indefinite article."""
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


class World:
    """A seeded synthetic world of `size` pages; every entity is computed on demand and cached in bounded LRUs."""

    def __init__(self, size: int, seed: int = 0):
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"world size must be an int, got {type(size).__name__}")
        if not MIN_SIZE <= size <= MAX_SIZE:
            raise ValueError(f"world size must be between {MIN_SIZE:,} and {MAX_SIZE:,} pages, got {size:,}")
        self.size, self.seed = size, seed
        self.counts = type_counts(size)
        starts, start = [], 0
        for t in schema.ENTITY_TYPES:
            starts.append(start)
            start += self.counts[t]
        self._starts = starts
        self._ranges = {t: range(s, s + self.counts[t]) for t, s in zip(schema.ENTITY_TYPES, starts, strict=True)}
        self._namers = {t: names.Namer(t, self.counts[t], seed) for t in schema.ENTITY_TYPES}
        self._key = names.mix(seed, 0x5EA7C4)
        self._entity = functools.lru_cache(maxsize=_ENTITY_CACHE)(self._build_entity)
        self._name = functools.lru_cache(maxsize=_FACT_CACHE)(self._draw_name)
        self._url = functools.lru_cache(maxsize=_FACT_CACHE)(lambda eid: page_url(self._name(eid)))
        self._birth_year = functools.lru_cache(maxsize=_FACT_CACHE)(self._draw_birth_year)
        self._founding = functools.lru_cache(maxsize=_FACT_CACHE)(self._draw_founding)
        self._authorship = functools.lru_cache(maxsize=_FACT_CACHE)(self._draw_authorship)
        self._country_population = functools.lru_cache(maxsize=_FACT_CACHE)(self._draw_country_population)

    # -- layout ---------------------------------------------------------------------------------

    def type_range(self, entity_type: str) -> range:
        """The eids of one type: a contiguous block."""
        return self._ranges[entity_type]

    def type_of(self, eid: int) -> str:
        """The type of an eid, from the block it falls in."""
        self._check(eid)
        return schema.ENTITY_TYPES[bisect.bisect_right(self._starts, eid) - 1]

    def name(self, eid: int) -> str:
        """An entity's page title, without building the entity."""
        self._check(eid)
        return self._name(eid)

    def url(self, eid: int) -> str:
        """An entity's page url."""
        self._check(eid)
        return self._url(eid)

    def entity(self, eid: int) -> Entity:
        """The entity with this eid, with all its schema attributes and relations."""
        self._check(eid)
        return self._entity(eid)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Entity]:
        return (self.entity(eid) for eid in range(self.size))

    def _check(self, eid: int) -> None:
        if not 0 <= eid < self.size:
            raise IndexError(f"eid {eid} outside this world of {self.size:,} pages")

    def _draw_name(self, eid: int) -> str:
        etype = self.type_of(eid)
        return self._namers[etype](eid - self._ranges[etype].start)

    def _rng(self, eid: int, purpose: int) -> random.Random:
        """The entity's own random stream for one purpose, stable across processes."""
        return random.Random(names.mix(self._key, eid, purpose))

    def _pick(self, rng: random.Random, etype: str) -> int:
        block = self._ranges[etype]
        return block.start + rng.randrange(len(block))

    def _pick_where(self, rng: random.Random, etype: str, ok: Callable[[int], bool]) -> int:
        """A random entity of a type that satisfies `ok` if a few draws find one, else the last draw."""
        for _ in range(_PICK_TRIES):
            eid = self._pick(rng, etype)
            if ok(eid):
                return eid
        return eid

    # -- facts other entities depend on (each depends only on earlier levels) -------------------

    def _draw_birth_year(self, person: int) -> int:
        return self._rng(person, _BIRTH).randint(1750, 2000)

    def _draw_country_population(self, country: int) -> int:
        return _log_uniform(self._rng(country, _POPULATION), 400_000, 120_000_000)

    def _draw_founding(self, org: int) -> tuple[int, int]:
        """(founder, founded_year) of a company or university: at least 20 years after the founder's birth."""
        rng = self._rng(org, _FOUNDING)
        founder = self._pick(rng, "person")
        born = self._birth_year(founder)
        return founder, rng.randint(born + 20, min(CURRENT_YEAR, born + 70))

    def _draw_authorship(self, book: int) -> tuple[int, int]:
        """(author, publication_year) of a book: at least 18 years after the author's birth."""
        rng = self._rng(book, _AUTHORSHIP)
        author = self._pick(rng, "person")
        born = self._birth_year(author)
        return author, rng.randint(born + 18, min(CURRENT_YEAR, born + 85))

    def _city_country(self, city: int) -> int:
        """City k of the city block belongs to country k mod n_countries, so cities 0..n-1 can be the capitals."""
        countries = self._ranges["country"]
        return countries.start + (city - self._ranges["city"].start) % len(countries)

    def _capital(self, country: int) -> int:
        return self._ranges["city"].start + (country - self._ranges["country"].start)

    def _is_capital(self, city: int) -> bool:
        return city - self._ranges["city"].start < self.counts["country"]

    def _mountain_country(self, mountain: int) -> int:
        return self._pick(self._rng(mountain, _LOCATION), "country")

    # -- entities ---------------------------------------------------------------------------------

    def _build_entity(self, eid: int) -> Entity:
        etype = self.type_of(eid)
        attrs, rels = _FACT_BUILDERS[etype](self, eid, self._rng(eid, _FACTS))
        return Entity(eid, etype, self._name(eid), attrs, rels)

    def _person(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        born = self._birth_year(eid)
        attrs = {"birth_year": born, "occupation": rng.choice(OCCUPATIONS)}
        rels = {
            "born_in": self._pick(rng, "city"),
            "studied_at": self._pick_where(rng, "university", lambda u: self._founding(u)[1] <= born + 18),
            "employer": self._pick_where(rng, "company", lambda c: self._founding(c)[1] <= born + 50),
        }
        return attrs, rels

    def _city(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        country = self._city_country(eid)
        people = self._country_population(country)
        if self._is_capital(eid):
            population = _log_uniform(rng, people / 40, people / 6)
        else:
            population = _log_uniform(rng, 2_000, min(2_000_000, people / 12))
        attrs = {"population": population, "founded_year": rng.randint(600, 1700)}
        rels = {
            "country": country,
            "mayor": self._pick_where(rng, "person", lambda p: 1940 <= self._birth_year(p) <= 1995),
        }
        return attrs, rels

    def _country(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        attrs = {
            "population": self._country_population(eid),
            "official_language": names.language_of(self._name(eid)),
            "currency": rng.choice(CURRENCIES),
        }
        return attrs, {"capital": self._capital(eid)}

    def _company(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        founder, founded = self._founding(eid)
        attrs = {
            "founded_year": founded,
            "industry": rng.choice(INDUSTRIES),
            "employees": _log_uniform(rng, 12, 180_000),
        }
        return attrs, {"founded_by": founder, "headquarters": self._pick(rng, "city")}

    def _university(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        founder, founded = self._founding(eid)
        attrs = {"founded_year": founded, "students": _log_uniform(rng, 800, 60_000)}
        return attrs, {"located_in": self._pick(rng, "city"), "founded_by": founder}

    def _river(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        source = self._pick(rng, "mountain")
        attrs = {"length_km": _log_uniform(rng, 30, 3_500)}
        return attrs, {"flows_through": self._mountain_country(source), "source": source}

    def _mountain(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        return {"elevation_m": _log_uniform(rng, 400, 7_500)}, {"country": self._mountain_country(eid)}

    def _film(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        director = self._pick_where(rng, "person", lambda p: 1860 <= self._birth_year(p) <= 1990)
        book = self._pick(rng, "book")
        earliest = max(self._birth_year(director) + 20, self._authorship(book)[1], 1900)
        attrs = {
            "release_year": rng.randint(earliest, min(CURRENT_YEAR, earliest + 40)),
            "genre": rng.choice(FILM_GENRES),
        }
        return attrs, {"directed_by": director, "filmed_in": self._pick(rng, "city"), "based_on": book}

    def _book(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        author, published = self._authorship(eid)
        attrs = {"publication_year": published, "genre": rng.choice(BOOK_GENRES)}
        publisher = self._pick_where(rng, "company", lambda c: self._founding(c)[1] <= published)
        return attrs, {"written_by": author, "publisher": publisher}

    def _event(self, eid: int, rng: random.Random) -> tuple[dict, dict]:
        organiser = self._pick(rng, "company")
        founded = self._founding(organiser)[1]
        attrs = {
            "year": rng.randint(founded, min(CURRENT_YEAR, founded + 60)),
            "attendance": _log_uniform(rng, 150, 400_000),
        }
        return attrs, {"location": self._pick(rng, "city"), "organised_by": organiser}

    # -- pages ------------------------------------------------------------------------------------

    def render_text(self, e: Entity) -> str:
        """The plain-text page body (no title line): prose paragraphs, then an infobox section."""
        fields = self._fields(e, False)
        paragraphs = [" ".join(s.format(**fields) for s in para) for para in self._plan(e)]
        infobox = [f"{label}: {value}" for label, value in self._infobox(e, False)]
        return "\n\n".join(paragraphs) + "\n\nInfobox\n" + "\n".join(infobox) + "\n"

    def render_html(self, e: Entity) -> str:
        """The full HTML page: title, heading, infobox table, and prose whose related names link to their pages."""
        fields = self._fields(e, True)
        paragraphs = "".join(
            "<p>" + " ".join(html.escape(s, quote=False).format(**fields) for s in para) + "</p>\n"
            for para in self._plan(e)
        )
        rows = "".join(
            f"<tr><th>{html.escape(label)}</th><td>{value}</td></tr>" for label, value in self._infobox(e, True)
        )
        title = html.escape(e.name)
        return (
            f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>{title}</title></head>\n'
            f'<body>\n<h1>{title}</h1>\n<table class="infobox"><caption>{title}</caption>{rows}</table>\n'
            f"{paragraphs}</body>\n</html>\n"
        )

    def page_row(self, e: Entity) -> dict:
        """The corpus row of a page: id, title, url, plain text and the urls it links to."""
        links = list(dict.fromkeys(self.url(e.rels[r.name]) for r in _RELS[e.type]))
        return {"id": e.doc_id, "title": e.name, "url": e.url, "text": self.render_text(e), "links": links}

    def _plan(self, e: Entity) -> list[list[str]]:
        """The page's paragraphs as sentence templates, chosen by the entity's text rng."""
        rng = self._rng(e.eid, _TEXT)
        lead, *groups = TEMPLATES[e.type]
        sentences = [rng.choice(group) for group in groups]
        if e.type == "city" and self._is_capital(e.eid):
            sentences.insert(0, rng.choice(CAPITAL_TEMPLATES))
        split = rng.randint(1, len(sentences) - 1)
        body = sentences[split:]
        for line in rng.sample(FLAVOUR[e.type], rng.randint(2, 3)):
            body.insert(rng.randint(1, len(body)), line)
        half = rng.randint(2, len(body) - 1) if len(body) > 4 else len(body)
        return [p for p in ([rng.choice(lead), *sentences[:split]], body[:half], body[half:]) if p]

    def _fields(self, e: Entity, as_html: bool) -> dict[str, str]:
        """Template fields: every attribute formatted as `schema.format_value`, every relation as its target's name."""
        short = e.name.split()[-1] if e.type == "person" else e.name
        fields = {"name": _text(e.name, as_html), "short": _text(short, as_html)}
        for a in _ATTRS[e.type]:
            fields[a.name] = _text(schema.format_value(a.kind, e.attrs[a.name]), as_html)
        for r in _RELS[e.type]:
            fields[r.name] = self._ref(e.rels[r.name], as_html)
        if e.type == "person":
            fields["is"] = "is" if int(e.attrs["birth_year"]) >= 1945 else "was"
        for label in ("occupation", "genre", "industry"):
            if label in e.attrs:
                fields["a_" + label] = _text(_a(str(e.attrs[label])), as_html)
        return fields

    def _infobox(self, e: Entity, as_html: bool) -> list[tuple[str, str]]:
        rows = [("Type", e.type.capitalize())]
        rows += [
            (LABELS[e.type, a.name], _text(schema.format_value(a.kind, e.attrs[a.name]), as_html))
            for a in _ATTRS[e.type]
        ]
        rows += [(LABELS[e.type, r.name], self._ref(e.rels[r.name], as_html)) for r in _RELS[e.type]]
        return rows

    def _ref(self, eid: int, as_html: bool) -> str:
        """A related entity as its name, or in HTML as a link to its page."""
        name = self.name(eid)
        return f'<a href="{html.escape(self.url(eid))}">{html.escape(name, quote=False)}</a>' if as_html else name

    # -- files ------------------------------------------------------------------------------------

    def write(self, out_dir: str | Path, *, html: bool = False, progress: bool = False) -> dict:
        """Stream corpus.jsonl, kb.jsonl (and html.jsonl) into out_dir, then the world.json manifest, last."""
        from tqdm import tqdm

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "world.json").unlink(missing_ok=True)
        rows: dict[str, Callable[[Entity], dict]] = {"corpus.jsonl": self.page_row, "kb.jsonl": self._kb_row}
        if html:
            rows["html.jsonl"] = lambda e: {"url": e.url, "html": self.render_html(e)}
        with ExitStack() as stack:
            sinks = {name: _HashedSink(stack.enter_context(open(out / name, "wb"))) for name in rows}
            for eid in tqdm(range(self.size), disable=not progress, unit="page", desc="world"):
                e = self._entity(eid)
                for name, row in rows.items():
                    sinks[name].add(json.dumps(row(e), ensure_ascii=False))
            digests = {name: sink.close() for name, sink in sinks.items()}
        manifest = {
            "format": FORMAT_VERSION,
            "size": self.size,
            "seed": self.seed,
            "counts": dict(self.counts),
            "files": digests,
        }
        (out / "world.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        return manifest

    def _kb_row(self, e: Entity) -> dict:
        return {"id": e.doc_id, "type": e.type, "name": e.name, "url": e.url, "attrs": e.attrs, "rels": e.rels}


class _HashedSink:
    """A JSONL writer that buffers lines and keeps the sha256 of everything written."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file, self._sha = file, hashlib.sha256()
        self._lines: list[str] = []

    def add(self, line: str) -> None:
        self._lines.append(line)
        if len(self._lines) >= _FLUSH_EVERY:
            self._flush()

    def close(self) -> str:
        """Flush what is left and return the file's sha256."""
        self._flush()
        return self._sha.hexdigest()

    def _flush(self) -> None:
        if self._lines:
            data = ("\n".join(self._lines) + "\n").encode("utf-8")
            self._file.write(data)
            self._sha.update(data)
            self._lines = []


def _text(value: str, as_html: bool) -> str:
    return html.escape(value, quote=False) if as_html else value


_ATTRS = {t: schema.attributes_of(t) for t in schema.ENTITY_TYPES}
_RELS = {t: schema.relations_of(t) for t in schema.ENTITY_TYPES}
_FACT_BUILDERS: dict[str, Callable[[World, int, random.Random], tuple[dict, dict]]] = {
    t: getattr(World, f"_{t}") for t in schema.ENTITY_TYPES
}
