"""Guards between the stdio transport and the MCP server loop (issue 8, hostile input).

- Answers what the SDK drops. A line that is not JSON, or not a JSON-RPC message, reaches
  the server loop as an exception item that the SDK only logs, so a client waiting on that
  request would wait forever. Here it gets the JSON-RPC error the spec asks for: -32700
  (parse error) or -32600 (invalid request), naming the request's id when one can be read.
- Backpressure. The SDK starts a task for every request it reads, with no limit, and
  writes replies with a blocking write to stdout: a client that keeps sending and stops
  reading would grow the shim without bound. Here a request is only handed on while fewer
  than MAX_IN_FLIGHT requests (and MAX_IN_FLIGHT_BYTES of their string arguments) await
  their replies; past that, stdin is simply not read, and the client's writes block.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anyio
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, JSONRPCNotification, JSONRPCRequest

log = logging.getLogger("wisp.transport")

MAX_IN_FLIGHT = 128
MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024

# `"id": 12` or `"id": "abc"` in the part of a line before anything nests.
_ID_RE = re.compile(r'"id"\s*:\s*(-?\d{1,18}(?![\d.eE])|"(?:[^"\\]|\\.){0,200}")')


def _request_id(value: Any) -> int | str | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return value


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
    errors = getattr(exc, "errors", None)
    details: list[dict[str, Any]] = []
    if callable(errors):
        try:
            details = list(errors())
        except Exception:
            details = []
    for d in details:
        if d.get("type") == "json_invalid":
            raw = d.get("input")
            if isinstance(raw, str) and not raw.strip():
                return None  # a blank line is no message: nothing to answer
            rid = _id_from_line(raw) if isinstance(raw, str) else None
            why = (d.get("ctx") or {}).get("error") or d.get("msg") or "invalid JSON"
            return JSONRPCError(
                jsonrpc="2.0", id=rid,
                error=ErrorData(code=PARSE_ERROR, message=f"Parse error: the line is not valid JSON ({why}); nothing was done."),
            )
    # Well-formed JSON that is not a JSON-RPC message: the validator's input is the object itself.
    # (A `missing` field error's input is the object that lacks it: here, the message.)
    obj = next((d.get("input") for d in details if d.get("type") == "missing" and len(d.get("loc", ())) == 2), None)
    if obj is None:
        obj = next((d.get("input") for d in details if d.get("loc") == ()), None)
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
        error=ErrorData(code=INVALID_REQUEST, message="Invalid Request: a message must be one JSON-RPC 2.0 object; nothing was done."),
    )


def _weight(msg: JSONRPCRequest) -> int:
    """Roughly the bytes a request holds while it runs: its top-level string arguments."""
    params = msg.params or {}
    args = params.get("arguments") if isinstance(params, dict) else None
    if not isinstance(args, dict):
        return 0
    return sum(len(v) for v in args.values() if isinstance(v, str))


class _Budget:
    def __init__(self) -> None:
        self.calls: dict[Any, int] = {}
        self.bytes = 0
        self.changed = anyio.Event()

    def full(self) -> bool:
        return bool(self.calls) and (len(self.calls) >= MAX_IN_FLIGHT or self.bytes >= MAX_IN_FLIGHT_BYTES)

    def add(self, rid: Any, weight: int) -> None:
        self.release(rid)
        self.calls[rid] = weight
        self.bytes += weight

    def release(self, rid: Any) -> None:
        weight = self.calls.pop(rid, None)
        if weight is None:
            return
        self.bytes -= weight
        self.changed.set()
        self.changed = anyio.Event()


def _key(rid: Any) -> Any:
    # The SDK matches a cancel's requestId to a request id loosely ("5" cancels 5).
    return str(rid)


class GuardedReadStream:
    def __init__(self, inner: Any, write: GuardedWriteStream) -> None:
        self._inner = inner
        self._write = write
        self._budget = write.budget

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

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
                    await self._write.send(SessionMessage(answer))
                continue
            msg = getattr(item, "message", None)
            if isinstance(msg, JSONRPCRequest):
                self._budget.add(_key(msg.id), _weight(msg))
            elif isinstance(msg, JSONRPCNotification) and msg.method == "notifications/cancelled":
                rid = (msg.params or {}).get("requestId") if isinstance(msg.params, dict) else None
                if rid is not None:
                    self._budget.release(_key(rid))  # a cancelled request gets no reply
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
                self.budget.release(_key(rid))

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
