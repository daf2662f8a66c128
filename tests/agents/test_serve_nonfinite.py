"""Non-finite numbers and `serve model` (issue 26 item 7): NaN weights are refused on every way in, and answers
are strict JSON (a non-finite logprob is null, as SGLang's orjson writes it), never a bare NaN."""

import asyncio
import json

import aiohttp
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.serve.http import serve_app
from searchgym.serve.model import ModelServerSettings, create_app, run_server
from searchgym.serve.model.wire import dumps, finite
from tests.agents.servers import GREEDY, PROMPT, generate, post

pytestmark = pytest.mark.asyncio(loop_scope="module")

POISONED = "model.layers.0.mlp.down_proj.weight"


def strict_json(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as strict parsers (JSON.parse, Go, serde) do."""

    def refuse(constant):
        raise ValueError(f"bare {constant} in JSON")

    return json.loads(text, parse_constant=refuse)


def nan_checkpoint(model_dir, out_dir, value=float("nan")):
    """The model saved, with its tokenizer, with one weight holding a non-finite value."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.state_dict()[POISONED][0, 0] = value
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out_dir)  # a policy dir: the engine checks its template
    return out_dir


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
async def test_a_checkpoint_with_non_finite_weights_is_refused_and_the_old_weights_serve_on(
    server, http, tmp_path, tiny_model_dir, value
):
    url, engine = server
    bad = nan_checkpoint(tiny_model_dir, tmp_path / "bad", value)
    before = await generate(
        http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 6, **GREEDY}, return_logprob=True
    )
    status, out = await post(http, url, "/update_weights_from_disk", {"model_path": str(bad), "weight_version": "9"})
    assert status == 400 and out["success"] is False
    assert "non-finite values (NaN or Infinity) in weights" in out["message"] and POISONED in out["message"]
    assert "keeps serving weight version 0" in out["message"]
    assert engine.nonfinite_weights() == []
    after = await generate(
        http, url, input_ids=PROMPT, sampling_params={"max_new_tokens": 6, **GREEDY}, return_logprob=True
    )
    assert after["output_ids"] == before["output_ids"] and after["meta_info"]["weight_version"] == "0"
    assert [row[0] for row in after["meta_info"]["output_token_logprobs"]] == pytest.approx(
        [row[0] for row in before["meta_info"]["output_token_logprobs"]], abs=1e-6
    )


async def test_a_tensor_update_with_nan_is_refused_and_a_relabel_still_works(server, http):
    """The path /update_weights_from_distributed takes (a state dict of received tensors over the current ones)."""
    url, engine = server
    state = engine.model.state_dict()
    poisoned = state[POISONED].clone()
    poisoned[1, 2] = float("nan")
    with pytest.raises(ValueError, match=rf"non-finite values .* in weights: \['{POISONED}'\]"):
        await engine.update_weights({**state, POISONED: poisoned}, engine.version + 1)
    assert engine.version == 0 and engine.nonfinite_weights() == []
    status, out = await post(http, url, "/update_weight_version", {"new_version": "relabelled"})
    assert status == 200 and out["success"] is True  # the model's own tensors are not re-read, and pass


def test_run_server_refuses_a_nan_checkpoint_before_serving(tiny_model_dir, tmp_path):
    bad = nan_checkpoint(tiny_model_dir, tmp_path / "bad")
    with pytest.raises(ValueError, match=rf"non-finite values \(NaN or Infinity\): \['{POISONED}'\]"):
        run_server(ModelServerSettings(model_path=str(bad), port=0))


async def test_answers_are_strict_json_when_the_model_computes_nan(tiny_model_dir):
    """Weights poisoned in place (past every check): logprobs come back null, never a bare NaN, in both dialects,
    streamed or not, and the server reports itself not ready, saying why."""
    engine = TorchEngine(tiny_model_dir)
    with torch.no_grad():
        engine.model.state_dict()[POISONED].fill_(float("nan"))
    app = create_app(engine, ModelServerSettings(model_path=str(tiny_model_dir), context_length=256))
    try:
        async with serve_app(app) as url, aiohttp.ClientSession() as http:
            reason = "warming up"
            for _ in range(600):  # the warm-up checks the weights first: at most a few polls
                async with http.get(url + "/health_generate") as resp:
                    status, reason = resp.status, await resp.text()
                if "warming up" not in reason:
                    break
                await asyncio.sleep(0.05)
            assert status == 503 and "the weights hold non-finite values (NaN or Infinity)" in reason
            body = {"input_ids": PROMPT, "return_logprob": True, "sampling_params": {"max_new_tokens": 3, **GREEDY}}
            async with http.post(url + "/generate", json=body) as resp:
                text = await resp.text()
            assert resp.status == 200 and "NaN" not in text
            out = strict_json(text)
            assert [row[0] for row in out["meta_info"]["output_token_logprobs"]] == [None] * 3
            async with http.post(url + "/generate", json={**body, "stream": True}) as resp:
                events = [line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: {")]
            assert events and all(
                row[0] is None for e in events for row in strict_json(e)["meta_info"]["output_token_logprobs"]
            )
            async with http.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3}) as resp:
                assert resp.status == 200 and strict_json(await resp.text())["object"] == "text_completion"
    finally:
        await engine.close()


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)


@given(_VALUES)
def test_dumps_is_strict_json_that_keeps_every_finite_value(value):
    text = dumps(value)
    assert strict_json(text) == finite(value)
    if finite(value) == value:  # no non-finite float in it: written exactly as json.dumps writes it
        assert text == json.dumps(value)


def test_dumps_writes_non_finite_numbers_as_null():
    value = {"a": [1.5, float("nan"), float("inf"), -float("inf"), {"b": (float("nan"), 2)}], "c": "NaN"}
    assert strict_json(dumps(value)) == {"a": [1.5, None, None, None, {"b": [None, 2]}], "c": "NaN"}
    assert finite(value)["a"][0] == 1.5 and dumps({"x": 1}) == json.dumps({"x": 1})
