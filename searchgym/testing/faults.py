"""Seeded fault generators for the reliability bench (issue 15): URL forms aimed at non-public addresses,
action text an agent might write, web responses that lie, junk request bodies, damaged cache rows, and damaged
lines of a user's text files (issue 44).

Each generator takes a `random.Random`, so a bench run tries the same forms every time; the property
tests draw the same shapes with hypothesis.
"""

from __future__ import annotations

import encodings.aliases
import ipaddress
import json
import random
import string
from typing import Any

from searchgym.envs.tools.url_safety import NON_PUBLIC_NETWORKS

# Every codec name Python knows, plus the non-text codecs a page's charset may name (issue 15, item 1).
CODEC_NAMES: list[str] = sorted(
    set(encodings.aliases.aliases)
    | set(encodings.aliases.aliases.values())
    | {"rot13", "base64", "hex", "zlib", "bz2", "uu", "quopri", "idna", "punycode", "no-such-codec"}
)

# Rows a damaged web cache may hold in place of a page: not JSON, not an object, wrong types, missing fields.
DAMAGED_CACHE_ROWS: list[str] = [
    "{not json",
    "[]",
    "null",
    '"text"',
    json.dumps({"url": 1, "title": "t", "text": "x", "links": []}),
    json.dumps({"title": "t"}),
    json.dumps({"url": "https://example.com/", "title": "t", "text": "x", "links": [1, 2]}),
]

BIG = "__a 5,000-digit number__"  # stands for one in a JSON body (json.dumps cannot write it): see _dumps

TAGS = [
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
    "\ud800",
    "\udfff",
    "\x00",
]


def ssrf_addresses(rng: random.Random, per_network: int = 3) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Addresses in every non-global range: its first and last, and random ones inside."""
    out: list[Any] = []
    for net in NON_PUBLIC_NETWORKS:
        picks = {0, net.num_addresses - 1} | {rng.randrange(net.num_addresses) for _ in range(per_network)}
        out += [net[i] for i in sorted(picks)]
    return out


def ssrf_urls(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[str]:
    """The URL spellings of one address: literal, and for IPv4 the integer, hex, octal, short and IPv6-embedded
    forms."""
    if ip.version == 6:
        return [f"http://[{ip}]/", f"https://[{ip.exploded}]:8443/x"]
    n = int(ip)
    a, b, c, d = ip.packed
    return [
        f"http://{ip}/",
        f"http://{n}/",
        f"http://{n:#x}/",
        f"http://0{a:o}.0{b:o}.0{c:o}.0{d:o}/",
        f"http://{a}.{(b << 16) | (c << 8) | d}/",
        f"http://[::ffff:{ip}]/",
        f"http://[64:ff9b::{ip}]/",
        f"http://[2002:{n >> 16:x}:{n & 0xFFFF:x}::1]/",
        f"http://user@{ip}:80/",
    ]


def action_forms(rng: random.Random, n: int) -> list[Any]:
    """What an agent's turn may be: tag soup, Hermes calls with nested/wrongly typed/surrogate JSON, huge text,
    lone surrogates, and values that are not strings at all."""
    forms: list[Any] = [None, 5, 3.5, b"<search>x</search>", ["<search>x</search>"], {"tool": "search"}, "", " "]
    makers = [
        lambda: "".join(rng.choice(TAGS) if rng.random() < 0.4 else _text(rng, 8) for _ in range(rng.randrange(1, 30))),
        lambda: (
            "<tool_call>"
            + _dumps(
                {"name": rng.choice(["search", "access", "answer", "x", None, 3]), "arguments": _json_value(rng, 3)}
            ).decode()
            + "</tool_call>"
        ),
        lambda: '<tool_call>{"name": "search", "arguments": "' + "[" * rng.randrange(100, 5000) + '"}</tool_call>',
        lambda: "<tool_call>" + '{"a":' * rng.randrange(100, 3000) + "</tool_call>",
        lambda: f"<{rng.choice(['search', 'access', 'answer'])}>{_text(rng, 40)}</{rng.choice(['search', 'answer'])}>",
        lambda: "<search>" + "x" * rng.randrange(10_000, 200_000) + "</search>",
        lambda: (
            "<access>"
            + rng.choice(
                [
                    "http://127.0.0.1/",
                    "file:///etc/passwd",
                    "http://[fec0::1]/",
                    "javascript:alert(1)",
                    "http://0x7f000001/",
                    _text(rng, 30),
                ]
            )
            + "</access>"
        ),
    ]
    while len(forms) < n:
        forms.append(rng.choice(makers)())
    return forms[:n]


def web_responses(rng: random.Random, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    """(status, headers, body) a page may answer: charsets naming any codec, junk headers, random bytes, tag soup."""
    out = []
    for _ in range(n):
        status = rng.choice([200, 200, 200, 203, 404, 410, 500, 503])
        charset = rng.choice(CODEC_NAMES)
        content_type = rng.choice(
            [
                f"text/html; charset={charset}",
                "text/html",
                "application/octet-stream",
                _printable(rng, 40),
                f"text/plain; charset={charset}",
            ]
        )
        headers = {"Content-Type": content_type}
        if rng.random() < 0.3:
            headers[rng.choice(["Content-Encoding", "Content-Language", "Link", "Refresh"])] = _printable(rng, 30)
        kind = rng.randrange(4)
        if kind == 0:
            body = rng.randbytes(rng.randrange(0, 2000))
        elif kind == 1:
            text = _text(rng, 200)
            body = f"<html><title>{text}</title><body><p>{text}</p></body>".encode("utf-8", "surrogatepass")
        elif kind == 2:
            body = f'<meta charset="{rng.choice(CODEC_NAMES)}"><p>{_text(rng, 100)}</p>'.encode(
                "utf-8", "surrogatepass"
            )
        else:
            body = ("<div>" * rng.randrange(1, 3000)).encode()
        out.append((status, headers, body))
    return out


def junk_bodies(rng: random.Random, n: int, valid: dict[str, Any] | None = None) -> list[bytes]:
    """Request bodies: random bytes, random JSON, or `valid` with one or two fields replaced by junk."""
    out = []
    for _ in range(n):
        kind = rng.randrange(3 if valid else 2)
        if kind == 0:
            out.append(rng.randbytes(rng.randrange(0, 64)))
        elif kind == 1:
            out.append(_dumps(_json_value(rng, 3)))
        else:
            body = json.loads(json.dumps(valid))
            for _ in range(rng.randrange(1, 3)):
                body[rng.choice(sorted(body))] = _json_value(rng, 2)
            out.append(_dumps(body))
    return out


def _dumps(value: Any) -> bytes:
    """JSON bytes of `value`, each BIG marker written as a 5,000-digit number."""
    return json.dumps(value).replace(json.dumps(BIG), "9" * 5000).encode("utf-8", "surrogatepass")


def _text(rng: random.Random, max_len: int) -> str:
    """Random Unicode, lone surrogates and control characters included."""
    return "".join(
        chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x2FFFF), rng.randrange(0xD800, 0xE000)]))
        for _ in range(rng.randrange(0, max_len + 1))
    )


def _printable(rng: random.Random, max_len: int) -> str:
    return "".join(rng.choice(string.printable[:95]) for _ in range(rng.randrange(0, max_len + 1)))


def _json_value(rng: random.Random, depth: int) -> Any:
    """A random JSON value: scalars of every type (huge ints, surrogate strings), nested lists and objects."""
    kind = rng.randrange(8 if depth > 0 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 2**63, 7, 1.5, -0.0, BIG])
    if kind in (3, 4, 5):
        return _text(rng, 20)
    if kind == 6:
        return [_json_value(rng, depth - 1) for _ in range(rng.randrange(0, 4))]
    return {_text(rng, 6): _json_value(rng, depth - 1) for _ in range(rng.randrange(0, 4))}


# How a line of a user's JSONL or text file may be damaged (issue 44): see damage_lines.
LINE_DAMAGES = ["latin-1", "utf-16", "cut", "junk", "duplicate", "not-an-object", "no-text"]


def damage_lines(data: bytes, how: str, at: int) -> bytes:
    """`data` (UTF-8 JSONL or qrels text) damaged `how` (one of LINE_DAMAGES) at line `at` (wrapped to the file's
    length): a latin-1 byte, the whole file re-encoded as UTF-16, a line cut in half, a junk line, the first line
    repeated, a JSON array line, a row without its text."""
    lines = data.splitlines(keepends=True)
    i = at % len(lines)
    if how == "latin-1":
        lines[i] = lines[i].replace(b"e", "\u00e9".encode("latin-1"), 1)
    elif how == "utf-16":
        return data.decode().encode("utf-16")
    elif how == "cut":
        lines[i] = lines[i][: max(1, len(lines[i]) // 2)] + b"\n"
    elif how == "junk":
        lines.insert(i, b"}{ not json\n")
    elif how == "duplicate":
        lines.insert(i, lines[0])
    elif how == "not-an-object":
        lines.insert(i, b"[1, 2]\n")
    elif how == "no-text":
        lines.insert(i, b'{"docid": "777"}\n')
    else:
        raise ValueError(f"unknown damage {how!r}; the damages are {LINE_DAMAGES}")
    return b"".join(lines)
