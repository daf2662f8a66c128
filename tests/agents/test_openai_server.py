"""`serve model`'s OpenAI API through the official `openai` client: a tool-calling round trip on a real (tiny) model,
every documented request field honoured or refused, /v1/completions and /v1/models."""

import asyncio
import json

import aiohttp
import openai
import pytest
from openai.types import completion_create_params as legacy_params
from openai.types.chat import completion_create_params as chat_params

from tests.agents.servers import generate, post, tool_model_fixtures, wait_for_tokens
from tests.agents.tool_model import ANSWER, ARGUMENTS, QUESTION, RESULT, TOOLS, exchange

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # shares the loop of the module's server
NAME = "tiny-tools"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who founded it?"}]
GREEDY = {"temperature": 0, "max_tokens": 6, "extra_body": {"ignore_eos": True}}


server_fixture, client_fixture = tool_model_fixtures(NAME)  # `server` and `client`


async def chat(client, **kwargs):
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("model", NAME)
    return await client.chat.completions.create(**kwargs)


# ---- tools, end to end ------------------------------------------------------------------------------------------


@in_module_loop
async def test_tool_calling_round_trip_with_the_openai_client(server, client):
    _, engine = server
    first, _ = exchange()
    called = await chat(client, messages=first, tools=TOOLS, temperature=0)
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "search" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == ARGUMENTS

    history = [*first, choice.message, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    answered = await chat(client, messages=history, tools=TOOLS, temperature=0)
    assert answered.choices[0].finish_reason == "stop" and answered.choices[0].message.content == ANSWER
    assert not answered.choices[0].message.tool_calls
    # the history was rendered exactly as the template renders a call (arguments as an object) and its result
    as_template = [
        QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": ARGUMENTS}}],
        },
        history[2],
    ]
    expected = engine.tokenizer.apply_chat_template(as_template, tools=TOOLS, add_generation_prompt=True)["input_ids"]
    assert answered.usage.prompt_tokens == len(expected)


@in_module_loop
async def test_tool_choice_none_renders_no_tools_and_parses_nothing(server, client):
    _, engine = server
    first, _ = exchange()
    plain = await chat(client, messages=first, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=8)
    expected = engine.tokenizer.apply_chat_template(first, add_generation_prompt=True)["input_ids"]
    assert plain.usage.prompt_tokens == len(expected) and not plain.choices[0].message.tool_calls
    single = await chat(client, messages=first, tools=TOOLS, temperature=0, parallel_tool_calls=False)
    assert len(single.choices[0].message.tool_calls) == 1


# ---- every documented field, honoured or refused -------------------------------------------------------------------

# fields whose effect a test below checks
HONOURED = {
    "messages",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "logit_bias",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
}
# values that change no output here: the reply must equal the plain one
INERT = {
    "user": "user-1",
    "safety_identifier": "hash-1",
    "prompt_cache_key": "key-1",
    "metadata": {"run": "7"},
    "prompt_cache_options": {"mode": "implicit"},
    "prompt_cache_retention": "in_memory",
    "store": False,
    "service_tier": "auto",
    "modalities": ["text"],
    "response_format": {"type": "text"},
    "reasoning_effort": "none",
    "verbosity": "medium",
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "logprobs": False,
    "top_logprobs": 0,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "n": 1,
    "stream": False,
    "model": NAME,
    "tools": [],
}
# values this server cannot honour (stream_options without stream: true included): a 400 naming the field
REFUSED = {
    "stream_options": {"include_usage": True},
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {"type": "json_object"},
    "store": True,
    "service_tier": "flex",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "high",
    "verbosity": "low",
    "web_search_options": {},
    "functions": [{"name": "f", "parameters": {}}],
    "function_call": "auto",
    "moderation": {"model": "omni-moderation-latest"},
    "n": 2,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "tool_choice": "required",
    "temperature": 3,
    "top_p": 0,
    "max_tokens": 0,
    "max_completion_tokens": 0,
    "logit_bias": {"99999": 1},
    "seed": "x",
    "stop": [""],
    "messages": [],
    "tools": [{"type": "web_search"}],
    "parallel_tool_calls": "yes",
    "model": 5,
    "user": 5,
    "metadata": {"a": 1},
    "prompt_cache_options": "x",
    "prompt_cache_retention": 5,
    "safety_identifier": 5,
    "prompt_cache_key": 5,
}


def test_the_tables_cover_every_field_the_openai_client_documents():
    documented = set(chat_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert documented <= HONOURED | set(INERT) | set(REFUSED), documented - (HONOURED | set(INERT) | set(REFUSED))


@in_module_loop
@pytest.mark.parametrize("field", sorted(INERT))
async def test_inert_values_leave_the_reply_unchanged(client, field):
    plain = await chat(client, **GREEDY)
    out = await chat(client, **{**GREEDY, field: INERT[field]})
    assert out.choices[0].message.content == plain.choices[0].message.content
    assert out.usage == plain.usage


@in_module_loop
@pytest.mark.parametrize("field", sorted(REFUSED))
async def test_what_cannot_be_honoured_is_a_400_naming_the_field(server, field):
    url, _ = server
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 2, field: REFUSED[field]}
    async with aiohttp.ClientSession() as http:
        status, out = await post(http, url, "/v1/chat/completions", body)
    assert status == 400 and out["error"]["type"] == "invalid_request_error" and field in out["error"]["message"]


@in_module_loop
async def test_unknown_fields_are_refused_as_openai_refuses_them(client):
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument.*best_of"):
        await chat(client, max_tokens=2, extra_body={"best_of": 2})


@in_module_loop
async def test_model_max_tokens_and_the_chat_template(server, client):
    _, engine = server
    out = await chat(
        client, model="any-name", max_tokens=5, max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.model == "any-name" and out.usage.completion_tokens == 3  # max_completion_tokens wins
    prompt = engine.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"]
    assert out.usage.prompt_tokens == len(prompt)
    async with aiohttp.ClientSession() as http:
        native = await generate(
            http,
            server[0],
            input_ids=prompt,
            sampling_params={"max_new_tokens": 3, "temperature": 0, "ignore_eos": True},
        )
    assert out.choices[0].message.content == native["text"]


@in_module_loop
async def test_temperature_top_p_and_seed(client):
    greedy = (await chat(client, **GREEDY)).choices[0].message.content
    sampled = {"temperature": 1.0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
    first = (await chat(client, seed=5, **sampled)).choices[0].message.content
    assert (await chat(client, seed=5, **sampled)).choices[0].message.content == first
    assert (await chat(client, seed=6, **sampled)).choices[0].message.content != first
    nucleus = await chat(client, seed=5, temperature=1.0, top_p=1e-9, max_tokens=6, extra_body={"ignore_eos": True})
    assert nucleus.choices[0].message.content == greedy  # only the top token is left


@in_module_loop
async def test_stop_and_logit_bias(server, client):
    _, engine = server
    reply = await chat(client, temperature=0, max_tokens=12, extra_body={"ignore_eos": True})
    full = reply.choices[0].message.content
    word = full[len(full) // 2 :].split()[0]
    stopped = await chat(client, temperature=0, max_tokens=12, stop=[word], extra_body={"ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == full[: full.find(word)]
    token = engine.tokenizer.encode(" Grishofield")[0]
    biased = await chat(
        client, temperature=0, max_tokens=3, logit_bias={str(token): 100}, extra_body={"ignore_eos": True}
    )
    assert biased.choices[0].message.content == engine.tokenizer.decode([token] * 3)


@in_module_loop
async def test_chat_errors_use_the_openai_envelope(client):
    for kwargs in (
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "search", "arguments": "{not json"}}
                    ],
                }
            ]
        },
    ):
        with pytest.raises(openai.BadRequestError) as error:
            await chat(client, max_tokens=2, **kwargs)
        assert error.value.status_code == 400 and error.value.body["message"]


@in_module_loop
async def test_a_generation_aborted_by_a_pause_is_a_503_with_retry_after(server):
    url, engine = server
    async with aiohttp.ClientSession() as http:

        async def long_chat():
            async with http.post(
                url + "/v1/chat/completions", json={"messages": MESSAGES, "temperature": 0, "ignore_eos": True}
            ) as resp:  # the rest of the context
                return resp.status, resp.headers.get("Retry-After"), await resp.json()

        request = asyncio.create_task(long_chat())
        await wait_for_tokens(engine, 3)
        await post(http, url, "/pause_generation", {"mode": "abort"})
        status, retry_after, body = await request
        await post(http, url, "/continue_generation", {})
    assert status == 503 and retry_after == "1" and "aborted" in body["error"]["message"]


# ---- /v1/completions and /v1/models -------------------------------------------------------------------------------

COMPLETION_REFUSED = {
    "best_of": 2,
    "logprobs": 2,
    "suffix": "end",
    "stream": "yes",
    "stream_options": {"include_usage": True},
    "n": 2,
    "frequency_penalty": 1,
    "presence_penalty": 1,
    "echo": "yes",
    "prompt": ["one", "two"],
    "max_tokens": 0,
    "temperature": -1,
    "top_p": 2,
    "seed": 1.5,
    "stop": 7,
    "logit_bias": {"x": 1},
    "user": 1,
    "model": 1,
}


def test_completion_fields_are_all_covered():
    documented = set(legacy_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert documented <= set(COMPLETION_REFUSED), documented - set(COMPLETION_REFUSED)


@in_module_loop
async def test_completions_text_in_text_out(server, client):
    url, engine = server
    prompt = "Where was the founder born?"
    out = await client.completions.create(
        model=NAME, prompt=prompt, max_tokens=5, temperature=0, seed=1, user="u", extra_body={"ignore_eos": True}
    )
    async with aiohttp.ClientSession() as http:
        native = await generate(
            http, url, text=prompt, sampling_params={"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
        )
    assert out.object == "text_completion" and out.choices[0].text == native["text"]
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5
    echoed = await client.completions.create(
        model=NAME, prompt=prompt, max_tokens=5, temperature=0, echo=True, best_of=1, extra_body={"ignore_eos": True}
    )
    assert echoed.choices[0].text == prompt + native["text"]
    default = await client.completions.create(
        model=NAME, prompt=engine.tokenizer.encode(prompt), temperature=0, extra_body={"ignore_eos": True}
    )
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens for completions
    assert default.choices[0].text.startswith(native["text"])


@in_module_loop
@pytest.mark.parametrize("field", sorted(COMPLETION_REFUSED))
async def test_completion_values_that_cannot_be_honoured_are_a_400(server, field):
    url, _ = server
    body = {"model": NAME, "prompt": "hi", "max_tokens": 2, field: COMPLETION_REFUSED[field]}
    async with aiohttp.ClientSession() as http:
        status, out = await post(http, url, "/v1/completions", body)
    assert status == 400 and field in out["error"]["message"]


@in_module_loop
async def test_models_list_and_retrieve(server, client):
    _, engine = server
    listed = await client.models.list()
    assert [m.id for m in listed.data] == [NAME]
    card = await client.models.retrieve(NAME)
    assert card.id == NAME and card.object == "model"
    with pytest.raises(openai.NotFoundError) as error:
        await client.models.retrieve("no-such-model")
    assert error.value.body["code"] == "model_not_found"
