"""The shared server's guards: what a peer may hold before and after it shows the token.

- Deadlines. A request's headers must arrive within HEADER_TIMEOUT_S of the connection opening
  (or of its previous reply), and its body within BODY_TIMEOUT_S of its headers; past either,
  the connection is closed. A reply being written or a call running has no deadline here (the
  call has its own time limit, an SSE stream is meant to stay open).
- Connections apart. A connection is unproven until one of its requests carries the token, then
  proven. At most MAX_UNPROVEN_CONNECTIONS unproven ones are kept: a new one past that closes the
  oldest unproven one (a client with the token sends its headers at once, so it is never the
  oldest for long; a peer without it cannot keep its place). Proven ones have their own room
  (MAX_PROVEN_CONNECTIONS, then 503), which no unproven peer can take.
- Bodies read whole before the SDK (`read_body`), so that transport/request_ids.py judges the envelope
  and a refused one is answered 400 (`refuse`) before anything runs; the SDK then reads the
  same bytes. A body whose Content-Length, or whose bytes, pass the SDK's limit is not read
  whole here: the SDK answers it 413.
- Body budgets. Request bodies received and not yet answered are counted per 2025-11-25 session
  (SESSION_BODY_BYTES, the most one stdio client may have in flight) and over all clients
  (TOTAL_BODY_BYTES, several sessions' worth); a connection carries one request at a time, whose
  body the SDK bounds (413). Past its session's share or the total, a request is answered 503
  while its body is still arriving; a body under SMALL_BODY_BYTES never counts as past the total,
  so a client with its own share left is served however much others hold. A 2026-07-28 client
  opens no session: each of its connections counts as one client.

Written against uvicorn's h11 protocol (its `H11Protocol`, the request cycle's `more_body`,
`response_complete`, and the per-connection `app`): the deadline and cap tests in
tests/python/test_http_guards.py run this class in uvicorn as installed, so a change there fails them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .token import Credentials
from ..transport.request_ids import IdsInFlight, Refusal
from ..transport.guard import MAX_IN_FLIGHT_BYTES

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("wisp.http")

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0
MAX_UNPROVEN_CONNECTIONS = 128
MAX_PROVEN_CONNECTIONS = 1024
SESSION_BODY_BYTES = MAX_IN_FLIGHT_BYTES
TOTAL_BODY_BYTES = 4 * MAX_IN_FLIGHT_BYTES
# A body this small is never refused for the total, so that a full server still takes every
# client's small calls: at most MAX_PROVEN_CONNECTIONS of them, 64 MiB, on top of the total.
SMALL_BODY_BYTES = 64 * 1024

_HEADERS, _BODY = "headers", "body"


class ConnectionGuard:
    """The server-wide side: which connections are proven, the caps, the credential verdict."""

    def __init__(self, credentials: Credentials, *, max_unproven: int = MAX_UNPROVEN_CONNECTIONS,
                 max_proven: int = MAX_PROVEN_CONNECTIONS, header_s: float = HEADER_TIMEOUT_S,
                 body_s: float = BODY_TIMEOUT_S) -> None:
        self.credentials = credentials
        self.max_unproven, self.max_proven = max_unproven, max_proven
        self.limits = {_HEADERS: header_s, _BODY: body_s}
        # Insertion order is age: the first is the oldest.
        self.unproven: dict[GuardedConnection, None] = {}
        self.proven: set[GuardedConnection] = set()

    def protocol(self) -> type[GuardedConnection]:
        """The asyncio protocol class for uvicorn's `Config(http=...)`, bound to this guard."""
        return type("WispConnection", (GuardedConnection,), {"guard": self})

    def arrived(self, conn: GuardedConnection) -> None:
        while len(self.unproven) >= self.max_unproven:
            oldest = next(iter(self.unproven))
            del self.unproven[oldest]
            log.debug("closing the oldest connection that has not shown the token, to make room")
            oldest.close_now()
        self.unproven[conn] = None

    def left(self, conn: GuardedConnection) -> None:
        self.unproven.pop(conn, None)
        self.proven.discard(conn)

    async def request(self, conn: GuardedConnection, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        refusal = self.credentials.judge(scope["headers"])
        if refusal is not None:
            await refusal.send(send)
            return
        if conn not in self.proven:
            if len(self.proven) >= self.max_proven:
                await unavailable(send, f"wisp serves at most {self.max_proven} connections with the token at once; "
                                        "close some, or retry", close=True)
                return
            self.unproven.pop(conn, None)
            self.proven.add(conn)
        await app(scope, receive, send)


class GuardedConnection(H11Protocol):
    """uvicorn's h11 protocol with wisp's deadlines, its place among unproven or proven
    connections, and the credential check before the app."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        app, guard = self.app, self.guard

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            await guard.request(self, app, scope, receive, send)

        self.app = guarded
        self._timer: asyncio.TimerHandle | None = None
        self._phase: tuple[str | None, object] = (None, None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self.guard.arrived(self)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.left(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def close_now(self) -> None:
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            # abort: a peer that does not read must not keep the socket open with unsent bytes.
            self.transport.abort()

    def _watch(self) -> None:
        """Arms the deadline of what the connection is waiting for: a request's headers (none
        yet, or the previous reply is done) or the rest of its body; none otherwise."""
        if self.transport is None or self.transport.is_closing():
            self._disarm()
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            phase: str | None = _HEADERS
        elif cycle.more_body and not cycle.disconnected:
            phase = _BODY
        else:
            phase = None
        # A new request (cycle) or a new phase of it starts a new clock; the same one keeps its own.
        if (phase, cycle) == self._phase:
            return
        self._disarm()
        self._phase = (phase, cycle)
        if phase is not None:
            self._timer = self.loop.call_later(self.guard.limits[phase], self._expired, phase)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, phase: str) -> None:
        self._timer = None
        log.debug("closing a connection whose request %s did not arrive within %g s", phase, self.guard.limits[phase])
        self.close_now()


class BodyBudgets:
    """Request bytes received and not yet answered, per session and over all clients."""

    def __init__(self, per_session: int = SESSION_BODY_BYTES, total: int = TOTAL_BODY_BYTES) -> None:
        self.per_session, self.total = per_session, total
        self.held = 0
        self.sessions: dict[str, int] = {}

    def take(self, session: str | None, n: int, request: int = 0) -> str | None:
        """Counts `n` more bytes of a request that holds `request` bytes already, for `session`
        (None: a request outside any session, bounded by its connection); returns why they are
        refused instead, counting nothing."""
        mine = self.sessions.get(session, 0) if session is not None else 0
        if session is not None and mine + n > self.per_session:
            return (f"this MCP session holds {self.per_session // (1024 * 1024)} MiB of requests that are not answered "
                    "yet; send this one again when some have been")
        if self.held + n > self.total and request + n > SMALL_BODY_BYTES:
            return (f"wisp holds {self.total // (1024 * 1024)} MiB of its clients' requests that are not answered yet; "
                    "send this one again when some have been")
        self.held += n
        if session is not None:
            self.sessions[session] = mine + n
        return None

    def give_back(self, session: str | None, n: int) -> None:
        self.held -= n
        if session is not None:
            left = self.sessions.get(session, 0) - n
            if left > 0:
                self.sessions[session] = left
            else:
                self.sessions.pop(session, None)


async def read_body(scope: Scope, receive: Receive, limit: int) -> tuple[bytes | None, Receive]:
    """The request's whole body (None when it passes `limit`, as declared or as sent) and the
    `receive` that gives the SDK what was read, then the rest of the connection's messages."""
    read: list[MutableMapping[str, Any]] = []
    size, whole = 0, False
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    if not (declared.isdigit() and (len(declared) > 19 or int(declared) > limit)):
        while size <= limit:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                whole = size <= limit
                break

    async def replay() -> Any:
        return read.pop(0) if read else await receive()

    body = b"".join(m.get("body", b"") for m in read if m["type"] == "http.request") if whole else None
    return body, replay


class Claim:
    """A request's id held in flight in its session until every holder has dropped it."""

    def __init__(self, rid: int | str, end: Callable[[], None]) -> None:
        self.id, self._end, self._holders = rid, end, 1

    def hold(self) -> None:
        self._holders += 1

    def drop(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            self._end()


class SessionIds:
    """Per 2025-11-25 session, the ids of the requests the SDK holds for it. A claim lasts until
    the SDK is done with its request: its POST handled and, when its connection closed first,
    the cancel for it handed over, so that a request reusing the id never meets the first
    one's reply stream (the SDK keys those by the id)."""

    def __init__(self) -> None:
        self.sessions: dict[str, IdsInFlight] = {}

    def claim(self, session: str, rid: int | str) -> Claim | None:
        """The id's claim, or None when a request of the session under that id is in flight."""
        ids = self.sessions.setdefault(session, IdsInFlight())
        token = ids.claim(rid)
        if token is None:
            return None

        def end() -> None:
            ids.release(rid, token)
            if not ids and self.sessions.get(session) is ids:
                del self.sessions[session]

        return Claim(rid, end)


async def refuse(send: Send, refusal: Refusal) -> None:
    """A 400 with the JSON-RPC error of a message transport/request_ids.py refused."""
    import json

    data = json.dumps(refusal.error()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


async def unavailable(send: Send, message: str, close: bool = False) -> None:
    """A 503 with a JSON-RPC error body that says why and when to retry."""
    import json

    data = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
               (b"retry-after", b"1")] + ([(b"connection", b"close")] if close else [])
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def make_budget_receive(budgets: BodyBudgets, session: str | None, receive: Receive,
                        on_message: Callable[[MutableMapping[str, Any]], None] | None = None
                        ) -> tuple[Receive, Callable[[], None]]:
    """`receive` with each body chunk counted against `session`'s share and the total (raises
    OverBudget, with the reason, past either), and the function that gives the bytes back."""
    held = 0

    async def counted() -> Any:
        nonlocal held
        message = await receive()
        if message["type"] == "http.request":
            n = len(message.get("body", b""))
            why = budgets.take(session, n, held)
            if why is not None:
                raise OverBudget(why)  # from inside the SDK's body read: nothing has been answered yet
            held += n
        if on_message is not None:
            on_message(message)
        return message

    def release() -> None:
        nonlocal held
        budgets.give_back(session, held)
        held = 0

    return counted, release


class OverBudget(Exception):
    """Raised into the SDK's body read when a body would pass its session's share or the total."""
