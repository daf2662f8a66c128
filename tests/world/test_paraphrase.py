"""Paraphrased questions (world/paraphrase.py): the invariants of its spec, on small worlds."""

import random
import re
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.envs.judges import normalize_answer
from searchgym.world import schema
from searchgym.world.kbwalk import NAMED_PREFIX, QUESTION
from searchgym.world.paraphrase import (
    DESCRIPTIONS,
    KINDS,
    MAX_EDITS,
    SYNONYM_QUESTION,
    content_words,
    edit_distance,
    misspell,
    paraphrase_set,
)
from searchgym.world.world import World

WORLDS = {size: World(size, seed) for size, seed in ((100, 0), (400, 3))}  # made once: a World is a pure function


def _fact(world, entity, field):
    """A fact of an entity as pages and answers write it."""
    if field in entity.rels:
        return world.name(entity.rels[field])
    return schema.format_value(schema.attribute(entity.type, field).kind, entity.attrs[field])


def _groups(tasks):
    """The rows of each question, in order."""
    groups = {}
    for task in tasks:
        groups.setdefault(task.metadata["question_id"], []).append(task)
    return list(groups.values())


def _names(question, name):
    """Whether the question holds the name as whole words."""
    return re.search(rf"\b{re.escape(name)}\b", question) is not None


def _outside(question, name):
    """The question's content words other than the name's."""
    return content_words(question) - content_words(name)


@settings(max_examples=200, deadline=None)
@given(
    word=st.text(alphabet=string.ascii_lowercase, min_size=3, max_size=12).map(str.capitalize),
    seed=st.integers(0, 2**32),
    edits=st.integers(1, MAX_EDITS),
)
def test_a_misspelling_differs_within_its_edits_and_keeps_the_first_letter(word, seed, edits):
    out = misspell(word, random.Random(seed), edits)
    assert out != word
    assert 1 <= edit_distance(word, out) <= edits
    assert out[0] == word[0]


def test_edit_distance_counts_swaps_as_one_edit():
    assert edit_distance("Therth", "Therth") == 0
    assert edit_distance("Therth", "Tehrth") == 1  # adjacent swap
    assert edit_distance("Therth", "Thert") == 1
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("abc", "") == 3


def test_every_question_has_a_synonym_that_shares_no_content_word():
    assert set(SYNONYM_QUESTION) == set(QUESTION)
    for key, template in SYNONYM_QUESTION.items():
        assert "{x}" in template
        assert not content_words(template.replace("{x}", "")) & content_words(QUESTION[key].replace("{x}", "")), key


@settings(max_examples=12, deadline=None)
@given(size=st.sampled_from(sorted(WORLDS)), seed=st.integers(0, 10**6))
def test_paraphrases_keep_answers_and_answer_page_and_differ_from_the_original(size, seed):
    world = WORLDS[size]
    tasks = paraphrase_set(world, 6, seed=seed)
    groups = _groups(tasks)
    assert len(groups) == 6 and len(tasks) == 6 * len(KINDS)
    names = {world.name(eid) for eid in range(world.size)}
    for rows in groups:
        assert [r.metadata["paraphrase_kind"] for r in rows] == list(KINDS)
        original = rows[0]
        entity = world.entity(int(original.metadata["answer_doc_id"]))
        asked = original.metadata["asked"]
        # the answer is the asked fact of the entity whose page it is
        assert original.answers[0] == _fact(world, entity, asked)
        assert original.metadata["answer_page"] == entity.url
        for row in rows[1:]:
            kind = row.metadata["paraphrase_kind"]
            assert row.answers == original.answers, kind
            assert row.metadata["answer_page"] == entity.url and row.metadata["original"] == original.question
            assert row.question != original.question, kind
            padded = f" {normalize_answer(row.question)} "
            assert not any(f" {normalize_answer(a)} " in padded for a in row.answers), (kind, row.question)
            if "misspelled_name" in row.metadata:
                wrong = row.metadata["misspelled_name"]
                assert 1 <= edit_distance(entity.name, wrong) <= MAX_EDITS
                assert wrong not in names and not _names(row.question, entity.name)
            if kind == "misspelled":
                assert row.question.replace(row.metadata["misspelled_name"], entity.name) == original.question
            if kind.startswith("synonym"):
                prefix = NAMED_PREFIX.get(entity.type, "")  # "the book ": part of how the question names it
                shown = prefix + row.metadata.get("misspelled_name", entity.name)
                words = _outside(row.question, shown) & _outside(original.question, prefix + entity.name)
                assert not words, row.question
            if kind == "described":
                fields = tuple(row.metadata["description_fields"])
                assert asked not in fields and not _names(row.question, entity.name)
                template = dict(DESCRIPTIONS[entity.type])[fields]
                text = row.metadata["description"]
                assert text in row.question
                fits = [
                    eid
                    for eid in world.type_range(entity.type)
                    if template.format(**{f: _fact(world, world.entity(eid), f) for f in fields}) == text
                ]
                assert fits == [entity.eid]  # the description fits this entity alone


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_the_set_is_a_function_of_the_seed_and_its_first_questions_do_not_depend_on_n(seed):
    world = WORLDS[400]
    tasks = paraphrase_set(world, 5, seed=seed)
    assert tasks == paraphrase_set(world, 5, seed=seed)
    assert paraphrase_set(world, 2, seed=seed) == tasks[: 2 * len(KINDS)]
