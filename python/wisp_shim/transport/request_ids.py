"""The one judgement of a client's JSON-RPC envelope and its request id, for both transports
(stdio: transport/stdio.py and transport/guard.py; the shared server: http/server.py).

Read before the SDK parses the message, because the SDK mistakes some of these for
something else: a request whose id is 1.5, true or null validates as a notification and is
never answered (over HTTP it would get `202` and silence), an integer id past 64 bits is
taken as is, and over HTTP a second request under an id still in flight overwrites the
first's reply stream, so one of them never gets its reply.

- A request (a top-level object with "method" and "id") must have an id that is a string or
  an integer (JSON-RPC 2.0; MCP forbids null): not a number with a fraction or exponent, not
  true/false, null, an object or an array, and an integer within int64. A string id must be
  text: an unpaired UTF-16 surrogate escape cannot be written back in a reply. A long string
  id is allowed (the transport's line or body limit bounds it).
- The envelope's members appear once each: with two "id" members, which one a reply should
  carry depends on the parser that reads it.
- A JSON array is a batch: MCP 2025-06-18 and later removed batching, so it is refused whole.
- Ids are keyed as the SDK correlates them (sdk_seams.request_key: "05", " 5" and 5 are one
  id), and a request whose key is held by a request of the same client still awaiting its
  reply is refused (`IdsInFlight`).

Everything refused here is answered -32600 before anything runs; the id is null when the
envelope's id is not one wisp may answer under. What this module cannot read (not JSON, not
UTF-8, a number Python's parser refuses) it leaves to the SDK, which answers it (-32700).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]  # the stdlib's, unlisted in typeshed
from typing import Any

from mcp_types import INVALID_REQUEST

from .sdk_seams import request_key

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_WS = re.compile(r"[ \t\n\r]*")
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the stdlib's, unlisted in typeshed
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _skip(text: str, at: int) -> int:
    """Past the JSON whitespace at `at` (none is a match too)."""
    found = _WS.match(text, at)
    return found.end() if found is not None else at


@dataclass(frozen=True)
class Refusal:
    """A message refused at the door: answered -32600 under `id` (None: id null)."""

    message: str
    id: int | str | None = None

    def error(self) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": self.id, "error": {"code": INVALID_REQUEST, "message": self.message}}


@dataclass(frozen=True)
class Request:
    """A request whose id is allowed: what the transport checks against its requests in flight."""

    id: int | str


def id_refusal(value: Any) -> str | None:
    """Why a request id is not allowed, or None for one that is."""
    if isinstance(value, bool):
        what = "true or false"
    elif isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return None
        what = "an integer outside 64 bits (-2^63 to 2^63-1)"
    elif isinstance(value, str):
        if _LONE_SURROGATE.search(value) is None:
            return None
        what = "a string with an unpaired UTF-16 surrogate escape"
    elif isinstance(value, float):
        what = "a number with a fraction or an exponent"
    else:
        what = {type(None): "null", dict: "an object", list: "an array"}.get(type(value), "not a string")
    return (f"Invalid Request: a request's \"id\" must be a string or an integer (this one is {what}); "
            "a message without an id is a notification. Nothing was done.")


BATCH = Refusal("Invalid Request: a JSON array (a batch) is not served: MCP 2025-06-18 and later removed "
                "JSON-RPC batching. Send each request as a message of its own; nothing was done.")


def judge(text: str | bytes) -> Refusal | Request | None:
    """The verdict on one message as the client sent it: a Refusal, a Request with an allowed
    id, or None for what is not refused here (a notification, a response, a message this
    cannot read: the SDK answers those)."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            return None
    start = _skip(text, 0)
    try:
        if text.startswith("[", start):
            _, end = _scan(text, start)
            return BATCH if _skip(text, end) == len(text) else None
        members = _top_level(text, start)
    except (ValueError, StopIteration, RecursionError):
        return None  # not JSON as Python reads it: the SDK's parser answers
    if members is None:
        return None
    seen: set[str] = set()
    repeated: set[str] = set()
    for name, _ in members:
        (repeated if name in seen else seen).add(name)
    twice = sorted(repeated)
    if twice:
        shown = ", ".join(json.dumps(n)[:40] for n in twice[:5])
        return Refusal(f"Invalid Request: the message has the member {shown} more than once, so what it asks "
                       "depends on who reads it; send each member once. Nothing was done.")
    fields = dict(members)
    if "method" not in fields or "id" not in fields:
        return None  # a notification or a response: no reply is owed
    why = id_refusal(fields["id"])
    return Refusal(why) if why is not None else Request(fields["id"])


def _top_level(text: str, i: int) -> list[tuple[str, Any]] | None:
    """The members of the one JSON object `text` holds, in order, duplicates kept; None when
    it holds something else. Values are read by the stdlib's scanner (C), so deep nesting in
    them costs what json.loads costs; a malformed text raises."""
    if not text.startswith("{", i):
        return None
    members: list[tuple[str, Any]] = []
    i = _skip(text, i + 1)
    if text.startswith("}", i):
        i += 1
    else:
        while True:
            if not text.startswith('"', i):
                raise ValueError("a member name must be a string")
            name, i = scanstring(text, i + 1, True)
            i = _skip(text, i)
            if not text.startswith(":", i):
                raise ValueError("expected ':'")
            value, i = _scan(text, _skip(text, i + 1))
            members.append((name, value))
            i = _skip(text, i)
            sep = text[i:i + 1]
            i = _skip(text, i + 1)
            if sep == "}":
                break
            if sep != ",":
                raise ValueError("expected ',' or '}'")
    if _skip(text, i) != len(text):
        raise ValueError("more after the object")
    return members


def in_flight(rid: int | str) -> Refusal:
    shown = json.dumps(rid)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return Refusal(f"Invalid Request: request id {shown} is already in flight: a request's id must differ from "
                   "those of the client's requests still awaiting a reply. Nothing was done.", rid)


class IdsInFlight:
    """One client's (one session's) requests awaiting their replies, by the SDK's key for their
    ids. A claim's token tells its release from a stale one for an earlier request under the
    same id."""

    def __init__(self) -> None:
        self._held: dict[Any, object] = {}

    def __len__(self) -> int:
        return len(self._held)

    def claim(self, rid: Any) -> object | None:
        """A token for `rid`, or None when a request under that id is in flight."""
        key = request_key(rid)
        if key in self._held:
            return None
        token = self._held[key] = object()
        return token

    def release(self, rid: Any, token: object | None = None) -> object | None:
        """Ends the claim on `rid` (only `token`'s, when given); returns the token it ended."""
        key = request_key(rid)
        held = self._held.get(key)
        if held is None or (token is not None and held is not token):
            return None
        del self._held[key]
        return held
