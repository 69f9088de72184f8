"""`--http HOST:PORT`: one wisp for every MCP client on the machine, over MCP's streamable HTTP:
the app and the server's lifecycle (its settings, the address among them, are options.py's).

The `mcp` SDK serves the protocol (`StreamableHTTPSessionManager`: 2025-11-25 clients with
sessions and their SSE streams, 2026-07-28 clients one request at a time), checks Host and
Origin (DNS rebinding), bounds request body size, sessions and idle time; uvicorn serves HTTP,
through http/guards.py's connection (deadlines, connection caps, the token's check from
http/token.py, body budgets). Decided here: which address may be bound, the bounds' values,
one `Core` (one core, one model, one thread registry) behind every session, what a dropped
connection means, and the lifecycle.

The tools are the stdio server's own (mcp/server.py's `build_server`): one `Server` object serves
every session, and each call reads its own session's roots and reports progress to it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import signal
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Callable

import anyio

from ..core import protocol
from ..core.client import Core
from ..core.process import CoreLaunch
from .options import MCP_PATH, Bind, HttpOptions, security_settings
from .token import HttpConfigError

# The SDK's HTTP side, starlette, uvicorn (and so guards.py and transport/request_ids.py) and the
# stdlib modules only the shared server needs are imported where they are used: a stdio wisp,
# whose __main__ imports this module, must not pay for them at
# every start.
if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.types import Message, Receive, Scope, Send

    from .guards import BodyBudgets, Claim

log = logging.getLogger("wisp.http")

# A tools/call whose arguments fit wisp's frame limit (core/protocol.py) fits in this body with
# room for the JSON-RPC envelope; a larger body could not be served anyway: 413 before parsing.
MAX_BODY_BYTES = protocol.MAX_FRAME_BYTES + 1024 * 1024
# On a stop signal, after the core is down: how long open connections (SSE streams) get to
# close before the process exits anyway; the core's own stop is bounded by core/process.py.
SHUTDOWN_GRACE_S = 0.5
# The SDK's MCP_SESSION_ID_HEADER, as ASGI spells header names.
SESSION_HEADER = b"mcp-session-id"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


# --- between the guards and the SDK ---------------------------------------------------------


class _Sessions:
    """The ASGI app behind the guards (the token is checked), in front of the SDK's session manager.

    - The core (and the local model) start with the first request that got this far.
    - A 2025-11-25 client that drops the connection of a POST before its reply ends that
      call: the SDK keeps serving a request whose stream is gone (that era lets a client
      resume it, which wisp, with no event store, cannot offer), so the disconnect is handed
      to the session as the client's `notifications/cancelled`. 2026-07-28 requests are
      cancelled by the SDK itself when their stream closes.
    - Every POST's body is judged by transport/request_ids.py before the SDK sees it: a batch, an id
      JSON-RPC does not allow, a member twice, and in a session an id whose request is still
      in flight, get 400 with a -32600 error and run nothing (the SDK would answer an odd id
      `202` and a reused one by overwriting the first request's reply stream).
    - Past the session cap, the SDK's 503 says what wisp's limit is and how to change it.
    - Request bodies in memory and not yet answered count against their session's share and
      the total (http_guards.BodyBudgets; 503 past either).
    """

    def __init__(self, manager: StreamableHTTPSessionManager, start_core: Callable[[], None], options: HttpOptions,
                 budgets: BodyBudgets) -> None:
        from .guards import SessionIds

        self.manager = manager
        self._budgets = budgets
        self._start_core = start_core
        self._options = options
        self._tasks: anyio.abc.TaskGroup | None = None
        self._ids = SessionIds()

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with self.manager.run(), anyio.create_task_group() as tg:
            self._tasks = tg
            try:
                yield
            finally:
                self._tasks = None
                tg.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from ..transport import request_ids
        from .guards import OverBudget, make_budget_receive, read_body, refuse, unavailable

        self._start_core()
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.manager.handle_request(scope, receive, send)
            return
        session = _header(scope, SESSION_HEADER)
        answered = cancelled = False
        claim: Claim | None = None

        def watch(message: Message) -> None:
            nonlocal cancelled
            if message["type"] == "http.disconnect" and claim is not None and not (answered or cancelled):
                cancelled = True
                claim.hold()  # the id stays in flight until the cancel is handed over too
                self._cancel(scope, claim.id, claim.drop)

        counted_receive, release = make_budget_receive(self._budgets, session, receive, watch)

        async def watched_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        try:
            body, replay = await read_body(scope, counted_receive, MAX_BODY_BYTES)
            verdict = request_ids.judge(body) if body is not None else None
            if isinstance(verdict, request_ids.Refusal):
                await refuse(send, verdict)
                return
            if session is not None and isinstance(verdict, request_ids.Request):
                claim = self._ids.claim(session, verdict.id)
                if claim is None:
                    log.warning("request id %.60r is already in flight in its session; refused", verdict.id)
                    await refuse(send, request_ids.in_flight(verdict.id))
                    return
            out = watched_send if session is not None else self._cap_message(send)
            await self.manager.handle_request(scope, replay, out)
        except OverBudget as exc:
            await unavailable(send, str(exc))
        finally:
            release()
            if claim is not None:
                claim.drop()

    def _cancel(self, scope: Scope, rid: int | str, then: Callable[[], object]) -> None:
        note = json.dumps({
            "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": rid, "reason": "the client's connection closed before the reply"},
        }).encode()
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(note)).encode()))
        sub = {**scope, "headers": headers}
        sent = False

        async def once() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": note, "more_body": False}

        async def discard(message: Message) -> None:
            pass

        async def cancel() -> None:
            try:
                await self.manager.handle_request(sub, once, discard)
            finally:
                then()

        log.debug("request %r: the client's connection closed before the reply; cancelling it", rid)
        if self._tasks is not None:
            self._tasks.start_soon(cancel)
        else:
            then()

    def _cap_message(self, send: Send) -> Send:
        held: Message | None = None

        async def cap_send(message: Message) -> None:
            nonlocal held
            # The session manager's one 503 (the guards' and the budgets' are sent past this).
            if message["type"] == "http.response.start" and message["status"] == 503:
                held = message
                return
            if held is not None and message["type"] == "http.response.body":
                o = self._options
                text = (
                    f"wisp serves at most {o.max_sessions} MCP sessions at once and that many are open; close a "
                    "client, or start wisp with a larger --max-sessions (a session expires after "
                    f"{o.session_idle_s:g} s "
                    "without a request: --session-idle-timeout)"
                )
                try:
                    error = json.loads(message.get("body", b""))
                    error["error"]["message"] = text
                except (ValueError, KeyError, TypeError):
                    error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": text}}
                data = json.dumps(error).encode()
                headers = [(k, v) for k, v in held["headers"] if k != b"content-length"]
                headers.append((b"content-length", str(len(data)).encode()))
                await send({**held, "headers": headers})
                held = None
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return
            await send(message)

        return cap_send


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


def build_app(server: Any, start_core: Callable[[], None], options: HttpOptions, port: int,
              budgets: BodyBudgets) -> Starlette:
    """The ASGI app behind the guards: the SDK's streamable HTTP at /mcp."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(
        app=server,
        security_settings=security_settings(options.bind, port),
        max_request_body_size=MAX_BODY_BYTES,
        max_sessions=options.max_sessions,
        session_idle_timeout=options.session_idle_s,
    )
    sessions = _Sessions(manager, start_core, options, budgets)
    return Starlette(routes=[Route(MCP_PATH, endpoint=sessions)], lifespan=lambda app: sessions.run())


# --- the server's run -----------------------------------------------------------------------


def listen(bind: Bind) -> socket.socket:
    """The listening socket, bound before anything starts, so a busy port is told at once."""
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    host = bind.host
    if host.lower() == "localhost":
        host, family = "127.0.0.1", socket.AF_INET
    # proto IPPROTO_TCP, not socket.create_server's 0: asyncio turns Nagle off (TCP_NODELAY) only
    # on connections whose socket says TCP, and with Nagle on, a reply written as headers then
    # body waits for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, bind.port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        hint = " (another wisp may be serving there; choose another port)" if exc.errno == errno.EADDRINUSE else ""
        raise HttpConfigError(f"cannot listen on {bind.host}:{bind.port}: {exc.strerror}{hint}") from None
    sock.set_inheritable(False)
    return sock


def _core_starter(core: Core, eager: bool) -> Callable[[], None]:
    """Starts the core once: at once with `eager`, else on the first request that needs it."""
    if eager:
        core.start()
    started = eager

    def start_core() -> None:
        nonlocal started
        if not started:
            started = True
            core.start()

    return start_core


def _uvicorn(app: Any, guard: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        # wisp handles the stop signals itself (serve): uvicorn's own handler would re-raise
        # the signal once it is done, after the core has been left to stop by itself.
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(uvicorn.Config(
        app, http=guard.protocol(), log_config=None, access_log=False, lifespan="on",
        # uvicorn waits any number of seconds; its annotation says int.
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,  # type: ignore[arg-type]
        server_header=False,
    ))


async def serve(config: CoreLaunch, max_threads: int, options: HttpOptions, exit_now: Callable[[], Any]) -> None:
    from ..mcp.server import build_server

    sock = listen(options.bind)
    port = sock.getsockname()[1]
    if not log.isEnabledFor(logging.DEBUG):
        # uvicorn's start and stop lines at info say nothing wisp's own do not.
        logging.getLogger("uvicorn").setLevel(logging.WARNING)
    core = Core(config)
    start_core = _core_starter(core, options.eager)

    from .guards import BodyBudgets, ConnectionGuard
    from .token import Credentials

    app = build_app(build_server(core, max_threads), start_core, options, port, BodyBudgets())
    http = _uvicorn(app, ConnectionGuard(Credentials(options.token.value)))
    done = anyio.Event()

    async def stop(reason: str) -> None:
        log.info("%s; stopping wisp-core and exiting", reason)
        http.should_exit = True  # stop accepting: uvicorn closes the listener within a tick
        with anyio.CancelScope(shield=True):
            await core.aclose()  # fails every running call (shutting_down) and stops the local model
            with anyio.move_on_after(SHUTDOWN_GRACE_S + 0.5):
                await done.wait()
        exit_now()

    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
                async for signum in signals:
                    await stop(f"got {signal.Signals(signum).name}")

        tg.start_soon(on_signal)
        log.info("serving MCP at %s (token: %s)", options.bind.url(port), options.token.where)
        try:
            await http.serve(sockets=[sock])
        finally:
            done.set()
            with anyio.CancelScope(shield=True):
                await core.aclose()
            tg.cancel_scope.cancel()


def describe(options: HttpOptions) -> list[str]:
    """--check's lines for --http."""
    return [
        f"http:         {options.bind.url()}" + ("" if options.bind.loopback else " (--allow-remote)"),
        f"token:        {options.token.where}",
    ]
