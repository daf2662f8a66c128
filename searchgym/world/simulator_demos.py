"""Demonstrations of the simulated search engine, cut from the world's pages (ZeroSearch's light fine-tune).

ZeroSearch (arXiv 2505.04588) fine-tunes its simulator LLM on a few examples so that it writes search results
at all, "useful" ones that hold the answer and "noisy" ones that do not. A small instruct model asked for
documents answers the query in a sentence instead (`searchgym bench simulated-search`), so searchgym writes such
examples from its synthetic world, where which page holds which answer is known:

- **The chat** is exactly what `SimulatedSearch` sends (`simulator_messages`: the prompt set's system prompt and
  its "useful" or "noisy" prompt for the query, n documents and the task's question and answers); the query is
  the question itself (as the bench asks it).
- **The reply** is n documents in the `Title:` / `URL:` / `Text:` form `parse_documents` reads:
  - useful: short passages of the page that holds the answer (the asked entity's page): each sentence that holds
    the answer, with the next sentence of its paragraph while the passage stays short, and the infobox lines that
    hold it; every useful passage holds the answer (checked);
  - noisy: the opening sentences of other pages, the asked entity's linked pages first (plausible near-misses)
    and then pages of the same type; none holds the answer in its title or text (checked).
- **Determinism.** A function of the world, the tasks and `seed`: the number of documents (1 to `max_docs`) and
  the noisy pages are drawn from a `random.Random` seeded by the seed and the task id.
- **Held out.** `demo_tasks` takes the questions after the ones a bench measures on, skipping any about the same
  entity, so no demonstrated question (nor its entity's page) is one the bench asks.
"""

from __future__ import annotations

import random
import re
from typing import Any

from searchgym.envs.answer_text import holds_answer
from searchgym.envs.tasks import Task
from searchgym.envs.tools.simulated_search import load_prompts, parse_documents, simulator_messages
from searchgym.world.paraphrase import paraphrase_set
from searchgym.world.world import World

KINDS = ("useful", "noisy")
MAX_WORDS = 30  # a passage grows by a sentence only while it stays this short: two documents fit the bench's 192 tokens
# one-hop questions asked of a world at most, per page: the paraphraser's stream skips repeated questions and never
# ends, so asking past the world's stock would wait forever (a 100-page world gives 400 and more)
QUESTIONS_PER_PAGE = 2
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")


def one_hop_tasks(world: World, n: int, seed: int) -> list[Task]:
    """The first n one-hop questions of the world as `bench simulated-search` asks them (paraphrase kind original)."""
    rows = paraphrase_set(world, n, seed=seed)
    return [t for t in rows if t.metadata.get("paraphrase_kind") == "original"][:n]


def demo_tasks(world: World, n: int, held_out: list[Task], seed: int) -> list[Task]:
    """n questions disjoint from `held_out` (the first len(held_out) questions of the same seed): the ones after
    them, none about an entity a held-out question asks about. Fewer when the world runs out."""
    drawn = len(held_out) + 2 * n + 8
    if drawn > QUESTIONS_PER_PAGE * len(world):  # the question stream is endless: past the world's stock it stalls
        raise ValueError(
            f"{n} demonstration questions beside {len(held_out)} held-out ones need up to {drawn} one-hop questions; "
            f"a world of {len(world)} pages is asked for at most {QUESTIONS_PER_PAGE * len(world)}"
        )
    questions = {t.question for t in held_out}
    entities = {t.metadata["entity_id"] for t in held_out}
    later = one_hop_tasks(world, drawn, seed)[len(held_out) :]
    picked = [t for t in later if t.question not in questions and t.metadata["entity_id"] not in entities]
    return picked[:n]


def sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(paragraph.strip()) if s.strip()]


def _page_parts(world: World, eid: int) -> tuple[list[list[str]], list[str]]:
    """A page's prose paragraphs (as sentences) and its infobox lines."""
    text = world.render_text(world.entity(eid))
    prose, _, infobox = text.partition("\n\nInfobox\n")
    return [sentences(p) for p in prose.split("\n\n") if p.strip()], [x for x in infobox.splitlines() if x.strip()]


def _short(passage: list[str], more: list[str]) -> str:
    for sentence in more:
        if len(" ".join([*passage, sentence]).split()) > MAX_WORDS:
            break
        passage = [*passage, sentence]
    return " ".join(passage)


def useful_passages(world: World, task: Task) -> list[str]:
    """Short passages of the answer page that hold the answer: its answer sentences, then its infobox's lines."""
    paragraphs, infobox = _page_parts(world, int(task.metadata["answer_doc_id"]))
    passages = []
    for para in paragraphs:
        for i, sentence in enumerate(para):
            if holds_answer(sentence, task.answers):
                passages.append(_short([sentence], para[i + 1 :]))
    lines = [line for line in infobox if holds_answer(line, task.answers)]
    if lines:
        passages.append(f"{world.name(int(task.metadata['answer_doc_id']))}. " + ". ".join(lines) + ".")
    return list(dict.fromkeys(p for p in passages if holds_answer(p, task.answers)))


def noisy_pages(world: World, task: Task, rng: random.Random) -> list[tuple[str, str, str]]:
    """(title, url, passage) of other pages that do not hold the answer: linked pages first, then the same type's."""
    entity = world.entity(int(task.metadata["answer_doc_id"]))
    linked = list(dict.fromkeys(entity.rels.values()))
    rng.shuffle(linked)
    kin = world.type_range(entity.type)
    same = rng.sample(kin, min(12, len(kin)))
    out = []
    for eid in dict.fromkeys([*linked, *same]):
        if eid == entity.eid:
            continue
        paragraphs, _ = _page_parts(world, eid)
        passage = _short(paragraphs[0][:1], paragraphs[0][1:])
        title = world.name(eid)
        if not holds_answer(f"{title} {passage}", task.answers):
            out.append((title, world.url(eid), passage))
    return out


def _documents(docs: list[tuple[str, str, str]]) -> str:
    return "\n\n".join(f"Title: {title}\nURL: {url}\nText: {text}" for title, url, text in docs)


def demonstration(world: World, task: Task, kind: str, prompts: dict[str, str], n: int, seed: int) -> dict[str, Any]:
    """One chat: the simulator's messages for n documents of `kind` on the task's question, and the reply."""
    rng = random.Random(f"{seed}\x00{task.id}\x00{kind}")
    if kind == "useful":
        page = world.entity(int(task.metadata["answer_doc_id"]))
        docs = [(page.name, page.url, passage) for passage in useful_passages(world, task)[:n]]  # never a repeat
    else:
        docs = noisy_pages(world, task, rng)[:n]
    reply = _documents(docs)
    messages = simulator_messages(prompts, kind, task.question, len(docs), (task.question, tuple(task.answers)))
    parse_documents(reply)  # a demonstration the engine could not read teaches nothing
    return {"messages": [*messages, {"role": "assistant", "content": reply}], "kind": kind, "task_id": task.id}


def simulator_demos(
    world: World, tasks: list[Task], *, prompt_set: str = "answer_aware", max_docs: int = 4, seed: int = 0
) -> list[dict[str, Any]]:
    """A useful and a noisy demonstration per task, under the packaged prompt set `prompt_set`; rows are
    {"messages": [system, user, assistant], "kind", "task_id"} (JSONL-ready for `searchgym sft`)."""
    prompts = load_prompts(prompt_set)
    out: list[dict[str, Any]] = []
    for task in tasks:
        n = random.Random(f"{seed}\x00{task.id}").randint(1, max_docs)
        if not useful_passages(world, task):
            continue  # cannot happen for a one-hop question (its page states the answer); never a false demo
        out.extend(demonstration(world, task, kind, prompts, n, seed) for kind in KINDS)
    return out
