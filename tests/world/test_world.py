"""The synthetic world: determinism, unique names, well-formed plausible facts, and pages that state them."""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.world import names, schema
from searchgym.world.page_templates import TEMPLATES
from searchgym.world.world import (
    BOOK_GENRES,
    CURRENCIES,
    CURRENT_YEAR,
    FILM_GENRES,
    INDUSTRIES,
    OCCUPATIONS,
    WORLD_URL_PREFIX,
    Entity,
    World,
    page_url,
    type_counts,
)

REPO = Path(__file__).resolve().parents[2]
FILES = ("corpus.jsonl", "kb.jsonl", "html.jsonl")


@pytest.fixture(scope="module")
def world() -> World:
    return World(2_000, seed=7)


@pytest.fixture(scope="module")
def entities(world: World) -> list[Entity]:
    return list(world)


def _prose(text: str) -> str:
    return text.split("\n\nInfobox\n")[0]


# -- determinism ---------------------------------------------------------------------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_writes_byte_identical_files(tmp_path: Path) -> None:
    a = World(1_500, seed=3).write(tmp_path / "a", html=True)
    b = World(1_500, seed=3).write(tmp_path / "b", html=True)
    assert a == b
    for name in FILES + ("world.json",):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    for name, digest in a["files"].items():
        assert _sha(tmp_path / "a" / name) == digest
    assert json.loads((tmp_path / "a" / "world.json").read_text()) == a
    c = World(1_500, seed=4).write(tmp_path / "c")
    assert c["files"]["corpus.jsonl"] != a["files"]["corpus.jsonl"]
    assert c["files"]["kb.jsonl"] != a["files"]["kb.jsonl"]


def test_fresh_process_with_other_hash_seed_writes_the_same_files(tmp_path: Path) -> None:
    here = World(1_500, seed=3).write(tmp_path / "here")
    code = (
        "import json, sys; from searchgym.world.world import World; "
        "print(json.dumps(World(1500, 3).write(sys.argv[1])))"
    )
    hash_seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "there")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
    )
    assert json.loads(done.stdout) == here
    assert (tmp_path / "here" / "corpus.jsonl").read_bytes() == (tmp_path / "there" / "corpus.jsonl").read_bytes()


def test_different_seeds_give_different_worlds() -> None:
    a, b = World(500, seed=1), World(500, seed=2)
    assert sum(a.name(i) != b.name(i) for i in range(500)) > 450
    assert sum(a.entity(i) != b.entity(i) for i in range(500)) > 450


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**64), size=st.integers(100, 3_000), data=st.data())
def test_entity_is_deterministic_and_well_formed(seed: int, size: int, data: st.DataObject) -> None:
    eid = data.draw(st.integers(0, size - 1))
    first, second = World(size, seed), World(size, seed)
    e = first.entity(eid)
    assert e == second.entity(eid)
    assert first.render_text(e) == second.render_text(second.entity(eid))
    _assert_well_formed(first, e)


# -- layout and names ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [100, 101, 137, 999, 2_000, 12_345, 1_000_000])
def test_counts_sum_to_size_and_blocks_are_contiguous(size: int) -> None:
    counts = type_counts(size)
    assert sum(counts.values()) == size
    assert all(counts[t] >= 1 for t in schema.ENTITY_TYPES) and counts["country"] >= 2
    assert counts["city"] >= counts["country"]
    w = World(size)
    start = 0
    for t in schema.ENTITY_TYPES:
        block = w.type_range(t)
        assert block.start == start and len(block) == counts[t]
        assert w.type_of(block.start) == t and w.type_of(block[-1]) == t
        start = block.stop
    assert start == size == len(w)


def test_size_bounds() -> None:
    for bad in (0, 99, 1_000_001):
        with pytest.raises(ValueError, match="between 100 and 1,000,000"):
            World(bad)
    with pytest.raises(TypeError):
        World(2_000.0)  # type: ignore[arg-type]
    assert World(1_000_000).name(999_999)
    w = World(100)
    for bad in (-1, 100):
        with pytest.raises(IndexError):
            w.entity(bad)


_W = r"[A-Z][a-z]+"


def _any(words) -> str:
    return "(?:" + "|".join(words) + ")"


_SHAPES = {
    "person": rf"{_W} {_W}",
    "city": rf"{_W}{_any(names.CITY_END)}",
    "country": rf"{_W}{_any(names.COUNTRY_ENDINGS)}",
    "company": rf"{_W} {_any(names.COMPANY_NOUNS)}",
    "university": rf"University of {_W}|{_W} University|{_W} College|{_W} Institute of Technology",
    "river": rf"{_W} River",
    "mountain": rf"Mount {_W}|{_W} Peak",
    "film": (
        rf"The {_any(names.FILM_ADJECTIVES)} {_any(names.FILM_NOUNS)} of {_W}|The {_W} {_any(names.FILM_NOUNS)}"
        rf"|{_any(names.FILM_ADJECTIVES)} {_any(names.FILM_NOUNS)} over {_W}"
    ),
    "book": rf"{_any(names.BOOK_PLURALS)} of {_W}|The {_W} {_any(names.BOOK_PLURALS)}"
    rf"|A {_any(names.BOOK_NOUNS)} in {_W}",
    "event": rf"{_W} {_any(('Festival', 'Summit', 'Fair', 'Marathon'))}|Congress of {_W}",
}


def test_all_names_of_a_200k_world_are_unique_and_well_shaped() -> None:
    w = World(200_000, seed=11)
    seen = set()
    for t in schema.ENTITY_TYPES:
        shape = re.compile(_SHAPES[t])
        for eid in w.type_range(t):
            name = w.name(eid)
            assert shape.fullmatch(name), (t, name)
            seen.add(name)
    assert len(seen) == w.size


def _can_spell(token: names.Token, word: str) -> bool:
    """Whether some choice of the token's slots spells exactly `word`."""
    ends = {0}
    for slot in token:
        ends = {end + len(part) for end in ends for part in slot if word.startswith(part, end)}
    return len(word) in ends


def _tokens_disjoint(a: names.Token, b: names.Token) -> bool:
    """Whether two tokens can never spell the same word (conservative: False when unsure)."""
    syllable_a, syllable_b = a in names.SYLLABLE_TOKENS, b in names.SYLLABLE_TOKENS
    if syllable_a and syllable_b:  # equal words would need one last-slot ending to be a suffix of the other's
        return not any(x.endswith(y) or y.endswith(x) for x in a[-1] for y in b[-1])
    if syllable_a or syllable_b:
        syllable, literal = (a, b) if syllable_a else (b, a)
        return not any(_can_spell(syllable, word) for slot in literal for word in slot)
    return not set(a[0]) & set(b[0])


def test_name_pieces_decode_uniquely_and_patterns_are_disjoint() -> None:
    for token in names.SYLLABLE_TOKENS:
        for slot in token[:-1]:
            assert len(set(slot)) == len(slot)
            assert not [(a, b) for a in slot for b in slot if a != b and b.startswith(a)], "slot must be prefix-free"
        assert len(set(token[-1])) == len(token[-1])
    for patterns in names.PATTERNS.values():
        for pattern in patterns:  # syllable tokens aside, every token is one word chosen from a list
            assert all(token in names.SYLLABLE_TOKENS or len(token) == 1 for token in pattern)
    every = [(t, i, p) for t, patterns in names.PATTERNS.items() for i, p in enumerate(patterns)]
    for t, i, p in every:
        for u, j, q in every:
            if (t, i) < (u, j) and len(p) == len(q):
                assert any(_tokens_disjoint(x, y) for x, y in zip(p, q, strict=True)), (
                    f"{t} pattern {i} may collide with {u} {j}"
                )
    assert names.language_of("Ostravia") == "Ostravian"


def test_names_fit_a_million_page_world() -> None:
    for t, n in type_counts(1_000_000).items():
        assert names.Namer(t, n, seed=0)(n - 1)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1_000, 4_097])
def test_permutation_is_a_bijection(n: int) -> None:
    perm = names.Permutation(n, key=12345)
    assert sorted(perm(i) for i in range(n)) == list(range(n))


# -- facts ---------------------------------------------------------------------------------------


def _assert_well_formed(w: World, e: Entity) -> None:
    assert e.type == w.type_of(e.eid) and e.name == w.name(e.eid)
    assert e.doc_id == str(e.eid) and e.url == w.url(e.eid) == page_url(e.name)
    assert e.url.startswith(WORLD_URL_PREFIX) and " " not in e.url
    assert list(e.attrs) == [a.name for a in schema.attributes_of(e.type)]
    assert list(e.rels) == [r.name for r in schema.relations_of(e.type)]
    for a in schema.attributes_of(e.type):
        assert isinstance(e.attrs[a.name], str if a.kind == "label" else int)
    for r in schema.relations_of(e.type):
        target = e.rels[r.name]
        assert target != e.eid and 0 <= target < w.size and w.type_of(target) == r.target


def test_entities_are_well_formed(world: World, entities: list[Entity]) -> None:
    assert [e.eid for e in entities] == list(range(world.size))
    for e in entities:
        _assert_well_formed(world, e)


def test_capitals_belong_to_their_country(world: World, entities: list[Entity]) -> None:
    for country in world.type_range("country"):
        capital = world.entity(country).rels["capital"]
        assert world.entity(capital).rels["country"] == country
    for e in entities:
        if e.type == "city":
            assert world.entity(e.rels["country"]).attrs["population"] > e.attrs["population"]


def test_facts_are_plausible(world: World, entities: list[Entity]) -> None:
    def attr(eid: int, name: str) -> int | str:
        return world.entity(eid).attrs[name]

    born = {e.eid: e.attrs["birth_year"] for e in entities if e.type == "person"}
    assert all(1750 <= y <= 2000 for y in born.values())
    for e in entities:
        a, r = e.attrs, e.rels
        years = [v for x, v in a.items() if x.endswith("year")]
        assert all(y <= CURRENT_YEAR for y in years)
        if e.type == "person":
            assert a["occupation"] in OCCUPATIONS
        elif e.type == "city":
            assert 600 <= a["founded_year"] < 1750 and 1_000 <= a["population"] <= 20_000_000
        elif e.type == "country":
            assert 100_000 <= a["population"] <= 200_000_000 and a["currency"] in CURRENCIES
            assert a["official_language"] == names.language_of(e.name) and a["official_language"].endswith("n")
        elif e.type in ("company", "university"):
            assert a["founded_year"] >= born[r["founded_by"]] + 20
            assert 10 <= a.get("employees", a.get("students")) <= 200_000
            assert e.type == "university" or a["industry"] in INDUSTRIES
        elif e.type == "river":
            assert 10 <= a["length_km"] <= 7_000
            assert r["flows_through"] == world.entity(r["source"]).rels["country"]
        elif e.type == "mountain":
            assert 300 <= a["elevation_m"] <= 9_000
        elif e.type == "book":
            assert a["publication_year"] >= born[r["written_by"]] + 18 and a["genre"] in BOOK_GENRES
        elif e.type == "film":
            assert a["release_year"] >= born[r["directed_by"]] + 20 and a["genre"] in FILM_GENRES
            assert a["release_year"] >= attr(r["based_on"], "publication_year")
        elif e.type == "event":
            assert a["year"] >= attr(r["organised_by"], "founded_year") and 100 <= a["attendance"] <= 1_000_000


def test_caches_are_bounded() -> None:
    w = World(30_000, seed=5)
    for eid in range(0, 30_000, 3):
        w.page_row(w.entity(eid))
    for cache in (w._entity, w._name, w._url, w._birth_year, w._founding, w._authorship, w._country_population):
        info = cache.cache_info()
        assert info.maxsize is not None and info.currsize <= info.maxsize


# -- pages ---------------------------------------------------------------------------------------


def test_text_states_every_fact_in_prose_and_infobox(world: World, entities: list[Entity]) -> None:
    for e in entities:
        text = world.render_text(e)
        prose, infobox = text.split("\n\nInfobox\n")
        assert not text.startswith(e.name + "\n") and 400 <= len(text) <= 2_500
        for a in schema.attributes_of(e.type):
            shown = schema.format_value(a.kind, e.attrs[a.name])
            assert shown in prose, (e.name, a.name, shown)
            assert f": {shown}\n" in infobox
        for r in schema.relations_of(e.type):
            target = world.name(e.rels[r.name])
            assert target in prose, (e.name, r.name, target)
            assert f": {target}\n" in infobox
        assert len(prose.split("\n\n")) >= 2


def test_sentence_forms_vary(world: World, entities: list[Entity]) -> None:
    leads = {world.render_text(e).split(e.name, 2)[1][:12] for e in entities if e.type == "person"}
    assert len(leads) >= 3


def test_every_fact_has_a_group_that_always_states_it() -> None:
    for t, groups in TEMPLATES.items():
        fields = [a.name for a in schema.attributes_of(t)] + [r.name for r in schema.relations_of(t)]
        for field in fields:
            shown = ("{" + field + "}", "{a_" + field + "}")
            assert any(all(any(f in v for f in shown) for v in group) for group in groups), (t, field)


def test_html_states_the_same_facts_and_links(world: World, entities: list[Entity]) -> None:
    for e in entities[::7]:
        page = world.render_html(e)
        title = html.escape(e.name)
        assert page.startswith("<!DOCTYPE html>") and f"<title>{title}</title>" in page and f"<h1>{title}</h1>" in page
        assert '<table class="infobox">' in page and page.count("<p>") >= 2
        for a in schema.attributes_of(e.type):
            assert html.escape(schema.format_value(a.kind, e.attrs[a.name]), quote=False) in page
        for r in schema.relations_of(e.type):
            target = e.rels[r.name]
            link = f'<a href="{html.escape(world.url(target))}">{html.escape(world.name(target), quote=False)}</a>'
            assert page.count(link) >= 2, (e.name, r.name)  # in the prose and in the infobox


def test_page_row(world: World, entities: list[Entity]) -> None:
    for e in entities[::5]:
        row = world.page_row(e)
        assert list(row) == ["id", "title", "url", "text", "links"]
        assert row["id"] == e.doc_id and row["title"] == e.name and row["url"] == e.url
        assert row["text"] == world.render_text(e)
        urls = [world.url(e.rels[r.name]) for r in schema.relations_of(e.type)]
        assert row["links"] == list(dict.fromkeys(urls))


def test_written_rows(tmp_path: Path) -> None:
    w = World(300, seed=9)
    manifest = w.write(tmp_path, html=True)
    assert list(manifest) == ["format", "size", "seed", "counts", "files"]
    assert manifest["format"] == 1 and manifest["size"] == 300 and manifest["seed"] == 9
    assert manifest["counts"] == type_counts(300) and set(manifest["files"]) == set(FILES)
    corpus = [json.loads(line) for line in (tmp_path / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    kb = [json.loads(line) for line in (tmp_path / "kb.jsonl").read_text(encoding="utf-8").splitlines()]
    pages = [json.loads(line) for line in (tmp_path / "html.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(corpus) == len(kb) == len(pages) == 300
    for eid in (0, 150, 299):
        e = w.entity(eid)
        assert corpus[eid] == w.page_row(e)
        assert kb[eid] == {
            "id": e.doc_id,
            "type": e.type,
            "name": e.name,
            "url": e.url,
            "attrs": e.attrs,
            "rels": e.rels,
        }
        assert list(kb[eid]) == ["id", "type", "name", "url", "attrs", "rels"]
        assert pages[eid] == {"url": e.url, "html": w.render_html(e)}


def test_page_url_quotes_unsafe_titles() -> None:
    assert page_url("Kelda Voss") == WORLD_URL_PREFIX + "Kelda_Voss"
    assert page_url("A/B?c") == WORLD_URL_PREFIX + "A%2FB%3Fc"
