"""Streamed text pieces (`TextDeltas`) concatenate to exactly the text the non-streamed route returns: with stop
strings cut as SGLang cuts them, and with tool calls parsed out of the content, for any output."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.agents.chat import parse_tool_calls
from searchgym.agents.engines.detokenize import output_text
from searchgym.agents.engines.types import FinishReason
from searchgym.serve.model.streaming import TextDeltas

CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Aldra"}}\n</tool_call>'
PIECES = st.sampled_from(
    ["Sure", " ", "\n", "the", " river", "é", "日本", "<", "tool", "_call", ">", "</", CALL, "  ", "stop", "STOP", "ab"]
)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


def streamed(deltas, ids):
    """The pieces pushed for every unfinished prefix of ids (the last token arrives with the final response)."""
    return "".join(deltas.push(ids[:k]) for k in range(1, len(ids)))


@SETTINGS
@given(pieces=st.lists(PIECES, min_size=1, max_size=12), stop=st.sampled_from(["", "stop", "ab", "\n", "er"]))
def test_pieces_concatenate_to_the_final_text_with_stop_strings(tokenizer, pieces, stop):
    ids = tokenizer.encode("".join(pieces))
    finish = FinishReason("length", len(ids))
    if stop:  # generation ends at the first token whose text completes the stop string, as the engine's
        for k in range(1, len(ids) + 1):
            if stop in tokenizer.decode(ids[:k], skip_special_tokens=False):
                ids, finish = ids[:k], FinishReason("stop", stop)
                break
    final = output_text(tokenizer, ids, finish)
    deltas = TextDeltas(tokenizer, (stop,) if stop else ())
    sent = streamed(deltas, ids)
    assert sent + deltas.finish(final) == final
    assert final.startswith(sent)  # nothing sent was taken back


@SETTINGS
@given(pieces=st.lists(PIECES, min_size=1, max_size=12))
def test_pieces_concatenate_to_the_content_left_by_tool_calls(tokenizer, pieces):
    ids = tokenizer.encode("".join(pieces))
    text = output_text(tokenizer, ids, FinishReason("length", len(ids)))
    content, _ = parse_tool_calls(text, {"search"})
    deltas = TextDeltas(tokenizer, tools=True)
    sent = streamed(deltas, ids)
    assert "<tool_call>" not in sent
    assert sent + deltas.finish(content) == (content or "")
    assert (content or "").startswith(sent)
