"""Structured tool calls from other libraries, written as the env's Hermes-format action text (the writer lives in
envs/actions.py, beside the parser that reads it, so agent programs in agents/ use it too)."""

from __future__ import annotations

from searchgym.envs.actions import ARGUMENTS, tool_call_action

__all__ = ["ARGUMENTS", "tool_call_action"]
