"""The roots an MCP client offers a call: asked for on the call's own channel, and each file://
URI turned into the local path it names. The core alone judges those paths (absolute, no NUL,
within the system's length, how many) before it binds anything; the shim judges only the URIs."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
from pydantic import BaseModel, ValidationError
from mcp.server.context import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from mcp.types import ListRootsRequest

from .. import errors
from ..errors import ShimError
from ..facts import MAX_CLIENT_ROOTS
from ..errors import short

log = logging.getLogger("wisp.server")

# How long a call waits for the client to list its roots before going on without them.
ROOTS_TIMEOUT_S = 2.0
# MAX_CLIENT_ROOTS (the core's fact): more roots than any real workspace offers; past it the core
# refuses the call (rather than some roots dropped without the caller knowing which), so one more
# than that is all the shim ever converts and sends.


class OfferedRoots(BaseModel):
    """A roots/list result as the client sent it: only the uri strings are used, checked by
    root_paths. The SDK has already checked the result's shape against the protocol's schema
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
        first: Mapping[str, Any] = exc.errors()[0] if exc.errors() else {}
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
    return root_paths(r.get("uri") if isinstance(r, dict) else r for r in offered.roots) or None


def root_paths(uris: Iterable[Any]) -> list[str]:
    """The local paths named by the client's file:// roots, in order, duplicates kept (they
    count towards the core's limit, which counts what the client offered), and no more than one
    past that limit: enough for the core to refuse the call.

    A file:// URI that does not name a path on this machine (another host, percent-escapes that
    are not UTF-8) is refused rather than guessed at; what the path itself must be is the core's
    judgement. Other schemes name no directory here: skipped. Linear in the number of roots."""
    paths: list[str] = []
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
            path = None
        if url.netloc not in ("", "localhost") or path is None:
            raise ShimError(
                errors.INVALID_ARGUMENT,
                f"the MCP client offered the root {short(uri)}, which does not name an absolute local path "
                "(file:///absolute/path, on this host, with UTF-8 percent-escapes); fix that root in the client, or "
                "start wisp with --root instead.",
            )
        paths.append(path)
        if len(paths) > MAX_CLIENT_ROOTS:
            break
    return paths
