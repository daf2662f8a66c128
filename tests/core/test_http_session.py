"""The request parsing both servers share: JSON that no tokenizer or index could take is a 400 naming where it is."""

import json

import aiohttp
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.serve.http import error_middleware, json_body, lone_surrogate, serve_app

SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
json_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=10)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | json_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_text, inner, max_size=3),
    max_leaves=10,
)


@given(json_values)
def test_valid_text_anywhere_passes(value):
    assert lone_surrogate({"x": value}) is None


@given(json_values, SURROGATES, st.integers(0, 20))
@settings(max_examples=200)
def test_a_lone_surrogate_anywhere_is_found(value, surrogate, depth):
    nested = f"abc{surrogate}"
    for i in range(depth % 4):
        nested = [value, nested] if i % 2 else {"k": nested, "v": value}
    assert lone_surrogate({"field": nested}) is not None
    assert lone_surrogate({f"key{surrogate}": 1}) == "a key of the body"


async def test_surrogate_escapes_get_a_400_not_a_500():
    async def echo(request):
        return web.json_response(await json_body(request))

    app = web.Application(
        middlewares=[error_middleware(lambda r, status, msg: web.json_response({"error": msg}, status=status))]
    )
    app.router.add_post("/echo", echo)
    async with serve_app(app) as url, aiohttp.ClientSession() as http:
        for body, status in [
            ('{"text": "caf\\u00e9 \\ud83d\\ude00"}', 200),
            ('{"text": "\\ud800"}', 400),
            ('{"queries": ["ok", "\\udfff"]}', 400),
            ('{"\\udc80": 1}', 400),
        ]:
            async with http.post(url + "/echo", data=body, headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == status, body
                if status == 200:
                    assert await resp.json() == json.loads(body)
                else:
                    assert "lone surrogate" in (await resp.json())["error"]
