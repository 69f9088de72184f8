"""Guards between the stdio transport and the MCP server loop (hostile input).

- Answers what the SDK drops. A line that is not JSON, or not a JSON-RPC message, reaches
  the server loop as an exception item that the SDK only logs, so a client waiting on that
  request would wait forever. Here it gets the JSON-RPC error the spec asks for: -32700
  (parse error) or -32600 (invalid request), naming the request's id when one can be read.
- Backpressure. The SDK starts a task for every request it reads, with no limit, and
  writes replies with a blocking write to stdout: a client that keeps sending and stops
  reading would grow the shim without bound. Here a request is only handed on while fewer
  than MAX_IN_FLIGHT requests (and MAX_IN_FLIGHT_BYTES of their arguments, every value
  counted, plus the client's roots fetched for them) await their replies; past that, stdin is
  simply not read, and the client's writes block.
- Request ids, as transport/request_ids.py judges them. The budget counts requests, keyed exactly as the
  SDK correlates ids ("05" and 5 are one id), and a slot is freed when its request ends,
  answered or not (the SDK's `on_request_unanswered` hook covers a cancelled one, however its
  cancel spelled the id). A request whose id is already in flight is refused with -32600
  before the SDK sees it: the SDK would run both and send two replies under one id. A line
  transport/request_ids.py refuses (an id that is neither a string nor an int64 integer, which the SDK
  would read as a notification and never answer; a member twice; a batch) is marked by
  transport/stdio.py (`screened`) so that it is answered -32600 with id null, as JSON-RPC 2.0 asks.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anyio
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, JSONRPCRequest

from . import request_ids
from .request_ids import IdsInFlight, Refusal
from .sdk_seams import bad_line, last_context, request_metadata
from ..errors import short

log = logging.getLogger("wisp.transport")

MAX_IN_FLIGHT = 128
MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024

# `"id": 12` or `"id": "abc"` in the part of a line before anything nests.
_ID_RE = re.compile(r'"id"\s*:\s*(-?\d{1,18}(?![\d.eE])|"(?:[^"\\]|\\.){0,200}")')


# What transport/stdio.py hands the SDK in place of a line transport/request_ids.py refuses: not JSON, so the SDK
# reports it, and _answer_for knows it by this prefix (the rest is wisp's own message).
_REFUSED = "\x00wisp refused: "


def screened(line: str) -> str:
    """The line for the SDK: as read, or marked refused (the SDK would read a request with an
    id such as 1.5 as a notification and never answer it)."""
    verdict = request_ids.judge(line)
    if isinstance(verdict, Refusal):
        return _REFUSED + verdict.message + "\n"
    return line


def _request_id(value: Any) -> int | str | None:
    return value if request_ids.id_refusal(value) is None else None


def _id_from_line(line: str) -> int | str | None:
    """The top-level id of a line that did not parse, when it can be told without nesting."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):
        msg = None
    if isinstance(msg, dict):
        return _request_id(msg.get("id"))
    if msg is not None:
        return None
    head = line[1:]
    cut = min((i for i in (head.find("{"), head.find("[")) if i >= 0), default=len(head))
    m = _ID_RE.search(head[:cut])
    if m is None:
        return None
    with_quotes = m.group(1)
    try:
        return _request_id(json.loads(with_quotes))
    except ValueError:
        return None


def _answer_for(exc: Exception) -> JSONRPCError | None:
    """The error reply for a line the transport could not turn into a message, or None for
    a line that was not a request (a bad notification or response gets no reply)."""
    bad = bad_line(exc)
    if bad is not None and bad.not_json:
        raw = bad.line
        if raw is not None and not raw.strip():
            return None  # a blank line is no message: nothing to answer
        if raw is not None and raw.startswith(_REFUSED):
            return JSONRPCError.model_validate(Refusal(raw[len(_REFUSED):].rstrip("\n")).error())
        rid = _id_from_line(raw) if raw is not None else None
        return JSONRPCError(
            jsonrpc="2.0", id=rid,
            error=ErrorData(code=PARSE_ERROR,
                            message=f"Parse error: the line is not valid JSON ({bad.why}); nothing was done."),
        )
    # Well-formed JSON that is not a JSON-RPC message.
    obj = bad.value if bad is not None else None
    if isinstance(obj, dict):
        if "method" not in obj or "id" not in obj:
            return None  # a notification or a response: nobody waits for an answer
        rid = _request_id(obj.get("id"))
        return JSONRPCError(
            jsonrpc="2.0", id=rid,
            error=ErrorData(
                code=INVALID_REQUEST,
                message="Invalid Request: a JSON-RPC 2.0 request needs \"jsonrpc\": \"2.0\", an integer or string "
                "\"id\" and a string \"method\"; nothing was done.",
            ),
        )
    return JSONRPCError(
        jsonrpc="2.0", id=None,
        error=ErrorData(code=INVALID_REQUEST,
                        message="Invalid Request: a message must be one JSON-RPC 2.0 object; nothing was done."),
    )


def _weight(msg: JSONRPCRequest) -> int:
    """Roughly the bytes a request holds while it runs: every value in its params, about as
    JSON writes them (a `files` list, a `schema`, `_meta` as much as `prompt`). Iterative, so
    no nesting the parser took can exhaust the stack here."""
    return json_size(msg.params)


def json_size(value: Any) -> int:
    """About the JSON length of a parsed value: strings by length, other scalars by a few
    bytes, and a separator for each element, key or item."""
    size = 0
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            size += len(v) + 3
        elif isinstance(v, dict):
            size += 2
            for k, item in v.items():
                size += len(k) + 4 if isinstance(k, str) else 8
                todo.append(item)
        elif isinstance(v, list | tuple):
            size += 2 + len(v)
            todo.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            size += 1 + v.bit_length() // 3
        else:
            size += 5
    return size


class _Budget:
    def __init__(self) -> None:
        # The requests in flight (request_ids.IdsInFlight: keyed as the SDK correlates ids) and
        # the bytes each holds, by its claim's token.
        self.ids = IdsInFlight()
        self.weights: dict[object, int] = {}
        self.bytes = 0
        self.changed = anyio.Event()

    def full(self) -> bool:
        return bool(self.ids) and (len(self.ids) >= MAX_IN_FLIGHT or self.bytes >= MAX_IN_FLIGHT_BYTES)

    def add(self, rid: Any, weight: int) -> object | None:
        """The request's token, or None when a request under its id is in flight."""
        token = self.ids.claim(rid)
        if token is not None:
            self.weights[token] = weight
            self.bytes += weight
        return token

    def charge(self, token: object, weight: int) -> None:
        """More bytes held by a request in flight (what it fetched from the client meanwhile);
        nothing for a request that has ended."""
        if token in self.weights:
            self.weights[token] += weight
            self.bytes += weight

    def release(self, rid: Any, token: object | None = None) -> None:
        ended = self.ids.release(rid, token)
        if ended is None:
            return
        self.bytes -= self.weights.pop(ended)
        self.changed.set()
        self.changed = anyio.Event()


class InFlight:
    """A request's entry in the budget, as its handler sees it (`ctx.request` on stdio): what
    the handler fetches for the request and holds while it runs (the client's roots) is
    charged here, so it counts like the request's own arguments."""

    __slots__ = ("_budget", "_token")

    def __init__(self, budget: _Budget, token: object) -> None:
        self._budget, self._token = budget, token

    def charge(self, weight: int) -> None:
        self._budget.charge(self._token, weight)


def charge(request_context: Any, weight: int) -> None:
    """Charge `weight` bytes to the request whose context this is, when its transport keeps a
    budget (stdio does; other transports' contexts are left alone)."""
    if isinstance(request_context, InFlight):
        request_context.charge(weight)


class GuardedReadStream:
    def __init__(self, inner: Any, write: GuardedWriteStream) -> None:
        self._inner = inner
        self._write = write
        self._budget = write.budget

    @property
    def last_context(self) -> Any:
        return last_context(self._inner)

    async def receive(self) -> Any:
        while self._budget.full():
            await self._budget.changed.wait()
        while True:
            item = await self._inner.receive()
            if isinstance(item, Exception):
                answer = _answer_for(item)
                log.warning("unreadable message from the client (%s)%s", str(item).splitlines()[0][:200],
                            "" if answer is None else f"; answered {answer.error.code}")
                if answer is not None:
                    # Not through the budget: its id may be that of a request still in flight.
                    await self._write.send_unbudgeted(SessionMessage(answer))
                continue
            msg = getattr(item, "message", None)
            if isinstance(msg, JSONRPCRequest):
                token = self._budget.add(msg.id, _weight(msg))
                if token is None:
                    log.warning("request id %s is already in flight; refused", short(msg.id))
                    refusal = request_ids.in_flight(msg.id).error()
                    await self._write.send_unbudgeted(SessionMessage(JSONRPCError.model_validate(refusal)))
                    continue

                async def unanswered(rid: Any = msg.id, token: object = token) -> None:
                    self._budget.release(rid, token)

                # stdio carries no metadata of its own; this hook is how the SDK says a request
                # ended without a reply (it was cancelled), whatever spelling its cancel used.
                # The handler reaches its own budget entry as `ctx.request` (InFlight).
                item = SessionMessage(msg, metadata=request_metadata(unanswered, InFlight(self._budget, token)))
            return item

    def __aiter__(self) -> GuardedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    def close(self) -> None:
        self._inner.close()

    async def __aenter__(self) -> GuardedReadStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class GuardedWriteStream:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.budget = _Budget()

    async def send(self, item: Any) -> None:
        try:
            await self._inner.send(item)
        finally:
            msg = getattr(item, "message", None)
            rid = getattr(msg, "id", None)
            if rid is not None and getattr(msg, "method", None) is None:
                self.budget.release(rid)

    async def send_unbudgeted(self, item: Any) -> None:
        """An answer that ends no request in the budget (a refused line)."""
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def close(self) -> None:
        self._inner.close()

    async def __aenter__(self) -> GuardedWriteStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def guard(read: Any, write: Any) -> tuple[GuardedReadStream, GuardedWriteStream]:
    """Wrap the stdio transport's streams for `Server.run`."""
    w = GuardedWriteStream(write)
    return GuardedReadStream(read, w), w
