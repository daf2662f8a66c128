"""Tool-call formats and how an episode's turns become tokens through a tokenizer's chat template.

The runner never re-tokenizes model output. It tokenizes only what the environment adds: the opening
prompt, and for each later turn the chat-template *delta* (close the assistant message, a user or
tool message holding the observation, open the next assistant message). The delta is read off the
tokenizer's own template by rendering a probe conversation, so any chat template works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STOPS: dict[str, tuple[str, ...]] = {
    "tags": ("</search>", "</access>", "</answer>"),
    "hermes": ("</tool_call>",),
}

_PROBE_USER, _PROBE_ANSWER, _PROBE_OBS, _PROBE_SYSTEM = "\x00U\x00", "\x00A\x00", "\x00O\x00", "\x00S\x00"
# sent as the system message where the template would otherwise write its own default one (SmolLM2's "You are a
# helpful AI assistant named SmolLM", Qwen2.5's "You are Qwen"): an identity no demonstration or episode asked for
SEARCH_AGENT_SYSTEM = "You are a search agent. Answer the user's question by using the tools the user describes."

# ChatML (the tiny model's template, and the one TRL gets for a ChatML model whose own cannot render tools, such as
# SmolLM2's); with `tools`, a Qwen2.5/Hermes-style system block lists them, assistant tool calls are written as
# <tool_call>{"name", "arguments"}</tool_call> and tool results go back as <tool_response> in a user turn.
# Conversations without tools render exactly as plain ChatML (no default system prompt).
CHATML_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nThese functions are available, described as JSON inside <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call functions, write one JSON object per call inside <tool_call></tool_call>:\\n"
    '<tool_call>\\n{"name": <function-name>, "arguments": <arguments-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first and tools %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set function = call['function'] if call['function'] is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + function['name'] + '\", \"arguments\": ' + (function['arguments'] | tojson)"
    " + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class ToolFormat:
    """Which syntax the agent writes tool calls in, and the strings that end a tool call."""

    name: str
    stops: tuple[str, ...]

    @classmethod
    def get(cls, name: str) -> ToolFormat:
        if name not in STOPS:
            raise ValueError(f"unknown tool format {name!r}; use one of {sorted(STOPS)}")
        return cls(name, STOPS[name])


class ChatTemplateDelta:
    """Token ids for the prompt and for each observation turn, from the tokenizer's chat template.

    `observation_role` is "user" (default), "tool" (the template's tool role, where it has one), or
    "inline" (Search-R1 style: the observation continues the assistant message as plain text).

    `system_prompt` is the system message every episode opens with. None sends none, unless the template would
    then write a default system message of its own: that one never reaches the model, `SEARCH_AGENT_SYSTEM` is
    sent instead (so what the model reads is chosen here, whatever template a model ships).
    """

    def __init__(self, tokenizer: Any, observation_role: str = "user", system_prompt: str | None = None):
        if observation_role not in ("user", "tool", "inline"):
            raise ValueError("observation_role must be 'user', 'tool' or 'inline'")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template: every episode is "
                "rendered through one, so a base model needs one added (tokenizer.chat_template) before it can play"
            )
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        if system_prompt is None and template_writes_default_system(tokenizer):
            system_prompt = SEARCH_AGENT_SYSTEM
        self.system_prompt = system_prompt
        self.eos_text = tokenizer.eos_token or ""
        if observation_role != "inline":
            self._close, self._turn_template = self._probe()

    def opening(self, first_observation: str) -> list[dict[str, str]]:
        """The opening messages: the system message (if any) and the user's prompt."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return system + [{"role": "user", "content": first_observation}]

    def prompt_ids(self, first_observation: str) -> list[int]:
        """The opening messages and the assistant generation prompt."""
        text = self.tokenizer.apply_chat_template(
            self.opening(first_observation), tokenize=False, add_generation_prompt=True
        )
        return self.encode(text)

    def observation_text(self, observation: str, ended_with_eos: bool) -> str:
        """The text between the model's last token and its next turn."""
        if self.observation_role == "inline":
            return f"\n\n{observation}\n\n"
        close = self._close
        if ended_with_eos and self.eos_text and close.startswith(self.eos_text):
            close = close[len(self.eos_text) :]
        return close + self._turn_template.replace(_PROBE_OBS, observation)

    def observation_ids(self, observation: str, ended_with_eos: bool) -> list[int]:
        return self.encode(self.observation_text(observation, ended_with_eos))

    def conversation_ids(self, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
        """A whole episode's (ids, loss mask) laid out exactly as the runner builds it while playing.

        `messages` alternate user (observation) and assistant (action) turns, starting with the prompt;
        the mask is 1 on assistant tokens. Supervised warm starts train on this layout, so the policy
        learns the very token context it later acts in.
        """
        if not messages or messages[0].get("role") != "user":
            raise ValueError("a conversation starts with the user's prompt")
        ids = self.prompt_ids(messages[0]["content"])
        mask = [0] * len(ids)
        for i, message in enumerate(messages[1:], start=1):
            expected = "assistant" if i % 2 else None
            if expected and message.get("role") != "assistant":
                raise ValueError(f"message {i} should be the assistant's turn, got role {message.get('role')!r}")
            if expected:
                piece, flag = self.encode(message["content"]), 1
            else:
                piece, flag = self.observation_ids(message["content"], ended_with_eos=False), 0
            ids.extend(piece)
            mask.extend([flag] * len(piece))
        return ids, mask

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _probe(self) -> tuple[str, str]:
        """(assistant-closing text, next-turn text with the observation placeholder) from the template."""
        conversation = self.opening(_PROBE_USER) + [{"role": "assistant", "content": _PROBE_ANSWER}]
        before = self.tokenizer.apply_chat_template(conversation, tokenize=False)
        after = self.tokenizer.apply_chat_template(
            conversation + [{"role": self.observation_role, "content": _PROBE_OBS}],
            tokenize=False,
            add_generation_prompt=True,
        )
        if not after.startswith(before) or _PROBE_ANSWER not in before or _PROBE_OBS not in after:
            raise ValueError(
                "this chat template does not extend a conversation by appending text; use observation_role='inline'"
            )
        close = before[before.rindex(_PROBE_ANSWER) + len(_PROBE_ANSWER) :]
        return close, after[len(before) :]


def template_writes_default_system(tokenizer: Any) -> bool:
    """Whether the chat template writes a system message of its own when a conversation has none."""
    return template_default_system(tokenizer) is not None


def template_default_system(tokenizer: Any) -> str | None:
    """The system message the chat template writes when a conversation has none (None: it writes none).

    Read off the template: render a conversation with a probe system message; the text around the probe opens and
    closes a system turn, and a conversation without one that has the same opening and closing holds the default
    between them. A fine-tune on chats sent without a system message (the synthesis agent's) is laid out with it,
    so the model learns the exact tokens it will read.
    """
    user = [{"role": "user", "content": _PROBE_USER}]
    try:
        bare = tokenizer.apply_chat_template(user, tokenize=False)
        with_system = tokenizer.apply_chat_template(
            [{"role": "system", "content": _PROBE_SYSTEM}] + user, tokenize=False
        )
    except Exception:  # a template that refuses system messages cannot write a default one either
        return None
    if _PROBE_SYSTEM not in with_system:
        return None
    opening, _, rest = with_system.partition(_PROBE_SYSTEM)
    if not opening.strip() or not bare.startswith(opening) or with_system.startswith(bare):
        return None
    if not bare.endswith(rest) or len(bare) < len(opening) + len(rest):
        return None
    return bare[len(opening) : len(bare) - len(rest)]
