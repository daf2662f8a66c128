"""Command-line flags generated from a settings dataclass, so a command's flags and its settings cannot drift.

`add_settings_flags(parser, EvalSettings)` adds one flag per field (`max_new_tokens` -> `--max-new-tokens`), with
the field's `setting(help=...)`, choices and type; `settings_values(args, EvalSettings)` gives back only the flags
the user typed, as the `values` layer of `load_settings` (defaults < `--config` file < flags < dotted overrides).
Range checks are not repeated here: `load_settings` runs every declared check and names the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

FLAG_DEST = "settings:"  # prefix of the argparse dests these flags write, so they never meet a command's own


def flag_name(field_name: str) -> str:
    """`max_new_tokens` -> `--max-new-tokens`."""
    return "--" + field_name.replace("_", "-")


def settings_argv(settings: Any) -> list[str]:
    """The flags that give `settings` from its class's defaults (the inverse of `add_settings_flags`): one per field
    not at its default, lists comma-joined and booleans as `--x`/`--no-x`; what a results file records as its
    command."""
    defaults = type(settings)()
    argv: list[str] = []
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value == getattr(defaults, f.name):
            continue
        if isinstance(value, bool):
            argv.append(flag_name(f.name) if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            argv += [flag_name(f.name), ",".join(map(str, value))]
        else:
            argv += [flag_name(f.name), str(value)]
    return argv


def _json_mapping(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"key\": 1}}', got {text!r}")
    return value


def _number_list(kind: type) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of {kind.__name__}s, got {text!r}") from None

    parse.__name__ = f"{kind.__name__} list"
    return parse


def _strip_optional(hint: Any) -> Any:
    """`int | None` -> `int`; anything else unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _parser_of(hint: Any) -> Callable[[str], Any] | None:
    """The argparse `type=` for a field's annotation; None for a type no flag can carry (a nested dataclass)."""
    hint = _strip_optional(hint)
    origin = typing.get_origin(hint)
    if hint in (int, float, str):
        return hint
    if hint is Path:
        return str  # settings keep paths as given; OmegaConf turns str into Path
    if origin in (dict, typing.Mapping) or hint is dict:
        return _json_mapping
    if origin in (list, tuple) and typing.get_args(hint)[:1] and typing.get_args(hint)[0] in (int, float, str):
        return _number_list(typing.get_args(hint)[0])
    return None


def add_settings_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    skip: Collection[str] = (),
    required: Collection[str] = (),
    positional: Mapping[str, str | None] | None = None,
) -> list[str]:
    """One flag per field of `cls` that a flag can carry (not nested dataclasses, not `skip`); returns their names.

    Help is the field's `setting(help=...)` with its default; a bool is `--x/--no-x`. No flag has a default of its
    own, so `settings_values` sees only what was typed and a `--config` file is not overridden by defaults.
    `required` names fields whose flag must be given (for fields without a default, prefer a `--config` file).
    `positional` maps fields to argparse `nargs` (None: exactly one) for those given by position, not by flag.
    """
    positional = positional or {}
    hints = typing.get_type_hints(cls)
    added = []
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        hint = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", "")
        if default not in (None, "", False) and not isinstance(default, (dict, list)):
            help_text = f"{help_text} (default: {default})".strip()
        kwargs: dict[str, Any] = {"dest": FLAG_DEST + f.name, "default": argparse.SUPPRESS, "help": help_text}
        if f.name in positional:
            element = _strip_optional(hint)
            if typing.get_origin(element) in (list, tuple):
                element = typing.get_args(element)[0]
            metavar = f.metadata.get("metavar", f.name.upper())
            kwargs.pop("dest")
            parser.add_argument(
                FLAG_DEST + f.name, nargs=positional[f.name], type=_parser_of(element) or str, metavar=metavar, **kwargs
            )
        elif _strip_optional(hint) is bool:
            parser.add_argument(flag_name(f.name), action=argparse.BooleanOptionalAction, **kwargs)
        else:
            parse = _parser_of(hint)
            if parse is None:
                continue
            if "choices" in f.metadata:  # None (off) is no value a flag can type
                kwargs["choices"] = [c for c in f.metadata["choices"] if c is not None]
            else:
                kwargs["metavar"] = f.metadata.get("metavar", f.name.upper())
            parser.add_argument(flag_name(f.name), type=parse, required=f.name in required, **kwargs)
        added.append(f.name)
    return added


def settings_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of `cls` whose flags were given on the command line, by field name (for `load_settings(values=)`)."""
    names = {f.name for f in dataclasses.fields(cls)}
    given = vars(args)
    return {
        key.removeprefix(FLAG_DEST): value
        for key, value in given.items()
        if key.startswith(FLAG_DEST) and key.removeprefix(FLAG_DEST) in names
    }
