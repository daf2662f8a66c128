"""Demonstrations of every step of the QA-synthesis agent, written from the synthetic world's KB.

SmolLM2-135M-Instruct loses 55 of 56 seeds to replies without the JSON a step asks for (`searchgym bench
synthesis`). As for the simulator (`world/simulator_demos.py`), the remedy is a light fine-tune on demonstrations.
They are made by running the agent itself over demonstration seed pages with `KBWriter` as its model and judge: a
chat model that answers each step's prompt from the world's KB and records the call, so each demonstration is the
agent's exact messages and a reply its parser takes. Per seed entity E:

- **read**: the page's first two sentences as the summary; one point per fact of the infobox ("E — Label: value").
- **propose**: the question kbwalk asks of one fact of E (`kbwalk.QUESTION`), a fact its description leaves out,
  so fuzzing never gives the answer away; the statement is that fact's point.
- **act**: FUZZ first, replacing E's name by kbwalk's description of E, only when the KB shows that no other
  entity fits it; then INJECT a linked page L named in that description, when L too has a description only it fits;
  then EXIT. The **inject** reply states L's description and puts it in the question in place of L's name.
- **quality**: all four flags true for a question the KB wrote with its answer; "supported" false for the same
  question with another answer (a corrupted copy checked once per `corrupt_every` seeds).
- **solve**: a guess, a value of the answer's kind drawn from another entity: a tool-free solver knows no fact of a
  fictional world, so the demonstrations teach the reply's form, never an answer.
- **judge** (ASearcher's grading prompt): Correct exactly when the prediction is one of the answer's aliases; the
  reply first sets the two answers side by side and says whether they are the same, then gives the verdict block.
- **uniqueness**: an alternative fits only when it is one of the answer's aliases (every relation and attribute of
  the world is functional).

The writer is deterministic in (world, seed). Demonstration seeds are disjoint from the pages a bench measures
(`demo_seed_pages`).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from searchgym.envs.answer_text import holds_answer, normalize_answer
from searchgym.envs.llm_judge import JUDGE_PROMPT
from searchgym.envs.tools.base import PageBackend, SearchBackend
from searchgym.synthesis.prompts import (
    ACT_PROMPT,
    INJECT_PROMPT,
    PROPOSE_PROMPT,
    QUALITY_PROMPT,
    READ_PROMPT,
    SOLVE_PROMPT,
    UNIQUE_PROMPT,
)
from searchgym.synthesis.qa_agent import CallFailure, Candidate, QAConfig, QASynthesisAgent, Rejected
from searchgym.world import schema
from searchgym.world.kbwalk import DESCRIPTIONS, NAMED_PREFIX, QUESTION, KBWalker
from searchgym.world.page_templates import LABELS
from searchgym.world.simulator_demos import sentences
from searchgym.world.world import Entity, World

# Each prompt is known by its first line (the judge's by its opening sentence).
STEPS = {
    prompt.splitlines()[0]: step
    for prompt, step in (
        (READ_PROMPT, "read"),
        (PROPOSE_PROMPT, "propose"),
        (ACT_PROMPT, "act"),
        (INJECT_PROMPT, "inject"),
        (QUALITY_PROMPT, "quality"),
        (SOLVE_PROMPT, "solve"),
        (UNIQUE_PROMPT, "uniqueness"),
        (JUDGE_PROMPT, "judge"),
    )
}
_TITLE = re.compile(r'From the information points of the page "(.*)", write')


@dataclass
class Plan:
    """What the KB writes for one seed entity: the question at each edit, its answer's aliases and statements."""

    entity: Entity
    fact: str  # the relation or attribute asked about
    answers: tuple[str, ...]
    statement: str
    questions: list[str]  # the proposed question, then after FUZZ, then after INJECT (as far as the KB allows)
    fuzz_reason: str = ""
    inject: tuple[str, str] | None = None  # (url, statement) of the injected linked page
    guesses: int = 0


def _line(prompt: str, label: str) -> str:
    """The rest of the prompt's first line that starts with `label`."""
    for line in prompt.splitlines():
        if line.startswith(label):
            return line[len(label) :].strip()
    return ""


def _reply(obj: dict[str, Any], lead: str = "") -> str:
    return (lead + "\n" if lead else "") + json.dumps(obj, ensure_ascii=False)


class KBWriter:
    """A chat model (`achat`) that answers the synthesis agent's prompts from the world's KB; `records` keeps each call
    as {"messages": [...the agent's, the reply], "step"}."""

    def __init__(self, world: World, seed: int = 0) -> None:
        self.world = world
        self.seed = seed
        self.walker = KBWalker(world, seed=seed)
        self.records: list[dict[str, Any]] = []
        self._by_url: dict[str, int] | None = None
        self._by_title: dict[str, int] | None = None
        self._plans: dict[int, Plan | None] = {}
        self._by_question: dict[str, Plan] = {}

    async def achat(self, messages: list[dict[str, str]], **sampling: Any) -> str:
        prompt = str(messages[-1]["content"])
        step = STEPS.get(prompt.splitlines()[0] if prompt else "", "unknown")
        reply = getattr(self, f"_{step}", self._unknown)(prompt)
        self.records.append({"messages": [*messages, {"role": "assistant", "content": reply}], "step": step})
        return reply

    # --- the plan of a seed entity -----------------------------------------------------------------------------

    def entity_at(self, url: str) -> Entity | None:
        """The entity whose page is at `url` (None for a page outside the world)."""
        if self._by_url is None:
            self._by_url = {e.url: e.eid for e in self.world}
        eid = self._by_url.get(url)
        return None if eid is None else self.world.entity(eid)

    def entity_named(self, title: str) -> Entity | None:
        """The entity whose page has the title `title`; names are unique in a world."""
        if self._by_title is None:
            self._by_title = {e.name: e.eid for e in self.world}
        eid = self._by_title.get(title)
        return None if eid is None else self.world.entity(eid)

    @property
    def questions(self) -> list[str]:
        """Every question the writer has planned (each plan's, at each edit)."""
        return list(self._by_question)

    def plan_of(self, question: str) -> Plan | None:
        """The plan that wrote `question` (at any of its edits)."""
        return self._by_question.get(question)

    def plan(self, entity: Entity) -> Plan | None:
        """The KB's trajectory for `entity` (None when no fact of it makes a question that keeps its answer hidden)."""
        if entity.eid not in self._plans:
            self._plans[entity.eid] = plan = self._make_plan(entity)
            if plan is not None:
                self._by_question.update((q, plan) for q in plan.questions)
        return self._plans[entity.eid]

    def _make_plan(self, entity: Entity) -> Plan | None:
        rng = random.Random(f"{self.seed}\x00{entity.eid}")
        described = set(DESCRIPTIONS.get(entity.type, ((), ""))[0])
        facts = [f for f in self.facts(entity) if f not in described] or self.facts(entity)
        rng.shuffle(facts)
        for fact in facts:
            answers = self.answers(entity, fact)
            named = NAMED_PREFIX.get(entity.type, "") + entity.name
            question = _ask(fact, entity, named)
            if holds_answer(question, answers):
                continue
            plan = Plan(entity, fact, answers, self.point(entity, fact), [question])
            self._edits(plan, described)
            return plan
        return None

    def _edits(self, plan: Plan, described: set[str]) -> None:
        """FUZZ (the entity's unique description) and INJECT (a linked page's), as far as the KB allows."""
        entity = plan.entity
        description = self.walker.description(entity) if plan.fact not in described else None
        if description is None or holds_answer(_ask(plan.fact, entity, description), plan.answers):
            return
        plan.questions.append(_ask(plan.fact, entity, description))
        plan.fuzz_reason = f"the name {entity.name} is replaced by a description that only it fits"
        for relation in DESCRIPTIONS[entity.type][0]:
            if relation not in entity.rels:
                continue
            linked = self.world.entity(entity.rels[relation])
            linked_description = self.walker.description(linked)
            question = plan.questions[-1]
            if linked_description is None or linked.name not in question:
                continue
            injected = question.replace(linked.name, linked_description, 1)
            if not holds_answer(injected, plan.answers):
                plan.questions.append(injected)
                plan.inject = (linked.url, f"{linked.name} is {linked_description}.")
                return

    def facts(self, entity: Entity) -> list[str]:
        """The entity's attributes, then its relations (the infobox's order)."""
        return [a.name for a in schema.attributes_of(entity.type)] + [r.name for r in schema.relations_of(entity.type)]

    def value(self, entity: Entity, fact: str) -> str:
        if fact in entity.rels:
            return self.world.name(entity.rels[fact])
        return schema.format_value(schema.attribute(entity.type, fact).kind, entity.attrs[fact])

    def answers(self, entity: Entity, fact: str) -> tuple[str, ...]:
        if fact in entity.rels:
            return (self.world.name(entity.rels[fact]),)
        return tuple(schema.answer_aliases(schema.attribute(entity.type, fact).kind, entity.attrs[fact]))

    def point(self, entity: Entity, fact: str) -> str:
        return f"{entity.name} — {LABELS[entity.type, fact]}: {self.value(entity, fact)}"

    def guess(self, plan: Plan) -> str:
        """A value of the answer's kind taken from another entity (never one of the answer's aliases)."""
        rng = random.Random(f"{self.seed}\x00{plan.entity.eid}\x00guess\x00{plan.guesses}")
        plan.guesses += 1
        entity, fact = plan.entity, plan.fact
        for _ in range(32):
            if fact in entity.rels:
                target_type = self.world.type_of(entity.rels[fact])
                block = self.world.type_range(target_type)
                candidate = self.world.name(block[rng.randrange(len(block))])
            else:
                block = self.world.type_range(entity.type)
                candidate = self.value(self.world.entity(block[rng.randrange(len(block))]), fact)
            if not self.is_answer(candidate, plan.answers):
                return candidate
        return "unknown"

    @staticmethod
    def is_answer(text: str, answers: tuple[str, ...] | list[str]) -> bool:
        return normalize_answer(text) in {normalize_answer(a) for a in answers}

    # --- one reply per step ------------------------------------------------------------------------------------

    def _read(self, prompt: str) -> str:
        entity = self.entity_at(_line(prompt, "URL:"))
        if entity is None:
            return _reply({"summary": "", "points": []}, "This page is not one I can read.")
        prose = self.world.render_text(entity).partition("\n\nInfobox\n")[0]
        summary = " ".join(sentences(prose.split("\n\n")[0])[:2])
        return _reply({"summary": summary, "points": [self.point(entity, f) for f in self.facts(entity)]})

    def _propose(self, prompt: str) -> str:
        match = _TITLE.search(prompt)
        entity = self.entity_named(match.group(1)) if match else None
        plan = self.plan(entity) if entity is not None else None
        if plan is None:
            return "No fact of this page makes a question whose answer stays hidden."
        return _reply({"question": plan.questions[0], "answer": plan.answers[0], "statement": plan.statement})

    def _act(self, prompt: str) -> str:
        question = _line(prompt, "Current question:")
        plan = self.plan_of(question)
        at = plan.questions.index(question) if plan else -1
        if plan is None or at == len(plan.questions) - 1:
            return _reply({"action": "EXIT"})
        if at == 0:
            reason = plan.fuzz_reason
            return _reply(
                {"action": "FUZZ", "question": plan.questions[1], "answer": plan.answers[0], "reason": reason}
            )
        assert plan.inject is not None  # a third question exists only after an inject
        return _reply({"action": "INJECT", "url": plan.inject[0]})

    def _inject(self, prompt: str) -> str:
        plan = self.plan_of(_line(prompt, "Current question:"))
        if plan is None or plan.inject is None:
            return "Nothing of this page fits the question."
        return _reply({"statement": plan.inject[1], "question": plan.questions[-1], "answer": plan.answers[0]})

    def _quality(self, prompt: str) -> str:
        plan = self.plan_of(_line(prompt, "Question:"))
        answer = _line(prompt, "Answer:")
        if plan is None:
            flags = dict.fromkeys(("fluent", "self_contained", "unique_answer", "supported"), False)
            return _reply({**flags, "reason": "The question is not one the statements describe."})
        supported = self.is_answer(answer, plan.answers)
        reason = (
            f"One fluent question, and the statements give {plan.answers[0]} as its only answer."
            if supported
            else f"The statements give {plan.answers[0]}, not {answer}."
        )
        flags = {"fluent": True, "self_contained": True, "unique_answer": True, "supported": supported}
        return _reply({**flags, "reason": reason})

    def _solve(self, prompt: str) -> str:
        plan = self.plan_of(_line(prompt, "Question:"))
        guess = self.guess(plan) if plan is not None else "unknown"
        return _reply({"answer": guess}, "I have no source for this, so this is a guess.")

    def _judge(self, prompt: str) -> str:
        references = _line(prompt, "Labelled answer(s):").split(" | ")
        prediction = _line(prompt, "Predicted answer:")
        plan = self.plan_of(_line(prompt, "Question:"))
        correct = self.is_answer(prediction, [*references, *(plan.answers if plan else ())])
        # the comparison spelled out before the verdict (the two answers side by side, then "Same:"): copying the
        # rationale "X is (not) the labelled answer Y" taught SmolLM2 the form of a verdict, not the comparison
        same = "yes" if correct else "no"
        rationale = f"{prediction} {'is' if correct else 'is not'} {references[0]}."
        verdict = _reply({"rationale": rationale, "judgement": "Correct" if correct else "Incorrect"})
        return f"Predicted: {prediction}\nLabelled: {references[0]}\nSame: {same}\n```json\n{verdict}\n```"

    def _uniqueness(self, prompt: str) -> str:
        intended, alternative = _line(prompt, "Intended answer:"), _line(prompt, "Alternative answer:")
        plan = self.plan_of(_line(prompt, "Question:"))
        fits = self.is_answer(alternative, [intended, *(plan.answers if plan else ())])
        reason = (
            f"{alternative} is another way of writing {intended}."
            if fits
            else f"The statements give {intended}; {alternative} does not fit them."
        )
        return _reply({"satisfies_all": fits, "reason": reason})

    def _unknown(self, prompt: str) -> str:
        return "I do not know this task."


def _ask(fact: str, entity: Entity, phrase: str) -> str:
    question = QUESTION[entity.type, fact].format(x=phrase)
    return question[0].upper() + question[1:]


def demo_seed_pages(urls: list[str], measured: int, n: int) -> list[str]:
    """The demonstration seeds: the `n` pages after the first `measured` of the seeded order (never one measured)."""
    return urls[measured : measured + n]


def correct_spellings(answer: str, plan: Plan | None) -> list[str]:
    """Two right answers in other spellings than `answer`: another alias where the fact has one, and lower case."""
    aliases = [a for a in (plan.answers if plan else ()) if a != answer]
    return list(dict.fromkeys([*aliases[:1], answer.lower(), f"the {answer}"]))[:2]


async def _record(agent: QASynthesisAgent, writer: KBWriter, urls: list[str], corrupt_every: int) -> dict[str, int]:
    outcomes = {"accepted": 0, "rejected": 0, "corrupted": 0}
    for i, url in enumerate(urls):
        first = len(writer.records)
        try:
            await _one_seed(agent, writer, url, i, corrupt_every, outcomes)
        finally:
            for record in writer.records[first:]:
                record["seed_page"] = url
    return outcomes


async def _one_seed(
    agent: QASynthesisAgent, writer: KBWriter, url: str, i: int, corrupt_every: int, outcomes: dict[str, int]
) -> None:
    """The agent's run on one seed, then the judge on right answers and quality on a wrong one."""
    try:
        candidate = await agent.run(url)
    except (Rejected, CallFailure):
        outcomes["rejected"] += 1
        return
    outcomes["accepted"] += 1
    for spelling in correct_spellings(candidate.answer, writer.plan_of(candidate.question)):
        # the judge grading right answers too (the solver's guesses it grades are all wrong)
        await agent.judge.ajudge(spelling, [candidate.answer], question=candidate.question)
    if corrupt_every and i % corrupt_every == 0:  # the quality check refusing an answer the statements do not give
        plan = writer.plan_of(candidate.question)
        assert plan is not None  # the writer wrote every accepted question
        wrong = Candidate(candidate.question, writer.guess(plan), candidate.statements, candidate.pages)
        try:
            await agent.check(wrong)
        except Rejected:
            outcomes["corrupted"] += 1


@dataclass
class Demos:
    """The recorded calls ({"messages": [user, assistant], "step"}, JSONL-ready), the demonstration seeds' outcomes
    ({"accepted", "rejected", "corrupted"}) and every question the KB wrote (to tell a copied one later)."""

    records: list[dict[str, Any]]
    outcomes: dict[str, int]
    questions: set[str]


def synthesis_demos(
    world: World,
    pages: PageBackend,
    search: SearchBackend | None,
    urls: list[str],
    *,
    seed: int = 0,
    config: QAConfig | None = None,
    corrupt_every: int = 4,
) -> Demos:
    """The calls of the agent run over `urls` with `KBWriter` as its model and judge, recorded."""
    writer = KBWriter(world, seed)
    agent = QASynthesisAgent(search, pages, writer, writer, config or QAConfig())
    outcomes = asyncio.run(_record(agent, writer, urls, corrupt_every))
    return Demos(writer.records, outcomes, set(writer.questions))
