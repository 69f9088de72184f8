"""`--http`'s settings, checked before anything starts: the address and its loopback rule, the
Host and Origin names the SDK lets in for it, the session bounds and the token (token.py)."""

from __future__ import annotations

import argparse
import contextlib
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import config
from .token import HttpConfigError, Token, load_token

if TYPE_CHECKING:
    from mcp.server.transport_security import TransportSecuritySettings

MCP_PATH = "/mcp"


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
        raise HttpConfigError(f"--http {text!r}: expected HOST:PORT, e.g. --http {config.DEFAULT_HTTP}")
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
        if host.lower() == "localhost":
            return ["localhost", "127.0.0.1"]
        return ["localhost", f"[{host}]" if ":" in host else host]
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


@dataclass
class HttpOptions:
    bind: Bind
    token: Token
    eager: bool = False
    max_sessions: int = config.DEFAULT_MAX_SESSIONS
    session_idle_s: float = config.DEFAULT_SESSION_IDLE_S


def options(ns: argparse.Namespace, generate_token: bool = True) -> HttpOptions | None:
    """--http's settings, checked before anything starts (None: serve stdio)."""
    where = config.http_address(ns)
    if where is None:
        return None
    idle = config.session_idle_s(ns)
    try:
        bind = parse_bind(where)
        check_bind(bind, ns.allow_remote)
        token = load_token(ns.token_file, config.env("WISP_HTTP_TOKEN"), generate=generate_token)
    except HttpConfigError as exc:
        raise SystemExit(f"wisp: {exc}") from None
    return HttpOptions(bind=bind, token=token, eager=ns.eager,
                       max_sessions=ns.max_sessions or config.DEFAULT_MAX_SESSIONS, session_idle_s=idle)
