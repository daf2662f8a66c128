"""serve model's RL routes coerce values as SGLang 0.5.23 does: pydantic's lax mode over its io_struct types.

Three checks: the fields we coerce are declared `int` / `bool` in SGLang's own `io_struct.py` (read from the
wheel); our coercion agrees with pydantic's lax `int` and `bool` on any value (hypothesis); and over HTTP an
int-like string or bool word is taken while junk is a 400 naming the field.
"""

from __future__ import annotations

import ast
import json

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.agents.engines.fields import InvalidRequest
from searchgym.serve.model.lax_fields import lax_boolean, lax_integer, shapes
from tests.agents.servers import model_server
from tests.agents.sglang_source import require_sglang

# (SGLang request type, field) -> what serve model reads it as
LAX_INT = {("InitWeightsUpdateGroupReqInput", f) for f in ("master_port", "rank_offset", "world_size")} | {
    ("UpdateWeightFromDiskReqInput", "token_step")
}
LAX_BOOL = (
    {("UpdateWeightsFromDistributedReqInput", f) for f in ("flush_cache", "abort_all_requests", "torch_empty_cache")}
    | {
        ("UpdateWeightFromDiskReqInput", f)
        for f in (
            "abort_all_requests",
            "is_async",
            "torch_empty_cache",
            "keep_pause",
            "recapture_cuda_graph",
            "flush_cache",
        )
    }
    | {
        ("ContinueGenerationReqInput", "torch_empty_cache"),
        ("AbortReq", "abort_all"),
        ("UpdateWeightVersionReqInput", "abort_all_requests"),
    }
)


def test_the_coerced_fields_are_sglangs_ints_and_bools():
    root = require_sglang()
    tree = ast.parse((root / "srt/managers/io_struct.py").read_text())
    declared = {
        (node.name, item.target.id): ast.unparse(item.annotation)
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }
    assert {key: declared.get(key) for key in LAX_INT} == {key: "int" for key in LAX_INT}
    assert {key: declared.get(key) for key in LAX_BOOL} == {key: "bool" for key in LAX_BOOL}
    assert declared[("UpdateWeightsFromDistributedReqInput", "shapes")] == "List[List[int]]"


def int_texts():
    """Strings near pydantic's int grammar: signs, underscores, zero fractions, padding, and near misses."""
    digits = st.text("0123456789", min_size=1, max_size=6)
    core = st.builds(
        lambda sign, parts, frac: sign + "_".join(parts) + frac,
        st.sampled_from(["", "+", "-", "--", "+-"]),
        st.lists(digits, min_size=1, max_size=3),
        st.sampled_from(["", ".0", ".00", ".", ".5", "e3", "_"]),
    )
    pad = st.sampled_from(["", " ", "\t", "\n", "\xa0", "\u2003", "\x1c"])
    return st.builds(lambda a, c, b: a + c + b, pad, core, pad)


VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    int_texts(),
    st.text(max_size=8),
    st.sampled_from(["true", "True", "YES", "off", "n", "t", " true", "1", "0", "2", "on "]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


def pydantic_says(kind, value):
    """(accepted, value) by pydantic's lax validation of `kind`, as FastAPI runs SGLang's request types."""
    pydantic = pytest.importorskip("pydantic")
    try:
        return True, pydantic.TypeAdapter(kind).validate_python(value)
    except pydantic.ValidationError:
        return False, None


def ours(coerce, value):
    try:
        return True, coerce(value, "field")
    except InvalidRequest as e:
        assert "field" in str(e)
        return False, None


@settings(max_examples=600, deadline=None)
@given(value=VALUES)
def test_lax_integer_accepts_exactly_what_sglangs_validation_accepts(value):
    assert ours(lax_integer, value) == pydantic_says(int, value)


@settings(max_examples=400, deadline=None)
@given(value=VALUES)
def test_lax_boolean_accepts_exactly_what_sglangs_validation_accepts(value):
    assert ours(lax_boolean, value) == pydantic_says(bool, value)


def test_shapes_take_int_like_sizes_and_name_the_field():
    assert shapes([[2, "3"], [], ["4.0"]], "shapes") == [[2, 3], [], [4]]
    for bad in ([["x"]], [2], "[[2]]", [[-1]]):
        with pytest.raises(InvalidRequest, match="shapes"):
            shapes(bad, "shapes")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tiny_model_dir):
    async with model_server(tiny_model_dir) as running:
        yield running


async def _post(url, path, body):
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, data=json.dumps(body), timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return resp.status, await resp.text()


@pytest.mark.asyncio(loop_scope="module")
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(size=st.one_of(st.integers(0, 9999).map(str), int_texts()))
async def test_an_int_like_size_reaches_the_group_check_and_junk_is_a_400_naming_shapes(server, size):
    url, _ = server
    status, text = await _post(
        url,
        "/update_weights_from_distributed",
        {"names": ["w"], "dtypes": ["float32"], "shapes": [[size]], "group_name": "never-joined"},
    )
    assert status == 400
    accepted, value = pydantic_says(int, size)
    if accepted and value >= 0:
        assert "no weight-update group" in text, text
    else:
        assert "shapes" in text, text


@pytest.mark.asyncio(loop_scope="module")
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(flag=VALUES)
async def test_a_bool_word_is_taken_and_junk_is_a_400_naming_the_field(server, flag):
    url, _ = server
    status, text = await _post(url, "/update_weight_version", {"new_version": "v1", "abort_all_requests": flag})
    accepted, _ = pydantic_says(bool, flag)
    if flag is None or accepted:  # null: the default, as serve model reads every absent or null field
        assert status == 200, text
    else:
        assert status == 400 and "abort_all_requests" in text, text


@pytest.mark.asyncio(loop_scope="module")
async def test_junk_master_port_is_a_400_naming_it(server):
    url, _ = server
    for port in ("13219x", "0x10", "", "1e4", [13219]):
        status, text = await _post(
            url,
            "/init_weights_update_group",
            {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2},
        )
        assert status == 400 and "master_port must be an integer" in text, (port, text)
