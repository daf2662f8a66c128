"""EngineChat: in-process chat over a token engine (TorchEngine, or SGLang servers), tools and tool calls included."""

import json
import re

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.agents.chat import EngineChat, ToolCall, parse_tool_calls
from searchgym.agents.engines.sglang_engine import SGLangEngine
from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.engines.types import FinishReason, GenerateRequest, GenerateResponse, SamplingParams
from tests.agents.servers import model_server
from tests.agents.tool_model import ARGUMENTS, QUESTION, RESULT, TOOLS, exchange

in_module_loop = pytest.mark.asyncio(loop_scope="module")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who founded it?"}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def torch_engine(tiny_model_dir):
    engine = TorchEngine(tiny_model_dir, seed=0)
    yield engine
    await engine.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def tool_chat(tool_model_dir):
    engine = TorchEngine(tool_model_dir, seed=0)
    yield EngineChat(engine, engine.tokenizer)
    await engine.close()


@in_module_loop
async def test_achat_is_the_engines_generation_through_the_chat_template(torch_engine):
    chat = EngineChat(torch_engine, torch_engine.tokenizer)
    text = await chat.achat(MESSAGES, temperature=0, max_tokens=16, ignore_eos=True)
    prompt = torch_engine.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"]
    direct = await torch_engine.agenerate(
        GenerateRequest(prompt, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))
    )
    assert text == torch_engine.tokenizer.decode(direct.output_ids, skip_special_tokens=True)
    word = re.findall(r"[A-Za-z]{3,}", text)[1]  # inside the reply: at its very end the length limit comes first
    stopped = await chat.achat(MESSAGES, temperature=0, max_tokens=16, ignore_eos=True, stop=[word])
    assert stopped == text[: text.find(word)]  # OpenAI's rule: the stop string is not part of the reply
    seeded = [await chat.achat(MESSAGES, temperature=1.0, max_tokens=8, seed=3) for _ in range(2)]
    assert seeded[0] == seeded[1]


@in_module_loop
async def test_the_same_adapter_over_sglang_servers(tiny_model_dir, torch_engine):
    async with model_server(tiny_model_dir) as (url, _):
        engine = await SGLangEngine([url]).start(timeout=30)
        remote = EngineChat(engine, torch_engine.tokenizer)
        local = EngineChat(torch_engine, torch_engine.tokenizer)
        sampling = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
        assert await remote.achat(MESSAGES, **sampling) == await local.achat(MESSAGES, **sampling)
        await engine.close()


@in_module_loop
async def test_tools_render_through_the_template_and_calls_come_back_parsed(tool_chat):
    first, second = exchange("call_7")
    prompt = tool_chat.render(first, TOOLS)
    assert (
        prompt == tool_chat.tokenizer.apply_chat_template(first, tools=TOOLS, add_generation_prompt=True)["input_ids"]
    )
    result = await tool_chat.acomplete(first, SamplingParams(max_new_tokens=60, temperature=0.0), TOOLS)
    assert result.finish_reason == "tool_calls" and result.content is None
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("search", ARGUMENTS)]
    answer = await tool_chat.acomplete(second, SamplingParams(max_new_tokens=20, temperature=0.0), TOOLS)
    assert answer.finish_reason == "stop" and answer.content == "Grishofield" and answer.tool_calls == []
    rendered = tool_chat.tokenizer.decode(tool_chat.render(second, TOOLS))
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "Aldra"}}\n</tool_call>'
        f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>"
    ) in rendered
    # without tools to parse for, the reply is the raw text (a chat workflow parses its own tool syntax)
    raw = await tool_chat.acomplete(first, SamplingParams(max_new_tokens=60, temperature=0.0), prompt_ids=prompt)
    assert raw.tool_calls == [] and raw.content == raw.text and raw.text.startswith("<tool_call>")


class ScriptedEngine:
    """An engine that answers every request with the token ids of a fixed text (to drive the parser)."""

    def __init__(self, tokenizer, text):
        self.ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
        self.version = 0

    async def agenerate(self, request):
        n = len(self.ids)
        return GenerateResponse(self.ids, [0.0] * n, [0] * n, FinishReason("stop", self.ids[-1]))


@in_module_loop
async def test_parallel_tool_calls_false_keeps_the_first_call(torch_engine):
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "%s"}}\n</tool_call>'
    engine = ScriptedEngine(torch_engine.tokenizer, "Let me look.\n" + call % "a" + "\n" + call % "b")
    chat = EngineChat(engine, torch_engine.tokenizer, context_length=4096)
    both = await chat.acomplete([QUESTION], SamplingParams(max_new_tokens=5), TOOLS)
    assert [json.loads(c.arguments)["query"] for c in both.tool_calls] == ["a", "b"]
    assert both.content == "Let me look." and both.finish_reason == "tool_calls"
    one = await chat.acomplete([QUESTION], SamplingParams(max_new_tokens=5), TOOLS, parallel_tool_calls=False)
    assert [json.loads(c.arguments)["query"] for c in one.tool_calls] == ["a"]


@pytest.mark.parametrize(
    "messages,options,message",
    [
        ([{"role": "robot", "content": "x"}], {}, "role in"),
        ([{"role": "user", "content": "x", "extra": 1}], {}, "unsupported field(s) ['extra']"),
        ([{"role": "user"}], {}, "needs content"),
        (
            [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "s", "arguments": "{"}}]}],
            {},
            "not valid JSON",
        ),
        ([{"role": "user", "content": "x"}], {"response_format": {"type": "json_object"}}, "response_format"),
        ([{"role": "user", "content": "x"}], {"n": 3}, "n must be 1"),
        ([{"role": "user", "content": "x"}], {"presence_penalty": 1.0}, "presence_penalty"),
        ([{"role": "user", "content": "x"}], {"max_tokens": 10**6}, "exceeds the model's maximum context length"),
        ([], {}, "non-empty list"),
    ],
)
@in_module_loop
async def test_bad_input_is_a_value_error_that_says_why(torch_engine, messages, options, message):
    chat = EngineChat(torch_engine, torch_engine.tokenizer)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        await chat.achat(messages, **options)


# ---- the tool-call parser -----------------------------------------------------------------------------------------

NAMES = ("search", "access", "answer")
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_ARGUMENTS = st.dictionaries(st.text(max_size=8), _VALUES, max_size=3)


@given(
    prefix=st.text(max_size=20).filter(lambda t: "<tool_call>" not in t),
    calls=st.lists(st.tuples(st.sampled_from(NAMES), _ARGUMENTS), min_size=1, max_size=3),
    separators=st.lists(st.sampled_from(["", "\n", " \n "]), min_size=3, max_size=3),
    closed=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_calls_written_as_the_template_writes_them_parse_back(prefix, calls, separators, closed):
    blocks = [
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>" for n, a in calls
    ]
    if not closed:  # a stop string at </tool_call> cuts the last closing tag
        blocks[-1] = blocks[-1].removesuffix("</tool_call>")
    text = prefix + "".join(
        sep + block for sep, block in zip(separators, blocks, strict=False)
    )  # separators: 3, drawn for up to 3 calls
    content, parsed = parse_tool_calls(text, set(NAMES))
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls
    assert content == (prefix.strip() or None)


_PIECES = [*'<>/{}": ,', "tool_call", "name", "search", "arguments", "<tool_call>", "</tool_call>", "{}", "\n"]


@given(text=st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))
@settings(max_examples=500, deadline=None)
def test_the_parser_never_raises_and_never_drops_text(text):
    content, calls = parse_tool_calls(text, {"search"})
    if not calls:
        assert content == text  # not all well formed: the reply stays whole
    assert all(isinstance(c, ToolCall) and c.name == "search" for c in calls)


def test_malformed_or_unknown_calls_leave_the_reply_whole():
    for text in (
        '<tool_call>\n{"name": "search", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>',
        '<tool_call>{"name": "search", "arguments": {}}</tool_call> and more <tool_call>{oops}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>prose<tool_call>'
        '{"name": "search", "arguments": {}}</tool_call>',
    ):
        assert parse_tool_calls(text, {"search"}) == (text, [])


def test_deeply_nested_tool_call_json_is_content_not_a_crash():
    """A model writing 100k open brackets inside <tool_call> overflows the JSON decoder: that is a malformed
    call (the reply stays content), never an exception out of the chat adapter or the server."""
    from searchgym.agents.chat import parse_tool_calls

    text = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    assert parse_tool_calls(text, frozenset({"search"})) == (text, [])
    nested = '<tool_call>{"name": "search", "arguments": "' + "[" * 100_000 + '"}</tool_call>'
    assert parse_tool_calls(nested, frozenset({"search"})) == (nested, [])
