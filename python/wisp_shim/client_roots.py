"""The roots an MCP client offers a call: asked for on the call's own channel, and each
checked to be one absolute local directory before the core is told of it."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
from pydantic import BaseModel, ValidationError
from mcp.server.context import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from mcp.types import ListRootsRequest

from . import errors
from .errors import ShimError
from .facts import MAX_CLIENT_ROOTS
from .tool_models import short

log = logging.getLogger("wisp.server")

# How long a call waits for the client to list its roots before going on without them.
ROOTS_TIMEOUT_S = 2.0
# MAX_CLIENT_ROOTS (the core's fact): more roots than any real workspace offers; past it a call
# that binds tools is refused (rather than some roots dropped without the caller knowing which).


class OfferedRoots(BaseModel):
    """A roots/list result as the client sent it: only the uri strings are used, checked by
    _root_paths. The SDK has already checked the result's shape against the protocol's schema
    (cheap); its typed ListRootsResult would validate every root again against pydantic URL types,
    slowly, before anyone can count them (test_hostile times 20,000), and would rewrite
    `file:relative` to `file:///relative`, hiding a root that is not absolute."""

    roots: list[Any]


async def client_roots(ctx: ServerRequestContext[Any]) -> list[str] | None:
    """The roots of the client that made this call, for a call that binds tools or attaches
    files; None when it offers none.

    Asked on this request's own channel (over streamable HTTP, the call's own response stream,
    which the client is reading), so every session of a shared server is asked for its own.
    Roots are deprecated in the 2026-07-28 protocol, which has no server-to-client requests, but
    they are still what Claude Code, Cursor and VS Code send; a client without them (or without
    a back-channel) simply gets wisp's own.
    """
    caps = ctx.session.client_capabilities
    if caps is None or caps.roots is None or not ctx.session.can_send_request:
        return None
    try:
        with anyio.fail_after(ROOTS_TIMEOUT_S):
            offered = await ctx.session.send_request(
                ListRootsRequest(), OfferedRoots, metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
            )
    except anyio.get_cancelled_exc_class():
        raise
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())) or "the result"
        raise ShimError(
            errors.INVALID_ARGUMENT,
            f"the MCP client's answer to roots/list is not what MCP specifies ({where}: "
            f"{first.get('msg', 'invalid')}); fix the client's roots, or start wisp with --root for the directories "
            "the model needs.",
        ) from None
    except Exception as exc:  # no back-channel, a slow client, or a client error: go on without
        log.debug("client roots unavailable: %s", exc)
        return None
    listed = offered.roots
    uris = [r.get("uri") if isinstance(r, dict) else r for r in listed[: MAX_CLIENT_ROOTS + 1]]
    return root_paths(uris, offered=len(listed)) or None


def root_paths(uris: list[Any], offered: int | None = None) -> list[str]:
    """The local directories named by the client's file:// roots, each once, in order.

    A root that does not decode to one absolute local path (a NUL inside, which the core's
    file calls would cut the path at; a relative path; another host; bytes that are not
    UTF-8) is refused rather than guessed at: the caller must not get a directory the client
    never offered. Linear in the number of roots."""
    offered = len(uris) if offered is None else offered
    if offered > MAX_CLIENT_ROOTS:
        raise ShimError(
            errors.INVALID_ARGUMENT,
            f"the MCP client offered {offered} roots, more than wisp's limit of {MAX_CLIENT_ROOTS}; offer fewer "
            "roots to wisp, or start it with --root for the directories the model needs.",
        )
    paths: dict[str, None] = {}
    for uri in uris:
        if not isinstance(uri, str):
            raise ShimError(errors.INVALID_ARGUMENT, f"the MCP client offered a root whose uri is not a string "
                                                     f"({short(uri)}); fix that root in the client.")
        url = urlsplit(uri)
        if url.scheme != "file":
            continue  # not a directory on this machine: nothing for the file tools
        try:
            path = unquote(url.path, errors="strict")
        except UnicodeDecodeError:
            path = ""
        if url.netloc not in ("", "localhost") or not path.startswith("/") or "\x00" in path:
            raise ShimError(
                errors.INVALID_ARGUMENT,
                f"the MCP client offered the root {short(uri)}, which does not decode to an absolute local path "
                "(file:///absolute/path, with no NUL and UTF-8 percent-escapes); fix that root in the client, or start "
                "wisp with --root instead.",
            )
        paths[path] = None
    return list(paths)
