"""The LLM judge parses what a judge model writes, and never passes a failure off as a wrong answer."""

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.agents.engines.openai_engine import OpenAIEngine
from searchgym.core.llm_calls import ReplyRetry
from searchgym.envs.llm_judge import LLMJudge, parse_judgement
from searchgym.testing.stand_in_llm import StandInLLM, stand_in_server

FAST = ReplyRetry(attempts=3, backoff=0.001)
verdicts = st.sampled_from(["Correct", "Incorrect"])
free_text = st.text(max_size=120).filter(lambda t: "</think>" not in t.lower())


class ScriptedChatModel:
    """Test double of a judge LLM at the ChatModel protocol level (a capable LLM cannot run here).

    It answers each call with the next scripted reply, or raises it if it is an exception.
    """

    def __init__(self, *replies):
        self.replies = list(replies)
        self.prompts = []

    async def achat(self, messages, **sampling):
        self.prompts.append(messages[-1]["content"])
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


@given(st.text(max_size=300))
def test_parse_never_raises(text):
    assert parse_judgement(text) in (None, "Correct", "Incorrect")


@given(st.sampled_from(["Correct", "Incorrect", "correct", "INCORRECT"]), st.text(max_size=80))
def test_last_json_block_wins(judgement, rationale):
    text = (
        'Some thoughts. {"judgement": "Incorrect"} more thoughts\n```json\n'
        + json.dumps({"rationale": rationale, "judgement": judgement})
        + "\n```"
    )
    assert parse_judgement(text) == judgement.capitalize()


def test_fallbacks_are_strict():
    assert parse_judgement("<think>Could this be incorrect? No") is None  # issue 26: was Incorrect
    assert parse_judgement("Judgement: **Correct**") == "Correct" and parse_judgement("Incorrect.") == "Incorrect"
    assert parse_judgement("<think>is it correct?</think>\nVerdict: Incorrect") == "Incorrect"
    assert parse_judgement("The prediction is correct.") is None  # a sentence, not a verdict
    assert parse_judgement("At first correct, but on reflection it is incorrect.") is None
    assert parse_judgement('{"judgement": "maybe"} no verdict here') is None
    assert parse_judgement('{"judgement": "Correct"} then <think>hmm') is None
    assert parse_judgement("") is None and parse_judgement(None) is None


@given(free_text, verdicts)
def test_nothing_inside_an_unterminated_think_block_is_a_verdict(thought, verdict):
    block = json.dumps({"rationale": "r", "judgement": verdict})
    assert parse_judgement("<think>" + thought) is None
    assert parse_judgement(f"<think>{thought}\n{block}\n{verdict}") is None
    assert parse_judgement(f"{block}\n<think>{thought}") is None  # it started thinking again and was cut


@given(free_text, verdicts)
def test_the_verdict_after_a_closed_think_block_decides_whatever_the_thoughts_say(thought, verdict):
    other = "Incorrect" if verdict == "Correct" else "Correct"
    reply = f"<think>{thought} {json.dumps({'judgement': other})}\n{other}</think>\n" + json.dumps(
        {"rationale": "checked", "judgement": verdict}
    )
    assert parse_judgement(reply) == verdict


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{}<>"), max_size=60), verdicts, st.data())
def test_a_reply_cut_anywhere_inside_its_verdict_block_holds_no_verdict(rationale, verdict, data):
    head = f"Reasoning: {rationale}\n```json\n"
    reply = head + json.dumps({"rationale": rationale, "judgement": verdict}) + "\n```"
    cut = data.draw(st.integers(len(head) + 1, len(reply) - len("\n```") - 1))
    assert parse_judgement(reply) == verdict
    assert parse_judgement(reply[:cut]) is None, reply[:cut]


def test_verdicts_failures_and_cache():
    model = ScriptedChatModel(
        '```json\n{"rationale": "same person", "judgement": "Correct"}\n```',
        "I cannot decide.",
        "Still thinking about it",
        "Hmm.",
        ConnectionError("endpoint down"),
    )
    judge = LLMJudge(model, retry=FAST)

    async def run():
        right = await judge.ajudge("K. Voss", ["Kelda Voss"], question="Who founded Tessar Works?")
        again = await judge.ajudge("K. Voss", ["Kelda Voss"], question="Who founded Tessar Works?")
        unsure = await judge.ajudge("1873", ["1874"], question="When?")
        down = await judge.ajudge("Velmora", ["Velmora"], question="Where?")
        empty = await judge.ajudge("  ", ["Velmora"], question="Where?")
        return right, again, unsure, down, empty

    right, again, unsure, down, empty = asyncio.run(run())
    assert right.correct and right.score == 1.0 and right.detail["calls"] == 1
    assert (again.correct, again.detail["calls"], again.detail["cached"]) == (True, 0, True)
    assert "Who founded Tessar Works?" in model.prompts[0] and "Kelda Voss" in model.prompts[0]
    assert unsure.error == "no verdict in the judge's output (after 3 tries)" and unsure.detail["calls"] == 3
    assert down.error.startswith("judge call failed: LLM endpoint ScriptedChatModel: ConnectionError")
    assert empty.error is None and not empty.correct
    assert judge.stats == {"calls": 5, "cache_hits": 1, "failures": 2}


def _grade(judge, pairs):
    async def go():
        try:
            return [await judge.ajudge(p, [r], question=f"Question {i}?") for i, (p, r) in enumerate(pairs)]
        finally:
            await judge.model.close()

    return asyncio.run(go())


PAIRS = [("Kelda Voss", "Kelda Voss"), ("Velmora", "Tessar"), ("1874", "1874"), ("Milind", "Sester")]


def test_replies_cut_at_max_tokens_are_judge_failures_never_verdicts():
    """Over HTTP, a judge endpoint whose every reply is cut at max_tokens gives failures (asked 3 times each);
    the same endpoint back to normal grades the same answers."""
    double = StandInLLM(faults=lambda n, prompt: "cut")
    with stand_in_server(double) as url:
        cut = _grade(LLMJudge(OpenAIEngine(url, "judge", backoff_base=0.001), retry=FAST), PAIRS)
        assert double.requests == 3 * len(PAIRS)
        double.faults = None
        back = _grade(LLMJudge(OpenAIEngine(url, "judge", backoff_base=0.001), retry=FAST), PAIRS)
    assert all(v.error and v.error.startswith("judge reply cut off") and not v.correct for v in cut)
    assert all(v.detail["calls"] == 3 for v in cut)
    assert [v.correct for v in back] == [True, False, True, False] and not any(v.error for v in back)


def test_an_intermittent_or_absent_judge_endpoint_never_yields_a_verdict_it_did_not_give():
    """Every other request fails (503, 429) or is cut: the client's and the judge's retries still grade every
    answer right; an endpoint that is not there at all is a failure per answer, never Incorrect."""
    faults = {0: "503", 1: None, 2: "cut", 3: "429"}
    double = StandInLLM(faults=lambda n, prompt: faults[n % 4])
    with stand_in_server(double) as url:
        flaky = _grade(LLMJudge(OpenAIEngine(url, "judge", backoff_base=0.001), retry=FAST), PAIRS)
    assert [v.correct for v in flaky] == [True, False, True, False] and not any(v.error for v in flaky)
    assert double.requests > len(PAIRS)
    gone = _grade(LLMJudge(OpenAIEngine(url, "judge", backoff_base=0.001, max_retries=2), retry=FAST), PAIRS)
    assert all(v.error.startswith(f"judge call failed: LLM endpoint {url}") for v in gone)
    assert all("gave up after 3 attempts" in v.error for v in gone)
