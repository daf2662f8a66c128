"""The action parser sees everything a language model writes: it must never raise and never guess wrong."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.envs.actions import MAX_ARGUMENT_CHARS, parse_action, strip_thinking

tags = st.sampled_from(
    [
        "<search>",
        "</search>",
        "<access>",
        "</access>",
        "<answer>",
        "</answer>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        '"name"',
        ":",
    ]
)
turns = st.lists(st.one_of(st.text(max_size=20), tags), max_size=30).map("".join)


@given(turns)
@settings(max_examples=400)
def test_any_text_parses_without_raising(text):
    action = parse_action(text)
    assert action.tool in (None, "search", "access", "answer")
    assert (action.tool is None) == (action.argument == "")
    if action.tool is None:
        assert action.errors, "an invalid turn must say why"
    assert "<search>" not in action.argument and "</answer>" not in action.argument


@given(
    st.sampled_from(["search", "access", "answer"]),
    st.text(min_size=1, max_size=50).filter(lambda s: s.strip() and "<" not in s),
)
def test_a_clean_call_is_read_exactly(tool, argument):
    action = parse_action(f"<think>let me see</think>\n<{tool}>{argument}</{tool}>")
    assert action.ok and action.tool == tool and action.argument == argument.strip()


@given(st.sampled_from(["search", "access", "answer"]), st.text(min_size=1, max_size=50).filter(str.strip))
def test_hermes_json_calls(tool, argument):
    key = {"search": "query", "access": "url", "answer": "answer"}[tool]
    text = "<tool_call>" + json.dumps({"name": tool, "arguments": {key: argument}}) + "</tool_call>"
    action = parse_action(text)
    if "<" in argument and any(t in argument for t in ("<search>", "<access>", "<answer>", "<tool_call>", "</")):
        return
    assert action.tool == tool and action.argument == argument.strip() and action.format == "json"


def test_thinking_is_not_an_action():
    assert parse_action("<think><answer>wrong</answer></think><search>right</search>").argument == "right"
    assert parse_action("<think>I might <answer>guess</answer>").tool is None
    assert parse_action("thinking without an opening tag</think><answer>1873</answer>").argument == "1873"
    assert strip_thinking("a<think>b</think>c<think>d</think>e") == "ace"


def test_last_call_wins_and_is_flagged():
    action = parse_action("<search>first</search> then <answer>second</answer>")
    assert action.tool == "answer" and action.argument == "second"
    assert any("2 tool calls" in e for e in action.errors)


def test_malformed_turns_are_explained():
    cases = {
        "": "no tool call",
        "<search>unclosed": "unbalanced <search>",
        "<search>  </search>": "empty <search>",
        "<search><answer>x</answer></search>": "nested",
        "<tool_call>{not json</tool_call>": "not valid JSON",
        '<tool_call>{"name": "browse", "arguments": {}}</tool_call>': "unknown tool",
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>': "needs an argument 'query'",
        '<tool_call>["search"]</tool_call>': "JSON object",
    }
    for text, expected in cases.items():
        action = parse_action(text)
        assert action.tool is None and any(expected in e for e in action.errors), (text, action)


def test_huge_and_hostile_turns_are_fast_and_safe():
    assert parse_action("<search>" * 200_000).tool is None  # linear scan, no backtracking blow-up
    action = parse_action("<answer>" + "x" * 1_000_000 + "</answer>")
    assert action.tool == "answer" and len(action.argument) == MAX_ARGUMENT_CHARS
    assert parse_action("<search>北京大学 😀 \x00</search>").argument == "北京大学 😀 \x00"
    assert parse_action(12).tool is None  # not even a string


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(alphabet=st.characters(blacklist_categories=())),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(
    st.sampled_from(["search", "access", "answer", "x", None, 3]),
    json_values,
    st.sampled_from(["", "[" * 5000, '{"a":' * 3000]),
)
@settings(max_examples=300)
def test_any_json_tool_call_parses_without_raising(name, arguments, nesting):
    """Nested, wrongly typed, surrogate-holding or deeply bracketed JSON arguments: never an exception."""
    for args in (arguments, json.dumps(arguments) + nesting, nesting):
        try:
            body = json.dumps({"name": name, "arguments": args})
        except (ValueError, RecursionError):
            continue
        action = parse_action(f"<tool_call>{body}</tool_call>")
        assert action.tool in (None, "search", "access", "answer") and (action.tool is None) == (not action.argument)
        action.argument.encode("utf-8")  # whatever reaches a backend can be encoded


def test_lone_surrogates_become_replacement_characters():
    action = parse_action("<search>caf\ud800e \udfff</search>")
    assert action.tool == "search" and action.argument == "caf\ufffde \ufffd"
