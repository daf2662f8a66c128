"""A proof of how many tool calls a question needs, found by playing the env's own tools.

`MinCallsProver.prove(task, limit)` computes the fewest search/access calls after which an agent has
*observed the answer*, over every play whose calls come from a stated, bounded action set, and returns
one play of that length (the witness, which the oracle then replays through the env).

What the proof quantifies over (the full action space is infinite, so this is the model):

Names found in parts 1..k of a page, joined, are formable after its k-th access (a name cut across
two parts counts).

* Queries an agent may search at any point:
  - the question verbatim, and the task's `start_query` (the start's name or its description);
  - the answer's own spellings verbatim (every alias: a conservative "lucky guess");
  - every entity name that occurs in the question or in any observation seen so far (search
    snippets, titles, page parts), and each such name followed by the question's keywords (its words
    that are neither stopwords nor part of a name), e.g. "Orvane Mills year university founded".
* Urls an agent may access: the url of every search hit seen so far, and the page url of every name
  allowed as a query (an agent that guesses urls from names), the answer's own name included.
  Accessing a url for the k-th time returns its k-th part, as the env does.

*Observed the answer*: a search hit of the answer page (the last page of the walk) whose text contains
the answer as that page states it, or parts 1..k of that page, joined (a play that reads part k has
read the parts before it, so a fact cut across two parts counts once both are read), or, when the
answer is an entity, a hit or parts of the answer entity's own page whose text names the answer
page's entity (a fact stated from the other end, e.g. "X is the capital of Y").

Why the search below is exact for this model: every action needs one observed item (a name or a url)
and nothing else, and an observation depends only on the call (never on the task or on earlier calls),
apart from a url's part number. So the cheapest play that makes a call is the cheapest play that
enables its item plus the call: with enable(x) the fewest calls after which item x is formable (0 for
items from the question), a search for q costs enable(q) + 1 and the k-th part of url u costs
enable(u) + k. By induction on play length, the call at position i of any play has cost <= i, so a
Dijkstra search (unit costs) over calls, in order of cost, finds the least cost of a call that observes
the answer, and the back-pointers give a play of exactly that length. The proof records how many calls
it explored and that every call of cost below the bound was explored.
"""

from __future__ import annotations

import heapq
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from searchgym.envs.search_env import SearchEnv
from searchgym.envs.tasks import Task, TaskPool
from searchgym.world.world import World, page_url

PROOF_VERSION = 2
QUERY_SET = (
    "question verbatim; start_query; every answer alias verbatim; every entity name in the question or in "
    "any observation so far; each such name followed by the question's keywords"
)
URL_SET = "every search hit's url seen so far; page_url(name) of every name allowed as a query (answer included)"
_STOP = frozenset(
    "a an the of in on at by to for from and or is was were which who what whom whose how many much "
    "does did do has have had with into through where when that this".split()
)
_DOC = re.compile(r"\[Doc \d+\]\((?P<url>[^)\s]*)\):\n")
_WORD = re.compile(r"[^\s,.;:?!()\"]+")
_PART = re.compile(r">>>> Page \d+ >>>> \(of \d+\) [^\n]*\n(?P<body>.*)\n\[[^\]\n]*\]\n</information>$", re.S)


def part_body(observation: str) -> str:
    """The page text of an access observation (its part, without the env's header and note)."""
    match = _PART.search(observation)
    return match.group("body") if match else observation


@dataclass(frozen=True)
class Call:
    """One tool call: a search for `arg`, or the `part`-th access of the url `arg`."""

    tool: str
    arg: str
    part: int = 0


@dataclass
class Proof:
    """The least number of calls that observes the answer, one play of that length, and what was searched."""

    min_calls: int | None  # None: no play of at most `limit` calls observes it
    play: list[tuple[str, str]]  # the witness: (tool, argument) per call
    explored_calls: int
    limit: int
    detail: dict[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        """What a task records about its proof."""
        return {
            "version": PROOF_VERSION,
            "min_calls": self.min_calls,
            "play": [list(c) for c in self.play],
            "explored_calls": self.explored_calls,
            "queries": QUERY_SET,
            "urls": URL_SET,
            **self.detail,
        }


class _Names:
    """Finds the world's entity names in a text: every name that starts at a word and occurs there whole."""

    def __init__(self, world: World):
        self.by_first: dict[str, list[str]] = defaultdict(list)
        for eid in range(world.size):
            name = world.name(eid)
            first = _WORD.match(name)
            if first:
                self.by_first[first.group()].append(name)

    def find(self, text: str) -> set[str]:
        found = set()
        for m in _WORD.finditer(text):
            for name in self.by_first.get(m.group(), ()):
                if text.startswith(name, m.start()):
                    found.add(name)
        return found


class MinCallsProver:
    """Plays calls through a SearchEnv (with the settings the questions will be served with) and caches them.

    Observations of search and access depend on the call alone, so one prover serves every task of a
    world; `env_settings` are recorded in each proof so a served env can be checked against them.
    """

    @classmethod
    def over(cls, world: World, index: Any, **env_settings: Any) -> MinCallsProver:
        """A prover playing through a fresh SearchEnv over `index` with these settings (and a turn budget
        that never truncates a probe)."""
        placeholder = TaskPool([Task("probe", "probe", ("probe",), {})])
        return cls(world, SearchEnv(placeholder, index, index, judge="em", **{**env_settings, "max_turns": 100_000}))

    def __init__(self, world: World, env: SearchEnv):
        self.world, self.env = world, env
        self.names = _Names(world)
        self._search: dict[str, list[tuple[str, str]]] = {}  # query -> [(url, hit text)]
        self._pages: dict[str, list[str]] = {}  # url -> parts
        self._found: dict[str, list[str]] = {}  # observed text -> entity names in it
        self.env_settings = {
            "top_k": env.top_k,
            "doc_chars": env.doc_chars,
            "page_chunk_chars": env.page_chunk_chars,
            "max_page_chars": env.max_page_chars,
            "max_page_chunks": env.max_page_chunks,
        }

    # --- the env's tools, cached --------------------------------------------------------------

    async def _step(self, action: str) -> tuple[str, dict[str, Any]]:
        if self.env._done or self.env.turn >= self.env.max_turns - 1:
            await self.env.areset(options={"index": 0})
        obs, _, _, _, info = await self.env.astep(action)
        return obs, info

    async def search(self, query: str) -> list[tuple[str, str]]:
        """(url, text) of each hit the env shows for this query."""
        if query not in self._search:
            obs, info = await self._step(f"<search>{query}</search>")
            parts = _DOC.split(obs)  # [head, url1, text1, url2, text2, ...]
            self._search[query] = [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
        return self._search[query]

    async def page(self, url: str) -> list[str]:
        """Every part the env serves of this url, in order (empty when the page is unknown)."""
        if url not in self._pages:
            await self.env.areset(options={"index": 0})  # a fresh page cursor
            parts: list[str] = []
            for _ in range(self.env.max_page_chunks):
                obs, info = await self._step(f"<access>{url}</access>")
                page = info.get("page")
                if not page or page.get("chunk") is None:
                    break
                parts.append(obs)
                if page["chunk"] >= page["chunks"]:
                    break
            self._pages[url] = parts
        return self._pages[url]

    def _names_in(self, text: str) -> list[str]:
        """The entity names in an observed text, sorted (cached: the same texts recur across calls and tasks)."""
        if text not in self._found:
            self._found[text] = sorted(self.names.find(text))
        return self._found[text]

    def read(self, url: str, part: int) -> str:
        """The text of parts 1..part of a page (already fetched with `page`), joined: what k accesses have shown."""
        return "".join(part_body(obs) for obs in self._pages[url][:part])

    # --- the proof ----------------------------------------------------------------------------

    async def prove(self, task: Task, limit: int) -> Proof:
        """The least number of calls (at most `limit`) after which the answer is observed, with a witness play."""
        meta = task.metadata
        answer_url, answer_text = meta["answer_page"], meta["answer_on_page"]
        last_name = meta["path"][-1]["name"]
        answer_entity_url = page_url(task.answers[0]) if meta.get("answer_type") == "entity" else None
        question_names = self.names.find(task.question)
        keywords = " ".join(
            w
            for w in _WORD.findall(task.question)
            if w.lower() not in _STOP and not any(w in n.split() for n in question_names)
        )

        def goal(url: str, text: str) -> bool:
            if url == answer_url and answer_text in text:
                return True
            return url == answer_entity_url and last_name in text

        enabled: dict[tuple[str, str], int] = {}  # ("q"|"u", item) -> cost at which it became formable
        parent: dict[Call, Call | None] = {}
        heap: list[tuple[int, int, Call]] = []
        seq = 0

        def enable(kind: str, item: str, cost: int, via: Call | None) -> None:
            nonlocal seq
            if not item or (kind, item) in enabled:
                return
            enabled[kind, item] = cost
            call = Call("search", item) if kind == "q" else Call("access", item, 1)
            parent[call] = via
            seq += 1
            heapq.heappush(heap, (cost + 1, seq, call))

        def enable_name(name: str, cost: int, via: Call | None) -> None:
            enable("q", name, cost, via)
            if keywords:
                enable("q", f"{name} {keywords}", cost, via)
            enable("u", page_url(name), cost, via)

        enable("q", task.question, 0, None)
        enable("q", meta.get("start_query", ""), 0, None)
        for alias in task.answers:
            enable("q", alias, 0, None)
        if answer_entity_url:
            enable("u", answer_entity_url, 0, None)
        for name in sorted(question_names):
            enable_name(name, 0, None)

        explored = 0
        while heap:
            cost, _, call = heapq.heappop(heap)
            if cost > limit:
                break
            explored += 1
            if call.tool == "search":
                segments = await self.search(call.arg)
            else:
                parts = await self.page(call.arg)
                if call.part > len(parts):
                    continue
                segments = [(call.arg, self.read(call.arg, call.part))]
                if call.part < len(parts):
                    nxt = Call("access", call.arg, call.part + 1)
                    parent[nxt] = call
                    seq += 1
                    heapq.heappush(heap, (cost + 1, seq, nxt))
            if any(goal(url, text) for url, text in segments):
                return Proof(
                    cost,
                    self._play(call, parent),
                    explored,
                    limit,
                    {"env": self.env_settings, "explored_below_bound": True},
                )
            for url, text in segments:
                enable("u", url, cost, call)
                for name in self._names_in(text):
                    enable_name(name, cost, call)
        return Proof(None, [], explored, limit, {"env": self.env_settings})

    @staticmethod
    def _play(call: Call, parent: dict[Call, Call | None]) -> list[tuple[str, str]]:
        """The witness: the chain of calls that enabled `call`, then the call (and the parts before it)."""
        play: list[tuple[str, str]] = []
        node: Call | None = call
        while node is not None:
            play.append((node.tool, node.arg))
            node = parent.get(node)
        return play[::-1]
