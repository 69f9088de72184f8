"""`--http HOST:PORT`: one wisp for every MCP client on the machine, over MCP's streamable HTTP.

The `mcp` SDK serves the protocol (`StreamableHTTPSessionManager`: 2025-11-25 clients with
sessions and their SSE streams, 2026-07-28 clients one request at a time), checks Host and
Origin (DNS rebinding), bounds request bodies, sessions and idle time; its bearer middleware
asks this module's verifier about the token; uvicorn serves HTTP. Decided here: which address
may be bound, which token, the bounds' values, one `Core` (one core, one model, one thread
registry) behind every session, what a dropped connection means, and the lifecycle.

The tools are the stdio server's own (server.py's `build_server`): one `Server` object serves
every session, and each call reads its own session's roots and reports progress to it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import anyio

from . import protocol
from .client import Core
from .core_process import CoreLaunch

# The SDK's HTTP side, starlette and the stdlib modules only the shared server needs are
# imported where they are used: a stdio wisp, which imports this module for its flags, must
# not pay for them at every start.
if TYPE_CHECKING:
    from mcp.server.auth.provider import AccessToken
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.applications import Starlette
    from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger("wisp.http")

MCP_PATH = "/mcp"
DEFAULT_HTTP = "127.0.0.1:8765"
# A tools/call whose arguments fit wisp's frame limit (protocol.py) fits in this body with
# room for the JSON-RPC envelope; a larger body could not be served anyway: 413 before parsing.
MAX_BODY_BYTES = protocol.MAX_FRAME_BYTES + 1024 * 1024
DEFAULT_MAX_SESSIONS = 64
DEFAULT_SESSION_IDLE_S = 30 * 60.0
# Open connections and requests in flight, over every client: past it uvicorn answers 503.
MAX_CONNECTIONS = 1024
# On a stop signal, after the core is down: how long open connections (SSE streams) get to
# close before the process exits anyway; the core's own stop is bounded by core_process.py.
SHUTDOWN_GRACE_S = 0.5
TOKEN_BYTES = 32
# A token set by hand must be hard to guess too, and must fit an HTTP header as it is.
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE_BYTES = 4096
# The SDK's MCP_SESSION_ID_HEADER, as ASGI spells header names.
SESSION_HEADER = b"mcp-session-id"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class HttpConfigError(Exception):
    """A --http setting wisp refuses to start with; the message says what to do."""


# --- the address ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bind:
    host: str  # as given, without brackets
    port: int

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}{MCP_PATH}"


def parse_bind(text: str) -> Bind:
    """HOST:PORT, with an IPv6 host in brackets ([::1]:8765)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise HttpConfigError(f"--http {text!r}: expected HOST:PORT, e.g. --http {DEFAULT_HTTP}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise HttpConfigError(f"--http {text!r}: write an IPv6 address in brackets, e.g. --http [::1]:8765")
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise HttpConfigError(f"--http {text!r}: the port must be a number from 0 to 65535 (0: any free port)")
    return Bind(host, port)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(bind: Bind, allow_remote: bool) -> None:
    if not bind.loopback and not allow_remote:
        raise HttpConfigError(
            f"--http {bind.host}:{bind.port} is not a loopback address: other machines could reach wisp there. "
            "Bind 127.0.0.1, ::1 or localhost, or pass --allow-remote to serve the network on purpose "
            "(then put a TLS proxy in front: wisp speaks plain HTTP)."
        )


def _host_names(bind: Bind) -> list[str]:
    """The names a client may put in Host for this server. A DNS rebinding attack needs a DNS
    name that resolves to this machine, so loopback literals and `localhost` are safe to add."""
    host = bind.host
    if bind.loopback:
        # `localhost` is served on 127.0.0.1 (listen).
        return ["localhost", "127.0.0.1"] if host.lower() == "localhost" else ["localhost", f"[{host}]" if ":" in host else host]
    if host in ("0.0.0.0", "::"):
        # Every address of the machine: its names, and loopback.
        names = {"localhost", "127.0.0.1", "[::1]", socket.gethostname(), socket.getfqdn()}
        with contextlib.suppress(OSError):
            for *_, addr in socket.getaddrinfo(socket.gethostname(), None):
                ip = str(addr[0])
                names.add(f"[{ip}]" if ":" in ip else ip)
        return sorted(n for n in names if n)
    return [f"[{host}]" if ":" in host else host]


def security_settings(bind: Bind, port: int) -> TransportSecuritySettings:
    """The SDK's DNS rebinding protection, on, for exactly this server's address and port:
    a Host that is not it gets 421, an Origin that is present and not its origin gets 403."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = _host_names(bind)
    hosts = [f"{n}:{port}" for n in names] + (names if port == 80 else [])
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts],
    )


# --- the token -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    value: bytes
    where: str  # said by --check and the start-up log: never the token itself


def default_token_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "wisp" / "http-token"


def _valid_token(text: str, where: str) -> bytes:
    token = text.strip()
    if len(token) < MIN_TOKEN_CHARS or not all("!" <= c <= "~" for c in token):
        raise HttpConfigError(
            f"the token in {where} must be at least {MIN_TOKEN_CHARS} printable ASCII characters with no spaces; "
            "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return token.encode("ascii")


def read_token_file(path: Path) -> bytes:
    """The token in `path`, which must be a regular file of this user's that no one else may read."""
    try:
        # O_NONBLOCK: a FIFO put there must be refused, not waited on.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise HttpConfigError(f"the token file {path} does not exist; create it (mode 0600) or leave out --token-file") from None
    except OSError as exc:
        raise HttpConfigError(f"the token file {path} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HttpConfigError(f"the token file {path} is not a regular file; point --token-file at a file that holds only the token")
        if st.st_uid != os.getuid():
            raise HttpConfigError(f"the token file {path} belongs to another user (uid {st.st_uid}); use a file of your own")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise HttpConfigError(
                f"the token file {path} is readable or writable by others (mode {mode:04o}); "
                f"only its owner may use it: chmod 600 {path}"
            )
        if st.st_size > MAX_TOKEN_FILE_BYTES:
            raise HttpConfigError(f"the token file {path} is {st.st_size} bytes; it must hold only the token")
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    return _valid_token(text, str(path))


def _generate_token(path: Path) -> bytes:
    """A new token in `path` (0600, in a 0700 directory); a token another wisp wrote there first wins."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path.parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise HttpConfigError(f"{path.parent} is not a directory of yours; set XDG_CONFIG_HOME or use --token-file")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path.parent, 0o700)
    import secrets

    token = secrets.token_urlsafe(TOKEN_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.write(fd, (token + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces a token file that is already there
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return read_token_file(path)


def load_token(token_file: str | None, generate: bool = True) -> Token:
    """WISP_HTTP_TOKEN, else --token-file, else the generated one (made on first use)."""
    env = os.environ.get("WISP_HTTP_TOKEN")
    if env:
        return Token(_valid_token(env, "WISP_HTTP_TOKEN"), "the environment variable WISP_HTTP_TOKEN")
    if token_file:
        path = Path(token_file).expanduser()
        return Token(read_token_file(path), str(path))
    path = default_token_path()
    if not os.path.lexists(path):
        if not generate:
            return Token(b"", f"{path} (not made yet: wisp writes a new token there when it starts with --http)")
        log.info("wrote a new HTTP token to %s", path)
        return Token(_generate_token(path), str(path))
    return Token(read_token_file(path), str(path))


class TokenVerifier:
    """The SDK's bearer middleware asks this whether a request's token is wisp's."""

    def __init__(self, token: bytes) -> None:
        import hmac

        from mcp.server.auth.provider import AccessToken

        self._compare = hmac.compare_digest
        self._token = token
        self._granted = AccessToken(token="", client_id="wisp", scopes=[])

    async def verify_token(self, token: str) -> AccessToken | None:
        # Constant time, and on bytes: a header may carry any latin-1 text.
        if self._compare(token.encode("latin-1", "replace"), self._token):
            return self._granted
        return None


# --- between the token check and the SDK ----------------------------------------------------


@dataclass
class HttpOptions:
    bind: Bind
    token: Token
    eager: bool = False
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_idle_s: float = DEFAULT_SESSION_IDLE_S


class _Sessions:
    """The ASGI app behind the token check, in front of the SDK's session manager.

    - The core (and the local model) start with the first request that got this far.
    - A 2025-11-25 client that drops the connection of a POST before its reply ends that
      call: the SDK keeps serving a request whose stream is gone (that era lets a client
      resume it, which wisp, with no event store, cannot offer), so the disconnect is handed
      to the session as the client's `notifications/cancelled`. 2026-07-28 requests are
      cancelled by the SDK itself when their stream closes.
    - Past the session cap, the SDK's 503 says what wisp's limit is and how to change it.
    - Request bodies in memory and not yet answered are bounded over all clients (503 past it).
    """

    def __init__(self, manager: StreamableHTTPSessionManager, start_core: Callable[[], None], options: HttpOptions) -> None:
        from .transport import MAX_IN_FLIGHT_BYTES

        self.manager = manager
        # Request bodies received and not yet answered, over every client: the budget is what
        # one stdio client may have in flight. Bytes a slow client has not sent count nothing.
        self._held = 0
        self._budget = MAX_IN_FLIGHT_BYTES
        self._start_core = start_core
        self._options = options
        self._tasks: anyio.abc.TaskGroup | None = None

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
        self._start_core()
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.manager.handle_request(scope, receive, send)
            return
        in_session = _header(scope, SESSION_HEADER) is not None
        body = bytearray() if in_session else None
        held = 0
        answered = False

        async def counted_receive() -> Message:
            nonlocal held
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                held += len(chunk)
                self._held += len(chunk)
                if self._held > self._budget:
                    raise _OverBudget  # from inside the SDK's body read: nothing has been answered yet
                if body is not None and len(body) <= MAX_BODY_BYTES:
                    body.extend(chunk)
            elif message["type"] == "http.disconnect" and body is not None and not answered:
                self._cancel(scope, bytes(body))
            return message

        async def watched_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        try:
            await self.manager.handle_request(scope, counted_receive, watched_send if in_session else self._cap_message(send))
        except _OverBudget:
            await _json_error(send, 503, (
                f"wisp holds {self._budget // (1024 * 1024)} MiB of its clients' requests that are not answered yet; "
                "send this one again when some have been"
            ))
        finally:
            self._held -= held

    def _cancel(self, scope: Scope, body: bytes) -> None:
        try:
            request = json.loads(body)
        except ValueError:
            return
        if not isinstance(request, dict) or "method" not in request or not isinstance(request.get("id"), int | str):
            return  # a notification or a response: nothing is running for it
        note = json.dumps({
            "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": request["id"], "reason": "the client's connection closed before the reply"},
        }).encode()
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"] + [(b"content-length", str(len(note)).encode())]
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

        log.debug("request %r: the client's connection closed before the reply; cancelling it", request["id"])
        if self._tasks is not None:
            self._tasks.start_soon(self.manager.handle_request, sub, once, discard)

    def _cap_message(self, send: Send) -> Send:
        held: Message | None = None

        async def cap_send(message: Message) -> None:
            nonlocal held
            # The session manager's one 503 (uvicorn's own, past MAX_CONNECTIONS, never gets here).
            if message["type"] == "http.response.start" and message["status"] == 503:
                held = message
                return
            if held is not None and message["type"] == "http.response.body":
                o = self._options
                text = (
                    f"wisp serves at most {o.max_sessions} MCP sessions at once and that many are open; close a "
                    f"client, or start wisp with a larger --max-sessions (a session expires after {o.session_idle_s:g} s "
                    "without a request: --session-idle-timeout)"
                )
                try:
                    error = json.loads(message.get("body", b""))
                    error["error"]["message"] = text
                except (ValueError, KeyError, TypeError):
                    error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": text}}
                data = json.dumps(error).encode()
                headers = [(k, v) for k, v in held["headers"] if k != b"content-length"] + [(b"content-length", str(len(data)).encode())]
                await send({**held, "headers": headers})
                held = None
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return
            await send(message)

        return cap_send


class _OverBudget(Exception):
    """Raised into the SDK's body read when the request bodies held would pass the budget."""


async def _json_error(send: Send, status: int, message: str) -> None:
    data = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), (b"retry-after", b"1")]})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


def build_app(server: Any, start_core: Callable[[], None], options: HttpOptions, port: int) -> Starlette:
    """The ASGI app: the token check, then the SDK's streamable HTTP at /mcp."""
    from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(
        app=server,
        security_settings=security_settings(options.bind, port),
        max_request_body_size=MAX_BODY_BYTES,
        max_sessions=options.max_sessions,
        session_idle_timeout=options.session_idle_s,
    )
    sessions = _Sessions(manager, start_core, options)
    return Starlette(
        routes=[Route(MCP_PATH, endpoint=RequireAuthMiddleware(sessions, required_scopes=[]))],
        middleware=[Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(TokenVerifier(options.token.value)))],
        lifespan=lambda app: sessions.run(),
    )


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


async def serve(config: CoreLaunch, max_threads: int, options: HttpOptions, exit_now: Callable[[], Any]) -> None:
    import uvicorn

    from .server import build_server

    sock = listen(options.bind)
    port = sock.getsockname()[1]
    if not log.isEnabledFor(logging.DEBUG):
        # uvicorn's start and stop lines at info say nothing wisp's own do not.
        logging.getLogger("uvicorn").setLevel(logging.WARNING)
    core = Core(config)
    if options.eager:
        core.start()
    started = False

    def start_core() -> None:
        nonlocal started
        if not started:
            started = True
            core.start()

    app = build_app(build_server(core, max_threads), start_core, options, port)

    class Server(uvicorn.Server):
        # wisp handles the stop signals itself (below): uvicorn's own handler would re-raise
        # the signal once it is done, after the core has been left to stop by itself.
        @contextlib.contextmanager
        def capture_signals(self):  # type: ignore[no-untyped-def]
            yield

    http = Server(uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on", limit_concurrency=MAX_CONNECTIONS,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S, server_header=False,
    ))
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
